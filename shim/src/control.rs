//! The shim's side of Crab's control API ([`crab_runtime::control`]): a listener per
//! container, and the operations. Each claims its container
//! ([`crate::containers::Operation`]), so a checkpoint never runs beside a pause, an
//! exec start or another checkpoint of the same container; a second one fails as
//! busy.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::time::{Duration, Instant};

use containerd_shim::protos::api::Status;
use containerd_shim::protos::events::task::TaskExit;
use containerd_shim::protos::protobuf::MessageField;
use crab_runtime::checkpoint::history::Entry;
use crab_runtime::checkpoint::ops::CheckpointRequest;
use crab_runtime::checkpoint::sched::Priority;
use crab_runtime::config::Config;
use crab_runtime::control::{self, AgentConn, Request, Response, Rollback};
use crab_runtime::error::ErrorKind;
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::task::JoinHandle;

use crate::checkpoint::restore_process;
use crate::containers::Operation;
use crate::error::{ShimError, ShimResult};
use crate::exec_wait::{check_checkpointable, lock_dumpable};
use crate::instance::{status_name, Instance};
use crate::process::Exit;
use crate::task::{blocking, TaskService};

/// How long a rollback waits for the old processes to be gone.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the process at the other end of `conn` may use the control socket
/// ([`crab_runtime::peer::allowed`]).
fn peer_allowed(conn: &tokio::net::UnixStream, group: Option<u32>) -> Result<(), String> {
    crab_runtime::peer::socket_allowed(std::os::fd::AsFd::as_fd(conn), group)
}

impl TaskService {
    /// Binds the container's control socket and serves it until the task is
    /// deleted. A container without one still runs, but `crabctl` cannot reach
    /// it: logged.
    pub(crate) fn serve_control(&self, config: &Config, id: &str) -> Option<JoinHandle<()>> {
        self.bind_control(config, id)
            .inspect_err(|e| {
                tracing::error!(%id, error = %e, "no control socket: crabctl cannot reach this container")
            })
            .ok()
    }

    fn bind_control(&self, config: &Config, id: &str) -> ShimResult<JoinHandle<()>> {
        let path = control::socket_path(config, &self.namespace, id);
        let _ = std::fs::remove_file(&path);
        let address = crab_runtime::socket_path::SocketPath::new(&path)?;
        let listener = UnixListener::bind(address.as_path())
            .map_err(|e| ShimError::Other(format!("bind {}: {e}", path.display())))?;
        let group = config.control_gid()?;
        if let Some(gid) = group {
            nix::unistd::chown(&path, None, Some(nix::unistd::Gid::from_raw(gid)))
                .map_err(|e| ShimError::Other(format!("chown {}: {e}", path.display())))?;
        }
        let mode = if group.is_some() { 0o660 } else { 0o600 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| ShimError::Other(format!("chmod {}: {e}", path.display())))?;
        let service = self.clone();
        let id = id.to_string();
        Ok(tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let service = service.clone();
                let id = id.clone();
                tokio::spawn(async move {
                    // The socket's mode is the first fence; the caller's credentials
                    // are the one that holds when the mode is loosened by mistake.
                    if let Err(why) = peer_allowed(&conn, group) {
                        tracing::warn!(%id, %why, "control socket: caller refused");
                        let (_, mut w) = conn.into_split();
                        let response = Response::Error {
                            kind: ErrorKind::InvalidArgument,
                            message: format!("permission denied: {why}"),
                        };
                        let mut out = serde_json::to_vec(&response).expect("response serializes");
                        out.push(b'\n');
                        let _ = w.write_all(&out).await;
                        return;
                    }
                    let (r, mut w) = conn.into_split();
                    let mut line = String::new();
                    if BufReader::new(r).read_line(&mut line).await.is_err() {
                        return;
                    }
                    let response = match serde_json::from_str::<Request>(&line) {
                        Ok(req) => service.control(&id, req).await,
                        Err(e) => Response::Error {
                            kind: ErrorKind::InvalidArgument,
                            message: format!("bad request: {e}"),
                        },
                    };
                    let mut out = serde_json::to_vec(&response).expect("response serializes");
                    out.push(b'\n');
                    let _ = w.write_all(&out).await;
                });
            }
        }))
    }

    async fn control(&self, served: &str, req: Request) -> Response {
        let (namespace, id) = req.target();
        if namespace != self.namespace || id != served {
            return Response::Error {
                kind: ErrorKind::InvalidArgument,
                message: format!(
                    "this socket serves {}/{served}, not {namespace}/{id}",
                    self.namespace
                ),
            };
        }
        let result = match req {
            Request::Checkpoint {
                id,
                request,
                caller,
                ..
            } => self
                .crab_checkpoint(&id, request, caller)
                .await
                .map(|entry| Response::Entry { entry }),
            Request::List { id, .. } => self
                .crab_list(&id)
                .await
                .map(|entries| Response::Entries { entries }),
            Request::Remove { id, checkpoint, .. } => self
                .crab_remove(&id, &checkpoint)
                .await
                .map(|entry| Response::Entry { entry }),
            Request::Turn {
                id,
                dry_run,
                background,
                agent,
                token,
                ..
            } => self
                .crab_turn(&id, dry_run, background, agent, token)
                .await
                .map(|(classification, entry)| Response::Turn {
                    classification,
                    entry,
                }),
            Request::Promote { id, token, .. } => Ok(Response::Done {
                changed: self.turns.promote(&id, token),
            }),
            Request::Gated { id, us, .. } => {
                self.turns.gated(&id, us);
                Ok(Response::Done { changed: true })
            }
            Request::Stats { id, .. } => {
                let mut stats = self.turns.stats(&id);
                if let Ok(slot) = self.containers.get(&id) {
                    if let Ok(inst) = slot.lock().await {
                        (stats.standby, stats.standby_missing, stats.standby_dropped) =
                            inst.standby.report();
                        (stats.fork_replicas, stats.fork_replicas_missing) =
                            inst.fork_replicas.report();
                    }
                }
                Ok(Response::Stats { stats })
            }
            Request::Rollback {
                id,
                checkpoint,
                caller,
                ..
            } => self
                .crab_rollback(&id, &checkpoint, caller)
                .await
                .map(|report| Response::RolledBack { report }),
            Request::FsSnapshot { id, name, .. } => self
                .crab_fs(&id, &name, false)
                .await
                .map(|ms| Response::Fs { name, ms }),
            Request::FsRollback { id, name, .. } => self
                .crab_fs(&id, &name, true)
                .await
                .map(|ms| Response::Fs { name, ms }),
        };
        result.unwrap_or_else(|e| Response::Error {
            kind: e.kind(),
            message: crab_runtime::helper::error_chain(&e),
        })
    }

    /// `crabctl checkpoint`, and the agent API's (`caller` is its connection).
    pub async fn crab_checkpoint(
        &self,
        id: &str,
        req: CheckpointRequest,
        caller: Option<AgentConn>,
    ) -> ShimResult<Entry> {
        let slot = self.containers.get(id)?;
        let _claim = slot.begin(Operation::Checkpointing)?;
        let sandbox = if req.kind.dumps_processes() {
            lock_dumpable(&slot, id, caller).await?.sandbox.clone()
        } else {
            // The files alone: running execs are frozen with the rest, not dumped.
            let inst = slot.lock().await?;
            check_checkpointable(&inst, id)?;
            inst.sandbox.clone()
        };
        let wants_standby = sandbox.config().standby.wants_replicas();
        let (entry, _) = blocking(move || sandbox.checkpoint(req, &Priority::high())).await?;
        tracing::info!(%id, seq = entry.seq, kind = ?entry.kind, total_ms = entry.timings.total_ms,
            freeze_ms = entry.timings.freeze_ms, fs_ms = entry.timings.fs_ms,
            dump_ms = entry.timings.dump_ms, sync_ms = entry.timings.sync_ms, "checkpoint");
        self.standby_after(id, wants_standby, &entry);
        Ok(entry)
    }

    /// `crabctl ls`.
    pub async fn crab_list(&self, id: &str) -> ShimResult<Vec<Entry>> {
        let sandbox = self.containers.get(id)?.lock().await?.sandbox.clone();
        // Waits for a checkpoint being recorded, off the async threads.
        blocking(move || sandbox.checkpoints()).await
    }

    /// `crabctl rm`.
    pub async fn crab_remove(&self, id: &str, name: &str) -> ShimResult<Entry> {
        let slot = self.containers.get(id)?;
        let _claim = slot.begin(Operation::RemovingCheckpoint)?;
        let sandbox = slot.lock().await?.sandbox.clone();
        let name = name.to_string();
        blocking(move || sandbox.remove_checkpoint(&name)).await
    }

    /// `crabctl fs snapshot` and `crabctl fs rollback` of a container this shim
    /// runs: its processes frozen around the change, and after a rollback the
    /// inspector told that the tree is no longer the one it watched (so the next
    /// turn takes everything, not a skip).
    pub async fn crab_fs(&self, id: &str, name: &str, rollback: bool) -> ShimResult<f64> {
        let started = Instant::now();
        let operation = if rollback {
            Operation::RollingBack
        } else {
            Operation::Snapshotting
        };
        let slot = self.containers.get(id)?;
        let _claim = slot.begin(operation)?;
        // Held: the container is paused behind containerd's back meanwhile.
        let inst = slot.lock().await?;
        let (sandbox, name) = (inst.sandbox.clone(), name.to_string());
        blocking(move || {
            if rollback {
                sandbox
                    .container()
                    .rolled_back_frozen(|| sandbox.rollback_files(&name))
            } else {
                sandbox.container().frozen(|| sandbox.snapshot_files(&name))
            }
        })
        .await?;
        Ok(started.elapsed().as_secs_f64() * 1000.0)
    }

    /// `crabctl rollback`: the files, and (when the checkpoint has a process image)
    /// the processes, become those of the checkpoint; the task keeps its id. An
    /// agent that lives in the sandbox and asks through the agent API (`caller`
    /// is its connection) gets the files only: a rollback of its own process
    /// would lose the answer and make it forget it asked, and ask again.
    pub async fn crab_rollback(
        &self,
        id: &str,
        name: &str,
        caller: Option<AgentConn>,
    ) -> ShimResult<Rollback> {
        let started = Instant::now();
        let slot = self.containers.get(id)?;
        let _claim = slot.begin(Operation::RollingBack)?;
        // Held throughout: the init's pid and stdio change.
        let mut guard = slot.lock().await?;
        let inst = &mut *guard;
        if !matches!(inst.init.status, Status::RUNNING | Status::PAUSED) {
            return Err(ShimError::FailedPrecondition(format!(
                "cannot roll back container {id}: it is {}",
                status_name(inst.init.status)
            )));
        }
        let sandbox = inst.sandbox.clone();
        let (entry, image) = {
            let (sandbox, name) = (sandbox.clone(), name.to_string());
            blocking(move || sandbox.find(&name)).await?
        };
        let snapshot = entry.fs_snapshot.clone().ok_or_else(|| {
            ShimError::FailedPrecondition(format!("checkpoint {name} has no file-system snapshot"))
        })?;
        let c = inst.container().clone();
        // The state becomes checkpoint `name`'s, which need not be the latest:
        // the facade taints the inspector, so every turn takes everything until
        // the next full checkpoint.
        // The files' rollback, by the container as `sandbox` holds it (an
        // adoption may change it).
        let files_of = |sandbox: &crab_runtime::sandbox::Sandbox| {
            let (sandbox, snapshot) = (sandbox.clone(), snapshot.clone());
            move || sandbox.rollback_files(&snapshot)
        };
        let rollback_fs = files_of(&sandbox);
        let inside = match caller {
            Some(conn) => {
                let sandbox = sandbox.clone();
                blocking(move || Ok(sandbox.holds_connection(conn))).await?
            }
            None => false,
        };
        if inside {
            tracing::info!(%id, seq = entry.seq, "rollback asked from inside the sandbox: the files only");
        }
        let Some((images, dumped)) = image.filter(|_| !inside) else {
            // Files only: the processes stay, frozen around the change.
            blocking(move || c.rolled_back_frozen(rollback_fs)).await?;
            return Ok(Rollback {
                checkpoint: entry,
                pid: inst.init.pid,
                processes: false,
                ms: started.elapsed().as_millis() as u64,
                standby: false,
            });
        };

        // A replica of the checkpoint, restored and stopped beforehand, is adopted
        // in place of a restore ([`crate::standby`]).
        let standby = inst.standby.take(entry.seq).await;
        let verify = {
            let (images, files) = (images.clone(), dumped.files.clone());
            move || crab_runtime::checkpoint::engine::verify_images(&images, &files)
        };
        // A damaged image is refused while the old processes still run (a
        // replica's restore read it whole already).
        let verify = if standby.is_none() {
            blocking(verify).await?;
            None
        } else {
            Some(verify)
        };
        // The client reading the output fifos must not see EOF while the old copy
        // tasks end and the new ones start: hold a writer open across the change.
        // And the client writing stdin must not find its fifo without a reader (its
        // write would fail with EPIPE and end its input for good): hold a reader
        // open until the new copy has opened the fifo (it does in the background),
        // the bytes typed meanwhile waiting in the fifo.
        let keep_open: Vec<std::fs::File> = [
            &inst.init.stdio.stdin,
            &inst.init.stdio.stdout,
            &inst.init.stdio.stderr,
        ]
        .into_iter()
        // Only fifos: a log file or a logging binary is not opened here.
        .filter_map(|p| match crate::log_uri::Output::parse(p) {
            Ok(crate::log_uri::Output::Fifo(path)) => Some(path),
            _ => None,
        })
        .filter_map(|p| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(p)
                .ok()
        })
        .collect();
        let verified_ms = started.elapsed().as_millis() as u64;
        // The old processes go first: their tree is replaced, not merged. A
        // replica does not wait for them to be gone: it shares nothing with them.
        let killed = kill_processes(inst).await?;
        let from_standby = standby.is_some();
        let adopted = match standby {
            Some(ready) => {
                // The replica's cgroups become the container's by renames
                // (`crab_runtime::standby`): a watch of the old memory cgroup
                // would report its removal as an OOM. A new watch starts below.
                if let Some(oom) = inst.oom.take() {
                    oom.abort();
                }
                let rootfs = inst.bundle.join("rootfs");
                crate::standby::adopt(&mut inst.sandbox, ready, rootfs, killed.pids.clone()).await
            }
            None => None,
        };
        // An adoption that failed after the replica took the container's
        // cgroups (its stdio) leaves the container as it answered it.
        let sandbox = inst.sandbox.clone();
        let rollback_fs = files_of(&sandbox);
        match (&adopted, killed) {
            (
                Some(_),
                Killed {
                    io: Some(mut io), ..
                },
            ) => {
                tokio::spawn(async move { io.finish(Duration::from_millis(200)).await });
            }
            (Some(_), _) => {}
            (None, killed) => wait_gone(inst.container(), killed).await?,
        }
        let stopped_ms = started.elapsed().as_millis() as u64;
        let mut fs_done_ms = 0;
        let adopted_ok = adopted.is_some();
        let restored = async {
            if let Some(v) = adopted {
                return Ok(v);
            }
            if let Some(verify) = verify {
                blocking(verify).await?;
            }
            blocking(rollback_fs).await?;
            fs_done_ms = started.elapsed().as_millis() as u64;
            let terminal = dumped.stdio.tty.is_some();
            restore_process(
                inst.config(),
                &inst.init.stdio,
                terminal,
                move |_, child| sandbox.restore_processes(&images, &dumped, child, true),
            )
            .await
        }
        .await;
        tokio::spawn(async move {
            tokio::time::sleep(STDIN_HANDOVER).await;
            drop(keep_open);
        });
        match restored {
            Ok((pid, io)) => {
                inst.init.pid = pid;
                inst.init.io = Some(io);
                inst.init.status = Status::RUNNING;
                if inst.oom.is_none() {
                    inst.oom = crate::oom::watch(inst.container(), self.events.clone());
                }
                let ms = started.elapsed().as_millis() as u64;
                // Time since the request at each step, for where a slow one went.
                tracing::info!(
                    %id,
                    seq = entry.seq,
                    pid,
                    verified_ms,
                    stopped_ms,
                    fs_done_ms,
                    ms,
                    from_standby,
                    adopted = adopted_ok,
                    "rolled back"
                );
                // The next rollback most likely goes back here too (a search
                // tries the node's next child).
                self.refresh_standby(id, inst, entry.seq);
                // The agent inside came back as it was at the process image:
                // the proxy answers its repeated requests from the journal up to
                // this entry (read at the relisten, before the new listener).
                // Off the async threads: it reads the history under its lock.
                let (sandbox, planned) = (inst.sandbox.clone(), entry.clone());
                let _ = blocking(move || {
                    let own = sandbox.container().key()?;
                    sandbox.plan_replay(&own, &planned);
                    Ok(())
                })
                .await;
                if let Some(p) = &inst.proxy {
                    p.relisten();
                }
                Ok(Rollback {
                    checkpoint: entry,
                    pid,
                    processes: true,
                    ms,
                    standby: adopted_ok,
                })
            }
            Err(e) => {
                // The old processes are gone and no new ones run: say so to containerd.
                let exit = Exit::now(128 + Signal::SIGKILL as u32);
                inst.init.set_exited(exit);
                self.events
                    .publish(TaskExit {
                        container_id: id.to_string(),
                        id: id.to_string(),
                        pid: 0,
                        exit_status: exit.code,
                        exited_at: MessageField::some(exit.timestamp()),
                        ..Default::default()
                    })
                    .await;
                Err(ShimError::Other(format!(
                    "rollback of {id} to {name} failed after its processes were stopped; \
                     the task is now stopped: {}",
                    crab_runtime::helper::error_chain(&e)
                )))
            }
        }
    }
}

/// How long a rollback keeps its own ends of the stdio fifos open after the new
/// copy tasks started: they open the fifos in the background, within milliseconds.
const STDIN_HANDOVER: Duration = Duration::from_secs(5);

/// The processes a rollback killed, and the old init's output, still draining.
struct Killed {
    pids: Vec<i32>,
    io: Option<crate::io::ProcessIo>,
}

/// Sends SIGKILL to every process of the container (at once, through the
/// tracking cgroup: no fork escapes it); the init's exit is then not reported (its
/// pid is forgotten before the reaper sees it).
async fn kill_processes(inst: &mut Instance) -> ShimResult<Killed> {
    let c = inst.container().clone();
    let paused = inst.init.status == Status::PAUSED;
    inst.init.pid = 0;
    let pids = blocking(move || {
        if paused {
            c.resume()?;
        }
        let tracking = c.tracking();
        let pids = tracking.pids()?;
        tracking.kill_all()?;
        Ok(pids)
    })
    .await?;
    Ok(Killed {
        pids,
        io: inst.init.io.take(),
    })
}

/// Waits until none of the container's processes is left, then for the old
/// init's output to drain.
async fn wait_gone(c: &crab_runtime::container::Container, killed: Killed) -> ShimResult<()> {
    let c = c.clone();
    blocking(move || {
        if c.tracking().wait_empty(KILL_TIMEOUT)? {
            return Ok(());
        }
        Err(crab_runtime::Error::WrongState {
            id: c.id().to_string(),
            state: "still running processes after SIGKILL".into(),
            operation: "roll back",
        })
    })
    .await?;
    if let Some(mut io) = killed.io {
        io.finish(Duration::from_millis(200)).await;
    }
    Ok(())
}
