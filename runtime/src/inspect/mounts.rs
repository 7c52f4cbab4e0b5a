//! Where a changed path lives: the container's mounts, seen from its init.
//!
//! The inspector reports paths as the container's tasks saw them (from their
//! root). Whether a change needs a file-system snapshot, a process dump, or
//! neither depends on the mount it falls in: the rootfs is snapshotted by the
//! storage backend; tmpfs and other internal mounts are saved by CRIU with the
//! processes; bind mounts from the host are outside the checkpoint.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// How a mount counts for a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Place {
    /// The container's rootfs: a backend snapshot holds it.
    Rootfs,
    /// tmpfs and the like inside the container: CRIU's image holds it.
    Internal,
    /// Bind-mounted from the host: not checkpointed, reported only.
    External,
    /// Kernel file systems (proc, sysfs, cgroup, devpts, mqueue), or no mount
    /// of the container at all (a memfd, say): not file state.
    Ignored,
}

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// Where it is mounted, as the container sees it.
    pub point: String,
    /// The superblock's device, kernel encoding (major << 20 | minor).
    pub dev: u32,
    /// The file system type.
    pub fstype: String,
}

const KERNEL_FS: [&str; 15] = [
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devpts",
    "mqueue",
    "securityfs",
    "debugfs",
    "tracefs",
    "bpf",
    "fusectl",
    "configfs",
    "binfmt_misc",
    "pstore",
    "nsfs",
];

/// Reads `/proc/<pid>/mountinfo`.
pub fn mounts_of(pid: i32) -> Result<Vec<Mount>> {
    let path = format!("/proc/{pid}/mountinfo");
    let text = std::fs::read_to_string(&path).map_err(Error::io(format!("read {path}")))?;
    Ok(text.lines().filter_map(parse_line).collect())
}

fn parse_line(line: &str) -> Option<Mount> {
    // id parent major:minor root point options [optional...] - fstype source super
    let fields: Vec<&str> = line.split(' ').collect();
    let (major, minor) = fields.get(2)?.split_once(':')?;
    let dash = fields.iter().position(|f| *f == "-")?;
    Some(Mount {
        point: crate::storage::adopt::unescape(fields.get(4)?),
        dev: (major.parse::<u32>().ok()? << 20) | minor.parse::<u32>().ok()?,
        fstype: fields.get(dash + 1)?.to_string(),
    })
}

/// A container's mounts, each with its [`Place`].
#[derive(Debug, Clone)]
pub struct MountMap {
    /// Longest mount point first, so the first prefix match is the right one.
    mounts: Vec<(Mount, Place)>,
}

impl MountMap {
    /// Classifies `mounts`; `binds` are the mount destinations the OCI spec
    /// declares as bind mounts (from the host).
    pub fn new(mounts: Vec<Mount>, binds: &[String]) -> MountMap {
        let mut mounts: Vec<(Mount, Place)> = mounts
            .into_iter()
            .map(|m| {
                let place = if m.point == "/" {
                    Place::Rootfs
                } else if binds.iter().any(|b| Path::new(b) == Path::new(&m.point)) {
                    Place::External
                } else if KERNEL_FS.contains(&m.fstype.as_str()) {
                    Place::Ignored
                } else {
                    Place::Internal
                };
                (m, place)
            })
            .collect();
        // Later mounts on the same point hide earlier ones: keep the last.
        let mut seen = std::collections::HashSet::new();
        mounts.reverse();
        mounts.retain(|(m, _)| seen.insert(m.point.clone()));
        mounts.sort_by_key(|(m, _)| std::cmp::Reverse(m.point.len()));
        MountMap { mounts }
    }

    /// The mounts, for a baseline's comparison.
    pub fn signature(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .mounts
            .iter()
            .map(|(m, _)| format!("{} {} {}", m.point, m.fstype, m.dev))
            .collect();
        v.sort();
        v
    }

    /// Where `path` lives. `dev` is the file's device when the kernel resolved
    /// the path from an open file (0 when the path is a syscall's argument).
    pub fn place(&self, path: &str, dev: u32) -> (Place, &str) {
        let found = self
            .mounts
            .iter()
            .find(|(m, _)| under(path, &m.point))
            .map(|(m, p)| (m, *p));
        match found {
            // A resolved path on another device than its mount's is not in
            // the container's tree (a memfd, an anonymous inode).
            Some((m, _)) if dev != 0 && m.dev != dev => {
                match self.mounts.iter().find(|(m, _)| m.dev == dev) {
                    Some((m, p)) => (*p, m.point.as_str()),
                    None => (Place::Ignored, ""),
                }
            }
            Some((m, p)) => (p, m.point.as_str()),
            None => (Place::Ignored, ""),
        }
    }
}

/// Whether `path` is `point` or below it (on a component boundary).
fn under(path: &str, point: &str) -> bool {
    if point == "/" {
        return path.starts_with('/');
    }
    path == point || (path.starts_with(point) && path.as_bytes().get(point.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(point: &str, dev: u32, fstype: &str) -> Mount {
        Mount {
            point: point.into(),
            dev,
            fstype: fstype.into(),
        }
    }

    #[test]
    fn mountinfo_lines_parse_with_their_device_and_escapes() {
        let l = "36 35 0:52 / /a\\040b rw,relatime shared:1 - tmpfs tmpfs rw";
        let got = parse_line(l).unwrap();
        assert_eq!(got, m("/a b", 52, "tmpfs"));
        let l = "22 1 8:3 / / rw - ext4 /dev/sda3 rw";
        assert_eq!(parse_line(l).unwrap().dev, (8 << 20) | 3);
    }

    #[test]
    fn the_longest_mount_point_on_a_component_boundary_wins() {
        let map = MountMap::new(
            vec![
                m("/", 1, "overlay"),
                m("/dev", 2, "tmpfs"),
                m("/dev/shm", 3, "tmpfs"),
                m("/proc", 4, "proc"),
                m("/data", 5, "ext4"),
            ],
            &["/data".to_string()],
        );
        assert_eq!(map.place("/etc/passwd", 0).0, Place::Rootfs);
        assert_eq!(map.place("/dev/shm/x", 0).0, Place::Internal);
        assert_eq!(map.place("/devices/x", 0).0, Place::Rootfs);
        assert_eq!(map.place("/proc/self/attr", 0).0, Place::Ignored);
        assert_eq!(map.place("/data/f", 0).0, Place::External);
        assert_eq!(map.place("/memfd:x (deleted)", 9).0, Place::Ignored);
        assert_eq!(map.place("/x", 3).0, Place::Internal);
    }
}
