//! A container's cgroup on a cgroup v2-only ("unified") host: where it is, and what
//! its interface files say.
//!
//! On such a host every controller lives in the one hierarchy at `/sys/fs/cgroup`,
//! and the container's own cgroup (`/sys/fs/cgroup/<cgroupsPath>`) is also the
//! cgroup id eBPF sees for its tasks, so it is the container's tracking cgroup
//! (`tracking`). Hybrid hosts (v1 controllers beside an empty cgroup2 tree) keep
//! their v1 paths; nothing here but [`favors_dynamic_moves`] and
//! [`v1_hierarchies`] is used there.
//!
//! The interface files have three shapes (the kernel's
//! `Documentation/admin-guide/cgroup-v2.rst`, "Interface Files"): flat keyed
//! (`cpu.stat`, `memory.stat`, `memory.events`: `KEY VALUE` lines), nested keyed
//! (`io.stat`: `MAJ:MIN KEY=VALUE ...` lines), and single values where `max` means
//! no limit (`memory.max`, `pids.max`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::metrics::{IoEntry, V2Metrics};
use crate::{Error, Result};

/// Where the unified hierarchy is mounted.
pub const ROOT: &str = "/sys/fs/cgroup";

/// The mount points of the host's cgroup v1 hierarchies (controllers and named
/// ones such as systemd's), by their file system's magic; none on a v2-only host.
pub(crate) fn v1_hierarchies() -> Vec<PathBuf> {
    use nix::sys::statfs::{statfs, CGROUP_SUPER_MAGIC};
    let Ok(entries) = std::fs::read_dir(ROOT) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|p| statfs(p).is_ok_and(|s| s.filesystem_type() == CGROUP_SUPER_MAGIC))
        .collect()
}

/// Whether this host has cgroup v2 alone (no v1 hierarchy): `/sys/fs/cgroup` is a
/// cgroup2 file system.
pub fn unified() -> bool {
    matches!(
        libcgroups::common::get_cgroup_setup(),
        Ok(libcgroups::common::CgroupSetup::Unified)
    )
}

/// Whether the host's cgroup2 hierarchy is mounted with `favordynmods`. Without
/// it, the first move of a process between cgroups after a quiet spell waits for
/// an RCU grace period (the kernel's `cgroup_threadgroup_rwsem` is a per-cpu
/// rwsem whose writer must wait for one): 6.5 ms measured on a 2-core host, most
/// of a standby adoption. With it the writer side stays ready (and, from Linux
/// 6.18, each thread group gets a lock of its own, which a remount cannot turn off
/// again). Read from `/proc/self/mountinfo`; false when it cannot be read.
pub fn favors_dynamic_moves() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|m| mountinfo_favors_dynmods(&m))
        .unwrap_or(false)
}

/// Whether a cgroup2 line of `mountinfo` names `favordynmods` among its super
/// block's options (the fields after ` - `: type, source, options).
fn mountinfo_favors_dynmods(mountinfo: &str) -> bool {
    mountinfo.lines().any(|line| {
        let Some((_, fs)) = line.split_once(" - ") else {
            return false;
        };
        let mut fields = fs.split_whitespace();
        fields.next() == Some("cgroup2")
            && fields
                .nth(1)
                .is_some_and(|opts| opts.split(',').any(|o| o == "favordynmods"))
    })
}

/// The directory of the cgroup at `cgroup_path` (a container's cgroupsPath,
/// relative to the hierarchy's root whether or not it starts with `/`).
pub fn dir_of(cgroup_path: &Path) -> PathBuf {
    let rel = cgroup_path.strip_prefix("/").unwrap_or(cgroup_path);
    Path::new(ROOT).join(rel)
}

/// Makes the cgroup at `dir` (below [`ROOT`]) and its missing parents, each after
/// its parent's available controllers are enabled for its children, as
/// libcgroups' v2 manager does when it makes a container's cgroup: a cgroup made
/// before gets no controller files until they are. Enabling is best effort (a
/// controller that cannot be, because a parent holds processes, is logged): the
/// limit that needs it fails when libcontainer applies it.
pub fn make_dir(dir: &Path) -> Result<()> {
    let rel = dir.strip_prefix(ROOT).map_err(|_| Error::Cgroup {
        operation: "make a cgroup",
        message: format!("{} is not below {ROOT}", dir.display()),
    })?;
    let mut current = PathBuf::from(ROOT);
    for part in rel.components() {
        enable_controllers(&current);
        current.push(part);
        match std::fs::create_dir(&current) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io(format!("create cgroup {}", current.display()))(e)),
        }
    }
    Ok(())
}

/// Enables for the children of the cgroup at `dir` every controller it has.
fn enable_controllers(dir: &Path) {
    let Ok(available) = std::fs::read_to_string(dir.join("cgroup.controllers")) else {
        return;
    };
    let enabled = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    let enabled: Vec<&str> = enabled.split_whitespace().collect();
    for c in available
        .split_whitespace()
        .filter(|c| !enabled.contains(c))
    {
        if let Err(e) = std::fs::write(dir.join("cgroup.subtree_control"), format!("+{c}")) {
            tracing::debug!(cgroup = %dir.display(), controller = c, error = %e, "enable controller");
        }
    }
}

/// `KEY VALUE` lines; lines of another shape are skipped.
pub fn parse_flat_keyed(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let key = parts.next()?;
            let value = parts.next()?.parse().ok()?;
            parts.next().is_none().then(|| (key.to_string(), value))
        })
        .collect()
}

/// A single value, or `None` for `max` (no limit).
pub fn parse_limit(text: &str) -> Option<u64> {
    match text.trim() {
        "max" => None,
        v => v.parse().ok(),
    }
}

/// `io.stat`: one entry per device, with the bytes and operations read and written.
pub fn parse_io_stat(text: &str) -> Vec<IoEntry> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let (major, minor) = parts.next()?.split_once(':')?;
            let mut entry = IoEntry {
                major: major.parse().ok()?,
                minor: minor.parse().ok()?,
                ..Default::default()
            };
            for kv in parts {
                let Some((k, v)) = kv.split_once('=') else {
                    continue;
                };
                let Ok(v) = v.parse() else { continue };
                match k {
                    "rbytes" => entry.rbytes = v,
                    "wbytes" => entry.wbytes = v,
                    "rios" => entry.rios = v,
                    "wios" => entry.wios = v,
                    _ => {}
                }
            }
            Some(entry)
        })
        .collect()
}

/// The text of `dir/name`; `None` when the file is not there (its controller is
/// not enabled for the cgroup, or the kernel is older than the file).
fn read_opt(dir: &Path, name: &str) -> Result<Option<String>> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("read {}", path.display()))(e)),
    }
}

/// A single counter; 0 when the file is not there.
fn read_value(dir: &Path, name: &str) -> Result<u64> {
    Ok(read_opt(dir, name)?
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0))
}

/// A limit; `u64::MAX` for `max`, as containerd's cgroup2 statistics give it, and 0
/// when the file is not there.
fn read_limit(dir: &Path, name: &str) -> Result<u64> {
    Ok(match read_opt(dir, name)? {
        Some(t) => parse_limit(&t).unwrap_or(u64::MAX),
        None => 0,
    })
}

fn read_flat(dir: &Path, name: &str) -> Result<BTreeMap<String, u64>> {
    Ok(read_opt(dir, name)?
        .map(|t| parse_flat_keyed(&t))
        .unwrap_or_default())
}

/// The statistics of the cgroup at `dir`. Fails when the cgroup is gone; a
/// controller that is not enabled there leaves its numbers at 0.
pub fn read_metrics(dir: &Path) -> Result<V2Metrics> {
    if !dir.join("cgroup.procs").exists() {
        return Err(Error::Cgroup {
            operation: "read v2 statistics",
            message: format!("{} is not a cgroup", dir.display()),
        });
    }
    let cpu = read_flat(dir, "cpu.stat")?;
    let cpu = |k: &str| cpu.get(k).copied().unwrap_or(0);
    let events = read_flat(dir, "memory.events")?;
    let event = |k: &str| events.get(k).copied().unwrap_or(0);
    Ok(V2Metrics {
        pids_current: read_value(dir, "pids.current")?,
        pids_limit: match read_limit(dir, "pids.max")? {
            // containerd reports no pids limit as 0.
            u64::MAX => 0,
            l => l,
        },
        cpu_usage_usec: cpu("usage_usec"),
        cpu_user_usec: cpu("user_usec"),
        cpu_system_usec: cpu("system_usec"),
        cpu_nr_periods: cpu("nr_periods"),
        cpu_nr_throttled: cpu("nr_throttled"),
        cpu_throttled_usec: cpu("throttled_usec"),
        memory_usage: read_value(dir, "memory.current")?,
        memory_limit: read_limit(dir, "memory.max")?,
        memory_max_usage: read_value(dir, "memory.peak")?,
        swap_usage: read_value(dir, "memory.swap.current")?,
        swap_limit: read_limit(dir, "memory.swap.max")?,
        memory_stat: read_flat(dir, "memory.stat")?,
        oom_low: event("low"),
        oom_high: event("high"),
        oom_max: event("max"),
        oom: event("oom"),
        oom_kill: event("oom_kill"),
        oom_group_kill: event("oom_group_kill"),
        io: read_opt(dir, "io.stat")?
            .map(|t| parse_io_stat(&t))
            .unwrap_or_default(),
    })
}

/// `oom_kill` of the cgroup at `dir`'s `memory.events`: how many of its tasks the
/// OOM killer has killed. `None` when the file cannot be read (the cgroup is gone).
pub fn oom_kills(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("memory.events")).ok()?;
    Some(
        parse_flat_keyed(&text)
            .get("oom_kill")
            .copied()
            .unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real files, as a 6.1 kernel writes them for a container's cgroup.
    const MEMORY_EVENTS: &str = "low 0\nhigh 0\nmax 37\noom 2\noom_kill 2\noom_group_kill 0\n";
    const CPU_STAT: &str = "usage_usec 18734\nuser_usec 9012\nsystem_usec 9722\n\
        core_sched.force_idle_usec 0\nnr_periods 12\nnr_throttled 3\nthrottled_usec 4511\n\
        nr_bursts 0\nburst_usec 0\n";
    const IO_STAT: &str = "254:0 rbytes=1458176 wbytes=4096 rios=64 wios=1 dbytes=0 dios=0\n\
        7:1 rbytes=8192 wbytes=0 rios=2 wios=0 dbytes=0 dios=0\n";
    const MEMORY_STAT: &str = "anon 1105920\nfile 4096\nkernel 303104\nkernel_stack 32768\n\
        pagetables 53248\nsec_pagetables 0\npercpu 0\nsock 0\nvmalloc 0\nshmem 0\n\
        file_mapped 0\nfile_dirty 0\nfile_writeback 0\nswapcached 0\nanon_thp 0\n\
        inactive_anon 1089536\nactive_anon 16384\ninactive_file 4096\nactive_file 0\n\
        unevictable 0\nslab_reclaimable 76264\nslab_unreclaimable 126808\nslab 203072\n\
        workingset_refault_anon 0\npgfault 2150\npgmajfault 0\n";

    #[test]
    fn test_memory_events_give_the_oom_kills() {
        let m = parse_flat_keyed(MEMORY_EVENTS);
        assert_eq!(m["oom_kill"], 2);
        assert_eq!(m["max"], 37);
        assert_eq!(m.len(), 6);
    }

    #[test]
    fn test_cpu_and_memory_stat_keep_every_key() {
        let cpu = parse_flat_keyed(CPU_STAT);
        assert_eq!(cpu["usage_usec"], 18734);
        assert_eq!(cpu["throttled_usec"], 4511);
        assert_eq!(cpu["core_sched.force_idle_usec"], 0);
        let mem = parse_flat_keyed(MEMORY_STAT);
        assert_eq!(mem["anon"], 1105920);
        assert_eq!(mem["slab"], 203072);
        assert_eq!(mem["pgfault"], 2150);
    }

    #[test]
    fn test_flat_keyed_skips_lines_of_another_shape() {
        let m = parse_flat_keyed("a 1\nb\nc x\nd 2 3\n\ne 4\n");
        assert_eq!(
            m.into_iter().collect::<Vec<_>>(),
            [("a".into(), 1), ("e".into(), 4)]
        );
    }

    #[test]
    fn test_io_stat_has_one_entry_per_device() {
        let io = parse_io_stat(IO_STAT);
        assert_eq!(
            io,
            [
                IoEntry {
                    major: 254,
                    minor: 0,
                    rbytes: 1458176,
                    wbytes: 4096,
                    rios: 64,
                    wios: 1
                },
                IoEntry {
                    major: 7,
                    minor: 1,
                    rbytes: 8192,
                    wbytes: 0,
                    rios: 2,
                    wios: 0
                }
            ]
        );
        assert!(parse_io_stat("").is_empty());
    }

    #[test]
    fn test_limit_max_is_none() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("33554432\n"), Some(33554432));
    }

    #[test]
    fn test_favordynmods_is_read_from_the_cgroup2_super_options() {
        let off = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
                   30 25 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,favordynmods\n";
        assert!(!mountinfo_favors_dynmods(off));
        let on = "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate,favordynmods\n";
        assert!(mountinfo_favors_dynmods(on));
        assert!(!mountinfo_favors_dynmods("garbage without a separator\n"));
    }

    #[test]
    fn test_dir_of_takes_absolute_and_relative_paths() {
        assert_eq!(
            dir_of(Path::new("/default/c1")),
            Path::new("/sys/fs/cgroup/default/c1")
        );
        assert_eq!(
            dir_of(Path::new("k8s/c")),
            Path::new("/sys/fs/cgroup/k8s/c")
        );
    }

    /// A directory with a cgroup's interface files, as the kernel lays them out.
    fn fake_cgroup(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.procs"), "1\n").unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn test_read_metrics_takes_each_file() {
        let dir = fake_cgroup(&[
            ("cpu.stat", CPU_STAT),
            ("memory.events", MEMORY_EVENTS),
            ("memory.stat", MEMORY_STAT),
            ("memory.current", "1417216\n"),
            ("memory.max", "33554432\n"),
            ("memory.peak", "2093056\n"),
            ("memory.swap.current", "0\n"),
            ("memory.swap.max", "max\n"),
            ("pids.current", "3\n"),
            ("pids.max", "max\n"),
            ("io.stat", IO_STAT),
        ]);
        let m = read_metrics(dir.path()).unwrap();
        assert_eq!(m.cpu_usage_usec, 18734);
        assert_eq!(m.cpu_nr_throttled, 3);
        assert_eq!(m.memory_usage, 1417216);
        assert_eq!(m.memory_limit, 33554432);
        assert_eq!(m.memory_max_usage, 2093056);
        assert_eq!(m.swap_limit, u64::MAX);
        assert_eq!(m.memory_stat["anon"], 1105920);
        assert_eq!((m.oom, m.oom_kill, m.oom_max), (2, 2, 37));
        assert_eq!(m.pids_current, 3);
        assert_eq!(m.pids_limit, 0);
        assert_eq!(m.io.len(), 2);
        assert_eq!(oom_kills(dir.path()), Some(2));
    }

    #[test]
    fn test_read_metrics_without_controllers_gives_zeros() {
        // The root's children before any controller is enabled for them.
        let dir = fake_cgroup(&[("cpu.stat", CPU_STAT)]);
        let m = read_metrics(dir.path()).unwrap();
        assert_eq!(m.cpu_usage_usec, 18734);
        assert_eq!((m.memory_usage, m.memory_limit, m.pids_current), (0, 0, 0));
        assert!(m.io.is_empty() && m.memory_stat.is_empty());
        assert_eq!(oom_kills(dir.path()), None);
    }

    #[test]
    fn test_read_metrics_of_a_removed_cgroup_fails() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        assert!(read_metrics(&gone).is_err());
    }
}
