//! Checkpoint and restore of a whole container: its processes through CRIU, its files
//! as a delta against its image.
//!
//! Checkpoint: freeze (unless containerd paused it already) → file-system delta (the
//! frozen tree cannot change under the walk) → CRIU dump (leave running, or exit) →
//! thaw → manifest last. A failure before the dump leaves the container running as
//! it was.
//!
//! Restore: the caller has made the rootfs equal to the checkpointed tree; the helper
//! joins the container's cgroups and runs `criu restore`, so that the restored init is
//! a child of the shim, in the right cgroups, with its stdio on new pipes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use libcontainer::container::ContainerStatus;
use oci_spec::runtime::Spec;

use super::calls::{ApplyFsDelta, Checkpoint};
use super::restore_helper::Restore;
use super::{fs_diff, FsPart, Kind, Manifest, Stdio, Timings, FS_DIFF};
use crate::config::Config;
use crate::container::{load_spec, Container, CreateOpts};
use crate::helper::{self, ChildStdio};
use crate::inspect::{self, Freeze};
use crate::storage::in_helper::{self, ChangedSinceImage};
use crate::storage::ImageSource;
use crate::{criu, Error, Result};

/// What a restore needs to know about the dumped container.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Dumped {
    /// Its id (a restored copy under another id gets a cgroup of its own).
    pub id: String,
    /// Its init's stdio keys.
    pub stdio: Stdio,
    /// The size of every file CRIU wrote, checked before a restore: a truncated or
    /// damaged image is refused, not fed to CRIU (which can spin on one).
    #[serde(default)]
    pub files: BTreeMap<String, u64>,
    /// Its network namespace was dumped empty, for the spec's hooks to make again
    /// ([`super::hooks`]).
    #[serde(default)]
    pub network_by_hooks: bool,
    /// Its mounts were another host's or another runtime's (an import): their
    /// sharing (the peer groups Docker's shared data root puts a root in) cannot
    /// be made again around this host's root, so CRIU restores them with its
    /// older mount engine, which does not try (`--mntns-compat-mode`).
    #[serde(default)]
    pub foreign_mounts: bool,
    /// Its network namespace (this inode) was the container's own but held and
    /// filled by the engine that made the container (Docker 28 moves its veth in
    /// between `Create` and `Start` and keeps the namespace bound): it is not in the
    /// images, and a restore of the same container joins it where the engine keeps
    /// it ([`crate::netns::bound_at`]).
    #[serde(default)]
    pub held_network: Option<u64>,
}

/// The files of a CRIU image directory and their sizes.
pub fn image_files(dir: &Path) -> BTreeMap<String, u64> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.ends_with(".img") || name == crate::pkeys::FILE
        })
        .map(|e| {
            let len = e.metadata().map(|m| m.len()).unwrap_or(0);
            (e.file_name().to_string_lossy().into_owned(), len)
        })
        .collect()
}

/// Refuses an image directory whose files differ from what the dump wrote, or that
/// holds anything but regular files: CRIU opens the images by name, and a symlink
/// (`pages-1.img -> /etc/shadow`, from a registry or another host) would load a
/// host file into the restored process.
pub fn verify_images(dir: &Path, files: &BTreeMap<String, u64>) -> Result<()> {
    let bad = |message: String| Error::BadCheckpoint {
        path: dir.to_path_buf(),
        message,
    };
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(bad("the image directory is not a directory".into())),
        Err(e) => return Err(bad(format!("the image directory: {e}"))),
    }
    let entries = std::fs::read_dir(dir).map_err(|e| bad(format!("read: {e}")))?;
    for e in entries {
        let e = e.map_err(|e| bad(format!("read: {e}")))?;
        let t = e.file_type().map_err(|e| bad(format!("read: {e}")))?;
        if !t.is_file() {
            return Err(bad(format!(
                "{:?} is not a regular file: an image directory holds nothing else",
                e.file_name()
            )));
        }
    }
    for (name, size) in files {
        if super::beneath::components(name.as_bytes()).map(|c| c.len()) != Some(1) {
            return Err(bad(format!("image name {name:?} is not a plain name")));
        }
        let actual = std::fs::symlink_metadata(dir.join(name)).map(|m| m.len());
        match actual {
            Ok(a) if a == *size => {}
            Ok(a) => {
                return Err(Error::BadCheckpoint {
                    path: dir.to_path_buf(),
                    message: format!(
                        "{name} holds {a} bytes, the dump wrote {size}: the checkpoint is truncated or damaged"
                    ),
                })
            }
            Err(e) => {
                return Err(Error::BadCheckpoint {
                    path: dir.to_path_buf(),
                    message: format!("{name}: {e}"),
                })
            }
        }
    }
    Ok(())
}

impl From<&Manifest> for Dumped {
    fn from(m: &Manifest) -> Dumped {
        Dumped {
            id: m.id.clone(),
            stdio: m.stdio.clone(),
            files: m.criu_files.clone(),
            network_by_hooks: m.network_by_hooks,
            foreign_mounts: false,
            // containerd's checkpoints dump the network namespace as it is.
            held_network: None,
        }
    }
}

/// How to checkpoint.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CheckpointOpts {
    /// The (existing, empty) checkpoint directory.
    pub dir: PathBuf,
    /// Stop the container after the dump (else it keeps running).
    pub exit: bool,
    /// The container's root file system, as this host sees it.
    pub rootfs: PathBuf,
    /// The image the rootfs was made from (`None`: the whole tree is the delta).
    pub image: Option<ImageSource>,
    /// CRIU.
    pub criu: criu::Tool,
    /// fsync the checkpoint before its manifest (not needed when containerd copies it
    /// into its content store).
    pub durable: bool,
    /// The configuration of the store that holds the container's tree, when one
    /// does: the file delta then asks it which names changed since the image
    /// ([`crate::storage::Store::changed_since_image`]) and compares only those,
    /// instead of walking both whole trees.
    pub store: Option<Config>,
    /// A checkpoint for containerd's API: when the spec's hooks make the network
    /// (Docker's bridge), it is dumped empty and made again by them at the restore.
    #[serde(default)]
    pub network_by_hooks: bool,
}

/// The cgroup path of a container under the freezer hierarchy (v1), or the unified one.
pub fn freezer_cgroup(relative: &Path) -> PathBuf {
    let rel = relative.strip_prefix("/").unwrap_or(relative);
    let v1 = Path::new("/sys/fs/cgroup/freezer");
    if v1.is_dir() {
        v1.join(rel)
    } else {
        Path::new("/sys/fs/cgroup").join(rel)
    }
}

/// The bind mounts of a spec, as (destination, source).
pub fn bind_mounts(spec: &Spec) -> Vec<(String, PathBuf)> {
    spec.mounts()
        .iter()
        .flatten()
        .filter(|m| crate::userns::idmapped_mounts::is_bind(m))
        .filter_map(|m| {
            Some((
                m.destination().to_string_lossy().into_owned(),
                m.source().clone()?,
            ))
        })
        .collect()
}

/// The CRIU keys of `pid`'s stdio (`pipe:[1234]`), and of its terminal.
pub fn stdio_keys(pid: i32) -> Stdio {
    Stdio {
        stdin: stdio_key(pid, 0),
        stdout: stdio_key(pid, 1),
        stderr: stdio_key(pid, 2),
        tty: super::tty::of_process(pid),
    }
}

/// CRIU's dump of the container's init `pid` into `images`, frozen through the
/// freezer of the container's `cgroup` (or, for a stopped process, through its
/// `tracking` cgroup: [`criu::Dump::tracking_cgroup`]).
/// `join_held_network`: a network namespace of the container's own that an engine
/// holds and filled ([`Dumped::held_network`]) stays out of the images (a history's
/// checkpoint, which an in-place rollback restores).
#[allow(clippy::too_many_arguments)]
pub(crate) fn dump_request(
    criu: criu::Tool,
    pid: i32,
    images: PathBuf,
    leave_running: bool,
    cgroup: &Path,
    tracking: &Path,
    spec: &Spec,
    stdio: &Stdio,
    join_held_network: bool,
) -> criu::Dump {
    let mut external_mounts: Vec<String> = bind_mounts(spec).into_iter().map(|(d, _)| d).collect();
    // libcontainer's binds of the container's cgroups (not in the spec as binds).
    match crate::cgroup_view::dumped(pid, spec) {
        Ok(points) => external_mounts.extend(points),
        Err(e) => tracing::warn!(pid, error = %e, "cgroup mounts of the container"),
    }
    if stdio.tty.is_some() {
        external_mounts.push(super::tty::CONSOLE.to_string());
    }
    let mut own_network = crate::netns::owns_network_namespace(spec);
    let mut external_namespaces: Vec<_> = crate::netns::joined(spec)
        .into_iter()
        .filter_map(|(kind, key)| {
            let inode = crate::netns::inode(pid, kind)?;
            Some((kind, inode, key))
        })
        .collect();
    // Docker 28 fills the namespace the runtime made (a veth whose other end it
    // keeps) and holds it bound: CRIU cannot make that veth again, and an in-place
    // rollback must stay on Docker's network. Docker 26's hooks remake theirs.
    let held_network = (join_held_network
        && own_network
        && !super::hooks::makes_network(spec)
        && !crate::netns::only_loopback(pid))
    .then(|| crate::netns::inode(pid, "net"))
    .flatten()
    .filter(|inode| crate::netns::bound_at(*inode).is_some());
    if let Some(inode) = held_network {
        external_namespaces.push(("net", inode, crate::netns::EXTERNAL_NET_KEY.to_string()));
        own_network = false;
    }
    // A user namespace's host device binds (libcontainer cannot mknod there).
    let external_keyed = if crate::userns::in_user_namespace(spec) {
        crate::userns::dev_binds::dumped(pid).unwrap_or_else(|e| {
            tracing::warn!(pid, error = %e, "host device binds of the container");
            Vec::new()
        })
    } else {
        Vec::new()
    };
    criu::Dump {
        criu,
        pid,
        images,
        leave_running,
        freeze_cgroup: Some(freezer_cgroup(cgroup)),
        tracking_cgroup: Some(tracking.to_path_buf()),
        external_mounts,
        external_keyed,
        external_namespaces,
        terminal: stdio.tty.is_some(),
        own_network,
        empty_network: false,
        loopback_only: own_network && crate::netns::only_loopback(pid),
        held_network,
    }
}

fn stdio_key(pid: i32, fd: i32) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

impl Container {
    /// Writes a full checkpoint of the running (or paused) container into `opts.dir`,
    /// in a helper process: CRIU and tar are children there, out of reach of the
    /// shim's reaper (which would collect them before their exit status is read).
    pub fn checkpoint(&self, opts: &CheckpointOpts) -> Result<Manifest> {
        let call = Checkpoint {
            root: self.root.clone(),
            state: self.state.clone(),
            opts: opts.clone(),
        };
        self.thawed_if_it_fails(|| helper::run(|_| call, ChildStdio::default()))
    }

    /// The checkpoint itself (in the helper).
    pub(crate) fn checkpoint_here(&self, opts: &CheckpointOpts) -> Result<Manifest> {
        let status = self.status()?;
        let pid = match (status, self.lc()?.pid()) {
            (ContainerStatus::Running | ContainerStatus::Paused, Some(pid)) => pid.as_raw(),
            _ => {
                return Err(Error::WrongState {
                    id: self.id().to_string(),
                    state: format!("{status:?}").to_lowercase(),
                    operation: "checkpoint",
                })
            }
        };
        let spec = load_spec(&self.state.bundle)?;
        crate::userns::joined::refuse_process_dump(self.id(), &spec)?;
        let started = Instant::now();
        let mut timings = Timings::default();
        // The inspector's view is reset by a dump that leaves the task running.
        let keeps_running = !opts.exit;
        let freeze = Freeze::begin(self, status == ContainerStatus::Running, keeps_running)?;
        timings.freeze_ms = started.elapsed().as_millis() as u64;
        let stdio = stdio_keys(pid);
        let terminal = stdio.tty.is_some();
        // Decided once: the dump's `--empty-ns net` and the manifest that tells
        // the restore to run the hooks must agree.
        let network_by_hooks = opts.network_by_hooks && super::hooks::dumps_network_empty(&spec);
        let result = self.dump_frozen(opts, pid, &spec, &stdio, network_by_hooks, &mut timings);
        if result.is_ok() && keeps_running {
            // Still frozen: everything is in this checkpoint.
            if let Err(e) = inspect::captured(self, Kind::Full, pid) {
                tracing::warn!(id = %self.id(), error = %e, "inspector reset after checkpoint");
            }
        }
        // With `exit` the tasks are gone, but the cgroup must not stay frozen.
        freeze.end(self, true, result.is_ok() && keeps_running);
        let (fs, process_bytes, criu_files) = result?;
        let manifest = Manifest {
            version: super::VERSION,
            kind: Kind::Full,
            namespace: self.state.namespace.clone(),
            id: self.id().to_string(),
            created_ms: Manifest::now_ms(),
            stdio,
            fs: Some(fs),
            process_bytes,
            terminal,
            timings,
            criu_files,
            network_by_hooks,
            replay: None,
            journal_files: Default::default(),
        };
        let mut manifest = manifest;
        manifest.timings.total_ms = started.elapsed().as_millis() as u64;
        if let Err(e) = manifest.write(&opts.dir, opts.durable) {
            inspect::taint(self);
            return Err(e);
        }
        Ok(manifest)
    }

    fn dump_frozen(
        &self,
        opts: &CheckpointOpts,
        pid: i32,
        spec: &Spec,
        stdio: &Stdio,
        empty_network: bool,
        timings: &mut Timings,
    ) -> Result<(FsPart, u64, BTreeMap<String, u64>)> {
        // At the top of the directory, as runc's: containerd 2.x's CRI unpacks them
        // into one flat directory (CheckpointContainer).
        let images = opts.dir.clone();
        std::fs::create_dir_all(&images)
            .map_err(Error::io(format!("create {}", images.display())))?;
        let mut request = dump_request(
            opts.criu.clone(),
            pid,
            images.clone(),
            !opts.exit,
            &self.cgroup_path()?,
            &self.state.tracking_cgroup,
            spec,
            stdio,
            false,
        );
        request.empty_network = empty_network;
        // The file delta (a walk of the rootfs against the image) and CRIU's dump
        // are independent: both run while the container is frozen, side by side.
        let (fs, dumped) = std::thread::scope(|s| {
            let delta = s.spawn(|| {
                let t = Instant::now();
                (write_fs_delta(opts, self), t.elapsed())
            });
            let t = Instant::now();
            let dumped = criu::dump(&request).map(|()| t.elapsed());
            let (fs, fs_took) = delta.join().expect("the file-delta thread does not panic");
            timings.fs_ms = fs_took.as_millis() as u64;
            (fs, dumped)
        });
        timings.dump_ms = dumped?.as_millis() as u64;
        let fs = fs?;
        // The images only: the file delta and the manifest are beside them.
        let files = image_files(&images);
        Ok((fs, files.values().sum(), files))
    }

    /// The first half of a restore (containerd's `Create`): a container whose
    /// processes do not exist yet, with its tracking cgroup. Returns it, where the CRIU
    /// images are, and the manifest. Its rootfs in
    /// `opts.bundle` must already hold the checkpointed files ([`apply_fs_delta`]).
    pub fn prepare_restore(
        config: &Config,
        opts: CreateOpts,
        dir: &Path,
        take_images: bool,
    ) -> Result<(Self, PathBuf, Manifest)> {
        let manifest = Manifest::read(dir)?;
        if manifest.kind == Kind::FsOnly {
            return Err(Error::BadCheckpoint {
                path: dir.to_path_buf(),
                message: "it holds files only: there are no processes to restore".into(),
            });
        }
        load_spec(&opts.bundle)?;
        let (container, _) = Container::new_unsaved(config, &opts, Some(&manifest.id))?;
        // containerd leaves the unpacked checkpoint in place until the shim is done
        // (runc's shim restores from it at Start). Moving it is free on the same file
        // system; across file systems it is used where it is, never copied. A
        // client's own image directory (`take_images` false) is only read.
        let images = super::images_in(dir);
        if !take_images {
            return Ok((container, images, manifest));
        }
        let staged = container.dir().join("checkpoint");
        let moved = std::fs::create_dir_all(container.dir())
            .and_then(|()| std::fs::rename(&images, &staged))
            .is_ok();
        let staged = if moved { staged } else { images };
        Ok((container, staged, manifest))
    }

    /// The first half of a restore from a history (the images stay where they are):
    /// a container whose processes do not exist yet, with its tracking cgroup.
    /// `dumped_id`: the container whose history it is.
    pub fn for_restore(config: &Config, opts: CreateOpts, dumped_id: &str) -> Result<Self> {
        load_spec(&opts.bundle)?;
        let (container, _) = Container::new_unsaved(config, &opts, Some(dumped_id))?;
        std::fs::create_dir_all(container.dir())
            .map_err(Error::io(format!("create {}", container.dir().display())))?;
        Ok(container)
    }

    /// The second half (containerd's `Start`): runs CRIU in the helper, with the init's
    /// stdio on `stdio`. Returns the restored init's pid. On failure whatever CRIU left
    /// in the container's cgroup is killed: nothing half-restored keeps running.
    /// `in_place`: a rollback, whose container keeps its cgroups as they are.
    pub fn restore(
        &self,
        images: &Path,
        from: &Dumped,
        criu: &criu::Tool,
        stdio: ChildStdio,
        in_place: bool,
    ) -> Result<i32> {
        // A rollback's container has its cgroups, recorded when it was made.
        let own_cgroup = if in_place {
            Some(self.cgroup_path()?)
        } else {
            None
        };
        let make = |stdio| Restore {
            id: self.state.id.clone(),
            root: self.root.clone(),
            bundle: self.state.bundle.clone(),
            images: images.to_path_buf(),
            criu: criu.clone(),
            stdio,
            dumped: from.clone(),
            tracking: self.state.tracking_cgroup.clone(),
            standby: None,
            in_place,
            cgroup_path: own_cgroup.clone(),
        };
        match helper::run(make, stdio).and_then(|restored| {
            let p = restored.phases;
            tracing::info!(
                id = %self.state.id,
                prepare_ms = p.prepare_ms,
                criu_ms = p.criu_ms,
                finish_ms = p.finish_ms,
                "restore phases"
            );
            self.save_state()?;
            Ok(restored.pid)
        }) {
            Ok(pid) => Ok(pid),
            Err(e) => {
                let _ = self.kill(nix::sys::signal::Signal::SIGKILL, true);
                Err(e)
            }
        }
    }
}

fn write_fs_delta(opts: &CheckpointOpts, c: &Container) -> Result<FsPart> {
    let mnt = opts.dir.join(".image");
    let _mounted = match &opts.image {
        Some(image) => {
            std::fs::create_dir_all(&mnt)
                .map_err(Error::io(format!("create {}", mnt.display())))?;
            Some(image.mount_readonly(&mnt)?)
        }
        None => None,
    };
    let base = opts.image.as_ref().map(|_| mnt.as_path());
    let named = match (&opts.store, &opts.image) {
        (Some(config), Some(image)) if config.storage.backend.names_changes() => {
            changed_since_image(config, c, image)
        }
        _ => None,
    };
    let diff = match (base, named) {
        (Some(base), Some(paths)) => match fs_diff::diff_paths(base, &opts.rootfs, &paths)? {
            Some(diff) => diff,
            None => fs_diff::diff(Some(base), &opts.rootfs)?,
        },
        _ => fs_diff::diff(base, &opts.rootfs)?,
    };
    let bytes = fs_diff::write_tar(&opts.rootfs, &diff, &opts.dir.join(FS_DIFF))?;
    drop(_mounted);
    let _ = std::fs::remove_dir(&mnt);
    Ok(FsPart {
        changed: diff.changed.len(),
        deleted: diff.deleted,
        bytes,
    })
}

/// What the store says may differ from the image; `None` (walk the trees) when
/// it cannot say, or fails: the walk gives the same answer, slower.
fn changed_since_image(
    config: &Config,
    c: &Container,
    image: &ImageSource,
) -> Option<std::collections::BTreeSet<String>> {
    let op = ChangedSinceImage {
        key: c.key().ok()?,
        image: image.clone(),
    };
    match in_helper::run(config, op) {
        Ok(paths) => paths,
        Err(e) => {
            tracing::warn!(id = %c.id(), error = %e, "changed names from the store: walking the trees");
            None
        }
    }
}

/// Makes `rootfs` (a fresh tree of the image) hold the checkpoint's files (tar runs in
/// a helper process, like CRIU).
pub fn apply_fs_delta(dir: &Path, manifest: &Manifest, rootfs: &Path) -> Result<()> {
    if manifest.fs.is_none() {
        return Ok(());
    }
    let call = ApplyFsDelta {
        dir: dir.to_path_buf(),
        rootfs: rootfs.to_path_buf(),
    };
    helper::run(|_| call, ChildStdio::default())
}

/// [`apply_fs_delta`] itself (in the helper).
pub(crate) fn apply_fs_delta_here(dir: &Path, rootfs: &Path) -> Result<()> {
    let manifest = Manifest::read(dir)?;
    match &manifest.fs {
        Some(fs) => fs_diff::apply(rootfs, &fs.deleted, &dir.join(FS_DIFF)),
        None => Ok(()),
    }
}
