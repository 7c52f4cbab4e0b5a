//! A CRI client: Kubernetes' runtime API v1 (the generated code of the `k8s-cri` crate),
//! spoken to the CRI-enabled private containerd (`hack/containerd.sh --cri`) the way
//! kubelet speaks it: a pod sandbox with a runtime handler, then containers in it.
//!
//! Environment:
//! - `CRAB_CRI_ADDRESS`: that containerd's socket (default `/run/crab/containerd-cri/containerd.sock`)
//! - `CRAB_CRI_NAMESPACE`: the containerd namespace CRI keeps its containers in (`k8s.io`)
//! - `CRAB_CRI_POD_SUBNET`: the pods' network (`10.88.213.0/24`)

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use containerd_client::tonic::transport::Channel;
use containerd_client::tonic::Status;
pub use k8s_cri::v1 as api;

use api::image_service_client::ImageServiceClient;
use api::runtime_service_client::RuntimeServiceClient;

use crate::{text, unique_id, wait_until};

/// The runtime handler of the crab runtime in the CRI config.
pub const CRAB_HANDLER: &str = "crab";
/// The crab runtime's handler without runtime options (`hack/containerd.sh`):
/// containerd 2.x starts a `hostUsers: false` pod's containers only on such a
/// handler (or runc's).
pub const CRAB_USERNS_HANDLER: &str = "crab-userns";
/// The runtime handler of runc's shim, the baseline.
pub const RUNC_HANDLER: &str = "runc";
/// The pods' network (the bridge `hack/containerd.sh --cri` writes), from
/// `CRAB_CRI_POD_SUBNET` (a /24, default `10.88.213.0/24`): the prefix of its addresses.
pub fn pod_subnet_prefix() -> String {
    let subnet = std::env::var("CRAB_CRI_POD_SUBNET").unwrap_or_else(|_| "10.88.213.0/24".into());
    let (net, bits) = subnet
        .split_once('/')
        .unwrap_or_else(|| panic!("CRAB_CRI_POD_SUBNET {subnet:?} is not ADDRESS/BITS"));
    assert_eq!(
        bits, "24",
        "CRAB_CRI_POD_SUBNET {subnet:?}: the tests expect a /24"
    );
    let (prefix, _) = net
        .rsplit_once('.')
        .unwrap_or_else(|| panic!("CRAB_CRI_POD_SUBNET {subnet:?} is not IPv4"));
    format!("{prefix}.")
}

/// The CRI containerd's socket.
pub fn address() -> String {
    std::env::var("CRAB_CRI_ADDRESS")
        .unwrap_or_else(|_| "/run/crab/containerd-cri/containerd.sock".into())
}

/// The containerd namespace CRI's containers live in.
pub fn namespace() -> String {
    std::env::var("CRAB_CRI_NAMESPACE").unwrap_or_else(|_| "k8s.io".into())
}

/// A CRI result: the gRPC status on failure.
pub type CriResult<T> = Result<T, Box<Status>>;

/// A blocking CRI client (the tests are synchronous).
pub struct Cri {
    rt: tokio::runtime::Runtime,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

impl Cri {
    /// Connects to the CRI containerd; panics (naming the set-up) if it does not answer.
    pub fn connect() -> Cri {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let addr = address();
        let channel = rt
            .block_on(containerd_client::connect(&addr))
            .unwrap_or_else(|e| {
                panic!("no CRI containerd at {addr} (hack/containerd.sh --cri start): {e}")
            });
        let cri = Cri {
            rt,
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        };
        let version = cri.version().expect("CRI Version");
        assert_eq!(version.runtime_api_version, "v1", "{version:?}");
        cri
    }

    fn run<T>(&self, f: impl std::future::Future<Output = CriResult<T>>) -> CriResult<T> {
        self.rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(120), f)
                .await
                .unwrap_or_else(|_| {
                    Err(Status::deadline_exceeded("CRI call took over 120 s").into())
                })
        })
    }

    /// Version.
    pub fn version(&self) -> CriResult<api::VersionResponse> {
        let mut c = self.runtime.clone();
        self.run(async move {
            Ok(c.version(api::VersionRequest {
                version: "v1".into(),
            })
            .await?
            .into_inner())
        })
    }

    /// The major version of the containerd behind CRI (`1.7.24~ds1`: 1, `v2.1.9`: 2).
    pub fn containerd_major(&self) -> u32 {
        let v = self.version().expect("CRI Version").runtime_version;
        v.trim_start_matches('v')
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("containerd's version {v:?}"))
    }

    /// ImageStatus of `image` (None when CRI does not know it).
    pub fn image(&self, image: &str) -> CriResult<Option<api::Image>> {
        let mut c = self.images.clone();
        let spec = image_spec(image);
        self.run(async move {
            Ok(c.image_status(api::ImageStatusRequest {
                image: Some(spec),
                verbose: false,
            })
            .await?
            .into_inner()
            .image)
        })
    }

    /// ImageFsInfo: the image file systems' mount points, as kubelet reads them.
    pub fn image_fs_mountpoints(&self) -> CriResult<Vec<String>> {
        let mut c = self.images.clone();
        self.run(async move {
            Ok(c.image_fs_info(api::ImageFsInfoRequest {})
                .await?
                .into_inner()
                .image_filesystems
                .into_iter()
                .filter_map(|f| f.fs_id.map(|id| id.mountpoint))
                .collect())
        })
    }

    /// RunPodSandbox.
    pub fn run_pod(&self, config: &api::PodSandboxConfig, handler: &str) -> CriResult<String> {
        let mut c = self.runtime.clone();
        let req = api::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.into(),
        };
        self.run(async move { Ok(c.run_pod_sandbox(req).await?.into_inner().pod_sandbox_id) })
    }

    /// PodSandboxStatus (verbose: with containerd's `info`, which holds the sandbox's spec).
    pub fn pod_status(&self, id: &str) -> CriResult<api::PodSandboxStatusResponse> {
        let mut c = self.runtime.clone();
        let req = api::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        };
        self.run(async move { Ok(c.pod_sandbox_status(req).await?.into_inner()) })
    }

    /// StopPodSandbox.
    pub fn stop_pod(&self, id: &str) -> CriResult<()> {
        let mut c = self.runtime.clone();
        let req = api::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.run(async move {
            c.stop_pod_sandbox(req).await?;
            Ok(())
        })
    }

    /// RemovePodSandbox.
    pub fn remove_pod(&self, id: &str) -> CriResult<()> {
        let mut c = self.runtime.clone();
        let req = api::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.run(async move {
            c.remove_pod_sandbox(req).await?;
            Ok(())
        })
    }

    /// ListPodSandbox: every pod's id.
    pub fn pod_ids(&self) -> CriResult<Vec<String>> {
        let mut c = self.runtime.clone();
        self.run(async move {
            Ok(
                c.list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
                    .await?
                    .into_inner()
                    .items
                    .into_iter()
                    .map(|p| p.id)
                    .collect(),
            )
        })
    }

    /// CreateContainer.
    pub fn create_container(
        &self,
        pod: &str,
        config: &api::ContainerConfig,
        sandbox: &api::PodSandboxConfig,
    ) -> CriResult<String> {
        let mut c = self.runtime.clone();
        let req = api::CreateContainerRequest {
            pod_sandbox_id: pod.into(),
            config: Some(config.clone()),
            sandbox_config: Some(sandbox.clone()),
        };
        self.run(async move { Ok(c.create_container(req).await?.into_inner().container_id) })
    }

    /// StartContainer.
    pub fn start_container(&self, id: &str) -> CriResult<()> {
        let mut c = self.runtime.clone();
        let req = api::StartContainerRequest {
            container_id: id.into(),
        };
        self.run(async move {
            c.start_container(req).await?;
            Ok(())
        })
    }

    /// StopContainer with a grace period of `timeout` seconds.
    pub fn stop_container(&self, id: &str, timeout: i64) -> CriResult<()> {
        let mut c = self.runtime.clone();
        let req = api::StopContainerRequest {
            container_id: id.into(),
            timeout,
        };
        self.run(async move {
            c.stop_container(req).await?;
            Ok(())
        })
    }

    /// ContainerStatus (verbose: containerd's `info` holds the runtime spec it sent).
    pub fn container_status(&self, id: &str) -> CriResult<api::ContainerStatusResponse> {
        let mut c = self.runtime.clone();
        let req = api::ContainerStatusRequest {
            container_id: id.into(),
            verbose: true,
        };
        self.run(async move { Ok(c.container_status(req).await?.into_inner()) })
    }

    /// ListContainers of one pod (all pods: `None`).
    pub fn container_ids(&self, pod: Option<&str>) -> CriResult<Vec<String>> {
        let mut c = self.runtime.clone();
        let filter = pod.map(|p| api::ContainerFilter {
            pod_sandbox_id: p.into(),
            ..Default::default()
        });
        self.run(async move {
            Ok(c.list_containers(api::ListContainersRequest { filter })
                .await?
                .into_inner()
                .containers
                .into_iter()
                .map(|c| c.id)
                .collect())
        })
    }

    /// ExecSync of `cmd`, bounded by `timeout` seconds.
    pub fn exec_sync(
        &self,
        id: &str,
        cmd: &[&str],
        timeout: i64,
    ) -> CriResult<api::ExecSyncResponse> {
        let mut c = self.runtime.clone();
        let req = api::ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout,
        };
        self.run(async move { Ok(c.exec_sync(req).await?.into_inner()) })
    }

    /// ContainerStats.
    pub fn container_stats(&self, id: &str) -> CriResult<api::ContainerStats> {
        let mut c = self.runtime.clone();
        let req = api::ContainerStatsRequest {
            container_id: id.into(),
        };
        self.run(async move {
            c.container_stats(req)
                .await?
                .into_inner()
                .stats
                .ok_or_else(|| Status::not_found("ContainerStats without stats").into())
        })
    }

    /// CheckpointContainer into the archive `location` (Unimplemented in containerd 1.7).
    pub fn checkpoint_container(&self, id: &str, location: &str) -> CriResult<()> {
        let mut c = self.runtime.clone();
        let req = api::CheckpointContainerRequest {
            container_id: id.into(),
            location: location.into(),
            timeout: 60,
        };
        self.run(async move {
            c.checkpoint_container(req).await?;
            Ok(())
        })
    }
}

fn image_spec(image: &str) -> api::ImageSpec {
    api::ImageSpec {
        image: image.into(),
        ..Default::default()
    }
}

/// Namespaces as kubelet asks for them by default: network and IPC shared by the
/// pod, a PID namespace per container.
fn kubelet_namespaces() -> api::NamespaceOption {
    api::NamespaceOption {
        network: api::NamespaceMode::Pod as i32,
        pid: api::NamespaceMode::Container as i32,
        ipc: api::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// A pod made through CRI; stopped and removed when dropped (with its log directory
/// and the pod-level cgroups that kubelet would remove).
pub struct Pod<'a> {
    /// The client.
    pub cri: &'a Cri,
    /// The pod sandbox id.
    pub id: String,
    /// The config it was made with (CreateContainer sends it again, as kubelet does).
    pub config: api::PodSandboxConfig,
    /// The pod's uid.
    pub uid: String,
}

impl<'a> Pod<'a> {
    /// RunPodSandbox with `handler`, configured as kubelet configures a BestEffort pod
    /// with the cgroupfs driver.
    pub fn run(cri: &'a Cri, handler: &str) -> Pod<'a> {
        Pod::run_annotated(cri, handler, &[])
    }

    /// [`Pod::run`] with pod annotations (kubelet passes a pod's own as they are).
    pub fn run_annotated(cri: &'a Cri, handler: &str, annotations: &[(&str, &str)]) -> Pod<'a> {
        Pod::run_with(cri, handler, annotations, None)
            .unwrap_or_else(|e| panic!("RunPodSandbox (handler {handler}): {e:?}"))
    }

    /// RunPodSandbox for a `hostUsers: false` pod: a user namespace of the
    /// pod's, ids 0..65536 inside being host ids `host_id..` (kubelet's request;
    /// its containers ask for the same, [`Pod::container_config`]).
    pub fn run_in_user_namespace(cri: &'a Cri, handler: &str, host_id: u32) -> CriResult<Pod<'a>> {
        let map = api::IdMapping {
            host_id,
            container_id: 0,
            length: 65536,
        };
        let userns = api::UserNamespace {
            mode: api::NamespaceMode::Pod as i32,
            uids: vec![map],
            gids: vec![map],
        };
        Pod::run_with(cri, handler, &[], Some(userns))
    }

    fn run_with(
        cri: &'a Cri,
        handler: &str,
        annotations: &[(&str, &str)],
        userns: Option<api::UserNamespace>,
    ) -> CriResult<Pod<'a>> {
        let name = unique_id("pod");
        let uid = format!("{}-uid", name);
        let log_dir = std::env::temp_dir().join("crab-cri-logs").join(&uid);
        std::fs::create_dir_all(&log_dir).expect("pod log directory");
        let config = api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: name.clone(),
                uid: uid.clone(),
                namespace: "crab-test".into(),
                attempt: 0,
            }),
            hostname: name.clone(),
            log_directory: log_dir.display().to_string(),
            labels: HashMap::from([("io.kubernetes.pod.name".into(), name.clone())]),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            linux: Some(api::LinuxPodSandboxConfig {
                cgroup_parent: format!("/kubepods/besteffort/pod{uid}"),
                security_context: Some(api::LinuxSandboxSecurityContext {
                    namespace_options: Some(api::NamespaceOption {
                        userns_options: userns,
                        ..kubelet_namespaces()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let id = cri.run_pod(&config, handler)?;
        Ok(Pod {
            cri,
            id,
            config,
            uid,
        })
    }

    /// A container config for `image` running `command`.
    pub fn container_config(
        &self,
        name: &str,
        image: &str,
        command: &[&str],
    ) -> api::ContainerConfig {
        api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(image_spec(image)),
            command: command.iter().map(|s| s.to_string()).collect(),
            log_path: format!("{name}/0.log"),
            linux: Some(api::LinuxContainerConfig {
                resources: Some(api::LinuxContainerResources {
                    cpu_shares: 2,
                    oom_score_adj: 1000,
                    ..Default::default()
                }),
                security_context: Some(api::LinuxContainerSecurityContext {
                    namespace_options: Some(api::NamespaceOption {
                        userns_options: self.user_namespace(),
                        ..kubelet_namespaces()
                    }),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }
    }

    /// The pod's user namespace request, if it has one.
    pub fn user_namespace(&self) -> Option<api::UserNamespace> {
        self.config
            .linux
            .as_ref()?
            .security_context
            .as_ref()?
            .namespace_options
            .as_ref()?
            .userns_options
            .clone()
    }

    /// CreateContainer + StartContainer of `config`; returns the container id.
    pub fn start(&self, config: &api::ContainerConfig) -> String {
        let id = self
            .cri
            .create_container(&self.id, config, &self.config)
            .unwrap_or_else(|e| panic!("CreateContainer: {e:?}"));
        self.cri
            .start_container(&id)
            .unwrap_or_else(|e| panic!("StartContainer {id}: {e:?}"));
        id
    }

    /// A started container of `image` running `command`.
    pub fn start_cmd(&self, name: &str, image: &str, command: &[&str]) -> String {
        self.start(&self.container_config(name, image, command))
    }

    /// ExecSync that must exit 0; returns its stdout.
    pub fn exec_ok(&self, container: &str, cmd: &[&str]) -> String {
        let r = self
            .cri
            .exec_sync(container, cmd, 30)
            .unwrap_or_else(|e| panic!("ExecSync {cmd:?}: {e:?}"));
        assert_eq!(
            r.exit_code,
            0,
            "ExecSync {cmd:?} exited {}: {}{}",
            r.exit_code,
            String::from_utf8_lossy(&r.stdout),
            String::from_utf8_lossy(&r.stderr)
        );
        String::from_utf8_lossy(&r.stdout).into_owned()
    }

    /// The pod's IP address on the pod network.
    pub fn ip(&self) -> String {
        let status = self.cri.pod_status(&self.id).expect("PodSandboxStatus");
        status
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .unwrap_or_default()
    }

    /// The host pid of the pod's sandbox (pause) process, from the verbose status.
    pub fn sandbox_pid(&self) -> i64 {
        let status = self.cri.pod_status(&self.id).expect("PodSandboxStatus");
        let info = status.info.get("info").expect("verbose sandbox info");
        let info: serde_json::Value = serde_json::from_str(info).expect("info is JSON");
        info["pid"]
            .as_i64()
            .unwrap_or_else(|| panic!("no pid in {info}"))
    }

    /// Waits until container `id` has exited; returns its status.
    pub fn wait_exited(&self, id: &str, timeout: Duration) -> api::ContainerStatus {
        let mut last = None;
        wait_until(timeout, || {
            last = self.cri.container_status(id).ok().and_then(|r| r.status);
            last.as_ref()
                .is_some_and(|s| s.state == api::ContainerState::ContainerExited as i32)
        });
        let status = last.unwrap_or_else(|| panic!("no status of {id}"));
        assert_eq!(
            status.state,
            api::ContainerState::ContainerExited as i32,
            "container {id} did not exit: {status:?}"
        );
        status
    }

    /// The pod's cgroup directories (one per hierarchy that has it).
    pub fn cgroup_dirs(&self) -> Vec<PathBuf> {
        let rel = format!("kubepods/besteffort/pod{}", self.uid);
        std::fs::read_dir("/sys/fs/cgroup")
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.path().join(&rel))
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// StopPodSandbox + RemovePodSandbox, which must succeed.
    pub fn remove(&self) {
        self.cri
            .stop_pod(&self.id)
            .unwrap_or_else(|e| panic!("StopPodSandbox: {e:?}"));
        self.cri
            .remove_pod(&self.id)
            .unwrap_or_else(|e| panic!("RemovePodSandbox: {e:?}"));
    }
}

impl Drop for Pod<'_> {
    fn drop(&mut self) {
        let _ = self.cri.stop_pod(&self.id);
        let _ = self.cri.remove_pod(&self.id);
        // kubelet removes a pod's cgroup once its containers are gone.
        for dir in self.cgroup_dirs() {
            let _ = std::fs::remove_dir(dir);
        }
        let _ = std::fs::remove_dir_all(&self.config.log_directory);
    }
}

/// The runtime spec containerd's CRI plugin sent for a container (from the verbose
/// ContainerStatus `info`).
pub fn runtime_spec(cri: &Cri, id: &str) -> serde_json::Value {
    let status = cri.container_status(id).expect("ContainerStatus");
    let info = status
        .info
        .get("info")
        .unwrap_or_else(|| panic!("no verbose info: {:?}", status.info));
    let info: serde_json::Value = serde_json::from_str(info).expect("info is JSON");
    info["runtimeSpec"].clone()
}

/// Runs `crabctl -a <CRI containerd> -n k8s.io ARGS`.
pub fn crabctl(args: &[&str]) -> Output {
    Command::new("crabctl")
        .arg("-a")
        .arg(address())
        .arg("-n")
        .arg(namespace())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run crabctl")
}

/// `crabctl ARGS` against the CRI containerd, which must succeed; returns stdout.
pub fn crabctl_ok(args: &[&str]) -> String {
    let out = crabctl(args);
    let (o, e) = text(&out);
    assert!(out.status.success(), "crabctl {args:?}: {o}{e}");
    o
}
