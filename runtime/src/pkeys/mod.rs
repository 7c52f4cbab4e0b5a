//! Memory protection keys, carried across a checkpoint.
//!
//! A process can tag its mappings with a protection key (`pkey_alloc`,
//! `pkey_mprotect`; x86's PKU): V8, so node and every agent written for it, keeps its
//! WebAssembly code under one and flips the thread's rights around each write. CRIU
//! restores the thread's rights register (it is part of the saved FPU state) but
//! neither which keys the process allocated nor which mappings carry them: the
//! restored process's next `pkey_mprotect` with its key fails with `EINVAL`, and V8
//! dies with "WasmCodeManager::Commit: Cannot make pre-reserved region writable" at
//! the next compile, which may be a background tier-up seconds later.
//!
//! So the dump records, beside CRIU's images, every mapping tagged with a key other
//! than 0 ([`record`]: from each process's `smaps`, while the tree is frozen), and
//! the restore, while the restored tasks are still stopped, makes each process
//! allocate those keys again and tag those mappings ([`reapply`]: a few system calls
//! run in the process under ptrace, as CRIU's own parasite does).
//!
//! The record comes with the images, so from another host too: it is only ever
//! applied to the restored tree's own processes, to mappings that exist there with
//! the same protection, and it changes nothing but their keys.

mod inject;
mod reapply;
mod record;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

pub use reapply::reapply;
pub(crate) use record::namespace_pid;
pub use record::record;

/// The record's name in a CRIU image directory.
pub const FILE: &str = "pkeys.json";

/// Keys are 4 bits on x86; 0 is every mapping's default and never recorded.
const MAX_KEY: u32 = 15;
/// Bounds on what a record (possibly from another host) may ask for.
const MAX_PROCESSES: usize = 4096;
const MAX_RANGES: usize = 65536;
const PAGE: u64 = 4096;

/// The tagged mappings of one dumped process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    /// Its pid in the container's pid namespace (the one CRIU restores).
    pub pid: i32,
    /// Its mappings tagged with a key other than 0.
    pub ranges: Vec<Range>,
}

/// One tagged mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Range {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// Its protection (`PROT_READ | PROT_WRITE | PROT_EXEC` bits).
    pub prot: u32,
    /// Its key.
    pub key: u32,
}

/// Everything recorded at one dump.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The processes with at least one tagged mapping.
    pub processes: Vec<Process>,
}

impl Record {
    /// The record in the image directory `images`, if the dump wrote one. A record
    /// that breaks the bounds is refused whole.
    pub fn load(images: &Path) -> Result<Option<Record>> {
        let path = images.join(FILE);
        let bad = |message: String| Error::BadCheckpoint {
            path: path.clone(),
            message,
        };
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(format!("read {}", path.display()))(e)),
        };
        let record: Record =
            serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a key record: {e}")))?;
        record.check().map_err(bad)?;
        Ok(Some(record))
    }

    fn check(&self) -> std::result::Result<(), String> {
        if self.processes.len() > MAX_PROCESSES {
            return Err(format!("{} processes", self.processes.len()));
        }
        let ranges: usize = self.processes.iter().map(|p| p.ranges.len()).sum();
        if ranges > MAX_RANGES {
            return Err(format!("{ranges} ranges"));
        }
        let mut pids = std::collections::HashSet::new();
        for p in &self.processes {
            if p.pid <= 0 || !pids.insert(p.pid) {
                return Err(format!("pid {} is not a process's own", p.pid));
            }
            for r in &p.ranges {
                let prot_bits = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u32;
                if r.key == 0 || r.key > MAX_KEY {
                    return Err(format!("key {} (1 to {MAX_KEY})", r.key));
                }
                if r.start >= r.end || r.start % PAGE != 0 || r.end % PAGE != 0 {
                    return Err(format!("range {:#x}-{:#x}", r.start, r.end));
                }
                if r.prot & !prot_bits != 0 {
                    return Err(format!("protection {:#x}", r.prot));
                }
            }
        }
        Ok(())
    }

    fn write(&self, images: &Path) -> Result<()> {
        let path: PathBuf = images.join(FILE);
        std::fs::write(&path, serde_json::to_vec(self).expect("json"))
            .map_err(Error::io(format!("write {}", path.display())))
    }
}

/// Whether this CPU and kernel give protection keys at all (else no process has one,
/// and the dump reads nothing).
pub fn supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        std::fs::read_to_string("/proc/cpuinfo")
            .map(|s| {
                s.lines()
                    .find(|l| l.starts_with("flags"))
                    .is_some_and(|l| l.split_whitespace().any(|w| w == "ospke"))
            })
            .unwrap_or(false)
    })
}

#[cfg(test)]
mod tests;
