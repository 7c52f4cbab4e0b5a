//! The container's own runtime options, asked of containerd when the task's hide
//! them.
//!
//! containerd gives a shim's `Create` the task's options when the client sent any,
//! and the container's runtime options only otherwise. `ctr run --uidmap` sends
//! runc's task options (the owner of the task's fifos) to every runtime, so a
//! `--runtime-config-path` given beside it never reached the shim, which then read
//! its default configuration without a word. In that case the shim reads the
//! container's record from containerd (`Containers.Get`, on the address containerd
//! started it with).

use containerd_client::services::v1::containers_client::ContainersClient;
use containerd_client::services::v1::GetContainerRequest;
use containerd_client::tonic::Request;
use containerd_client::with_namespace;
use containerd_shim::protos::protobuf::well_known_types::any::Any;

use crate::error::{ShimError, ShimResult};
use crate::options::RuntimeOptions;

/// Whether `options` (a `Create`'s) are some other runtime's, under which the
/// container's own may hide.
pub fn hide_runtime_options(options: Option<&Any>) -> bool {
    options.is_some_and(|o| !o.type_url.is_empty() && !RuntimeOptions::is_ours(&o.type_url))
}

/// The runtime options containerd holds for container `id` of `namespace`.
pub async fn of_container(address: &str, namespace: &str, id: &str) -> ShimResult<RuntimeOptions> {
    let failed = |what: &str, e: String| {
        ShimError::Other(format!("the runtime options of {id}: {what}: {e}"))
    };
    let channel = containerd_client::connect(address).await.map_err(|e| {
        failed(
            &format!("connect to containerd at {address}"),
            e.to_string(),
        )
    })?;
    let req = GetContainerRequest { id: id.to_string() };
    let container = ContainersClient::new(channel)
        .get(with_namespace!(req, namespace))
        .await
        .map_err(|e| failed("containerd's Containers.Get", e.to_string()))?
        .into_inner()
        .container
        .ok_or_else(|| failed("containerd's Containers.Get", "no container".into()))?;
    let Some(options) = container.runtime.and_then(|r| r.options) else {
        return Ok(RuntimeOptions::default());
    };
    let any = Any {
        type_url: options.type_url,
        value: options.value,
        ..Default::default()
    };
    RuntimeOptions::from_any(Some(&any)).map_err(ShimError::InvalidArgument)
}
