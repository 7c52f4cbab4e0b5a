//! The task service: containerd's task API over [`crab_runtime`].
//!
//! Each container sits behind a lock of its own ([`crate::containers`]). Each
//! operation holds its container's lock from start to end, including the
//! publication of its event, so that the exit handler (which takes the same lock)
//! can never report an exit before the start it follows. Long operations
//! (checkpoints, turns, rollbacks) claim the container first, and what would
//! conflict with them fails as busy instead of waiting.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use containerd_shim::api::*;
use containerd_shim::protos::api::{ProcessInfo, Status};
use containerd_shim::protos::events::task::*;
use containerd_shim::protos::protobuf::MessageField;
use containerd_shim::ExitSignal;
use crab_runtime::config::Config;
use crab_runtime::container::CreateOpts;
use crab_runtime::sandbox::Sandbox;
use crab_runtime::storage::ContainerKey;
use nix::sys::signal::Signal;

use crate::console::{self, ConsoleSocket};
use crate::containers::{Containers, Creating, TryLock};
use crate::error::{ShimError, ShimResult};
use crate::events::Events;
use crate::instance::{status_name, Instance};
use crate::io::{PipeIo, ProcessIo, StdioPaths};
use crate::options::RuntimeOptions;
use crate::process::{Exit, Process};
use crate::{metrics, oom, rootfs};
use crab_runtime::config::PolicyMode;

/// Name of the file beside the bundle that keeps the resolved config for `delete`.
pub const BUNDLE_CONFIG: &str = "crab-config.toml";
/// How long Delete waits for the last output to reach containerd.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);
/// How long an exec's start, or an agent's turn, waits for a running operation
/// (a checkpoint, a rollback) on its container before it fails as busy.
pub(crate) const OPERATION_WAIT: Duration = Duration::from_secs(60);
/// How long the shim waits for a terminal's pty master.
const CONSOLE_TIMEOUT: Duration = Duration::from_secs(10);

/// The task service.
#[derive(Clone)]
pub struct TaskService {
    pub(crate) containers: Arc<Containers>,
    pub(crate) events: Events,
    pub(crate) exit: Arc<ExitSignal>,
    pub(crate) namespace: String,
    pub(crate) turns: Arc<crate::turn::Turns>,
    /// containerd's address (the proxy's forks go through it).
    pub(crate) address: String,
}

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> crab_runtime::Result<T> + Send + 'static,
) -> ShimResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ShimError::Other(format!("blocking task: {e}")))?
        .map_err(ShimError::from)
}

impl TaskService {
    /// A service with no containers.
    pub fn new(
        events: Events,
        exit: Arc<ExitSignal>,
        namespace: &str,
        address: &str,
    ) -> TaskService {
        TaskService {
            containers: Arc::default(),
            events,
            exit,
            namespace: namespace.to_string(),
            turns: Arc::default(),
            address: address.to_string(),
        }
    }

    /// Create: mount the rootfs, create the container (its init waits for Start).
    pub async fn create(&self, req: CreateTaskRequest) -> ShimResult<CreateTaskResponse> {
        let slot = self.containers.reserve(&req.id)?;
        let creating = Creating::new(&self.containers, &slot).await;
        let runc = crate::options::RuncTaskOptions::from_any(req.options.as_ref())
            .map_err(ShimError::InvalidArgument)?;
        let restore =
            crate::options::restore_request(&runc, &req.checkpoint, &self.namespace, &req.id)?;
        // A request's path is not a directory of images.
        let image_path = match restore {
            Some(_) => None,
            None => runc.criu_image_path.map(PathBuf::from),
        };
        let opts = match &restore {
            Some(r) => RuntimeOptions {
                config_path: r.config_path.clone(),
                config_body: r.config_body.clone(),
            },
            None if crate::container_options::hide_runtime_options(req.options.as_ref()) => {
                crate::container_options::of_container(&self.address, &self.namespace, &req.id)
                    .await?
            }
            None => RuntimeOptions::from_any(req.options.as_ref())
                .map_err(ShimError::InvalidArgument)?,
        };
        let (mut config, source) = Config::load_with_env(
            opts.config_body.as_deref(),
            opts.config_path.as_deref().map(Path::new),
        )?;
        let bundle = PathBuf::from(&req.bundle);
        let spec = crab_runtime::container::load_spec(&bundle)?;
        config.storage.backend = rootfs::backend_for(&config, &spec)?;
        crate::proxy::configure(&mut config, &spec)?;
        // Before the configuration is written: it may move the listener's port.
        let proxy_listener = crate::proxy_listener::claim(&mut config, &spec)?;
        crate::checkpoint::configure(&mut config, &spec)?;
        crate::standby::configure(&mut config, &spec)?;
        crate::standby_forks::configure(&mut config, &spec)?;
        // Standbys of a shim that crashed: their processes are stopped, not gone.
        // A read of one directory, at every create (a restore's too).
        let c = config.clone();
        tokio::task::spawn_blocking(move || crab_runtime::standby::reconcile(&c));
        tracing::info!(id = %req.id, ?source, backend = ?config.storage.backend, "create");
        let key = ContainerKey::new(&self.namespace, &req.id)?;
        // Written before anything is made, so that `delete` after a shim crash knows
        // the state dir and the store to clean.
        std::fs::write(bundle.join(BUNDLE_CONFIG), config.to_toml())
            .map_err(|e| ShimError::Other(format!("write {BUNDLE_CONFIG}: {e}")))?;

        if !req.checkpoint.is_empty() || restore.is_some() || image_path.is_some() {
            let instance = self
                .create_restored(&req, config, bundle, restore, image_path, proxy_listener)
                .await?;
            let _held = creating.fill(instance);
            self.publish_create(&req, 0).await;
            return Ok(CreateTaskResponse::default());
        }
        // One edit of the spec: a default PATH, the proxy's base URLs and token.
        let api_token = crate::proxy::token_for_create(&config, &spec)?;
        let mut vars = vec![("PATH".into(), crate::spec_env::DEFAULT_PATH.into())];
        vars.extend(crate::proxy::env_vars(&config, api_token.as_deref()));
        crate::spec_env::add_missing(&bundle, &vars)?;
        let rootfs_mounted =
            rootfs::prepare(&config, &key, &req.rootfs, &bundle.join("rootfs")).await?;
        let stdio = StdioPaths {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
            container: (self.namespace.clone(), req.id.clone()),
        };
        let opts = CreateOpts {
            namespace: self.namespace.clone(),
            id: req.id.clone(),
            bundle: bundle.clone(),
            console_socket: None,
        };
        let created = start_process(&config, &stdio, opts, |cfg, opts, child| {
            Sandbox::create(cfg.clone(), opts, child)
        })
        .await;
        let ((sandbox, pid), io) = match created {
            Ok(v) => v,
            Err(e) => {
                rootfs::release(&config, &key, &bundle.join("rootfs"), rootfs_mounted).await;
                return Err(e);
            }
        };
        let proxy = match self
            .start_proxy(
                &config,
                &bundle,
                &req.id,
                api_token.as_deref(),
                proxy_listener,
            )
            .await
        {
            Ok(p) => p,
            Err(e) => {
                let c = sandbox.container().clone();
                let _ = blocking(move || {
                    let _ = c.kill(Signal::SIGKILL, true);
                    c.delete()
                })
                .await;
                rootfs::release(&config, &key, &bundle.join("rootfs"), rootfs_mounted).await;
                return Err(e);
            }
        };
        let mut init = Process::new("", stdio);
        init.pid = pid;
        init.io = Some(io);
        let oom = oom::watch(sandbox.container(), self.events.clone());
        rootfs::collect(&config, &req.rootfs);
        let control = self.serve_control(&config, &req.id);
        let _held = creating.fill(Instance {
            sandbox,
            bundle,
            rootfs_mounted,
            init,
            execs: HashMap::new(),
            oom,
            image: crate::checkpoint::image_mounts(&req),
            restore: None,
            control,
            proxy,
            proxy_listener: None,
            api_token,
            standby: Default::default(),
            fork_replicas: Default::default(),
        });
        self.publish_create(&req, pid).await;
        Ok(CreateTaskResponse {
            pid: pid as u32,
            ..Default::default()
        })
    }

    /// Starts the container's turn proxy when its configuration asks for one.
    pub(crate) async fn start_proxy(
        &self,
        config: &Config,
        bundle: &Path,
        id: &str,
        token: Option<&str>,
        listener: Option<std::net::TcpListener>,
    ) -> ShimResult<Option<crate::proxy::TurnProxy>> {
        if !config.proxy.enabled() {
            return Ok(None);
        }
        let (config, bundle, id) = (config.clone(), bundle.to_path_buf(), id.to_string());
        let token = token.map(str::to_string);
        let (namespace, address) = (self.namespace.clone(), self.address.clone());
        tokio::task::spawn_blocking(move || {
            let log = crate::proxy::log_path(&config, &namespace, &id);
            let launch = crate::proxy::Launch {
                config_file: &bundle.join(BUNDLE_CONFIG),
                address: &address,
                namespace: &namespace,
                id: &id,
                log: &log,
                token: token.as_deref(),
                listener: listener.as_ref(),
            };
            crate::proxy::start(&config, &launch).map(Some)
        })
        .await
        .map_err(|e| ShimError::Other(format!("turn proxy: {e}")))?
    }

    async fn publish_create(&self, req: &CreateTaskRequest, pid: i32) {
        self.events
            .publish(TaskCreate {
                container_id: req.id.clone(),
                bundle: req.bundle.clone(),
                rootfs: req.rootfs.clone(),
                io: MessageField::some(TaskIO {
                    stdin: req.stdin.clone(),
                    stdout: req.stdout.clone(),
                    stderr: req.stderr.clone(),
                    terminal: req.terminal,
                    ..Default::default()
                }),
                checkpoint: req.checkpoint.clone(),
                pid: pid as u32,
                ..Default::default()
            })
            .await;
    }

    /// Start the init, or an exec process added earlier.
    pub async fn start(&self, req: StartRequest) -> ShimResult<StartResponse> {
        let slot = self.containers.get(&req.id)?;
        // An exec (a platform's probe, say) waits for a checkpoint to end
        // rather than fail.
        let mut guard = slot.lock_idle(OPERATION_WAIT).await?;
        let inst = &mut *guard;
        if req.exec_id.is_empty() {
            if inst.init.status != Status::CREATED {
                return Err(ShimError::FailedPrecondition(format!(
                    "container {} is {}: it can be started only once",
                    req.id,
                    status_name(inst.init.status)
                )));
            }
            if inst.restore.is_some() {
                self.start_restored(inst).await?;
                let listener = inst.proxy_listener.take();
                inst.api_token = crate::proxy::token_for_restored(inst.config(), inst.init.pid)?;
                // The restored processes are in a new network namespace.
                match self
                    .start_proxy(
                        inst.config(),
                        &inst.bundle,
                        &req.id,
                        inst.api_token.as_deref(),
                        listener,
                    )
                    .await
                {
                    Ok(p) => inst.proxy = p,
                    Err(e) => tracing::error!(id = %req.id, error = %e, "no turn proxy"),
                }
            } else {
                let sandbox = inst.sandbox.clone();
                blocking(move || sandbox.start()).await?;
            }
            inst.init.status = Status::RUNNING;
            let pid = inst.init.pid;
            self.events
                .publish(TaskStart {
                    container_id: req.id.clone(),
                    pid: pid as u32,
                    ..Default::default()
                })
                .await;
            return Ok(StartResponse {
                pid: pid as u32,
                ..Default::default()
            });
        }
        inst.require_running("start an exec process")?;
        let config = inst.config().clone();
        let sandbox = inst.sandbox.clone();
        let scratch = inst.scratch_dir();
        let proc = inst.process_mut(&req.exec_id)?;
        if proc.status != Status::CREATED {
            return Err(ShimError::FailedPrecondition(format!(
                "exec {} is {}: it can be started only once",
                req.exec_id,
                status_name(proc.status)
            )));
        }
        let spec_file = write_exec_spec(&scratch, &req.id, &req.exec_id, proc)?;
        let opts = CreateOpts {
            namespace: self.namespace.clone(),
            id: req.id.clone(),
            bundle: PathBuf::new(),
            console_socket: None,
        };
        let spec_path = spec_file.clone();
        let result = start_process(&config, &proc.stdio, opts, move |_, opts, child| {
            sandbox.exec(&spec_path, opts.console_socket, child)
        })
        .await;
        let _ = std::fs::remove_file(&spec_file);
        let (pid, io) = result?;
        proc.pid = pid;
        proc.io = Some(io);
        proc.status = Status::RUNNING;
        self.events
            .publish(TaskExecStarted {
                container_id: req.id.clone(),
                exec_id: req.exec_id.clone(),
                pid: pid as u32,
                ..Default::default()
            })
            .await;
        Ok(StartResponse {
            pid: pid as u32,
            ..Default::default()
        })
    }

    /// Register an exec process (started by a later Start).
    pub async fn exec(&self, req: ExecProcessRequest) -> ShimResult<()> {
        let slot = self.containers.get(&req.id)?;
        let mut inst = slot.lock().await?;
        inst.require_running("exec")?;
        if req.exec_id.is_empty() {
            return Err(ShimError::InvalidArgument(
                "exec id must not be empty".into(),
            ));
        }
        if inst.execs.contains_key(&req.exec_id) {
            return Err(ShimError::AlreadyExists(format!(
                "exec {} already exists in container {}",
                req.exec_id, req.id
            )));
        }
        let mut spec =
            req.spec.as_ref().map(|a| a.value.clone()).ok_or_else(|| {
                ShimError::InvalidArgument("exec request has no process spec".into())
            })?;
        let invalid =
            |e: String| ShimError::InvalidArgument(format!("invalid exec process spec: {e}"));
        serde_json::from_slice::<oci_spec::runtime::Process>(&spec)
            .map_err(|e| invalid(e.to_string()))?;
        let mut json: serde_json::Value =
            serde_json::from_slice(&spec).map_err(|e| invalid(e.to_string()))?;
        // The request's flag wins, as with runc's shim: clients set it and leave
        // the spec's as their process template has it.
        json["terminal"] = req.terminal.into();
        // An exec reaches the turn proxy as the init does: Docker builds an exec's
        // environment from its own record, not the spec the shim edited, and agent
        // platforms act through exec.
        let mut vars = vec![("PATH".into(), crate::spec_env::DEFAULT_PATH.into())];
        vars.extend(crate::proxy::env_vars(
            inst.config(),
            inst.api_token.as_deref(),
        ));
        crate::spec_env::add_to_process(&mut json, &vars).map_err(invalid)?;
        spec = serde_json::to_vec(&json)
            .map_err(|e| ShimError::Other(format!("exec process spec: {e}")))?;
        let mut proc = Process::new(
            &req.exec_id,
            StdioPaths {
                stdin: req.stdin.clone(),
                stdout: req.stdout.clone(),
                stderr: req.stderr.clone(),
                terminal: req.terminal,
                container: (self.namespace.clone(), req.id.clone()),
            },
        );
        proc.spec = Some(spec);
        inst.execs.insert(req.exec_id.clone(), proc);
        self.events
            .publish(TaskExecAdded {
                container_id: req.id.clone(),
                exec_id: req.exec_id.clone(),
                ..Default::default()
            })
            .await;
        Ok(())
    }

    /// State of the init or an exec.
    pub async fn state(&self, req: StateRequest) -> ShimResult<StateResponse> {
        let slot = self.containers.get(&req.id)?;
        let inst = slot.lock().await?;
        let p = inst.process(&req.exec_id)?;
        let exit = p.exit();
        Ok(StateResponse {
            id: req.id.clone(),
            bundle: inst.bundle.display().to_string(),
            pid: p.pid as u32,
            status: p.status.into(),
            stdin: p.stdio.stdin.clone(),
            stdout: p.stdio.stdout.clone(),
            stderr: p.stdio.stderr.clone(),
            terminal: p.stdio.terminal,
            exit_status: exit.map(|e| e.code).unwrap_or(0),
            exited_at: exit.map(|e| e.timestamp()).into(),
            exec_id: req.exec_id.clone(),
            ..Default::default()
        })
    }

    /// Signal the init (or all processes), or an exec.
    pub async fn kill(&self, req: KillRequest) -> ShimResult<()> {
        let slot = self.containers.get(&req.id)?;
        let inst = slot.lock().await?;
        let signal = Signal::try_from(req.signal as i32)
            .map_err(|_| ShimError::InvalidArgument(format!("invalid signal {}", req.signal)))?;
        let p = inst.process(&req.exec_id)?;
        if p.status == Status::STOPPED || (p.pid == 0 && !req.exec_id.is_empty()) {
            return Err(ShimError::NotFound("process already finished".into()));
        }
        if req.exec_id.is_empty() {
            let c = inst.container().clone();
            let all = req.all;
            return blocking(move || c.kill(signal, all)).await;
        }
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.pid), signal)
            .map_err(|e| ShimError::NotFound(format!("process {}: {e}", p.pid)))
    }

    /// Delete an exited exec, or the container once its init has exited.
    pub async fn delete(&self, req: DeleteRequest) -> ShimResult<DeleteResponse> {
        let slot = self.containers.get(&req.id)?;
        let mut guard = slot.lock().await?;
        let inst = &mut *guard;
        if !req.exec_id.is_empty() {
            let p = inst.process(&req.exec_id)?;
            if matches!(p.status, Status::RUNNING | Status::PAUSED) {
                return Err(ShimError::FailedPrecondition(format!(
                    "exec {} is still running",
                    req.exec_id
                )));
            }
            let mut p = inst.execs.remove(&req.exec_id).expect("checked above");
            if let Some(io) = p.io.as_mut() {
                io.finish(OUTPUT_DRAIN).await;
            }
            let exit = p.exit();
            return Ok(delete_response(p.pid, exit));
        }
        if matches!(inst.init.status, Status::RUNNING | Status::PAUSED) {
            return Err(ShimError::FailedPrecondition(format!(
                "container {} is still running: kill it first",
                req.id
            )));
        }
        // A checkpoint of a container that has exited may still be writing.
        slot.require_idle()?;
        self.turns.forget(&req.id);
        if let Some(io) = inst.init.io.as_mut() {
            io.finish(OUTPUT_DRAIN).await;
        }
        for p in inst.execs.values_mut() {
            if let Some(io) = p.io.as_mut() {
                io.finish(Duration::ZERO).await;
            }
        }
        if let Some(t) = inst.oom.take() {
            t.abort();
        }
        if let Some(p) = inst.proxy.take() {
            let _ = tokio::task::spawn_blocking(move || p.stop()).await;
            crate::proxy::remove_logs(inst.config(), &self.namespace, &req.id);
        }
        if let Some(ready) = inst.standby.clear() {
            crate::standby::discard(inst.config(), ready).await;
        }
        for ready in inst.fork_replicas.clear() {
            crate::standby::discard(inst.config(), ready).await;
        }
        if let Some(t) = inst.control.take() {
            t.abort();
            let path = crab_runtime::control::socket_path(inst.config(), &self.namespace, &req.id);
            let _ = std::fs::remove_file(path);
        }
        // A restore never started: what it would have removed once the
        // processes were back (its pinned images, an unpacked checkpoint).
        if let Some(pending) = inst.restore.take() {
            for p in &pending.cleanup {
                let _ = std::fs::remove_dir_all(p);
            }
            if let Some(ready) = pending.replica {
                crate::standby::discard(inst.config(), ready).await;
            }
        }
        let c = inst.container().clone();
        let deleted = blocking(move || c.delete()).await;
        if let Ok(key) = ContainerKey::new(&self.namespace, &req.id) {
            // A client may commit a stopped container from its writable layer.
            if let Err(e) = crate::adopt::write_back(inst.config(), &key, &inst.bundle).await {
                tracing::error!(id = %req.id, error = %e,
                    "the tree's changes are not in the client's writable layer");
            }
            let target = inst.bundle.join("rootfs");
            rootfs::release(inst.config(), &key, &target, inst.rootfs_mounted).await;
        }
        deleted?;
        let exit = inst.init.exit();
        let resp = delete_response(inst.init.pid, exit);
        self.events
            .publish(TaskDelete {
                container_id: req.id.clone(),
                pid: resp.pid,
                exit_status: resp.exit_status,
                exited_at: resp.exited_at.clone(),
                id: req.id.clone(),
                ..Default::default()
            })
            .await;
        // Forgotten last: until the delete event is out, the shim serves a
        // container, so a `Shutdown` does not end it under the event.
        self.containers.remove(&req.id);
        Ok(resp)
    }

    /// All pids of the container.
    pub async fn pids(&self, req: PidsRequest) -> ShimResult<PidsResponse> {
        let slot = self.containers.get(&req.id)?;
        let inst = slot.lock().await?;
        let pids = inst.container().tracking().pids()?;
        Ok(PidsResponse {
            processes: pids
                .into_iter()
                .map(|pid| ProcessInfo {
                    pid: pid as u32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
    }

    /// Freeze the container.
    pub async fn pause(&self, req: PauseRequest) -> ShimResult<()> {
        let slot = self.containers.get(&req.id)?;
        slot.require_idle()?;
        let mut inst = slot.lock().await?;
        inst.require_running("pause")?;
        let c = inst.container().clone();
        blocking(move || c.pause()).await?;
        // A client that reads its own writable layer pauses first (`docker
        // commit`): it gets the tree's changes there. If they cannot be written,
        // the pause fails, rather than the commit silently missing them.
        if let Ok(key) = ContainerKey::new(&self.namespace, &req.id) {
            if let Err(e) = crate::adopt::write_back(inst.config(), &key, &inst.bundle).await {
                let c = inst.container().clone();
                if let Err(r) = blocking(move || c.resume()).await {
                    tracing::warn!(id = %req.id, error = %r, "resume after a failed write-back");
                }
                return Err(ShimError::Other(format!(
                    "write the container's changes back into the client's layer: {e}"
                )));
            }
        }
        inst.init.status = Status::PAUSED;
        self.events
            .publish(TaskPaused {
                container_id: req.id.clone(),
                ..Default::default()
            })
            .await;
        Ok(())
    }

    /// Thaw the container.
    pub async fn resume(&self, req: ResumeRequest) -> ShimResult<()> {
        let slot = self.containers.get(&req.id)?;
        slot.require_idle()?;
        let mut inst = slot.lock().await?;
        if inst.init.status != Status::PAUSED {
            return Err(ShimError::FailedPrecondition(format!(
                "container {} is {}, not paused",
                req.id,
                status_name(inst.init.status)
            )));
        }
        let c = inst.container().clone();
        blocking(move || c.resume()).await?;
        inst.init.status = Status::RUNNING;
        self.events
            .publish(TaskResumed {
                container_id: req.id.clone(),
                ..Default::default()
            })
            .await;
        Ok(())
    }

    /// Close a process's stdin.
    pub async fn close_io(&self, req: CloseIORequest) -> ShimResult<()> {
        let slot = self.containers.get(&req.id)?;
        let inst = slot.lock().await?;
        let p = inst.process(&req.exec_id)?;
        if req.stdin {
            if let Some(io) = &p.io {
                io.close_stdin().await;
            }
        }
        Ok(())
    }

    /// Resize a process's terminal.
    pub async fn resize_pty(&self, req: ResizePtyRequest) -> ShimResult<()> {
        let slot = self.containers.get(&req.id)?;
        let inst = slot.lock().await?;
        let p = inst.process(&req.exec_id)?;
        match p.io.as_ref().and_then(|io| io.console()) {
            Some(master) => console::resize(master, req.width, req.height),
            None => Err(ShimError::FailedPrecondition(
                "process has no terminal".into(),
            )),
        }
    }

    /// Apply new resources (an OCI `LinuxResources` JSON).
    pub async fn update(&self, req: UpdateTaskRequest) -> ShimResult<()> {
        let slot = self.containers.get(&req.id)?;
        let inst = slot.lock().await?;
        let data = req
            .resources
            .as_ref()
            .map(|a| a.value.clone())
            .ok_or_else(|| ShimError::InvalidArgument("update without resources".into()))?;
        let resources: oci_spec::runtime::LinuxResources = serde_json::from_slice(&data)
            .map_err(|e| ShimError::InvalidArgument(format!("invalid resources: {e}")))?;
        let c = inst.container().clone();
        blocking(move || c.update(&resources)).await
    }

    /// cgroup metrics.
    pub async fn stats(&self, req: StatsRequest) -> ShimResult<StatsResponse> {
        let slot = self.containers.get(&req.id)?;
        let inst = slot.lock().await?;
        let c = inst.container().clone();
        let stats = blocking(move || c.metrics()).await?;
        let any = metrics::to_any(&stats).map_err(ShimError::Other)?;
        Ok(StatsResponse {
            stats: MessageField::some(any),
            ..Default::default()
        })
    }

    /// Wait for a process to exit.
    pub async fn wait(&self, req: WaitRequest) -> ShimResult<WaitResponse> {
        let mut rx = {
            let slot = self.containers.get(&req.id)?;
            let inst = slot.lock().await?;
            inst.process(&req.exec_id)?.subscribe()
        };
        let exit = loop {
            if let Some(e) = *rx.borrow_and_update() {
                break e;
            }
            if rx.changed().await.is_err() {
                return Err(ShimError::NotFound(format!(
                    "{} was deleted before it exited",
                    req.id
                )));
            }
        };
        Ok(WaitResponse {
            exit_status: exit.code,
            exited_at: MessageField::some(exit.timestamp()),
            ..Default::default()
        })
    }

    /// Shim and init pids.
    pub async fn connect(&self, req: ConnectRequest) -> ShimResult<ConnectResponse> {
        let task_pid = match self.containers.get(&req.id) {
            Ok(slot) => slot.lock().await.map(|i| i.init.pid as u32).unwrap_or(0),
            Err(_) => 0,
        };
        Ok(ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            ..Default::default()
        })
    }

    /// Exit the shim once it serves no container.
    pub async fn shutdown(&self, _req: ShutdownRequest) -> ShimResult<()> {
        if self.containers.is_empty() {
            self.exit.signal();
        }
        Ok(())
    }

    /// Records a process exit the reaper saw and tells containerd. The containers
    /// nobody holds are looked at at once; each held one is waited for on its own
    /// task, so that a long operation on one container never delays the exits of
    /// another.
    pub async fn process_exit(&self, pid: i32, code: i32) {
        let mut held = Vec::new();
        for slot in self.containers.all() {
            let recorded = match slot.try_lock() {
                TryLock::Locked(mut inst) => {
                    self.record_exit(slot.id(), &mut inst, pid, code).await
                }
                TryLock::Gone => false,
                TryLock::Held => {
                    held.push(slot.clone());
                    false
                }
            };
            if recorded {
                return;
            }
        }
        for slot in held {
            let service = self.clone();
            tokio::spawn(async move {
                if let Ok(mut inst) = slot.lock().await {
                    service.record_exit(slot.id(), &mut inst, pid, code).await;
                }
            });
        }
    }

    /// Records the exit of `pid` if it is one of `inst`'s processes.
    async fn record_exit(&self, id: &str, inst: &mut Instance, pid: i32, code: i32) -> bool {
        let proc = if inst.init.pid == pid {
            Some(&mut inst.init)
        } else {
            inst.execs.values_mut().find(|p| p.pid == pid)
        };
        let Some(proc) = proc else { return false };
        if proc.exit().is_some() {
            return true;
        }
        let exit = Exit::now(code as u32);
        proc.set_exited(exit);
        let exec_id = proc.exec_id.clone();
        if exec_id.is_empty() {
            inst.kill_orphans_of_init().await;
        }
        let policy = &inst.config().policy;
        if !exec_id.is_empty() && policy.turn_on_exec && policy.mode == PolicyMode::Adaptive {
            // An orchestrator's tool call ended: close the turn once the
            // container's lock is free (after this exit is recorded).
            let (svc, id) = (self.clone(), id.to_string());
            tokio::spawn(async move {
                if let Err(e) = svc.crab_turn(&id, false, true, None, None).await {
                    tracing::warn!(%id, error = %e, "turn after exec");
                }
            });
        }
        tracing::info!(%id, %exec_id, pid, code, "process exited");
        self.events
            .publish(TaskExit {
                container_id: id.to_string(),
                id: if exec_id.is_empty() {
                    id.to_string()
                } else {
                    exec_id
                },
                pid: pid as u32,
                exit_status: code as u32,
                exited_at: MessageField::some(exit.timestamp()),
                ..Default::default()
            })
            .await;
        true
    }
}

fn delete_response(pid: i32, exit: Option<Exit>) -> DeleteResponse {
    DeleteResponse {
        pid: pid as u32,
        exit_status: exit.map(|e| e.code).unwrap_or(0),
        exited_at: exit.map(|e| e.timestamp()).into(),
        ..Default::default()
    }
}

fn write_exec_spec(scratch: &Path, id: &str, exec_id: &str, p: &Process) -> ShimResult<PathBuf> {
    std::fs::create_dir_all(scratch)
        .map_err(|e| ShimError::Other(format!("create {}: {e}", scratch.display())))?;
    let file = scratch.join(format!("{id}-{exec_id}-process.json"));
    let spec = p.spec.as_deref().unwrap_or_default();
    std::fs::write(&file, spec)
        .map_err(|e| ShimError::Other(format!("write {}: {e}", file.display())))?;
    Ok(file)
}

/// Sets up stdio (pipes, or a console socket for a terminal), runs `spawn` on a
/// blocking thread, then starts copying. Returns what `spawn` returned and the io.
pub(crate) async fn start_process<T: Send + 'static>(
    config: &Config,
    stdio: &StdioPaths,
    mut opts: CreateOpts,
    spawn: impl FnOnce(&Config, CreateOpts, crab_runtime::helper::ChildStdio) -> crab_runtime::Result<T>
        + Send
        + 'static,
) -> ShimResult<(T, ProcessIo)> {
    let cfg = config.clone();
    if stdio.terminal {
        let socket = ConsoleSocket::bind(&config.state_dir.join("console"))?;
        opts.console_socket = Some(socket.path().to_path_buf());
        let receive = tokio::spawn(socket.receive(CONSOLE_TIMEOUT));
        let spawned = blocking(move || spawn(&cfg, opts, Default::default())).await;
        let value = match spawned {
            Ok(v) => v,
            Err(e) => {
                receive.abort();
                return Err(e);
            }
        };
        let master = receive
            .await
            .map_err(|e| ShimError::Other(format!("console task: {e}")))??;
        let io = ProcessIo::terminal(stdio, master)?;
        return Ok((value, io));
    }
    let (pipes, child) = PipeIo::new(stdio)?;
    let value = blocking(move || spawn(&cfg, opts, child)).await?;
    Ok((value, pipes.start()?))
}
