//! The few calls of containerd's gRPC API that `crabctl` makes to bring up tasks from
//! Crab's checkpoints (restore, fork, import): containers, snapshots and tasks.

use std::collections::HashMap;

use anyhow::{anyhow, bail, Context, Result};
use containerd_client::services::v1::container::Runtime;
use containerd_client::services::v1::containers_client::ContainersClient;
use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::images_client::ImagesClient;
use containerd_client::services::v1::leases_client::LeasesClient;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::snapshots::{
    CommitSnapshotRequest, Info, MountsRequest, PrepareSnapshotRequest, RemoveSnapshotRequest,
    StatSnapshotRequest,
};
use containerd_client::services::v1::tasks_client::TasksClient;
use containerd_client::services::v1::{
    AddResourceRequest, CreateRequest as LeaseCreateRequest, DeleteRequest as LeaseDeleteRequest,
    Resource as LeaseResource,
};
use containerd_client::services::v1::{
    Container, CreateContainerRequest, CreateTaskRequest, DeleteTaskRequest, GetContainerRequest,
    GetImageRequest, GetRequest, ListContainersRequest, ReadContentRequest, StartRequest,
};
use containerd_client::tonic::transport::Channel;
use containerd_client::tonic::{Code, Request, Status};
use containerd_client::types::Mount;
use containerd_client::with_namespace;
use crab_runtime::checkpoint::source::{RestoreOptions, RestoreRequest, Source};

/// A single-threaded async runtime for the gRPC calls.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")
}

/// A connection to one containerd, in one namespace.
#[derive(Clone)]
pub struct Client {
    pub(crate) channel: Channel,
    pub(crate) namespace: String,
    /// A lease the snapshots this client prepares and commits are held by
    /// ([`Client::under_lease`]).
    lease: Option<String>,
}

/// containerd's gRPC header naming the lease a request's resources belong to.
const LEASE_HEADER: &str = "containerd-lease";

/// The type of [`RuntimeOptions`].
const RUNTIME_OPTIONS_TYPE: &str = "runtimeoptions.v1.Options";

/// `runtimeoptions.v1.Options`: how a crab container was given its configuration.
#[derive(Clone, PartialEq, prost::Message)]
struct RuntimeOptions {
    #[prost(string, tag = "2")]
    config_path: String,
    #[prost(string, tag = "3")]
    config_body: String,
}

impl Client {
    /// Connects to containerd's socket.
    pub async fn connect(address: &str, namespace: &str) -> Result<Client> {
        let channel = containerd_client::connect(address)
            .await
            .with_context(|| format!("connect to containerd at {address}"))?;
        Ok(Client {
            lease: None,
            channel,
            namespace: namespace.to_string(),
        })
    }

    /// The container record `id`.
    pub async fn container(&self, id: &str) -> Result<Container> {
        let req = GetContainerRequest { id: id.to_string() };
        let resp = ContainersClient::new(self.channel.clone())
            .get(with_namespace!(req, self.namespace))
            .await
            .with_context(|| format!("container {id} in namespace {}", self.namespace))?;
        resp.into_inner()
            .container
            .ok_or_else(|| anyhow!("containerd returned no container {id}"))
    }

    /// Creates a container record like `from`, named `id`, with its own snapshot key,
    /// marked pending ([`crate::pending`]) until the caller finishes it.
    pub async fn create_container_like(&self, from: &Container, id: &str) -> Result<Container> {
        let spec = match &from.spec {
            Some(any) => Some(spec_with_own_cgroup(any, &from.id, id)?),
            None => None,
        };
        let mut c = Container {
            id: id.to_string(),
            snapshot_key: id.to_string(),
            created_at: None,
            updated_at: None,
            spec,
            ..from.clone()
        };
        crate::pending::mark(&mut c);
        let req = CreateContainerRequest { container: Some(c) };
        let resp = ContainersClient::new(self.channel.clone())
            .create(with_namespace!(req, self.namespace))
            .await
            .with_context(|| format!("create container {id}"))?;
        resp.into_inner()
            .container
            .ok_or_else(|| anyhow!("containerd returned no container {id}"))
    }

    /// The containers whose label `key` is `value`.
    pub async fn containers_labelled(&self, key: &str, value: &str) -> Result<Vec<Container>> {
        let req = ListContainersRequest {
            filters: vec![format!("labels.\"{key}\"=={value}")],
        };
        Ok(ContainersClient::new(self.channel.clone())
            .list(with_namespace!(req, self.namespace))
            .await
            .with_context(|| format!("list containers labelled {key}={value}"))?
            .into_inner()
            .containers)
    }

    /// Creates a container record from its parts (an import).
    pub async fn create_container(&self, c: Container) -> Result<()> {
        let id = c.id.clone();
        let req = CreateContainerRequest { container: Some(c) };
        ContainersClient::new(self.channel.clone())
            .create(with_namespace!(req, self.namespace))
            .await
            .with_context(|| format!("create container {id}"))?;
        Ok(())
    }

    /// A blob of the content store.
    async fn read_blob(&self, digest: &str) -> Result<Vec<u8>> {
        let req = ReadContentRequest {
            digest: digest.to_string(),
            offset: 0,
            size: 0,
        };
        let mut stream = ContentClient::new(self.channel.clone())
            .read(with_namespace!(req, self.namespace))
            .await
            .with_context(|| format!("read blob {digest}"))?
            .into_inner();
        let mut data = Vec::new();
        while let Some(chunk) = stream
            .message()
            .await
            .with_context(|| format!("read blob {digest}"))?
        {
            data.extend_from_slice(&chunk.data);
        }
        Ok(data)
    }

    /// The chain id of image `name`'s layers: the snapshot a container of it starts
    /// from (the image must be unpacked for the snapshotter, as `ctr images import`
    /// does).
    pub async fn image_chain_id(&self, name: &str) -> Result<String> {
        use sha2::{Digest, Sha256};
        let req = GetImageRequest {
            name: name.to_string(),
        };
        let image = ImagesClient::new(self.channel.clone())
            .get(with_namespace!(req, self.namespace))
            .await
            .map_err(|s| {
                anyhow!(
                    "image {name} is not in this containerd ({}): import it first",
                    s.message()
                )
            })?
            .into_inner()
            .image
            .ok_or_else(|| anyhow!("image {name} not found"))?;
        let target = image
            .target
            .ok_or_else(|| anyhow!("image {name} has no target"))?;
        let mut doc: serde_json::Value =
            serde_json::from_slice(&self.read_blob(&target.digest).await?)?;
        if doc["manifests"].is_array() {
            // An index: this host's platform, else the first manifest.
            let manifests = doc["manifests"].as_array().cloned().unwrap_or_default();
            let pick = manifests
                .iter()
                .find(|m| {
                    m["platform"]["architecture"] == "amd64" && m["platform"]["os"] == "linux"
                })
                .or(manifests.first())
                .ok_or_else(|| anyhow!("image {name}: empty index"))?;
            let digest = pick["digest"].as_str().unwrap_or_default().to_string();
            doc = serde_json::from_slice(&self.read_blob(&digest).await?)?;
        }
        let config_digest = doc["config"]["digest"]
            .as_str()
            .ok_or_else(|| anyhow!("image {name}: manifest without config"))?
            .to_string();
        let config: serde_json::Value =
            serde_json::from_slice(&self.read_blob(&config_digest).await?)?;
        let diff_ids: Vec<String> = config["rootfs"]["diff_ids"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|d| d.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let mut chain = String::new();
        for d in diff_ids {
            chain = if chain.is_empty() {
                d
            } else {
                format!(
                    "sha256:{:x}",
                    Sha256::digest(format!("{chain} {d}").as_bytes())
                )
            };
        }
        if chain.is_empty() {
            bail!("image {name} has no layers");
        }
        Ok(chain)
    }

    /// The mounts of an existing snapshot.
    pub async fn mounts(&self, snapshotter: &str, key: &str) -> Result<Vec<Mount>> {
        let req = MountsRequest {
            snapshotter: snapshotter.to_string(),
            key: key.to_string(),
        };
        let resp = SnapshotsClient::new(self.channel.clone())
            .mounts(with_namespace!(req, self.namespace))
            .await
            .with_context(|| format!("mounts of snapshot {key}"))?;
        Ok(resp.into_inner().mounts)
    }

    /// `msg` in this client's namespace, and under its lease if it has one.
    fn request<T>(&self, msg: T) -> Request<T> {
        let mut req = with_namespace!(msg, self.namespace);
        if let Some(lease) = self.lease.as_ref().and_then(|l| l.parse().ok()) {
            req.metadata_mut().insert(LEASE_HEADER, lease);
        }
        req
    }

    /// This connection, with the snapshots it prepares and commits held by lease
    /// `id` (containerd's garbage collector removes a snapshot nothing references).
    pub fn under_lease(&self, id: &str) -> Client {
        Client {
            lease: Some(id.to_string()),
            ..self.clone()
        }
    }

    /// Creates lease `id`, which containerd drops by itself after `ttl` (a crashed
    /// caller leaves nothing held for good).
    pub async fn create_lease(&self, id: &str, ttl: std::time::Duration) -> Result<()> {
        let expire = chrono::Utc::now() + chrono::Duration::from_std(ttl)?;
        let req = LeaseCreateRequest {
            id: id.to_string(),
            labels: HashMap::from([(
                "containerd.io/gc.expire".to_string(),
                expire.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            )]),
        };
        LeasesClient::new(self.channel.clone())
            .create(with_namespace!(req, self.namespace))
            .await
            .with_context(|| format!("create lease {id}"))?;
        Ok(())
    }

    /// Adds snapshot `key` to lease `id`.
    pub async fn lease_snapshot(&self, id: &str, snapshotter: &str, key: &str) -> Result<()> {
        let req = AddResourceRequest {
            id: id.to_string(),
            resource: Some(LeaseResource {
                id: key.to_string(),
                r#type: format!("snapshots/{snapshotter}"),
            }),
        };
        LeasesClient::new(self.channel.clone())
            .add_resource(with_namespace!(req, self.namespace))
            .await
            .with_context(|| format!("add snapshot {key} to lease {id}"))?;
        Ok(())
    }

    /// Deletes lease `id` (what it held stays while something else references it).
    pub async fn delete_lease(&self, id: &str) -> Result<()> {
        let req = LeaseDeleteRequest {
            id: id.to_string(),
            sync: false,
        };
        LeasesClient::new(self.channel.clone())
            .delete(with_namespace!(req, self.namespace))
            .await
            .with_context(|| format!("delete lease {id}"))?;
        Ok(())
    }

    /// Snapshot `key`'s information (its parent, its kind), or `None` if there is none.
    pub async fn stat_snapshot(&self, snapshotter: &str, key: &str) -> Result<Option<Info>> {
        let req = StatSnapshotRequest {
            snapshotter: snapshotter.to_string(),
            key: key.to_string(),
        };
        match SnapshotsClient::new(self.channel.clone())
            .stat(with_namespace!(req, self.namespace))
            .await
        {
            Ok(resp) => Ok(resp.into_inner().info),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(anyhow!(s)).with_context(|| format!("stat snapshot {key}")),
        }
    }

    /// Commits the writable snapshot `key` as `name`.
    pub async fn commit(
        &self,
        snapshotter: &str,
        name: &str,
        key: &str,
    ) -> std::result::Result<(), Status> {
        let req = CommitSnapshotRequest {
            snapshotter: snapshotter.to_string(),
            name: name.to_string(),
            key: key.to_string(),
            ..Default::default()
        };
        SnapshotsClient::new(self.channel.clone())
            .commit(self.request(req))
            .await
            .map(|_| ())
    }

    /// Removes snapshot `key` (gone already is not an error).
    pub async fn remove_snapshot(&self, snapshotter: &str, key: &str) -> Result<()> {
        let req = RemoveSnapshotRequest {
            snapshotter: snapshotter.to_string(),
            key: key.to_string(),
        };
        match SnapshotsClient::new(self.channel.clone())
            .remove(with_namespace!(req, self.namespace))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(anyhow!(s)).with_context(|| format!("remove snapshot {key}")),
        }
    }

    /// Prepares a writable snapshot `key` on `parent`; returns its mounts.
    pub async fn prepare(&self, snapshotter: &str, key: &str, parent: &str) -> Result<Vec<Mount>> {
        let req = PrepareSnapshotRequest {
            snapshotter: snapshotter.to_string(),
            key: key.to_string(),
            parent: parent.to_string(),
            labels: HashMap::new(),
        };
        let resp = SnapshotsClient::new(self.channel.clone())
            .prepare(self.request(req))
            .await
            .with_context(|| format!("prepare snapshot {key}"))?;
        Ok(resp.into_inner().mounts)
    }

    /// Deletes the task of container `id`, with containerd's answer as it is
    /// (see [`crate::crashed`] for what it means after a crash).
    pub async fn delete_task(&self, id: &str) -> std::result::Result<(), Status> {
        let req = DeleteTaskRequest {
            container_id: id.to_string(),
        };
        TasksClient::new(self.channel.clone())
            .delete(with_namespace!(req, self.namespace))
            .await
            .map(|_| ())
    }

    /// Whether containerd has a task for container `id`.
    pub async fn has_task(&self, id: &str) -> Result<bool> {
        let req = GetRequest {
            container_id: id.to_string(),
            exec_id: String::new(),
        };
        match TasksClient::new(self.channel.clone())
            .get(with_namespace!(req, self.namespace))
            .await
        {
            Ok(_) => Ok(true),
            Err(s) if s.code() == Code::NotFound => Ok(false),
            Err(s) => Err(anyhow!("the task of {id}: {}", s.message())),
        }
    }

    /// Creates and starts the task of container `c` (with the mounts of its snapshot),
    /// its processes restored from `source`. Returns the init's pid.
    pub async fn start_restored(
        &self,
        c: &Container,
        rootfs: Vec<Mount>,
        source: Source,
    ) -> Result<u32> {
        let (config_path, config_body) = runtime_config(c.runtime.as_ref());
        let request = RestoreRequest {
            namespace: self.namespace.clone(),
            id: c.id.clone(),
            options: RestoreOptions {
                source,
                config_path,
                config_body,
            },
        }
        .write()
        .context("write the restore request")?;
        let req = CreateTaskRequest {
            container_id: c.id.clone(),
            rootfs,
            options: Some(restore_request_options(request.path())),
            ..Default::default()
        };
        let mut tasks = TasksClient::new(self.channel.clone());
        tasks
            .create(with_namespace!(req, self.namespace))
            .await
            .map_err(|s| anyhow!("create the task of {}: {}", c.id, s.message()))?;
        // The shim has read it.
        drop(request);
        // The task holds the checkpoint's files, its processes not yet restored (in a
        // restore, a fork and an import).
        crab_runtime::storage::fault::point("task.created");
        let req = StartRequest {
            container_id: c.id.clone(),
            exec_id: String::new(),
        };
        let started = tasks
            .start(with_namespace!(req, self.namespace))
            .await
            .map_err(|s| anyhow!("start the task of {}: {}", c.id, s.message()))?;
        Ok(started.into_inner().pid)
    }
}

/// The runtime options that give a crab container the configuration file
/// `config_path` (what `ctr run --runtime-config-path` sends).
pub fn runtime_options(config_path: &str) -> prost_types::Any {
    use prost::Message;
    prost_types::Any {
        type_url: RUNTIME_OPTIONS_TYPE.to_string(),
        value: RuntimeOptions {
            config_path: config_path.to_string(),
            config_body: String::new(),
        }
        .encode_to_vec(),
    }
}

/// `containerd.runc.v1.Options`, with only the field Crab's restore requests use.
#[derive(Clone, PartialEq, prost::Message)]
struct RuncOptions {
    #[prost(string, tag = "10")]
    criu_image_path: String,
}

/// The task options naming restore request `path`: runc's options type, the only one
/// containerd 2.x takes, which 1.7 hands over too (see [`RestoreRequest`]).
fn restore_request_options(path: &std::path::Path) -> prost_types::Any {
    use prost::Message;
    prost_types::Any {
        type_url: "containerd.runc.v1.Options".to_string(),
        value: RuncOptions {
            criu_image_path: path.to_string_lossy().into_owned(),
        }
        .encode_to_vec(),
    }
}

/// The crab configuration a container was created with (`--runtime-config-path`).
fn runtime_config(runtime: Option<&Runtime>) -> (Option<String>, Option<String>) {
    use prost::Message;
    let Some(any) = runtime.and_then(|r| r.options.as_ref()) else {
        return (None, None);
    };
    if !any.type_url.ends_with(RUNTIME_OPTIONS_TYPE) {
        return (None, None);
    }
    match RuntimeOptions::decode(any.value.as_slice()) {
        Ok(o) => (
            Some(o.config_path).filter(|s| !s.is_empty()),
            Some(o.config_body).filter(|s| !s.is_empty()),
        ),
        Err(_) => (None, None),
    }
}

/// `spec` (an OCI spec as containerd stores it: JSON in an `Any`) for a copy
/// `id` of container `from`: where its `linux.cgroupsPath` names `from`'s own
/// cgroup (`/<namespace>/<from>`, as `ctr` and crabctl make it), the copy's
/// names its own (`/<namespace>/<id>`), so that whatever restores the copy
/// later (a rollback, a replica, a restore after a crash, a fork of the copy)
/// finds the cgroup the copy was given, never its source's. Other paths (a
/// systemd slice, an orchestrator's) stay as they are.
fn spec_with_own_cgroup(spec: &prost_types::Any, from: &str, id: &str) -> Result<prost_types::Any> {
    let mut json: serde_json::Value =
        serde_json::from_slice(&spec.value).context("parse the source's spec")?;
    let Some(slot) = json.pointer_mut("/linux/cgroupsPath") else {
        return Ok(spec.clone());
    };
    let Some(path) = slot.as_str() else {
        return Ok(spec.clone());
    };
    let own = crab_runtime::checkpoint::own_cgroup_path(std::path::Path::new(path), from, id);
    *slot = serde_json::Value::String(own.to_string_lossy().into_owned());
    Ok(prost_types::Any {
        type_url: spec.type_url.clone(),
        value: serde_json::to_vec(&json).context("write the copy's spec")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_runtime_options_an_import_sends_name_its_configuration() {
        let runtime = Runtime {
            name: "io.containerd.crab.v2".into(),
            options: Some(runtime_options("/etc/crab/tenant.toml")),
        };
        assert_eq!(
            runtime_config(Some(&runtime)),
            (Some("/etc/crab/tenant.toml".into()), None)
        );
    }

    fn spec(cgroups_path: &str) -> prost_types::Any {
        let json = serde_json::json!({
            "ociVersion": "1.1.0",
            "process": {"args": ["sh"]},
            "linux": {"cgroupsPath": cgroups_path},
        });
        prost_types::Any {
            type_url: "types.containerd.io/opencontainers/runtime-spec/1/Spec".into(),
            value: serde_json::to_vec(&json).unwrap(),
        }
    }

    fn cgroups_path(any: &prost_types::Any) -> String {
        let v: serde_json::Value = serde_json::from_slice(&any.value).unwrap();
        v["linux"]["cgroupsPath"].as_str().unwrap().to_string()
    }

    #[test]
    fn a_copys_spec_names_its_own_cgroup_not_its_sources() {
        let copy = spec_with_own_cgroup(&spec("/crab/web"), "web", "web-fork-1").unwrap();
        assert_eq!(cgroups_path(&copy), "/crab/web-fork-1");
        let v: serde_json::Value = serde_json::from_slice(&copy.value).unwrap();
        assert_eq!(
            v["process"]["args"][0], "sh",
            "the rest of the spec is kept"
        );
        // A path that is not the source's own (a systemd slice, an
        // orchestrator's) stays.
        let slice = spec_with_own_cgroup(&spec("system.slice:docker:web"), "web", "w2").unwrap();
        assert_eq!(cgroups_path(&slice), "system.slice:docker:web");
    }
}
