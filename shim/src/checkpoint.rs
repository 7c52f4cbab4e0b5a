//! containerd's checkpoint and restore: `Checkpoint`, and `Create` + `Start` with a
//! checkpoint (as runc's shim does it, the processes come back at `Start`).

use std::path::PathBuf;
use std::time::Instant;

use containerd_shim::api::*;
use containerd_shim::protos::events::task::*;
use crab_runtime::checkpoint::engine::{apply_fs_delta, CheckpointOpts, Dumped};
use crab_runtime::checkpoint::Manifest;
use crab_runtime::config::Config;
use crab_runtime::container::{Container, CreateOpts};
use crab_runtime::storage::layers::MountSpec;
use crab_runtime::storage::ImageSource;

use crate::error::{ShimError, ShimResult};
use crate::instance::Instance;
use crate::options::CheckpointOptions;
use crate::task::{blocking, start_process, State, TaskService};

/// A checkpoint waiting for `Start`: CRIU images staged in the container's state dir.
#[derive(Debug)]
pub struct PendingRestore {
    /// The staged CRIU images.
    pub images: PathBuf,
    /// The checkpoint's manifest.
    pub manifest: Manifest,
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
        let state = self.state.lock().await;
        let inst = state.get(&req.id)?;
        crate::control::check_dumpable(inst, &req.id)?;
        let image = if inst.image.is_empty() {
            None
        } else {
            Some(ImageSource::from_mounts(&inst.image)?)
        };
        let dir = PathBuf::from(&req.path);
        std::fs::create_dir_all(&dir)
            .map_err(|e| ShimError::Other(format!("create {}: {e}", dir.display())))?;
        let copts = CheckpointOpts {
            dir,
            exit: opts.exit,
            rootfs: inst.bundle.join("rootfs"),
            image,
            criu: inst.config.checkpoint.criu.clone(),
            durable: false,
        };
        let c = inst.container.clone();
        let started = Instant::now();
        let m = blocking(move || c.checkpoint(&copts)).await?;
        tracing::info!(
            id = %req.id,
            exit = opts.exit,
            ms = started.elapsed().as_millis() as u64,
            process_bytes = m.process_bytes,
            fs_bytes = m.fs.as_ref().map(|f| f.bytes).unwrap_or(0),
            freeze_ms = m.timings.freeze_ms,
            fs_ms = m.timings.fs_ms,
            dump_ms = m.timings.dump_ms,
            total_ms = m.timings.total_ms,
            "checkpointed"
        );
        self.events
            .publish(TaskCheckpointed {
                container_id: req.id.clone(),
                checkpoint: req.path.clone(),
                ..Default::default()
            })
            .await;
        Ok(())
    }

    /// `Create` with a checkpoint: the rootfs (already prepared) gets the checkpoint's
    /// files, the CRIU images are staged; the processes come back at `Start`.
    pub(crate) async fn create_restored(
        &self,
        state: &mut State,
        req: &CreateTaskRequest,
        config: Config,
        bundle: PathBuf,
        rootfs_mounted: bool,
    ) -> ShimResult<CreateTaskResponse> {
        let dir = PathBuf::from(&req.checkpoint);
        let opts = CreateOpts {
            namespace: self.namespace.clone(),
            id: req.id.clone(),
            bundle: bundle.clone(),
            console_socket: None,
        };
        let rootfs = bundle.join("rootfs");
        let cfg = config.clone();
        let cfg_for_control = config.clone();
        let (container, images, manifest) = blocking(move || {
            let manifest = Manifest::read(&dir)?;
            apply_fs_delta(&dir, &manifest, &rootfs)?;
            Container::prepare_restore(&cfg, opts, &dir)
        })
        .await?;
        if manifest.terminal != req.terminal {
            let _ = blocking({
                let c = container.clone();
                move || c.delete()
            })
            .await;
            return Err(ShimError::InvalidArgument(format!(
                "checkpoint was taken {} a terminal, the new task asks {} one",
                if manifest.terminal { "with" } else { "without" },
                if req.terminal { "for" } else { "for no" },
            )));
        }
        let mut init = crate::process::Process::new(
            "",
            crate::io::StdioPaths {
                stdin: req.stdin.clone(),
                stdout: req.stdout.clone(),
                stderr: req.stderr.clone(),
                terminal: req.terminal,
            },
        );
        init.pid = 0;
        state.containers.insert(
            req.id.clone(),
            Instance {
                container,
                config,
                bundle,
                rootfs_mounted,
                image: image_mounts(req),
                init,
                execs: Default::default(),
                oom: None,
                restore: Some(PendingRestore { images, manifest }),
                control: self.serve_control(&cfg_for_control, &req.id).ok(),
            },
        );
        Ok(CreateTaskResponse::default())
    }

    /// `Start` of a container created from a checkpoint.
    pub(crate) async fn start_restored(&self, inst: &mut Instance) -> ShimResult<i32> {
        let pending = inst.restore.take().expect("caller checked");
        let container = inst.container.clone();
        let criu = inst.config.checkpoint.criu.clone();
        let opts = CreateOpts {
            namespace: self.namespace.clone(),
            id: container.id().to_string(),
            bundle: inst.bundle.clone(),
            console_socket: None,
        };
        let (images, manifest) = (pending.images.clone(), pending.manifest.clone());
        let started = Instant::now();
        let result = start_process(&inst.config, &inst.init.stdio, opts, move |_, _, child| {
            container.restore(&images, &Dumped::from(&manifest), &criu, child)
        })
        .await;
        let (pid, io) = match result {
            Ok(v) => v,
            Err(e) => {
                inst.restore = Some(pending);
                return Err(e);
            }
        };
        tracing::info!(id = %inst.container.id(), pid, ms = started.elapsed().as_millis() as u64, "restored");
        let _ = std::fs::remove_dir_all(&pending.images);
        // An unpacked checkpoint left by containerd (which removes it never).
        if let Some(parent) = pending.images.parent().filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("ctrd-checkpoint"))
        }) {
            let _ = std::fs::remove_dir_all(parent);
        }
        inst.init.pid = pid;
        inst.init.io = Some(io);
        inst.oom = crate::oom::watch(&inst.container, self.events.clone());
        Ok(pid)
    }
}

/// The image layers of a create request, kept for the file-system delta of a later
/// checkpoint.
pub fn image_mounts(req: &CreateTaskRequest) -> Vec<MountSpec> {
    req.rootfs
        .iter()
        .map(|m| MountSpec {
            kind: m.type_.clone(),
            source: m.source.clone(),
            options: m.options.clone(),
        })
        .collect()
}
