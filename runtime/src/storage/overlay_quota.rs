//! The overlay store's pool quota, measured: overlay has no quota of its own on
//! most file systems, so a write past the quota is not stopped as it happens (use
//! btrfs or ZFS for that). Each snapshot counts the bytes of its copy of the upper
//! directory, which its copy walks anyway, and records them beside it; a snapshot that
//! would bring the container's upper directory and snapshots past the quota is
//! refused, so a sandbox that keeps writing stops getting checkpoints and the
//! others keep theirs.

use std::path::Path;

use super::ContainerKey;
use crate::{Error, Result};

/// A snapshot's file holding the bytes of its copy of the upper directory.
pub(super) const BYTES_FILE: &str = "bytes";

/// Bytes the snapshots in `dir` hold, from their records (one without a record,
/// made before they were kept, counts nothing).
pub(super) fn held(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join(BYTES_FILE)).ok())
        .filter_map(|t| t.trim().parse::<u64>().ok())
        .sum()
}

/// Records the bytes of the regular files in the upper directory of the snapshot
/// at `snap` (an imported one: a snapshot taken here records what its copy wrote).
pub(super) fn record(snap: &Path) -> Result<()> {
    let bytes = crate::checkpoint::dir_bytes(&snap.join("upper"));
    let file = snap.join(BYTES_FILE);
    std::fs::write(&file, bytes.to_string()).map_err(Error::io(format!("write {}", file.display())))
}

/// Refuses a snapshot of `copied` bytes when, with the live upper directory (as
/// large) and the snapshots `snapshots` holds, the container would pass `limit`.
pub(super) fn admit(
    key: &ContainerKey,
    limit: Option<u64>,
    copied: u64,
    snapshots: &Path,
) -> Result<()> {
    let Some(limit) = limit else {
        return Ok(());
    };
    let others = held(snapshots);
    let total = copied.saturating_mul(2).saturating_add(others);
    if total > limit {
        return Err(Error::QuotaExceeded {
            what: format!("snapshot of {key}"),
            quota: "quota.sandbox_pool_bytes",
            message: format!(
                "its upper directory holds {copied} bytes, so with this snapshot and the \
                 {others} bytes its other snapshots hold it would take {total} bytes of {limit}"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_records_count_toward_the_quota() {
        let t = tempfile::tempdir().unwrap();
        for (name, bytes) in [("a", "100"), ("b", "50\n")] {
            std::fs::create_dir(t.path().join(name)).unwrap();
            std::fs::write(t.path().join(name).join(BYTES_FILE), bytes).unwrap();
        }
        std::fs::create_dir(t.path().join("old")).unwrap();
        assert_eq!(held(t.path()), 150);
        let key = ContainerKey::new("ns", "c").unwrap();
        admit(&key, Some(350), 100, t.path()).unwrap();
        let e = admit(&key, Some(349), 100, t.path()).unwrap_err();
        assert!(e.to_string().contains("quota.sandbox_pool_bytes"), "{e}");
        admit(&key, None, u64::MAX, t.path()).unwrap();
    }

    #[test]
    fn an_imported_snapshots_size_is_measured_not_taken_from_the_archive() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("upper/d")).unwrap();
        std::fs::write(t.path().join("upper/d/f"), vec![1u8; 1000]).unwrap();
        std::fs::write(t.path().join("upper/g"), vec![1u8; 24]).unwrap();
        std::fs::write(t.path().join(BYTES_FILE), "0").unwrap();
        record(t.path()).unwrap();
        let text = std::fs::read_to_string(t.path().join(BYTES_FILE)).unwrap();
        assert_eq!(text, "1024");
    }
}
