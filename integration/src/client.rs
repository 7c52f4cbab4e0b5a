//! containerd's gRPC API, for what containerd's Go client does and `ctr` cannot: task
//! options (runc's `ShimCgroup`, `CriuImagePath`), checkpoint options with an image
//! path, containers on a read-only view snapshot. The calls and option types are
//! those of the Go client's `WithShimCgroup`, `WithRestoreImagePath`,
//! `WithCheckpointImagePath` and `WithNewSnapshotView` for a runtime that is not
//! runc's: containerd 1.x's client sends containerd's older `containerd.linux.runc.*`
//! messages, 2.x's runc's own (`containerd.runc.v1.*`) to every runtime; the client
//! sends those of the containerd it talks to.

use containerd_client::services::v1::containers_client::ContainersClient;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::snapshots::{
    MountsRequest, RemoveSnapshotRequest, StatSnapshotRequest, ViewSnapshotRequest,
};
use containerd_client::services::v1::tasks_client::TasksClient;
use containerd_client::services::v1::version_client::VersionClient;
use containerd_client::services::v1::{
    CheckpointTaskRequest, Container, CreateContainerRequest, CreateTaskRequest,
    DeleteContainerRequest, GetContainerRequest, StartRequest,
};
use containerd_client::tonic::transport::Channel;
use containerd_client::types::Mount;
// `with_namespace!` names `Request` as it finds it in scope.
use containerd_client::tonic::Request;
use containerd_client::with_namespace;

/// The snapshotter `ctr` uses by default.
pub const SNAPSHOTTER: &str = "overlayfs";

/// `containerd.linux.runc.CreateOptions`: the task options the Go client 1.x sends to
/// a runtime that is not runc's (only the fields the tests set).
#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateOptions {
    /// The cgroup the shim is to run in.
    #[prost(string, tag = "9")]
    pub shim_cgroup: String,
    /// CRIU images to restore the task from.
    #[prost(string, tag = "13")]
    pub criu_image_path: String,
}

/// `containerd.runc.v1.Options`: the same fields as the Go client 2.x sends them.
#[derive(Clone, PartialEq, prost::Message)]
struct RuncOptions {
    #[prost(string, tag = "3")]
    shim_cgroup: String,
    #[prost(string, tag = "10")]
    criu_image_path: String,
}

/// `containerd.linux.runc.CheckpointOptions` (the fields the tests set).
#[derive(Clone, PartialEq, prost::Message)]
pub struct CheckpointOptions {
    /// Stop the task after the checkpoint.
    #[prost(bool, tag = "1")]
    pub exit: bool,
    /// Where the checkpoint goes instead of containerd's content store.
    #[prost(string, tag = "8")]
    pub image_path: String,
}

impl CreateOptions {
    /// As the `Any` the Go client of containerd `major` sends.
    pub fn to_any(&self, major: u32) -> prost_types::Any {
        if major >= 2 {
            let runc = RuncOptions {
                shim_cgroup: self.shim_cgroup.clone(),
                criu_image_path: self.criu_image_path.clone(),
            };
            return any("containerd.runc.v1.Options", &runc);
        }
        any("containerd.linux.runc.CreateOptions", self)
    }
}

impl CheckpointOptions {
    /// As the `Any` the Go client of containerd `major` sends (the same fields under
    /// two names).
    pub fn to_any(&self, major: u32) -> prost_types::Any {
        if major >= 2 {
            return any("containerd.runc.v1.CheckpointOptions", self);
        }
        any("containerd.linux.runc.CheckpointOptions", self)
    }
}

/// The task options that restore a new task of container `target` from checkpoint
/// `checkpoint` of container `id`'s history in `namespace` (what `crabctl restore`
/// and `fork` send: a restore request, written here and removed when the returned
/// guard is dropped, named in runc's options).
pub fn restore_from_history(
    namespace: &str,
    target: &str,
    id: &str,
    checkpoint: &str,
) -> (
    prost_types::Any,
    crab_runtime::checkpoint::source::WrittenRequest,
) {
    use crab_runtime::checkpoint::source::{RestoreOptions, RestoreRequest, Source};
    let request = RestoreRequest {
        namespace: namespace.into(),
        id: target.into(),
        options: RestoreOptions {
            source: Source::History {
                namespace: namespace.into(),
                id: id.into(),
                checkpoint: checkpoint.into(),
            },
            config_path: None,
            config_body: None,
        },
    }
    .write()
    .expect("write a restore request");
    let runc = RuncOptions {
        shim_cgroup: String::new(),
        criu_image_path: request.path().to_string_lossy().into_owned(),
    };
    (any("containerd.runc.v1.Options", &runc), request)
}

/// runc's task options naming `path` as the CRIU image path (where `crabctl`
/// names its restore requests).
pub fn options_naming(path: &std::path::Path) -> prost_types::Any {
    let runc = RuncOptions {
        shim_cgroup: String::new(),
        criu_image_path: path.to_string_lossy().into_owned(),
    };
    any("containerd.runc.v1.Options", &runc)
}

fn any(type_url: &str, m: &impl prost::Message) -> prost_types::Any {
    prost_types::Any {
        type_url: type_url.to_string(),
        value: m.encode_to_vec(),
    }
}

/// A blocking client of one containerd namespace (the tests are synchronous).
pub struct Client {
    rt: tokio::runtime::Runtime,
    channel: Channel,
    namespace: String,
    major: u32,
}

/// A gRPC call's failure.
pub type CallResult<T> = Result<T, Box<containerd_client::tonic::Status>>;

impl Client {
    /// Connects to the test containerd (`crate::address()`), in the test namespace.
    pub fn connect() -> Client {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let address = crate::address();
        let channel = rt
            .block_on(containerd_client::connect(&address))
            .unwrap_or_else(|e| {
                panic!("connect to containerd at {address} (hack/containerd.sh start): {e}")
            });
        let mut version = VersionClient::new(channel.clone());
        let v = rt
            .block_on(version.version(()))
            .expect("containerd's Version")
            .into_inner()
            .version;
        let major = v
            .trim_start_matches('v')
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("containerd's version {v:?}"));
        Client {
            rt,
            channel,
            namespace: crate::namespace(),
            major,
        }
    }

    /// The major version of the containerd it talks to.
    pub fn containerd_major(&self) -> u32 {
        self.major
    }

    fn call<T>(
        &self,
        f: impl std::future::Future<
            Output = Result<
                containerd_client::tonic::Response<T>,
                containerd_client::tonic::Status,
            >,
        >,
    ) -> CallResult<T> {
        self.rt
            .block_on(f)
            .map(|r| r.into_inner())
            .map_err(Box::new)
    }

    /// containerd's record of container `id`.
    pub fn container(&self, id: &str) -> CallResult<Container> {
        let req = GetContainerRequest { id: id.into() };
        let mut c = ContainersClient::new(self.channel.clone());
        Ok(self
            .call(c.get(with_namespace!(req, self.namespace)))?
            .container
            .expect("containerd answers with the container"))
    }

    /// Creates a container record.
    pub fn create_container(&self, container: Container) -> CallResult<()> {
        let req = CreateContainerRequest {
            container: Some(container),
        };
        let mut c = ContainersClient::new(self.channel.clone());
        self.call(c.create(with_namespace!(req, self.namespace)))
            .map(drop)
    }

    /// Deletes a container record (its task must be gone).
    pub fn delete_container(&self, id: &str) -> CallResult<()> {
        let req = DeleteContainerRequest { id: id.into() };
        let mut c = ContainersClient::new(self.channel.clone());
        self.call(c.delete(with_namespace!(req, self.namespace)))
            .map(drop)
    }

    /// The parent of snapshot `key`.
    pub fn snapshot_parent(&self, key: &str) -> CallResult<String> {
        let req = StatSnapshotRequest {
            snapshotter: SNAPSHOTTER.into(),
            key: key.into(),
        };
        let mut c = SnapshotsClient::new(self.channel.clone());
        Ok(self
            .call(c.stat(with_namespace!(req, self.namespace)))?
            .info
            .map(|i| i.parent)
            .unwrap_or_default())
    }

    /// Makes a read-only view `key` of `parent`; returns its mounts.
    pub fn view(&self, key: &str, parent: &str) -> CallResult<Vec<Mount>> {
        let req = ViewSnapshotRequest {
            snapshotter: SNAPSHOTTER.into(),
            key: key.into(),
            parent: parent.into(),
            labels: Default::default(),
        };
        let mut c = SnapshotsClient::new(self.channel.clone());
        Ok(self
            .call(c.view(with_namespace!(req, self.namespace)))?
            .mounts)
    }

    /// The mounts of snapshot `key`.
    pub fn mounts(&self, key: &str) -> CallResult<Vec<Mount>> {
        let req = MountsRequest {
            snapshotter: SNAPSHOTTER.into(),
            key: key.into(),
        };
        let mut c = SnapshotsClient::new(self.channel.clone());
        Ok(self
            .call(c.mounts(with_namespace!(req, self.namespace)))?
            .mounts)
    }

    /// Removes snapshot `key`.
    pub fn remove_snapshot(&self, key: &str) -> CallResult<()> {
        let req = RemoveSnapshotRequest {
            snapshotter: SNAPSHOTTER.into(),
            key: key.into(),
        };
        let mut c = SnapshotsClient::new(self.channel.clone());
        self.call(c.remove(with_namespace!(req, self.namespace)))
            .map(drop)
    }

    /// Creates the task of container `id` on `rootfs`, with no stdio; returns its pid.
    pub fn create_task(
        &self,
        id: &str,
        rootfs: Vec<Mount>,
        options: Option<prost_types::Any>,
    ) -> CallResult<u32> {
        let req = CreateTaskRequest {
            container_id: id.into(),
            rootfs,
            options,
            ..Default::default()
        };
        let mut c = TasksClient::new(self.channel.clone());
        Ok(self
            .call(c.create(with_namespace!(req, self.namespace)))?
            .pid)
    }

    /// Starts the task of container `id`; returns its pid.
    pub fn start_task(&self, id: &str) -> CallResult<u32> {
        let req = StartRequest {
            container_id: id.into(),
            exec_id: String::new(),
        };
        let mut c = TasksClient::new(self.channel.clone());
        Ok(self
            .call(c.start(with_namespace!(req, self.namespace)))?
            .pid)
    }

    /// Checkpoints the task of container `id` with `options`.
    pub fn checkpoint_task(&self, id: &str, options: prost_types::Any) -> CallResult<()> {
        let req = CheckpointTaskRequest {
            container_id: id.into(),
            parent_checkpoint: String::new(),
            options: Some(options),
        };
        let mut c = TasksClient::new(self.channel.clone());
        self.call(c.checkpoint(with_namespace!(req, self.namespace)))
            .map(drop)
    }
}
