//! Out-of-memory notification for a container's memory cgroup, v1 or v2.
//!
//! - **v1** (hybrid and legacy hosts): the memory controller signals OOM events
//!   through an eventfd registered in `cgroup.event_control` against
//!   `memory.oom_control`. The eventfd also fires once when the cgroup is removed.
//! - **v2** (cgroup v2-only hosts): the kernel updates the cgroup's `memory.events`
//!   and notifies its watchers (inotify `IN_MODIFY`) when a count changes; an OOM
//!   kill is a growing `oom_kill`. The inotify fd also wakes when the cgroup is
//!   removed (`IN_IGNORED`).
//!
//! Either way the fd is polled, [`OomWatch::drain`] says how many OOM events it
//! brought, and a reader checks [`OomWatch::cgroup_exists`] to know that the watch
//! is over.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use crate::{Error, Result};

/// Root of the v1 memory hierarchy.
pub const MEMORY_V1_ROOT: &str = "/sys/fs/cgroup/memory";

/// A registered OOM watch.
#[derive(Debug)]
pub struct OomWatch {
    kind: Kind,
    dir: PathBuf,
}

#[derive(Debug)]
enum Kind {
    /// The eventfd registered with the v1 memory controller.
    V1(OwnedFd),
    /// An inotify watch on `memory.events`, and the `oom_kill` count last seen.
    V2 { inotify: Inotify, seen: AtomicU64 },
}

impl AsRawFd for OomWatch {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match &self.kind {
            Kind::V1(event) => event.as_raw_fd(),
            Kind::V2 { inotify, .. } => inotify.as_fd().as_raw_fd(),
        }
    }
}

impl OomWatch {
    /// Registers for OOM events of the container cgroup at `cgroup_path` (its
    /// cgroupsPath, relative to each hierarchy's root): in the unified hierarchy on
    /// a cgroup v2-only host, else in the v1 memory hierarchy. The fd to poll is
    /// non-blocking and readable on each event.
    pub fn register(cgroup_path: &Path) -> Result<OomWatch> {
        if crate::cgroup2::unified() {
            Self::register_v2(&crate::cgroup2::dir_of(cgroup_path))
        } else {
            let rel = cgroup_path.strip_prefix("/").unwrap_or(cgroup_path);
            Self::register_v1(&Path::new(MEMORY_V1_ROOT).join(rel))
        }
    }

    /// Registers with the v1 memory cgroup at `dir`.
    pub fn register_v1(dir: &Path) -> Result<OomWatch> {
        let control = std::fs::File::open(dir.join("memory.oom_control")).map_err(Error::io(
            format!("open {}/memory.oom_control", dir.display()),
        ))?;
        let efd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(Error::sys("eventfd"))?;
        let line = format!("{} {}", efd.as_fd().as_raw_fd(), control.as_raw_fd());
        std::fs::write(dir.join("cgroup.event_control"), line).map_err(Error::io(format!(
            "register OOM event in {}",
            dir.display()
        )))?;
        Ok(OomWatch {
            kind: Kind::V1(efd.into()),
            dir: dir.to_path_buf(),
        })
    }

    /// Watches the `memory.events` of the v2 cgroup at `dir`. OOM kills that
    /// happened before count as seen.
    pub fn register_v2(dir: &Path) -> Result<OomWatch> {
        let events = dir.join("memory.events");
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(Error::sys("inotify_init1"))?;
        inotify
            .add_watch(&events, AddWatchFlags::IN_MODIFY)
            .map_err(Error::sys(format!("watch {}", events.display())))?;
        // Read after the watch is in place: a kill in between is counted then.
        let seen = crate::cgroup2::oom_kills(dir).ok_or_else(|| Error::Cgroup {
            operation: "watch OOM events",
            message: format!("cannot read {}", events.display()),
        })?;
        Ok(OomWatch {
            kind: Kind::V2 {
                inotify,
                seen: AtomicU64::new(seen),
            },
            dir: dir.to_path_buf(),
        })
    }

    /// Consumes what woke the fd; returns how many OOM events it brought (0 when
    /// none: a v2 cgroup's other memory events, or its removal).
    pub fn drain(&self) -> u64 {
        match &self.kind {
            Kind::V1(event) => {
                let mut buf = [0u8; 8];
                match nix::unistd::read(event.as_raw_fd(), &mut buf) {
                    Ok(8) => u64::from_ne_bytes(buf),
                    _ => 0,
                }
            }
            Kind::V2 { inotify, seen } => {
                // Every queued event: the count is read once, after them.
                while matches!(inotify.read_events(), Ok(events) if !events.is_empty()) {}
                let Some(now) = crate::cgroup2::oom_kills(&self.dir) else {
                    return 0;
                };
                let before = seen.swap(now, Ordering::Relaxed);
                now.saturating_sub(before)
            }
        }
    }

    /// Whether the memory cgroup still exists (the fd also fires on its removal).
    pub fn cgroup_exists(&self) -> bool {
        let file = match self.kind {
            Kind::V1(_) => "memory.oom_control",
            Kind::V2 { .. } => "memory.events",
        };
        self.dir.join(file).exists()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// inotify on a plain file stands in for the kernel's notification on
    /// `memory.events`: the same watch, the same reads.
    #[test]
    fn test_v2_watch_counts_new_oom_kills_only() -> Result<()> {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("memory.events");
        let write = |oom_kill: u64| {
            std::fs::write(
                &events,
                format!("low 0\nhigh 0\nmax 9\noom 1\noom_kill {oom_kill}\noom_group_kill 0\n"),
            )
            .unwrap()
        };
        write(1);
        let watch = OomWatch::register_v2(dir.path())?;
        // Nothing new yet: the kill before the watch is not reported.
        assert_eq!(watch.drain(), 0);
        write(3);
        assert_eq!(watch.drain(), 2);
        // Another memory event that is no kill.
        write(3);
        assert_eq!(watch.drain(), 0);
        assert!(watch.cgroup_exists());
        std::fs::remove_file(&events).unwrap();
        assert_eq!(watch.drain(), 0);
        assert!(!watch.cgroup_exists());
        Ok(())
    }

    #[test]
    fn test_v2_watch_needs_memory_events() {
        let dir = tempfile::tempdir().unwrap();
        assert!(OomWatch::register_v2(dir.path()).is_err());
    }
}
