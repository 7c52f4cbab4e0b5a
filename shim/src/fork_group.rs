//! Where a fork's task is served: in the shim of the container it is forked from,
//! when that container keeps replicas for forks ([`crate::standby_forks`]).
//!
//! A replica's processes are children of the shim that made them: only that shim
//! can wait for them, so only it can adopt them. containerd lets a shim's `start`
//! answer the address of a shim that already runs (its pods' containers share one
//! that way), and then creates the task there. The fork's `start` reads the
//! restore request `crabctl fork` named in its task options: only root writes
//! those ([`crab_runtime::checkpoint::source::REQUEST_DIR`]), so no client can
//! put its container into another one's shim by an annotation.

use std::path::Path;

use crab_runtime::checkpoint::source::Source;
use crab_runtime::config::Config;
use crab_runtime::storage::ContainerKey;

/// The address of the live shim of the container that the container `id` of
/// `namespace` (whose bundle is `bundle`) is forked from, when the restore
/// request in its task options (`stdin`, as containerd writes them to `start`)
/// names one of this host in the same namespace and the fork asks for replicas
/// for forks. `None`: the fork gets a shim of its own, as any container.
pub fn source_shim(bundle: &Path, namespace: &str, id: &str, stdin: &[u8]) -> Option<String> {
    if stdin.is_empty() {
        return None;
    }
    let any = crate::options::any_from_bytes(stdin).ok()?;
    let runc = crate::options::RuncTaskOptions::from_any(Some(&any)).ok()?;
    let request = crate::options::restore_request(&runc, "", namespace, id).ok()??;
    let Source::History {
        namespace: src_ns,
        id: src,
        ..
    } = &request.source
    else {
        return None;
    };
    if src_ns != namespace || src == id {
        return None;
    }
    // Checked as containerd checks ids: no separator, nothing above the bundle's
    // directory.
    let src = ContainerKey::new(src_ns, src).ok()?;
    let (mut config, _) = Config::load_with_env(
        request.config_body.as_deref(),
        request.config_path.as_deref().map(Path::new),
    )
    .ok()?;
    let spec = crab_runtime::container::load_spec(bundle).ok()?;
    crate::standby_forks::configure(&mut config, &spec).ok()?;
    if config.standby.forks == 0 {
        return None;
    }
    let src_bundle = bundle.parent()?.join(src.id());
    let address = std::fs::read_to_string(src_bundle.join("address")).ok()?;
    let address = address.trim();
    let socket = address.strip_prefix("unix://").unwrap_or(address);
    // A shim that is gone (its socket left behind) serves nothing.
    std::os::unix::net::UnixStream::connect(socket).ok()?;
    Some(address.to_string())
}
