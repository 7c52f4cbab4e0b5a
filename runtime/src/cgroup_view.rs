//! The cgroup file system a container sees, on a host with cgroup v1 hierarchies.
//!
//! Docker, Kubernetes and containerd's CRI plugin give every container a spec mount
//! of type `cgroup` at `/sys/fs/cgroup`, usually `ro`. libcontainer turns it into a
//! tmpfs with one bind per v1 hierarchy, each of the container's own cgroup, and
//! mounts them all read-write whatever the spec says. runc honours `ro`. Left
//! writable, a sandbox raises its own `memory.limit_in_bytes`, and through the
//! named `systemd` hierarchy, where libcontainer leaves the init in the host's root
//! cgroup, it sees and writes the host's whole tree (`release_agent` included).
//! This module owns the three things Crab adds:
//!
//! - [`join_systemd`]: the creating process joins the container's own cgroup of the
//!   named `systemd` hierarchy before libcontainer forks the init (as runc's
//!   cgroupfs driver does), so the bind shows that cgroup, not the host's root;
//!   [`leave_systemd`] removes it with the container.
//! - [`seal`]: after create and after restore, the whole view is made read-only in
//!   the container's mount namespace when the spec asks for `ro`.
//! - CRIU: the binds are external mounts ([`dumped`] names them for the dump,
//!   [`restored`] gives the restored container's own cgroups as their sources).
//!   Without that CRIU refuses the dump ("doesn't have a proper root mount").

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use oci_spec::runtime::Spec;

use crate::{Error, Result};

/// Where the host mounts its cgroup hierarchies.
const HOST_ROOT: &str = "/sys/fs/cgroup";
/// The named hierarchy systemd hosts (and this kind of hybrid host) mount.
const SYSTEMD: &str = "systemd";

/// The spec's cgroup mount: (its destination, whether it asks for read-only).
pub fn spec_mount(spec: &Spec) -> Option<(PathBuf, bool)> {
    spec.mounts().iter().flatten().find_map(|m| {
        let typ = m.typ().as_deref()?;
        if typ != "cgroup" && typ != "cgroup2" {
            return None;
        }
        let ro = m.options().iter().flatten().any(|o| o == "ro");
        Some((m.destination().clone(), ro))
    })
}

/// One line of a mountinfo table: the fields this module reads.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountLine {
    /// The mount point, as the reading process sees it.
    point: String,
    /// The file-system type.
    fstype: String,
}

/// Parses a mountinfo table (proc(5)): the mount point is field 5, the type the
/// first field after the ` - ` separator. Octal escapes (`\040`) are decoded.
fn mountinfo(text: &str) -> Vec<MountLine> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let point = left.split(' ').nth(4)?;
            let fstype = right.split(' ').next()?;
            Some(MountLine {
                point: crate::storage::adopt::unescape(point),
                fstype: fstype.to_string(),
            })
        })
        .collect()
}

fn is_cgroup(fstype: &str) -> bool {
    fstype == "cgroup" || fstype == "cgroup2"
}

/// The cgroup mounts at or below `dest` in a mountinfo table.
fn cgroup_points(table: &str, dest: &Path) -> Vec<String> {
    mountinfo(table)
        .into_iter()
        .filter(|m| is_cgroup(&m.fstype) && Path::new(&m.point).starts_with(dest))
        .map(|m| m.point)
        .collect()
}

/// The cgroup mounts of `pid`'s view under the spec's cgroup mount: CRIU must be
/// told they are external.
pub fn dumped(pid: i32, spec: &Spec) -> Result<Vec<String>> {
    let Some((dest, _)) = spec_mount(spec) else {
        return Ok(Vec::new());
    };
    let path = format!("/proc/{pid}/mountinfo");
    let table = std::fs::read_to_string(&path).map_err(Error::io(format!("read {path}")))?;
    Ok(cgroup_points(&table, &dest))
}

/// The external cgroup mounts of a restore, for the calling process, which has
/// joined the restored container's cgroups: (mount point inside the container,
/// that cgroup's directory on this host). They are what libcontainer binds at
/// create: one per v1 hierarchy of this host, or the unified tree on a v2-only host.
///
/// A standby replica's restore (`standby`: what its cgroups add to the
/// container's names, [`crate::standby::cgroup_path`]) joins cgroups beside the
/// container's, which are removed once it is adopted: its view shows the
/// container's own cgroups instead, where its processes move at adoption. A bind
/// of the standby's would show an empty directory from then on.
pub fn restored(spec: &Spec, standby: Option<&str>) -> Result<Vec<(String, PathBuf)>> {
    let Some((dest, _)) = spec_mount(spec) else {
        return Ok(Vec::new());
    };
    let read =
        |path: &str| std::fs::read_to_string(path).map_err(Error::io(format!("read {path}")));
    let (table, own) = (read("/proc/self/mountinfo")?, read("/proc/self/cgroup")?);
    let host: Vec<String> = mountinfo(&table)
        .into_iter()
        .filter(|m| m.fstype == "cgroup")
        .filter_map(|m| {
            let rel = Path::new(&m.point).strip_prefix(HOST_ROOT).ok()?;
            let name = rel.to_str()?;
            (!name.is_empty() && !name.contains('/')).then(|| name.to_string())
        })
        .collect();
    let viewed = |name: &str| {
        let path = own_path(&own, name).ok_or_else(|| missing_hierarchy(name))?;
        Ok::<_, Error>(container_path(path, standby))
    };
    if host.is_empty() {
        // A v2-only host: the unified tree is mounted at `dest` itself.
        let path = viewed("")?;
        let source = Path::new(HOST_ROOT).join(path.trim_start_matches('/'));
        return Ok(vec![(dest.to_string_lossy().into_owned(), source)]);
    }
    host.into_iter()
        .map(|name| {
            let path = viewed(&name)?;
            let source = Path::new(HOST_ROOT)
                .join(&name)
                .join(path.trim_start_matches('/'));
            Ok((dest.join(&name).to_string_lossy().into_owned(), source))
        })
        .collect()
}

/// The container's own cgroup path from the restoring process's `path`: the same,
/// or without the standby's `suffix` it ends with.
fn container_path(path: String, standby: Option<&str>) -> String {
    match standby.and_then(|s| path.strip_suffix(s)) {
        Some(own) => own.to_string(),
        None => path,
    }
}

fn missing_hierarchy(name: &str) -> Error {
    Error::Cgroup {
        operation: "find the restored container's cgroups",
        message: format!("this process is in no cgroup of the {name} hierarchy"),
    }
}

/// The calling process's path in the hierarchy mounted at `<HOST_ROOT>/<name>`, from
/// its /proc/self/cgroup (`id:controllers:path`): `name` is the controllers as
/// mounted (`cpu,cpuacct`), a named hierarchy's name, or "" for the unified one.
fn own_path(table: &str, name: &str) -> Option<String> {
    table.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = if name.is_empty() {
            id == "0" && controllers.is_empty()
        } else {
            controllers == name || controllers.strip_prefix("name=") == Some(name)
        };
        matches.then(|| path.to_string())
    })
}

/// The container's own directory in the host's named systemd hierarchy, if the host
/// mounts one (cgroup v1 or hybrid).
fn systemd_dir(cgroup_path: &Path) -> Option<PathBuf> {
    let root = Path::new(HOST_ROOT).join(SYSTEMD);
    if !root.join("cgroup.procs").exists() {
        return None;
    }
    let rel = cgroup_path.strip_prefix("/").unwrap_or(cgroup_path);
    Some(root.join(rel))
}

/// Moves the calling (single-threaded) process into the container's own cgroup of
/// the named systemd hierarchy, creating it; the init it forks inherits it.
pub fn join_systemd(cgroup_path: &Path) -> Result<()> {
    let Some(dir) = systemd_dir(cgroup_path) else {
        return Ok(());
    };
    if cgroup_path
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        return Err(Error::Cgroup {
            operation: "join the systemd hierarchy",
            message: format!("cgroup path {} climbs with ..", cgroup_path.display()),
        });
    }
    std::fs::create_dir_all(&dir).map_err(Error::io(format!("create {}", dir.display())))?;
    let procs = dir.join("cgroup.procs");
    std::fs::write(&procs, std::process::id().to_string())
        .map_err(Error::io(format!("write {}", procs.display())))
}

/// Removes the container's cgroup of the named systemd hierarchy (its tasks are
/// gone). Its parents may hold other containers: they stay, as runc leaves them.
pub fn leave_systemd(cgroup_path: &Path) {
    let Some(dir) = systemd_dir(cgroup_path) else {
        return;
    };
    if dir == Path::new(HOST_ROOT).join(SYSTEMD) {
        return;
    }
    match std::fs::remove_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "remove systemd cgroup"),
    }
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;

/// Makes the container's cgroup view read-only, when its spec asks for it, in the
/// mount namespace of `pid` (the container's init). The calling process must be
/// single-threaded: it stays in that namespace (the helper ends after its request).
pub fn seal(pid: i32, spec: &Spec) -> Result<()> {
    let Some((dest, true)) = spec_mount(spec) else {
        return Ok(());
    };
    let ns = format!("/proc/{pid}/ns/mnt");
    let file = File::open(&ns).map_err(Error::io(format!("open {ns}")))?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(Error::sys(format!("setns {ns}")))?;
    // The namespace's root is now the container's: walk to the destination without
    // following any symlink, and never above that root.
    let root = File::open("/").map_err(Error::io("open the container's root"))?;
    let rel = dest.strip_prefix("/").unwrap_or(&dest);
    let target = crate::checkpoint::beneath::open(
        std::os::fd::AsFd::as_fd(&root),
        std::os::unix::ffi::OsStrExt::as_bytes(rel.as_os_str()),
        libc::O_PATH | libc::O_DIRECTORY,
        0,
    )
    .map_err(Error::io(format!(
        "open {} in the container",
        rel.display()
    )))?;
    let attr = crate::userns::mount_idmap::MountAttr {
        attr_set: MOUNT_ATTR_RDONLY,
        ..Default::default()
    };
    crate::userns::mount_idmap::mount_setattr(target.as_fd(), &attr, true).map_err(Error::io(
        format!("make {} read-only in the container", dest.display()),
    ))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
113 111 0:136 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=755
114 113 0:29 /crab/c /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
122 113 0:37 /crab/c /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
130 111 0:40 / /sys/fs/cgroup2 rw - cgroup2 cgroup2 rw
131 111 0:41 / /mnt/a\\040b rw - cgroup cgroup rw,pids
";

    #[test]
    fn the_cgroup_mounts_below_the_destination_are_external_and_the_tmpfs_is_not() {
        assert_eq!(
            cgroup_points(TABLE, Path::new("/sys/fs/cgroup")),
            ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/systemd"]
        );
    }

    #[test]
    fn mount_points_with_escaped_spaces_are_decoded() {
        assert_eq!(cgroup_points(TABLE, Path::new("/mnt")), ["/mnt/a b"]);
    }

    #[test]
    fn own_paths_are_found_by_controllers_by_name_and_for_the_unified_tree() {
        let own = "9:name=systemd:/crab/c\n2:cpu,cpuacct:/crab/c2\n1:pids:/p\n0::/u\n";
        assert_eq!(own_path(own, "systemd").as_deref(), Some("/crab/c"));
        assert_eq!(own_path(own, "cpu,cpuacct").as_deref(), Some("/crab/c2"));
        assert_eq!(own_path(own, "pids").as_deref(), Some("/p"));
        assert_eq!(own_path(own, "").as_deref(), Some("/u"));
        assert_eq!(own_path(own, "memory"), None);
    }

    #[test]
    fn a_standbys_view_shows_the_containers_own_cgroup_it_moves_to_at_adoption() {
        let standby = "/crab/web@standby-41-3";
        assert_eq!(
            container_path(standby.into(), Some("@standby-41-3")),
            "/crab/web"
        );
        // A plain restore's view is the cgroup it joined.
        assert_eq!(container_path("/crab/web".into(), None), "/crab/web");
        assert_eq!(
            container_path("/crab/web".into(), Some("@standby-41-3")),
            "/crab/web"
        );
    }

    #[test]
    fn the_spec_mount_says_where_and_whether_read_only() {
        let spec: Spec = serde_json::from_value(serde_json::json!({
            "ociVersion": "1.0.2",
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                 "options": ["nosuid", "ro"]}
            ]
        }))
        .unwrap();
        assert_eq!(
            spec_mount(&spec),
            Some((PathBuf::from("/sys/fs/cgroup"), true))
        );
        let none: Spec = serde_json::from_value(serde_json::json!({
            "ociVersion": "1.0.2", "mounts": []
        }))
        .unwrap();
        assert_eq!(spec_mount(&none), None);
    }
}
