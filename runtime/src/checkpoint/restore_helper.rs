//! The helper's side of a restore: runs in the single-threaded helper process.
//!
//! It joins the container's cgroups (the tracking cgroup2 directory and the v1
//! hierarchies the spec names, with its resources applied) before it runs CRIU, so that
//! the restored tasks are born in them; CRIU restores the root task as the helper's
//! child, which becomes the shim's (a subreaper) when the helper exits. Then it brings
//! the restored network namespace's loopback up and writes libcontainer's state, so
//! that kill, pause, exec, stats and delete work on the restored container as on any.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use libcgroups::common::CgroupManager;
use libcontainer::config::YoukiConfig;
use libcontainer::container::{Container as LcContainer, ContainerStatus};
use serde::{Deserialize, Serialize};

use super::engine::bind_mounts;
use crate::container::load_spec;
use crate::helper::{inherited_or_null, Call, Request, StdioFds};
use crate::tracking::TrackingCgroup;
use crate::{criu, netns, Error, Result};

/// Where a restore's time went, in ms (logged by the shim: a restore's cost
/// is mostly CRIU's, and the rest must stay small).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct RestorePhases {
    /// Cgroups joined, images checked, stdio and mounts prepared.
    pub prepare_ms: u64,
    /// CRIU's restore.
    pub criu_ms: u64,
    /// State saved, loopback up.
    pub finish_ms: u64,
}

/// Restore a container's processes from CRIU images (see [`crate::checkpoint`]);
/// answers the restored init's pid and where the time went.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Restore {
    /// Container id.
    pub id: String,
    /// libcontainer's state root.
    pub root: PathBuf,
    /// The OCI bundle, its rootfs already holding the checkpointed files.
    pub bundle: PathBuf,
    /// The CRIU images.
    pub images: PathBuf,
    /// CRIU.
    pub criu: criu::Tool,
    /// New stdio for the restored init.
    pub stdio: StdioFds,
    /// What the restore needs to know about the dumped container.
    pub dumped: super::engine::Dumped,
    /// The tracking cgroup to join first.
    pub tracking: PathBuf,
    /// A standby replica (`crate::standby`): the processes are restored into its
    /// tree, stopped, in the cgroups beside the container's
    /// ([`crate::standby::cgroup_path`]; `tracking` is the standby's), and
    /// libcontainer's state is left as it is, the container's own processes
    /// running on.
    #[serde(default)]
    pub standby: Option<crate::standby::Target>,
    /// A rollback in place: the container's cgroups, where they are all still
    /// there, are joined as they are (the limits it runs under, its spec's or an
    /// update's since) rather than given the spec's resources again.
    #[serde(default)]
    pub in_place: bool,
    /// The container's own cgroup path, for a container that has one already
    /// (a rollback in place, a replica of a live container): its libcontainer
    /// state's, which its spec need not name (a fork's spec is its source's, a
    /// copy restored by containerd names the checkpointed container). `None`: a
    /// new container, whose path comes from its spec ([`own_cgroup_path`]).
    #[serde(default)]
    pub cgroup_path: Option<PathBuf>,
}

/// What a [`Restore`] answers.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Restored {
    /// The restored init's host pid.
    pub pid: i32,
    /// Where the time went.
    pub phases: RestorePhases,
}

crate::helper::travels_as!(Request: Restore => Restore);

impl Call for Restore {
    type Reply = Restored;
    const OPERATION: &'static str = "restore container";

    fn stdio(&self) -> StdioFds {
        self.stdio
    }

    fn serve(self) -> Result<Restored> {
        serve(self)
    }
}

/// Restores the container `call` names.
fn serve(call: Restore) -> Result<Restored> {
    let started = std::time::Instant::now();
    let ms = |t: std::time::Instant| t.elapsed().as_millis() as u64;
    let Restore {
        id,
        root,
        bundle,
        images,
        criu: criu_bin,
        stdio,
        dumped,
        tracking,
        standby: target,
        in_place,
        cgroup_path: recorded,
    } = call;
    let standby = target.is_some();
    TrackingCgroup::at(tracking).add(std::process::id() as i32)?;
    let spec = load_spec(&bundle)?;
    let mut youki = YoukiConfig::from_spec(&spec, &id).map_err(|e| Error::InvalidSpec {
        bundle: bundle.clone(),
        message: e.to_string(),
    })?;
    youki.cgroup_path = match recorded {
        Some(path) => path,
        None => own_cgroup_path(&youki.cgroup_path, &dumped.id, &id),
    };
    let cgroup_path = match &target {
        Some(t) => crate::standby::cgroup_path(&youki.cgroup_path, &t.suffix),
        None => youki.cgroup_path.clone(),
    };
    super::engine::verify_images(&images, &dumped.files)?;
    // A rollback's container keeps its cgroups: joining them is a write per
    // hierarchy, where libcgroups' manager reads the mount table per controller.
    let own = in_place && dumped.id == id && !standby;
    match existing_cgroup(&cgroup_path).filter(|_| own) {
        Some(procs) => join_existing(&procs)?,
        None => join_cgroups(&id, &cgroup_path, &spec)?,
    }
    crate::cgroup_view::join_systemd(&cgroup_path)?;

    // The new pipes replace the dumped ones, by CRIU's key. A key seen twice (fd 2
    // duplicated from fd 1) is inherited once. A dumped terminal is replaced by the
    // new pty slave the shim passed as stdin (see `super::tty`).
    let fds: Vec<OwnedFd> = [stdio.stdin, stdio.stdout, stdio.stderr]
        .into_iter()
        .map(inherited_or_null)
        .collect::<Result<_>>()?;
    let mut inherit: Vec<(RawFd, String)> = Vec::new();
    let keys = &dumped.stdio;
    for (key, fd) in [&keys.stdin, &keys.stdout, &keys.stderr]
        .into_iter()
        .zip(&fds)
    {
        if let Some(key) = key.as_ref().filter(|k| k.starts_with("pipe:")) {
            if !inherit.iter().any(|(_, k)| k == key) {
                clear_cloexec(fd.as_raw_fd())?;
                inherit.push((fd.as_raw_fd(), key.clone()));
            }
        }
    }
    // Joined namespaces (a pod's network) are handed to CRIU by the dump's key.
    let joined: Vec<(OwnedFd, String)> = netns::joined_paths(&spec)
        .into_iter()
        .map(|(_, key, path)| {
            let file = std::fs::File::open(&path)
                .map_err(Error::io(format!("open namespace {}", path.display())))?;
            Ok((OwnedFd::from(file), key))
        })
        .collect::<Result<_>>()?;
    // The engine's namespace (Docker 28's), where the engine still holds it; only
    // the same container joins it (a fork or a copy would share its network).
    let mut joined = joined;
    if let Some(inode) = dumped.held_network {
        let refuse = |message: String| Error::Helper {
            operation: Restore::OPERATION,
            message,
        };
        if dumped.id != id {
            return Err(refuse(format!(
                "the checkpoint of {} is on the network namespace its engine made \
                 (net:[{inode}]): only {} itself is restored onto it",
                dumped.id, dumped.id
            )));
        }
        let path = netns::bound_at(inode).ok_or_else(|| {
            refuse(format!(
                "the network namespace net:[{inode}] its engine held is gone \
                 (the container was removed or restarted)"
            ))
        })?;
        let file = std::fs::File::open(&path)
            .map_err(Error::io(format!("open namespace {}", path.display())))?;
        joined.push((OwnedFd::from(file), netns::EXTERNAL_NET_KEY.to_string()));
    }
    for (fd, key) in &joined {
        clear_cloexec(fd.as_raw_fd())?;
        inherit.push((fd.as_raw_fd(), key.clone()));
    }
    // Binds staged for CRIU (idmapped ones, and those of a container with a
    // user namespace, which CRIU opens from inside it), detached once it is done.
    let staged = crate::userns::staged_binds::Staged::make(&root, &id, &bundle, &spec)?;
    let mut external_mounts = bind_mounts(staged.as_ref().map_or(&spec, |s| s.spec()));
    let strips = target.as_ref().and_then(|t| t.view_strips());
    external_mounts.extend(crate::cgroup_view::restored(&spec, strips)?);
    if crate::userns::in_user_namespace(&spec) {
        external_mounts.extend(crate::userns::dev_binds::restored(&spec));
    }
    if let Some(tty) = &dumped.stdio.tty {
        let slave = &fds[0];
        clear_cloexec(slave.as_raw_fd())?;
        inherit.push((slave.as_raw_fd(), tty.clone()));
        // /dev/console was the old slave bound in: the new one is bound there instead.
        let path = std::fs::read_link(format!("/proc/self/fd/{}", slave.as_raw_fd()))
            .map_err(Error::io("find the new terminal's path"))?;
        if !path.starts_with("/dev/pts/") {
            return Err(Error::Helper {
                operation: Restore::OPERATION,
                message: format!(
                    "the checkpoint has a terminal, but stdin is {} and not a pty",
                    path.display()
                ),
            });
        }
        external_mounts.push((super::tty::CONSOLE.to_string(), path));
    }
    let dir = match &target {
        Some(t) => crate::standby::work_dir(&root, &id, &t.suffix),
        None => root.join(&id),
    };
    let rootfs = match (target, spec.root().as_ref().map(|r| r.path().clone())) {
        (Some(t), _) => t.rootfs,
        (None, Some(p)) if p.is_absolute() => p,
        (None, Some(p)) => bundle.join(p),
        (None, None) => bundle.join("rootfs"),
    };

    std::fs::create_dir_all(&dir).map_err(Error::io(format!("create {}", dir.display())))?;
    let prepare_ms = ms(started);
    let criu_started = std::time::Instant::now();
    let maps = crate::userns::check_bundle(&bundle, &spec)?;
    if let Some(maps) = &maps {
        let changed = crate::userns::images::hand_to_namespace_root(&images, maps)?;
        tracing::debug!(changed, "images handed to the user namespace's root");
    }
    // The processes' protection keys are put back before any of them runs.
    let keys = crate::pkeys::Record::load(&images)?;
    let stopped = crate::stopped::Record::load(&images)?;
    let pid = criu::restore(&criu::Restore {
        criu: criu_bin,
        images,
        work: dir.clone(),
        root: rootfs,
        pidfile: dir.join("restored.pid"),
        inherit,
        external_mounts,
        network_by_hooks: dumped.network_by_hooks.then(|| {
            let exe =
                std::fs::read_link("/proc/self/exe").unwrap_or_else(|_| "/proc/self/exe".into());
            super::hooks::action_script(&exe, &bundle, &id)
        }),
        mount_compat: dumped.foreign_mounts,
        leave_stopped: standby || keys.is_some(),
    })?;
    drop(fds);
    drop(joined);
    drop(staged);
    // CRIU made the user namespace from the images: it must be the spec's (the
    // caller kills what was restored when this fails).
    crate::userns::restored::verify(pid, maps.as_ref())?;
    if let Some(keys) = &keys {
        let tree = crate::pkeys::reapply(keys, pid)?;
        if !standby {
            crate::resume::continue_processes(&tree, &stopped);
        }
    }
    let criu_ms = ms(criu_started);
    let finish_started = std::time::Instant::now();
    if !standby {
        let lc_bundle =
            crate::userns::staged_binds::libcontainer_bundle(&root, &id, &bundle, &spec)?;
        save_state(&id, pid, &lc_bundle, &dir, &youki)?;
    }
    if netns::owns_network_namespace(&spec) {
        netns::loopback_up(pid)?;
    }
    // Last: the helper stays in the container's mount namespace.
    crate::cgroup_view::seal(pid, &spec)?;
    Ok(Restored {
        pid,
        phases: RestorePhases {
            prepare_ms,
            criu_ms,
            finish_ms: ms(finish_started),
        },
    })
}

/// Records the restored container in libcontainer's state, so that kill, pause,
/// exec, stats and delete work on it as on any.
pub(crate) fn save_state(
    id: &str,
    pid: i32,
    bundle: &Path,
    dir: &Path,
    youki: &YoukiConfig,
) -> Result<()> {
    let mut lc = LcContainer::new(id, ContainerStatus::Running, Some(pid), bundle, dir)
        .map_err(Error::libcontainer("record restored container"))?;
    lc.set_systemd(false);
    lc.save()
        .map_err(Error::libcontainer("save restored container"))?;
    youki.save(dir).map_err(|e| Error::Io {
        context: format!("save {}", dir.display()),
        source: std::io::Error::other(e.to_string()),
    })
}

/// The `cgroup.procs` files of the cgroup `path` in every hierarchy a container's
/// cgroups are made in (v1's controller hierarchies, or the one v2 tree); `None`
/// when one lacks it. The named `systemd` hierarchy (joined by
/// [`crate::cgroup_view::join_systemd`]) is not the container manager's, and is
/// left out.
fn existing_cgroup(path: &Path) -> Option<Vec<PathBuf>> {
    let rel = path.strip_prefix("/").unwrap_or(path);
    let procs_in = |base: &Path| {
        let f = base.join(rel).join("cgroup.procs");
        f.is_file().then_some(f)
    };
    if crate::cgroup2::unified() {
        return procs_in(Path::new(crate::cgroup2::ROOT)).map(|f| vec![f]);
    }
    let files = crate::cgroup2::v1_hierarchies()
        .into_iter()
        .filter(|h| !h.ends_with("systemd"))
        .map(|h| procs_in(&h))
        .collect::<Option<Vec<_>>>()?;
    (!files.is_empty()).then_some(files)
}

/// Moves this process into the cgroups whose `cgroup.procs` files are `procs`.
fn join_existing(procs: &[PathBuf]) -> Result<()> {
    let me = std::process::id().to_string();
    for f in procs {
        std::fs::write(f, &me).map_err(Error::io(format!("join {}", f.display())))?;
    }
    Ok(())
}

/// Makes the container's cgroups at `path` (libcgroups' manager), joins them and
/// applies the spec's resources.
fn join_cgroups(id: &str, path: &Path, spec: &oci_spec::runtime::Spec) -> Result<()> {
    let cgroup_err = |operation: &'static str| {
        move |e: libcgroups::common::AnyManagerError| Error::Cgroup {
            operation,
            message: e.to_string(),
        }
    };
    let manager = crate::container::cgroup_manager_at(id, path)?;
    manager
        .add_task(nix::unistd::Pid::this())
        .map_err(cgroup_err("join the container's cgroups"))?;
    crate::container::apply_resources(&manager, spec)
}

/// containerd restores the checkpointed spec, whose cgroups path names the
/// checkpointed container (`/<namespace>/<old id>`), which may still be running: the
/// restored container gets its own (`/<namespace>/<new id>`), so that pausing or
/// deleting one never touches the other.
pub fn own_cgroup_path(path: &Path, dumped_id: &str, id: &str) -> PathBuf {
    if dumped_id != id && path.file_name().is_some_and(|n| n == dumped_id) {
        path.with_file_name(id)
    } else {
        path.to_path_buf()
    }
}

fn clear_cloexec(fd: RawFd) -> Result<()> {
    // SAFETY: fcntl on an fd this process owns; no memory is passed.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } < 0 {
        return Err(Error::sys("clear CLOEXEC")(nix::Error::last()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_copy_gets_a_cgroup_of_its_own() {
        let p = Path::new("/crab/web");
        assert_eq!(own_cgroup_path(p, "web", "web-2"), Path::new("/crab/web-2"));
        assert_eq!(own_cgroup_path(p, "web", "web"), p);
        assert_eq!(
            own_cgroup_path(Path::new("/custom/x"), "web", "web-2"),
            Path::new("/custom/x")
        );
    }
}
