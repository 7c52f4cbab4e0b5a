//! containerd's checkpoint and restore: `Checkpoint`, and `Create` + `Start` with a
//! checkpoint (as runc's shim does it, the processes come back at `Start`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use containerd_shim::api::*;
use containerd_shim::protos::events::task::*;
use crab_runtime::checkpoint::engine::{apply_fs_delta, CheckpointOpts, Dumped};
use crab_runtime::checkpoint::source::{RestoreOptions, Source};
use crab_runtime::checkpoint::{reuse, Manifest, CONTAINERD_UNPACKED_PREFIX};
use crab_runtime::config::{
    Backend, Config, CHECKPOINT_DURABILITY_ANNOTATION, CHECKPOINT_EXIT_ANNOTATION,
};
use crab_runtime::container::CreateOpts;
use crab_runtime::helper::ChildStdio;
use crab_runtime::sandbox::{PinnedImage, RestoreImages, Sandbox};
use crab_runtime::storage::fault;
use crab_runtime::storage::layers::MountSpec;
use crab_runtime::storage::ContainerKey;
use crab_runtime::storage::ImageSource;

use crate::containers::Operation;
use crate::error::{ShimError, ShimResult};
use crate::instance::Instance;
use crate::io::{PipeIo, ProcessIo, StdioPaths};
use crate::options::CheckpointOptions;
use crate::rootfs;
use crate::task::{blocking, TaskService};

/// Applies the container's `io.crab.checkpoint.exit` and
/// `io.crab.checkpoint.durability` annotations to `config`.
pub fn configure(config: &mut Config, spec: &oci_spec::runtime::Spec) -> ShimResult<()> {
    choose_annotated(spec, CHECKPOINT_EXIT_ANNOTATION, |v| {
        config.checkpoint.choose_exit(v)
    })?;
    choose_annotated(spec, CHECKPOINT_DURABILITY_ANNOTATION, |v| {
        config.checkpoint.choose_durability(v)
    })
}

/// Applies the annotation `name` of `spec` with `choose`, when it is set; a value
/// `choose` refuses fails the create, naming the annotation.
pub fn choose_annotated(
    spec: &oci_spec::runtime::Spec,
    name: &str,
    choose: impl FnOnce(&str) -> Result<(), String>,
) -> ShimResult<()> {
    match spec.annotations().as_ref().and_then(|a| a.get(name)) {
        None => Ok(()),
        Some(v) => choose(v).map_err(|m| ShimError::InvalidArgument(format!("{name}: {m}"))),
    }
}

/// A checkpoint waiting for `Start`.
#[derive(Debug)]
pub struct PendingRestore {
    /// The CRIU images.
    pub images: PathBuf,
    /// What the restore needs to know about the dumped container.
    pub dumped: Dumped,
    /// What the shim removes once the processes are back (an unpacked checkpoint of
    /// containerd's, which containerd never removes; an unpacked import).
    pub cleanup: Vec<PathBuf>,
    /// A fork's replica of the checkpoint, taken from the container it is forked
    /// from, adopted at `Start` in place of a restore ([`crate::standby_forks`]).
    pub replica: Option<crate::standby::Ready>,
}

/// Whose checkpoint directory a restore reads, which says what the shim may do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DirOwner {
    /// containerd's unpacked checkpoint: its images are moved and removed.
    Containerd,
    /// An import's unpacked archive: the shim's to remove.
    Import,
    /// A client's image path (`WithRestoreImagePath`): read where it is, kept.
    Client,
}

/// Where a restored task's files and processes come from.
enum Plan {
    /// A checkpoint directory.
    Dir(PathBuf, DirOwner),
    /// A checkpoint in a history on this host.
    History(ContainerKey, Box<PinnedImage>),
}

impl TaskService {
    /// Checkpoint: the container's processes and its file-system delta into `req.path`.
    pub async fn checkpoint(&self, req: CheckpointTaskRequest) -> ShimResult<()> {
        let opts = CheckpointOptions::from_any(req.options.as_ref())
            .map_err(ShimError::InvalidArgument)?;
        if req.path.is_empty() {
            return Err(ShimError::InvalidArgument(
                "checkpoint needs a path to write to".into(),
            ));
        }
        let slot = self.containers.get(&req.id)?;
        let _claim = slot.begin(Operation::Checkpointing)?;
        // Running execs are waited for (they cannot be dumped), the claim holding
        // new ones back.
        let inst = crate::exec_wait::lock_dumpable(&slot, &req.id, None).await?;
        let image = if inst.image.is_empty() {
            None
        } else {
            Some(ImageSource::from_mounts(&inst.image)?)
        };
        let exit = opts
            .exit
            .unwrap_or(inst.config().checkpoint.exit_when_unspecified);
        let dir = PathBuf::from(opts.image_path.as_deref().unwrap_or(&req.path));
        std::fs::create_dir_all(&dir)
            .map_err(|e| ShimError::Other(format!("create {}: {e}", dir.display())))?;
        let copts = CheckpointOpts {
            dir,
            exit,
            rootfs: inst.bundle.join("rootfs"),
            image,
            criu: crab_runtime::criu::Tool::from_config(inst.config()),
            durable: false,
            // The tree is the store's when containerd's image mounts were turned
            // into one (not with the passthrough backend).
            store: (inst.config().storage.backend != Backend::Passthrough
                && !inst.image.is_empty())
            .then(|| inst.config().clone()),
            // containerd's checkpoint restores as a new task: the spec's hooks
            // (Docker's network) run again then.
            network_by_hooks: true,
        };
        let (c, config, sandbox, bundle) = (
            inst.container().clone(),
            inst.config().clone(),
            inst.sandbox.clone(),
            inst.bundle.clone(),
        );
        // The claim keeps conflicting operations out; the container's lock is let
        // go while the checkpoint queues and dumps, so that its state, kill and
        // exits get through. A checkpoint that ends the task keeps it, so that the
        // task's exit is reported after the checkpoint.
        let _held = if exit {
            Some(inst)
        } else {
            drop(inst);
            None
        };
        let started = Instant::now();
        // Through the turn policy: nothing changed since the last checkpoint
        // that containerd asked for, so that one is the answer.
        if !exit {
            let (c, config, dir) = (c.clone(), config.clone(), copts.dir.clone());
            if blocking(move || reuse::reuse(&config, &c, &dir)).await? {
                tracing::info!(id = %req.id, ms = started.elapsed().as_millis() as u64,
                    "checkpoint unchanged since the last one: reused");
                crate::cri_checkpoint::hand_over(&bundle, &req.id, &copts.dir);
                self.publish_checkpointed(&req).await;
                return Ok(());
            }
        }
        let dir = copts.dir.clone();
        let (c2, config2) = (c.clone(), config.clone());
        let m = blocking(move || sandbox.checkpoint_to(&copts)).await?;
        // containerd 2.x's CRI reads CRIU's stats from the container's CRI directory.
        crate::cri_checkpoint::hand_over(&bundle, &req.id, &dir);
        if !exit {
            blocking(move || {
                reuse::keep(&config2, &c2, &dir);
                Ok(())
            })
            .await?;
        }
        tracing::info!(
            id = %req.id,
            exit,
            ms = started.elapsed().as_millis() as u64,
            process_bytes = m.process_bytes,
            fs_bytes = m.fs.as_ref().map(|f| f.bytes).unwrap_or(0),
            freeze_ms = m.timings.freeze_ms,
            fs_ms = m.timings.fs_ms,
            dump_ms = m.timings.dump_ms,
            total_ms = m.timings.total_ms,
            "checkpointed"
        );
        self.publish_checkpointed(&req).await;
        Ok(())
    }

    async fn publish_checkpointed(&self, req: &CheckpointTaskRequest) {
        self.events
            .publish(TaskCheckpointed {
                container_id: req.id.clone(),
                checkpoint: req.path.clone(),
                ..Default::default()
            })
            .await;
    }

    /// `Create` of a task whose processes come from a checkpoint: containerd's (its
    /// `checkpoint` dir), or Crab's (a [`RestoreOptions`] task option: a checkpoint in a
    /// history on this host, or an imported directory). The rootfs is made to hold the
    /// checkpoint's files; the processes come back at `Start`.
    pub(crate) async fn create_restored(
        &self,
        req: &CreateTaskRequest,
        config: Config,
        bundle: PathBuf,
        restore: Option<RestoreOptions>,
        image_path: Option<PathBuf>,
        proxy_listener: Option<std::net::TcpListener>,
    ) -> ShimResult<Instance> {
        let key = ContainerKey::new(&self.namespace, &req.id)?;
        let target = bundle.join("rootfs");
        let plan = match restore.map(|r| r.source) {
            None => match image_path {
                // containerd 2.x names a client's image path as the checkpoint too.
                Some(path) if req.checkpoint.is_empty() || Path::new(&req.checkpoint) == path => {
                    Plan::Dir(path, DirOwner::Client)
                }
                _ => Plan::Dir(PathBuf::from(&req.checkpoint), DirOwner::Containerd),
            },
            Some(Source::Dir { path }) => Plan::Dir(path, DirOwner::Import),
            Some(Source::History {
                namespace,
                id,
                checkpoint,
            }) => {
                let src = ContainerKey::new(&namespace, &id)?;
                // Pinned now: a retention before Start cannot take the images.
                let pinned = {
                    let (config, src, key) = (config.clone(), src.clone(), key.clone());
                    blocking(move || Sandbox::pin_checkpoint(&config, &src, &checkpoint, &key))
                        .await?
                };
                Plan::History(src, Box::new(pinned))
            }
        };
        // A fork of a container this shim serves may take one of its replicas.
        let fork_of = match &plan {
            Plan::History(src, pinned) if *src != key && !req.terminal => {
                Some((src.clone(), pinned.entry.seq))
            }
            _ => None,
        };
        let mut replica = match fork_of {
            Some((src, seq)) => self.take_fork_replica(&src, seq).await,
            None => None,
        };
        let rootfs_mounted = match &plan {
            Plan::History(src, pinned) if *src != key => {
                let snapshot = pinned.entry.fs_snapshot.clone().unwrap_or_default();
                let made = self
                    .fork_tree(&config, (src, &snapshot), &key, req, replica.as_mut())
                    .await;
                match made {
                    Ok(m) => m,
                    Err(e) => {
                        if let Some(r) = replica {
                            crate::standby::discard(&config, r).await;
                        }
                        return Err(e);
                    }
                }
            }
            _ => rootfs::prepare(&config, &key, &req.rootfs, &target).await?,
        };
        let opts = CreateOpts {
            namespace: self.namespace.clone(),
            id: req.id.clone(),
            bundle: bundle.clone(),
            console_socket: None,
        };
        let (cfg, terminal) = (config.clone(), req.terminal);
        let prepared = blocking(move || -> crab_runtime::Result<(Sandbox, PendingRestore)> {
            match plan {
                Plan::Dir(dir, owner) => {
                    let manifest = Manifest::read(&dir)?;
                    check_terminal(terminal, manifest.stdio.tty.is_some(), &dir)?;
                    apply_fs_delta(&dir, &manifest, &target)?;
                    let keep = owner == DirOwner::Client;
                    let (sandbox, RestoreImages { images, mut dumped }) =
                        Sandbox::for_dir_restore(cfg, opts, &dir, !keep)?;
                    // An import's processes had their mounts on another host, or
                    // under another runtime (Docker's shared data root).
                    dumped.foreign_mounts = owner == DirOwner::Import;
                    // containerd never removes its unpacked checkpoint; an import's
                    // unpacked archive is the shim's to remove too; a client's
                    // images are the client's.
                    let whole = owner == DirOwner::Import
                        || dir.file_name().is_some_and(|n| {
                            n.to_string_lossy().starts_with(CONTAINERD_UNPACKED_PREFIX)
                        });
                    let mut cleanup = Vec::new();
                    if !keep {
                        cleanup.push(images.clone());
                    }
                    if whole && !keep {
                        cleanup.push(dir);
                    }
                    Ok((
                        sandbox,
                        PendingRestore {
                            images,
                            dumped,
                            cleanup,
                            replica: None,
                        },
                    ))
                }
                Plan::History(src, pinned) => {
                    // A failure drops the pin, and its links with it.
                    check_terminal(terminal, pinned.dumped.stdio.tty.is_some(), &pinned.images)?;
                    // The same container after a crash: its tree goes back,
                    // and its agent, fast-forwarded, replays to the entry.
                    let sandbox = Sandbox::for_history_restore(cfg, opts, &src, &pinned)?;
                    let (images, dumped, pin) = pinned.keep();
                    Ok((
                        sandbox,
                        PendingRestore {
                            images,
                            dumped,
                            cleanup: vec![pin],
                            replica: None,
                        },
                    ))
                }
            }
        })
        .await;
        let (sandbox, mut pending) = match prepared {
            Ok(v) => v,
            Err(e) => {
                rootfs::release(&config, &key, &bundle.join("rootfs"), rootfs_mounted).await;
                if let Some(r) = replica {
                    crate::standby::discard(&config, r).await;
                }
                return Err(e);
            }
        };
        pending.replica = replica;
        let init = crate::process::Process::new(
            "",
            crate::io::StdioPaths {
                stdin: req.stdin.clone(),
                stdout: req.stdout.clone(),
                stderr: req.stderr.clone(),
                terminal: req.terminal,
                container: (self.namespace.clone(), req.id.clone()),
            },
        );
        let control = self.serve_control(&config, &req.id);
        // The tree holds the checkpoint's files; Create has not answered yet.
        fault::shim_point("restore.prepared", config.fault_file.as_deref());
        Ok(Instance {
            sandbox,
            bundle,
            rootfs_mounted,
            image: image_mounts(req),
            init,
            execs: Default::default(),
            oom: None,
            restore: Some(pending),
            control,
            proxy: None,
            proxy_listener,
            api_token: None,
            standby: Default::default(),
            fork_replicas: Default::default(),
        })
    }

    /// The tree of a fork of `src`'s `snapshot`: its replica's, when it has one
    /// whose tree can be taken (no clone then), else a clone of the snapshot.
    async fn fork_tree(
        &self,
        config: &Config,
        (src, snapshot): (&ContainerKey, &str),
        key: &ContainerKey,
        req: &CreateTaskRequest,
        replica: Option<&mut crate::standby::Ready>,
    ) -> ShimResult<bool> {
        let target = PathBuf::from(&req.bundle).join("rootfs");
        if let Some(r) = replica {
            let taken =
                rootfs::prepare_taken(config, key, r.standby.tree(), &req.rootfs, &target).await;
            match taken {
                Ok(mounted) => {
                    r.standby.tree_given();
                    return Ok(mounted);
                }
                Err(e) => tracing::warn!(id = %req.id, error = %e,
                    "the replica's tree not taken: cloning the snapshot"),
            }
        }
        rootfs::prepare_clone(config, src, snapshot, key, &req.rootfs, &target).await
    }

    /// `Start` of a container created from a checkpoint.
    pub(crate) async fn start_restored(&self, inst: &mut Instance) -> ShimResult<i32> {
        let mut pending = inst.restore.take().expect("caller checked");
        if let Some(ready) = pending.replica.take() {
            let started = Instant::now();
            let rootfs = inst.bundle.join("rootfs");
            let dumped_id = pending.dumped.id.clone();
            let adopted = crate::standby_forks::adopt(
                &mut inst.sandbox,
                ready,
                rootfs,
                dumped_id,
                &inst.init.stdio,
            )
            .await;
            if let Some((pid, io)) = adopted {
                tracing::info!(id = %inst.container().id(), pid,
                    ms = started.elapsed().as_millis() as u64, "restored from a replica");
                return Ok(self.restored(inst, pid, io, pending.cleanup));
            }
        }
        let sandbox = inst.sandbox.clone();
        let (images, dumped) = (pending.images.clone(), pending.dumped.clone());
        let terminal = dumped.stdio.tty.is_some();
        let started = Instant::now();
        let fault_file = inst.config().fault_file.clone();
        fault::shim_point("restore.starting", fault_file.as_deref());
        let result = restore_process(
            inst.config(),
            &inst.init.stdio,
            terminal,
            move |_, child| sandbox.restore_processes(&images, &dumped, child, false),
        )
        .await;
        let (pid, io) = match result {
            Ok(v) => v,
            Err(e) => {
                inst.restore = Some(pending);
                return Err(e);
            }
        };
        // CRIU restored the processes; Start has not answered yet.
        fault::shim_point("restore.restored", fault_file.as_deref());
        tracing::info!(id = %inst.container().id(), pid, ms = started.elapsed().as_millis() as u64, "restored");
        Ok(self.restored(inst, pid, io, pending.cleanup))
    }

    /// Records the restored init `pid` and its stdio, watches the container's
    /// memory, and removes what the restore no longer needs (`cleanup`) in the
    /// background: removing images costs about 0.2 ms per MB here, and `Start`
    /// waits for nothing in them any more. Answers `pid`.
    fn restored(&self, inst: &mut Instance, pid: i32, io: ProcessIo, cleanup: Vec<PathBuf>) -> i32 {
        tokio::task::spawn_blocking(move || {
            for p in &cleanup {
                let _ = std::fs::remove_dir_all(p);
            }
        });
        inst.init.pid = pid;
        inst.init.io = Some(io);
        inst.oom = crate::oom::watch(inst.container(), self.events.clone());
        pid
    }
}

/// Refuses a task with a terminal whose checkpointed processes had none (their stdio
/// were pipes: a terminal cannot take their place). The other way round is allowed:
/// the restored processes get a new terminal, whose output goes to the task's stdout
/// (crabctl's restores and forks create their tasks without a terminal).
fn check_terminal(task: bool, dumped: bool, dir: &Path) -> crab_runtime::Result<()> {
    if task && !dumped {
        return Err(crab_runtime::Error::BadCheckpoint {
            path: dir.to_path_buf(),
            message: "the task asks for a terminal, but the checkpointed processes had none".into(),
        });
    }
    Ok(())
}

/// Starts restored processes (`restore` runs CRIU) with their stdio: a dumped terminal
/// gets a new pty, whose slave CRIU puts in place of the dumped one and whose master
/// goes to the task's fifos, as at create; pipes otherwise.
pub(crate) async fn restore_process<T: Send + 'static>(
    config: &Config,
    stdio: &StdioPaths,
    terminal: bool,
    restore: impl FnOnce(&Config, ChildStdio) -> crab_runtime::Result<T> + Send + 'static,
) -> ShimResult<(T, ProcessIo)> {
    let cfg = config.clone();
    if !terminal {
        let (pipes, child) = PipeIo::new(stdio)?;
        let value = blocking(move || restore(&cfg, child)).await?;
        return Ok((value, pipes.start()?));
    }
    let (master, slave) = crate::console::open_pty()?;
    let child = ChildStdio {
        stdin: Some(slave),
        ..Default::default()
    };
    let value = blocking(move || restore(&cfg, child)).await?;
    Ok((value, ProcessIo::terminal(stdio, master)?))
}

/// The image layers of a create request, kept for the file-system delta of a later
/// checkpoint.
pub fn image_mounts(req: &CreateTaskRequest) -> Vec<MountSpec> {
    rootfs::mount_specs(&req.rootfs)
}
