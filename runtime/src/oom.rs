//! Out-of-memory notification for a container's memory cgroup (cgroup v1).
//!
//! The v1 memory controller signals OOM events through an eventfd registered in
//! `cgroup.event_control` against `memory.oom_control`. The eventfd also fires once when
//! the cgroup is removed, so a reader checks [`OomWatch::cgroup_exists`] before it reports.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::{Error, Result};

/// Root of the v1 memory hierarchy.
pub const MEMORY_V1_ROOT: &str = "/sys/fs/cgroup/memory";

impl std::os::fd::AsRawFd for OomWatch {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.event.as_raw_fd()
    }
}

/// A registered OOM watch.
#[derive(Debug)]
pub struct OomWatch {
    event: OwnedFd,
    dir: PathBuf,
}

impl OomWatch {
    /// Registers for OOM events of the memory cgroup at `cgroup_path` (relative to the
    /// v1 memory hierarchy). The returned fd is non-blocking and readable on each event.
    pub fn register(cgroup_path: &Path) -> Result<OomWatch> {
        let rel = cgroup_path.strip_prefix("/").unwrap_or(cgroup_path);
        let dir = Path::new(MEMORY_V1_ROOT).join(rel);
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
            event: efd.into(),
            dir,
        })
    }

    /// The eventfd to poll.
    pub fn fd(&self) -> &OwnedFd {
        &self.event
    }

    /// Consumes a pending event; returns how many events it counted (0 when none).
    pub fn drain(&self) -> u64 {
        let mut buf = [0u8; 8];
        match nix::unistd::read(self.event.as_raw_fd(), &mut buf) {
            Ok(8) => u64::from_ne_bytes(buf),
            _ => 0,
        }
    }

    /// Whether the memory cgroup still exists (the eventfd also fires on its removal).
    pub fn cgroup_exists(&self) -> bool {
        self.dir.join("memory.oom_control").exists()
    }
}
