//! One container the shim serves: its runtime handle, its init and exec processes.

use std::collections::HashMap;
use std::path::PathBuf;

use containerd_shim::protos::api::Status;
use crab_runtime::config::Config;
use crab_runtime::container::Container;
use crab_runtime::sandbox::Sandbox;
use tokio::task::JoinHandle;

use crab_runtime::storage::layers::MountSpec;

use crate::checkpoint::PendingRestore;
use crate::error::{ShimError, ShimResult};
use crate::process::Process;

/// How long the init's exit waits for the processes it left to be gone
/// ([`Instance::kill_orphans_of_init`]).
const ORPHANS_GONE_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// A container and its processes.
#[derive(Debug)]
pub struct Instance {
    /// The runtime's facade over the container (and the configuration it was
    /// created with): every operation of Crab's goes through it.
    pub sandbox: Sandbox,
    /// Bundle directory.
    pub bundle: PathBuf,
    /// Whether the shim mounted `bundle/rootfs` (and so must unmount it).
    pub rootfs_mounted: bool,
    /// The init process.
    pub init: Process,
    /// Exec processes by exec id.
    pub execs: HashMap<String, Process>,
    /// The OOM watcher task.
    pub oom: Option<JoinHandle<()>>,
    /// containerd's rootfs mounts (the image layers), for a checkpoint's file delta.
    pub image: Vec<MountSpec>,
    /// A checkpoint to restore at `Start`.
    pub restore: Option<PendingRestore>,
    /// The control socket's server.
    pub control: Option<JoinHandle<()>>,
    /// The turn proxy, when the configuration asks for one.
    pub proxy: Option<crate::proxy::TurnProxy>,
    /// The proxy's listener, bound at `Create` in a shared network namespace
    /// ([`crate::proxy_listener`]), until a restored task's proxy starts with it.
    pub proxy_listener: Option<std::net::TcpListener>,
    /// The agent API's token, when the proxy serves the agent API.
    pub api_token: Option<String>,
    /// Its standby replica, when it asks for one ([`crate::standby`]).
    pub standby: crate::standby::Slot,
    /// Its replicas for forks, when it asks for them ([`crate::standby_forks`]).
    pub fork_replicas: crate::standby_forks::Pool,
}

impl Instance {
    /// The process named by `exec_id` ("" for the init).
    pub fn process(&self, exec_id: &str) -> ShimResult<&Process> {
        if exec_id.is_empty() {
            return Ok(&self.init);
        }
        self.execs.get(exec_id).ok_or_else(|| {
            ShimError::NotFound(format!(
                "exec {exec_id} not found in container {}",
                self.container().id()
            ))
        })
    }

    /// Mutable [`Instance::process`].
    pub fn process_mut(&mut self, exec_id: &str) -> ShimResult<&mut Process> {
        if exec_id.is_empty() {
            return Ok(&mut self.init);
        }
        let id = self.container().id().to_string();
        self.execs.get_mut(exec_id).ok_or_else(|| {
            ShimError::NotFound(format!("exec {exec_id} not found in container {id}"))
        })
    }

    /// After the init's exit: a container without a pid namespace of its own
    /// (`hostPID`, a pod's shared one) keeps its other processes, which the
    /// kernel kills with the init only inside a namespace it owns. They are
    /// killed, and gone, before the exit is reported, as runc's shim does: a
    /// client that saw the exit counts on them being gone, and a killed
    /// process ends only when it next runs, later on a busy host.
    pub async fn kill_orphans_of_init(&self) {
        let own = crab_runtime::container::load_spec(&self.bundle)
            .map(|spec| {
                crab_runtime::container::owns_namespace(
                    &spec,
                    oci_spec::runtime::LinuxNamespaceType::Pid,
                )
            })
            .unwrap_or(true);
        if own {
            return;
        }
        let id = self.container().id();
        let tracking = self.container().tracking();
        if let Err(e) = tracking.kill_all() {
            tracing::warn!(%id, error = %e, "kill what the init left");
            return;
        }
        // Off the runtime's threads: the wait sleeps.
        let gone =
            tokio::task::spawn_blocking(move || tracking.wait_empty(ORPHANS_GONE_WITHIN)).await;
        if !matches!(gone, Ok(Ok(true))) {
            tracing::warn!(%id, "what the init left is killed but not gone after {ORPHANS_GONE_WITHIN:?}");
        }
    }

    /// Fails unless the init is running (not created, paused or stopped).
    pub fn require_running(&self, operation: &str) -> ShimResult<()> {
        if self.init.status == Status::RUNNING {
            Ok(())
        } else {
            Err(ShimError::FailedPrecondition(format!(
                "cannot {operation}: container {} is {}",
                self.container().id(),
                status_name(self.init.status)
            )))
        }
    }

    /// The runtime's handle (for the task API's process operations).
    pub fn container(&self) -> &Container {
        self.sandbox.container()
    }

    /// The configuration the container was created with.
    pub fn config(&self) -> &Config {
        self.sandbox.config()
    }

    /// Where exec process specs and console sockets go.
    pub fn scratch_dir(&self) -> PathBuf {
        self.config().state_dir.join("scratch")
    }
}

/// Lower-case name of a status, for messages.
pub fn status_name(s: Status) -> &'static str {
    match s {
        Status::CREATED => "created",
        Status::RUNNING => "running",
        Status::STOPPED => "stopped",
        Status::PAUSED => "paused",
        Status::PAUSING => "pausing",
        Status::UNKNOWN => "unknown",
    }
}
