//! Which dumped processes were stopped by a signal, recorded beside CRIU's images.
//!
//! CRIU restores such a process stopped by itself. But a restore that leaves every
//! task stopped (`--leave-stopped`: a standby replica, protection keys put back)
//! ends with Crab continuing the tree, and that must not continue a process its
//! sandbox had stopped: a shell's stopped job would run on after a rollback.
//!
//! The record comes with the images, so from another host too: it can only keep
//! processes of the restored tree stopped, which the sandbox can do itself.

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The record's name in a CRIU image directory.
pub const FILE: &str = "stopped.json";
/// Bound on what a record (possibly from another host) may name.
const MAX_PROCESSES: usize = 4096;

/// The stopped processes of one dump.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Their pids in the container's pid namespace (those CRIU restores).
    pub processes: BTreeSet<i32>,
}

/// Records, in the image directory `images`, the stopped processes `stopped`
/// (host pids, those of the dumped, frozen cgroup that [`super::stopped_among`]
/// found). Writes nothing when there is none; a process that is gone is skipped
/// (it is not in the dump either).
pub fn record(stopped: &[i32], images: &Path) -> Result<()> {
    let path = images.join(FILE);
    let _ = std::fs::remove_file(&path);
    let processes: BTreeSet<i32> = stopped
        .iter()
        .copied()
        .filter_map(crate::pkeys::namespace_pid)
        .collect();
    if processes.is_empty() {
        return Ok(());
    }
    tracing::debug!(?processes, "stopped processes recorded");
    let record = Record { processes };
    std::fs::write(&path, serde_json::to_vec(&record).expect("json"))
        .map_err(Error::io(format!("write {}", path.display())))
}

impl Record {
    /// The record in the image directory `images` (empty when the dump wrote
    /// none). One that breaks the bounds is refused whole.
    pub fn load(images: &Path) -> Result<Record> {
        let path = images.join(FILE);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Record::default()),
            Err(e) => return Err(Error::io(format!("read {}", path.display()))(e)),
        };
        let bad = |message: String| Error::BadCheckpoint {
            path: path.clone(),
            message,
        };
        let record: Record = serde_json::from_slice(&bytes)
            .map_err(|e| bad(format!("not a record of stopped processes: {e}")))?;
        if record.processes.len() > MAX_PROCESSES {
            return Err(bad(format!("{} processes", record.processes.len())));
        }
        if let Some(p) = record.processes.iter().find(|&&p| p <= 0) {
            return Err(bad(format!("pid {p}")));
        }
        Ok(record)
    }

    /// Of the restored tree's host pids `tree`, those to leave stopped.
    pub fn among(&self, tree: &[i32]) -> Vec<i32> {
        if self.processes.is_empty() {
            return Vec::new();
        }
        tree.iter()
            .copied()
            .filter(|&host| {
                crate::pkeys::namespace_pid(host).is_some_and(|ns| self.processes.contains(&ns))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_record_is_an_empty_one() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Record::load(dir.path()).unwrap(), Record::default());
        assert!(Record::default().among(&[1, 2]).is_empty());
    }

    #[test]
    fn a_record_from_elsewhere_that_breaks_the_bounds_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for text in [
            "{\"processes\":[0]}".to_string(),
            "{\"processes\":[-4]}".to_string(),
            "not json".to_string(),
            format!(
                "{{\"processes\":[{}]}}",
                (1..=MAX_PROCESSES as i32 + 1)
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        ] {
            std::fs::write(dir.path().join(FILE), text).unwrap();
            let e = Record::load(dir.path()).unwrap_err();
            assert!(matches!(e, Error::BadCheckpoint { .. }), "{e}");
        }
    }

    /// A stopped child is recorded by its pid in its namespace (here the host's,
    /// the same), a running one is not, and the record names it among a tree.
    #[test]
    fn a_stopped_process_is_recorded_and_found_again() {
        let dir = tempfile::tempdir().unwrap();
        let sleeper = crate::stopped::tests::sleeper;
        let (mut stopped, mut running) = (sleeper(), sleeper());
        let (s, r) = (stopped.id() as i32, running.id() as i32);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(s),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !super::super::process_stopped(s) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        record(&super::super::stopped_among(&[s, r]), dir.path()).unwrap();
        let loaded = Record::load(dir.path()).unwrap();
        let among = loaded.among(&[r, s]);
        for c in [&mut stopped, &mut running] {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        assert_eq!(loaded.processes, BTreeSet::from([s]));
        assert_eq!(among, vec![s]);
        record(&super::super::stopped_among(&[r]), dir.path()).unwrap();
        assert!(!dir.path().join(FILE).exists(), "none stopped, no record");
    }
}
