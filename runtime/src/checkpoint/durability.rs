//! When a checkpoint's process image reaches the disk.
//!
//! `[checkpoint] durability` (or a container's `io.crab.checkpoint.durability`):
//!
//! - `host` (the default): every image file is synced before the checkpoint is
//!   reported; it survives a crash of the host.
//! - `shim`: the checkpoint is reported once its images are written, which is
//!   in the kernel's page cache: they survive a crash of the shim, of CRIU, of
//!   the container (the page cache belongs to the kernel), not one of the host.
//!   A thread syncs them at once in the background and then leaves a marker
//!   (`.<seq>.synced`) beside them. The history records each image not yet known
//!   synced with the boot it was written in ([`History::unsynced`]), in the same
//!   durable save that records its entry. At the history's next open an image of
//!   this boot is synced if the thread has not done it (its shim died), and one
//!   of an earlier boot without its marker is dropped with every entry that uses
//!   it: the host went down before it was on disk, so it may be torn. A restore
//!   after a host crash then starts from the newest checkpoint that was synced.
//!
//! The sync costs about as much as writing the images again to the disk; for a
//! tree search or RL rollouts, whose checkpoints need not outlive the host, it is
//! the third of a checkpoint that `shim` takes off the critical path.

use std::path::{Path, PathBuf};

use super::history::{self, History};
use super::{sync_path, sync_tree};

/// This boot of the host (the kernel's `boot_id`); empty if the kernel does not
/// say, which makes every unsynced image an earlier boot's once one is known.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The marker left once image `seq` in the history directory `dir` is synced.
fn marker(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!(".{seq}.synced"))
}

/// The file of the lock a sync of image `seq` holds ([`lock_syncing`]).
fn syncing(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!(".{seq}.syncing"))
}

/// Syncs image `seq` of the history directory `dir` and leaves its marker.
fn sync_image(dir: &Path, seq: u64) -> crate::Result<()> {
    sync_tree(&history::image_dir(dir, seq))?;
    let m = marker(dir, seq);
    std::fs::write(&m, b"").map_err(crate::Error::io(format!("write {}", m.display())))?;
    sync_path(dir)
}

/// The lock a sync of image `seq` holds while it runs (`.<seq>.syncing`): an
/// open of the history leaves an image alone while its sync is alive, and syncs
/// it itself once the process that was to do it is gone (the kernel drops the
/// lock with it). `None` when another holds it.
fn lock_syncing(dir: &Path, seq: u64, wait: bool) -> crate::Result<Option<std::fs::File>> {
    use crate::file_lock::{lock, LockMode};
    let mode = if wait {
        LockMode::Exclusive
    } else {
        LockMode::TryExclusive
    };
    lock(&syncing(dir, seq), mode)
}

/// Syncs image `seq` under its lock, then removes the lock's file.
fn sync_locked(dir: &Path, seq: u64, lock: std::fs::File) -> crate::Result<()> {
    sync_image(dir, seq)?;
    let _ = std::fs::remove_file(syncing(dir, seq));
    drop(lock);
    Ok(())
}

/// Syncs image `seq` of `dir` in a thread of its own; the caller has recorded
/// it in [`History::unsynced`]. The sync's lock is taken before this returns, so
/// an open right after leaves the image to the thread. A failure is logged: an
/// open after the thread syncs it.
pub fn sync_in_background(dir: PathBuf, seq: u64) {
    let lock = match lock_syncing(&dir, seq, true) {
        Ok(Some(l)) => l,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(seq, error = %e, "lock the sync of a process image");
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name(format!("sync-{seq}"))
        .spawn(move || {
            if let Err(e) = sync_locked(&dir, seq, lock) {
                tracing::warn!(dir = %dir.display(), seq, error = %e,
                    "sync a process image in the background");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(seq, error = %e, "start the sync of a process image");
    }
}

/// Settles the images `history` (in `dir`) records as not yet synced (see the
/// module's docs); answers whether `history` changed and must be saved. An entry
/// dropped here goes to [`History::uncollected`]. A history with none reads
/// nothing more.
pub(crate) fn settle(history: &mut History, dir: &Path) -> crate::Result<bool> {
    if history.unsynced.is_empty() {
        return Ok(false);
    }
    settle_in(history, dir, &boot_id())
}

/// [`settle`] in boot `boot`.
fn settle_in(history: &mut History, dir: &Path, boot: &str) -> crate::Result<bool> {
    let unsynced = std::mem::take(&mut history.unsynced);
    let before = unsynced.len();
    let mut dropped = false;
    for (seq, written_in) in unsynced {
        let image = history::image_dir(dir, seq);
        if marker(dir, seq).exists() || !image.exists() {
            // Synced, or removed with its last entry.
            let _ = std::fs::remove_file(marker(dir, seq));
            continue;
        }
        if written_in == boot {
            match lock_syncing(dir, seq, false)? {
                // Its sync runs: it stays recorded until the sync has left its
                // marker.
                None => {
                    history.unsynced.insert(seq, written_in);
                }
                // Its shim died before the sync: done here, with no marker (the
                // history's save below forgets it).
                Some(lock) => {
                    sync_tree(&image)?;
                    let _ = std::fs::remove_file(syncing(dir, seq));
                    drop(lock);
                }
            }
            continue;
        }
        let torn: Vec<String> = history
            .entries
            .iter()
            .filter(|e| e.process_image == Some(seq))
            .map(|e| e.name.clone())
            .collect();
        tracing::warn!(seq, entries = ?torn,
            "a process image written in an earlier boot was never synced: its checkpoints are dropped");
        for name in torn {
            history.remove(&name)?;
            dropped = true;
        }
    }
    Ok(dropped || history.unsynced.len() != before)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::history::tests::entry;
    use crate::storage::ContainerKey;

    fn history_with_images(dir: &Path, seqs: &[u64]) -> History {
        let key = ContainerKey::new("ns", "c").unwrap();
        let mut h = History::load(dir, &key).unwrap();
        for &s in seqs {
            let mut e = entry(s, false);
            e.process_image = Some(s);
            h.entries.push(e);
            std::fs::create_dir_all(history::image_dir(dir, s)).unwrap();
            std::fs::write(history::image_dir(dir, s).join("pages-1.img"), b"p").unwrap();
        }
        h
    }

    #[test]
    fn an_image_of_an_earlier_boot_never_synced_is_dropped_with_its_entries() {
        let t = tempfile::tempdir().unwrap();
        let mut h = history_with_images(t.path(), &[1, 2]);
        // Checkpoint 3 uses image 2 (a file-system-only turn after it).
        let mut fs_only = entry(3, false);
        fs_only.process_image = Some(2);
        h.entries.push(fs_only);
        h.unsynced.insert(2, "boot-a".into());
        assert!(settle_in(&mut h, t.path(), "boot-b").unwrap());
        let left: Vec<u64> = h.entries.iter().map(|e| e.seq).collect();
        assert_eq!(left, [1], "image 1 was synced before; 2 and 3 used image 2");
        let gone: Vec<u64> = h.uncollected.iter().map(|e| e.seq).collect();
        assert_eq!(gone, [2, 3]);
        assert!(h.unsynced.is_empty());
    }

    #[test]
    fn an_image_synced_before_the_host_went_down_is_kept() {
        let t = tempfile::tempdir().unwrap();
        let mut h = history_with_images(t.path(), &[1]);
        h.unsynced.insert(1, "boot-a".into());
        sync_image(t.path(), 1).unwrap();
        assert!(settle_in(&mut h, t.path(), "boot-b").unwrap());
        assert_eq!(h.entries.len(), 1);
        assert!(h.unsynced.is_empty());
        assert!(!marker(t.path(), 1).exists(), "the marker has served");
    }

    #[test]
    fn an_image_of_this_boot_whose_sync_never_ran_is_synced_at_the_next_open() {
        let t = tempfile::tempdir().unwrap();
        let mut h = history_with_images(t.path(), &[1]);
        h.unsynced.insert(1, "boot-a".into());
        assert!(settle_in(&mut h, t.path(), "boot-a").unwrap());
        assert_eq!(h.entries.len(), 1);
        assert!(h.unsynced.is_empty());
        assert!(
            !settle_in(&mut h, t.path(), "boot-a").unwrap(),
            "nothing left"
        );
    }

    #[test]
    fn an_image_whose_sync_runs_is_left_to_it() {
        let t = tempfile::tempdir().unwrap();
        let mut h = history_with_images(t.path(), &[1]);
        h.unsynced.insert(1, "boot-a".into());
        let running = lock_syncing(t.path(), 1, true).unwrap().unwrap();
        assert!(!settle_in(&mut h, t.path(), "boot-a").unwrap());
        assert_eq!(h.unsynced.len(), 1, "still the sync's");
        assert!(!marker(t.path(), 1).exists());
        sync_locked(t.path(), 1, running).unwrap();
        assert!(settle_in(&mut h, t.path(), "boot-a").unwrap());
        assert!(h.unsynced.is_empty());
    }

    #[test]
    fn the_background_sync_leaves_its_marker() {
        let t = tempfile::tempdir().unwrap();
        let _h = history_with_images(t.path(), &[4]);
        sync_in_background(t.path().to_path_buf(), 4);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !marker(t.path(), 4).exists() {
            assert!(std::time::Instant::now() < deadline, "no marker");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn this_boot_has_an_id() {
        assert!(!boot_id().is_empty());
    }
}
