//! The per-container cgroup2 "tracking" directory.
//!
//! On hybrid hosts libcgroups puts a container in v1 hierarchies only, while
//! `bpf_get_current_cgroup_id()` reports the task's cgroup in the cgroup2 (unified)
//! hierarchy. So every container also gets a directory there, with no controllers
//! enabled: its inode number is the cgroup id eBPF sees for all of the container's tasks,
//! because children inherit it. The helper process moves itself in before it forks the
//! container, so no task of the container is ever outside it.
//!
//! On cgroup v2-only hosts the container's own cgroup is its tracking cgroup
//! (see `crate::cgroup2`): made here before the helper joins it, then used as it is
//! by libcontainer's v2 manager, which enables the controllers in its parents.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// A container's tracking cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackingCgroup {
    path: PathBuf,
}

impl TrackingCgroup {
    /// The directory for `namespace`/`id` below `root` (it need not exist yet).
    pub fn new(root: &Path, namespace: &str, id: &str) -> TrackingCgroup {
        TrackingCgroup {
            path: root.join(namespace).join(id),
        }
    }

    /// Wraps an existing path.
    pub fn at(path: PathBuf) -> TrackingCgroup {
        TrackingCgroup { path }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Creates the directory (and parents); returns its cgroup id.
    pub fn create(&self) -> Result<u64> {
        std::fs::create_dir_all(&self.path).map_err(Error::io(format!(
            "create tracking cgroup {}",
            self.path.display()
        )))?;
        self.id()
    }

    /// The cgroup id: the directory's inode number.
    pub fn id(&self) -> Result<u64> {
        let md = std::fs::metadata(&self.path).map_err(Error::io(format!(
            "stat tracking cgroup {}",
            self.path.display()
        )))?;
        Ok(md.ino())
    }

    /// Moves a process into it.
    pub fn add(&self, pid: i32) -> Result<()> {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string()).map_err(Error::io(format!(
            "move pid {pid} into {}",
            self.path.display()
        )))
    }

    /// The pids of the processes in it (all of the container's processes).
    pub fn pids(&self) -> Result<Vec<i32>> {
        let text = match std::fs::read_to_string(self.path.join("cgroup.procs")) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(Error::io(format!(
                    "read {}/cgroup.procs",
                    self.path.display()
                ))(e))
            }
        };
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// Whether a process is in it or in a cgroup below it (`cgroup.events`); a
    /// cgroup that cannot be read counts as populated.
    pub fn populated(&self) -> bool {
        std::fs::read_to_string(self.path.join("cgroup.events"))
            .map(|events| !events.lines().any(|l| l.trim() == "populated 0"))
            .unwrap_or(true)
    }

    /// Waits until it holds no process, at most `within`; answers whether it is
    /// empty. A killed process ends when it next runs, which on a loaded host
    /// can take milliseconds: whoever reports the processes gone waits here.
    pub fn wait_empty(&self, within: std::time::Duration) -> Result<bool> {
        let deadline = std::time::Instant::now() + within;
        while !self.pids()?.is_empty() {
            if std::time::Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        Ok(true)
    }

    /// SIGKILLs every process in it: at once with cgroup.kill where the kernel has
    /// it (no fork escapes it), else one by one.
    pub fn kill_all(&self) -> Result<()> {
        let pids = self.pids()?;
        if pids.is_empty() {
            return Ok(());
        }
        let kill = self.path.join("cgroup.kill");
        if kill.exists() {
            return std::fs::write(&kill, "1")
                .map_err(Error::io(format!("write {}", kill.display())));
        }
        for pid in pids {
            // A process that exits meanwhile is not an error.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        Ok(())
    }

    /// Kills every process in it and removes it. Removing a directory that is
    /// already gone is not an error.
    pub fn destroy(&self) -> Result<()> {
        if !self.path.exists() {
            return Ok(());
        }
        if let Err(e) = self.kill_all() {
            tracing::warn!(cgroup = %self.path.display(), error = %e, "kill before removal");
        }
        // Killed tasks leave the cgroup asynchronously: retry rmdir for a moment.
        let mut last = None;
        for _ in 0..200 {
            match std::fs::remove_dir(&self.path) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => last = Some(e),
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Err(Error::io(format!(
            "remove tracking cgroup {}",
            self.path.display()
        ))(last.expect("retried at least once")))
    }
}
