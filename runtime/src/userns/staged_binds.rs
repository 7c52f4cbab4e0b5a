//! Bind mounts the runtime stages for libcontainer and CRIU: copies of their
//! sources, made by the host's root, attached where the container's root can
//! reach them for the length of a create or a restore.
//!
//! Two kinds of bind need it (and the namespace files such a container joins,
//! which libcontainer opens from inside its user namespace too):
//! - an idmapped one ([`super::idmapped_mounts`]): libcontainer 0.7 cannot
//!   make it, so it binds an idmapped copy instead;
//! - any bind of a container with a user namespace: libcontainer binds from
//!   inside that namespace, and CRIU opens a restore's external mounts from
//!   there too, where a source below a directory only the host's root may pass
//!   (containerd CRI's `/dev/shm` and `/etc/hosts` of a pod) cannot be reached.
//!   runc opens such sources from the host's side; a copy made there does the
//!   same.
//!
//! The copies are attached in `<state_dir>.idmap/<ns>/<id>/`, a directory of the
//! container root's host ids (mode 0700, below directories anyone may pass but
//! not list): while they are attached, only the host's root and the sandbox's
//! own root ids can reach them, which is what the sandbox gets anyway. They are
//! detached as soon as libcontainer or CRIU has bound them (the container keeps
//! its binds); the directory goes at delete ([`release`]). Nothing there is
//! removed recursively: a point may still hold a source.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxNamespaceType, Spec};

use super::idmapped_mounts::{self, has_option, is_bind};
use super::mount_idmap::{self, Recursion};
use super::Extent;
use crate::{Error, Result};

/// Copies of a container's bind sources attached at staging points, and the
/// spec that binds them: detached and removed when dropped.
#[derive(Debug)]
pub struct Staged {
    points: Vec<PathBuf>,
    spec: Spec,
}

impl Staged {
    /// Stages the binds of container `id` that need it (`root`: its namespace's
    /// state directory, `spec` from `bundle`); `None` when none does. Points are
    /// named by the calling process, so concurrent restores of one container (a
    /// replica made beside a rollback) do not meet.
    pub fn make(root: &Path, id: &str, bundle: &Path, spec: &Spec) -> Result<Option<Staged>> {
        let (idmapped, maps) = idmapped_mounts::checked_requests(bundle, spec)?;
        let mounts = spec.mounts().as_deref().unwrap_or(&[]);
        let staged_indexes: Vec<usize> = mounts
            .iter()
            .enumerate()
            .filter(|(i, m)| {
                idmapped.iter().any(|r| r.index == *i)
                    || (maps.is_some()
                        && is_bind(m)
                        && m.source().as_ref().is_some_and(|s| s.is_absolute()))
            })
            .map(|(i, _)| i)
            .collect();
        // libcontainer opens the namespaces to join after it joined the user
        // namespace: a pinned one below a directory of the host root's (containerd
        // 2.x's `pinned-namespaces/net`) is staged too, bound at a point.
        let staged_namespaces: Vec<usize> = match (&maps, spec.linux()) {
            (Some(_), Some(linux)) => linux
                .namespaces()
                .iter()
                .flatten()
                .enumerate()
                .filter(|(_, n)| n.typ() != LinuxNamespaceType::User && n.path().is_some())
                .map(|(i, _)| i)
                .collect(),
            _ => Vec::new(),
        };
        if staged_indexes.is_empty() && staged_namespaces.is_empty() {
            return Ok(None);
        }
        let owner = maps
            .as_ref()
            .and_then(|m| Some((m.root_uid()?, m.root_gid()?)));
        let dir = points_dir(root, id, owner)?;
        let me = std::process::id();
        let mut staged = Staged {
            points: Vec::new(),
            spec: spec.clone(),
        };
        let mut carriers: Vec<(Vec<Extent>, Vec<Extent>, OwnedFd)> = Vec::new();
        // The host's propagating mounts, read once for all the file binds.
        let mut propagating = None;
        for i in staged_indexes {
            let m = &mounts[i];
            let source = m.source().clone().unwrap_or_default();
            // What is copied (the source, or the directory of a file whose
            // mount propagates), and the name bound from the copy.
            let request = idmapped.iter().find(|r| r.index == i);
            let (copied, name) = match request.map_or_else(
                || file_in_a_propagating_mount(&source, &mut propagating),
                |_| None,
            ) {
                Some((parent, name)) => (parent, Some(name)),
                None => (source.clone(), None),
            };
            let tree = match request {
                Some(r) => {
                    let at = match carriers
                        .iter()
                        .position(|(u, g, _)| *u == r.uids && *g == r.gids)
                    {
                        Some(at) => at,
                        None => {
                            let fd = mount_idmap::carrier_namespace(&r.uids, &r.gids)?;
                            carriers.push((r.uids.clone(), r.gids.clone(), fd));
                            carriers.len() - 1
                        }
                    };
                    mount_idmap::copy_of(&source, r.how, Some(&carriers[at].2))?
                }
                None => {
                    let how = Recursion {
                        tree: name.is_none() && has_option(m, "rbind"),
                        idmap: false,
                    };
                    mount_idmap::copy_of(&copied, how, None)?
                }
            };
            let point = dir.join(format!("m{i}-{me}"));
            detach_all(&point)?;
            make_point(&point, &copied)?;
            staged.points.push(point.clone());
            mount_idmap::attach(&tree, &point)?;
            if let Some(all) = staged.spec.mounts_mut() {
                all[i].set_source(Some(match &name {
                    Some(name) => point.join(name),
                    None => point,
                }));
                idmapped_mounts::strip(&mut all[i]);
            }
        }
        for i in staged_namespaces {
            let Some(linux) = staged.spec.linux_mut() else {
                break;
            };
            let Some(n) = linux.namespaces_mut().as_mut().and_then(|v| v.get_mut(i)) else {
                continue;
            };
            let path = n.path().clone().unwrap_or_default();
            let point = dir.join(format!("ns{i}-{me}"));
            detach_all(&point)?;
            make_point(&point, Path::new("/dev/null"))?;
            staged.points.push(point.clone());
            nix::mount::mount(
                Some(&path),
                &point,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(Error::sys(format!(
                "bind the namespace {} for the container",
                path.display()
            )))?;
            n.set_path(Some(point));
        }
        Ok(Some(staged))
    }

    /// The spec whose staged binds take the staging points, plainly.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for p in &self.points {
            if let Err(e) = detach_all(p).and_then(|()| remove_one(p)) {
                tracing::warn!(point = %p.display(), error = %e, "staged bind");
            }
        }
    }
}

/// `spec` as libcontainer records it for container `id` (exec loads and checks
/// it again): without what asks for idmapped mounts, which libcontainer 0.7
/// refuses.
pub fn plain(spec: &Spec) -> Spec {
    let mut plain = spec.clone();
    for m in plain.mounts_mut().iter_mut().flatten() {
        if idmapped_mounts::asks(m) {
            idmapped_mounts::strip(m);
        }
    }
    plain
}

/// Writes `spec` as a bundle of Crab's for container `id` (`root`: its
/// namespace's state; `bundle`: containerd's, which the root file system is
/// made absolute against). Answers its directory.
pub fn write_bundle(root: &Path, id: &str, bundle: &Path, spec: &Spec) -> Result<PathBuf> {
    let mut spec = spec.clone();
    if let Some(r) = spec.root_mut() {
        if !r.path().is_absolute() {
            r.set_path(bundle.join(r.path()));
        }
    }
    let dir = bundle_dir(root, id);
    crate::checkpoint::history::create_private_dir(&dir)?;
    let file = dir.join("config.json");
    spec.save(&file).map_err(|e| Error::InvalidSpec {
        bundle: bundle.to_path_buf(),
        message: format!("write {}: {e}", file.display()),
    })?;
    Ok(dir)
}

/// The bundle libcontainer records for container `id`: containerd's own, or,
/// when its spec asks for idmapped mounts, Crab's with the [`plain`] spec.
pub fn libcontainer_bundle(root: &Path, id: &str, bundle: &Path, spec: &Spec) -> Result<PathBuf> {
    if !spec.mounts().iter().flatten().any(idmapped_mounts::asks) {
        return Ok(bundle.to_path_buf());
    }
    write_bundle(root, id, bundle, &plain(spec))
}

fn bundle_dir(root: &Path, id: &str) -> PathBuf {
    root.join(format!(".bundle-{id}"))
}

/// Where container `id`'s copies are attached (`root`: its namespace's state
/// directory `<state_dir>/<ns>`): `<state_dir>.idmap/<ns>/<id>`, made here;
/// `owner`: the host uid and gid of the container's root (`None`: the host's
/// root).
fn points_dir(root: &Path, id: &str, owner: Option<(u32, u32)>) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let mut made = points_base(root);
    for part in [
        Path::new(""),
        root.file_name().map(Path::new).unwrap_or(Path::new("_")),
    ] {
        made.push(part);
        std::fs::create_dir_all(&made).map_err(Error::io(format!("create {}", made.display())))?;
        std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o711))
            .map_err(Error::io(format!("chmod {}", made.display())))?;
    }
    let dir = made.join(id);
    crate::checkpoint::history::create_private_dir(&dir)?;
    let (uid, gid) = owner.unwrap_or((0, 0));
    std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
        .map_err(Error::io(format!("chown {}", dir.display())))?;
    Ok(dir)
}

fn points_base(root: &Path) -> PathBuf {
    let state_dir = root.parent().unwrap_or(root);
    let mut name = state_dir.as_os_str().to_owned();
    name.push(".idmap");
    PathBuf::from(name)
}

/// Removes Crab's bundle of container `id` and what its creates and restores
/// left staged (a helper killed midway): mounts detached first, then only
/// files and empty directories removed.
pub fn release(root: &Path, id: &str) -> Result<()> {
    let bundle = bundle_dir(root, id);
    remove_one(&bundle.join("config.json"))?;
    remove_one(&bundle)?;
    let points = points_base(root)
        .join(root.file_name().unwrap_or_default())
        .join(id);
    if let Ok(entries) = std::fs::read_dir(&points) {
        for e in entries.flatten() {
            detach_all(&e.path())?;
            remove_one(&e.path())?;
        }
    }
    remove_one(&points)
}

fn remove_one(path: &Path) -> Result<()> {
    let r = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
    };
    r.map_err(Error::io(format!("remove {}", path.display())))
}

/// The directory and name of `source` when it is a file in a mount that
/// propagates (shared, or a slave: Docker's `resolv.conf`, `hostname` and
/// `hosts` below its data root). Such a file is staged as a copy of its
/// directory, not of itself: a bind of it in the container is then a slave of
/// the same peer group, and a restore's CRIU, which copies that sharing from
/// the mount its source path resolves to, needs that mount's root to hold the
/// roots of all the group's binds (`MOVE_MOUNT_SET_GROUP`). A copy of each file
/// holds only itself, and the second of Docker's three files failed with
/// EINVAL. The sandbox's root sees no more for it: the copy is attached only
/// while libcontainer or CRIU binds from it, before any process of the sandbox
/// runs.
/// The source's links are resolved first, as the copy of the file itself
/// resolved them: the name bound from the copy of the directory is the file.
fn file_in_a_propagating_mount(
    source: &Path,
    propagating: &mut Option<HashSet<u64>>,
) -> Option<(PathBuf, std::ffi::OsString)> {
    let file = std::fs::canonicalize(source).ok()?;
    let meta = std::fs::metadata(&file).ok()?;
    if meta.is_dir() {
        return None;
    }
    let id = mount_id(&file)?;
    if !propagating
        .get_or_insert_with(propagating_mounts)
        .contains(&id)
    {
        return None;
    }
    Some((file.parent()?.to_path_buf(), file.file_name()?.to_owned()))
}

/// The ids of this process's mounts that are shared or slaves (their mountinfo
/// line has `shared:N` or `master:N`); none if it cannot be read.
fn propagating_mounts() -> HashSet<u64> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter(|l| {
            l.split(" - ").next().is_some_and(|head| {
                head.split(' ')
                    .skip(6)
                    .any(|f| f.starts_with("shared:") || f.starts_with("master:"))
            })
        })
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .collect()
}

/// The id of the mount holding `path` (statx's `STATX_MNT_ID`).
fn mount_id(path: &Path) -> Option<u64> {
    let c =
        std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str())).ok()?;
    // SAFETY: statx writes one `struct statx` into the zeroed local and reads the
    // NUL-terminated path for the call.
    unsafe {
        let mut st: libc::statx = std::mem::zeroed();
        let r = libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, libc::STATX_MNT_ID, &mut st);
        (r == 0 && st.stx_mask & libc::STATX_MNT_ID != 0).then_some(st.stx_mnt_id)
    }
}

/// A staging point shaped as its source: a directory, or an empty file.
fn make_point(target: &Path, source: &Path) -> Result<()> {
    let is_dir = std::fs::metadata(source)
        .map_err(Error::io(format!("stat {}", source.display())))?
        .is_dir();
    match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() == is_dir && !m.is_symlink() => return Ok(()),
        Ok(_) => remove_one(target)?,
        Err(_) => {}
    }
    let made = if is_dir {
        std::fs::create_dir(target)
    } else {
        std::fs::File::create(target).map(drop)
    };
    made.map_err(Error::io(format!("create {}", target.display())))
}

/// Detaches every mount stacked at `target`.
fn detach_all(target: &Path) -> Result<()> {
    for _ in 0..16 {
        if !is_mount_root(target) {
            return Ok(());
        }
        mount_idmap::detach(target)?;
    }
    Ok(())
}

/// Whether `path` is the root of a mount (statx's `STATX_ATTR_MOUNT_ROOT`),
/// without following a final symlink.
fn is_mount_root(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
    else {
        return false;
    };
    // SAFETY: statx writes one `struct statx` into the zeroed local and reads the
    // NUL-terminated path for the call.
    unsafe {
        let mut st: libc::statx = std::mem::zeroed();
        let r = libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            0,
            &mut st,
        );
        r == 0
            && st.stx_attributes_mask & libc::STATX_ATTR_MOUNT_ROOT as u64 != 0
            && st.stx_attributes & libc::STATX_ATTR_MOUNT_ROOT as u64 != 0
    }
}

#[cfg(all(test, feature = "host-tests"))]
mod tests {
    use super::*;
    use std::process::Command;

    fn sh(script: &str) {
        let ok = Command::new("sh")
            .arg("-c")
            .arg(script)
            .status()
            .unwrap()
            .success();
        assert!(ok, "{script}");
    }

    // Needs root (it mounts).
    #[test]
    fn a_file_in_a_shared_mount_is_staged_as_its_directory_and_a_link_to_it_as_the_file() {
        let base = std::env::temp_dir().join(format!("crab-stage-{}", std::process::id()));
        let (shared, private) = (base.join("shared"), base.join("private"));
        std::fs::create_dir_all(&shared).unwrap();
        std::fs::create_dir_all(&private).unwrap();
        sh(&format!(
            "mount -t tmpfs t {s} && mount --make-shared {s} && mount -t tmpfs t {p} && \
             mount --make-private {p} && echo h > {s}/hosts && echo r > {p}/resolv.conf && \
             mkdir {s}/dir && ln -s {s}/hosts {p}/link",
            s = shared.display(),
            p = private.display()
        ));
        let mut read = None;
        let got = file_in_a_propagating_mount(&shared.join("hosts"), &mut read);
        let via_link = file_in_a_propagating_mount(&private.join("link"), &mut read);
        let in_private = file_in_a_propagating_mount(&private.join("resolv.conf"), &mut read);
        let a_dir = file_in_a_propagating_mount(&shared.join("dir"), &mut None);
        sh(&format!(
            "umount {} {}",
            shared.display(),
            private.display()
        ));
        std::fs::remove_dir_all(&base).unwrap();
        let expected = Some((shared.clone(), std::ffi::OsString::from("hosts")));
        assert_eq!(got, expected);
        assert_eq!(via_link, expected, "the link resolved to the file it names");
        assert_eq!(
            in_private, None,
            "a private mount has no sharing to restore"
        );
        assert_eq!(a_dir, None, "a directory is staged as itself");
    }
}
