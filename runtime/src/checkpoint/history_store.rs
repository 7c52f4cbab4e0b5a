//! The one way to a container's checkpoint history.
//!
//! [`HistoryStore::open`] takes the container's history lock (an exclusive
//! `flock` on `<store>/<namespace>/.<id>.lock`) and holds it until the value is
//! dropped. Every reader and writer goes through it, in whichever process it runs
//! (a shim, its helper, `crabctl`): a retention that deletes snapshots and images
//! never runs beside a restore or a fork reading them, nor two checkpoints of one
//! container beside each other. containerd ids never start with a dot, so the
//! lock file cannot be taken for a history directory.
//!
//! Locks are per open file, so one process must not open the same history twice
//! at once: a second open waits for the first to be dropped.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::history::{self, create_private_dir, Entry, History};
use crate::config::Config;
use crate::storage::ContainerKey;
use crate::{Error, Result};

/// A container's history, locked while this value lives.
#[derive(Debug)]
pub struct HistoryStore {
    dir: PathBuf,
    history: History,
    _lock: File,
}

impl HistoryStore {
    /// Locks the history of `key` (waiting for another holder) and reads it (an
    /// empty one if the container has none yet).
    pub fn open(config: &Config, key: &ContainerKey) -> Result<HistoryStore> {
        let dir = history::dir(config, key);
        let lock = lock(&lock_path(config, key))?;
        let mut history = History::load(&dir, key)?;
        if super::durability::settle(&mut history, &dir)? {
            history.save(&dir)?;
        }
        Ok(HistoryStore {
            dir,
            history,
            _lock: lock,
        })
    }

    /// Whether `key` has anything on disk: a history, or the lock file of one.
    pub fn exists(config: &Config, key: &ContainerKey) -> bool {
        history::dir(config, key).exists() || lock_path(config, key).exists()
    }

    /// The directory of the container's checkpoints.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The manifest as read (and changed since).
    pub fn history(&self) -> &History {
        &self.history
    }

    /// The manifest, to change; [`HistoryStore::save`] writes it.
    pub fn history_mut(&mut self) -> &mut History {
        &mut self.history
    }

    /// The checkpoint named `name` (a name or a seq).
    pub fn find(&self, name: &str) -> Result<&Entry> {
        self.history.find(name)
    }

    /// Writes the manifest durably.
    pub fn save(&self) -> Result<()> {
        self.history.save(&self.dir)
    }

    /// Deletes the whole history: its manifest and process images, and the lock
    /// file (a later open makes a new one). The caller deletes the snapshots.
    pub fn remove(self, config: &Config, key: &ContainerKey) -> Result<()> {
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("remove {}", self.dir.display()))(e)),
        }
        // Unlinked while still locked: a waiter finds the file gone and opens anew.
        let _ = std::fs::remove_file(lock_path(config, key));
        Ok(())
    }
}

/// Where the lock of `key`'s history is.
fn lock_path(config: &Config, key: &ContainerKey) -> PathBuf {
    config
        .checkpoint
        .store
        .join(key.namespace())
        .join(format!(".{}.lock", key.id()))
}

/// Opens and locks `path`, making it if needed. A holder may unlink the file
/// (when it removes the history): the lock is then retried on the new file.
pub(crate) fn lock(path: &Path) -> Result<File> {
    if let Some(parent) = path.parent() {
        create_private_dir(parent)?;
    }
    loop {
        let file = crate::file_lock::lock(path, crate::file_lock::LockMode::Exclusive)?
            .expect("a blocking lock is always taken");
        let held = file
            .metadata()
            .map_err(Error::io(format!("stat {}", path.display())))?;
        match std::fs::metadata(path) {
            Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => return Ok(file),
            // Removed (or replaced) while this process waited: lock the new one.
            _ => continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    fn config(store: &Path) -> Config {
        let mut c = Config::default();
        c.checkpoint.store = store.to_path_buf();
        c
    }

    #[test]
    fn test_second_open_waits_for_the_first_to_be_dropped() {
        let t = tempfile::tempdir().unwrap();
        let config = config(t.path());
        let key = ContainerKey::new("ns", "c").unwrap();
        let first = HistoryStore::open(&config, &key).unwrap();
        let (tx, rx) = mpsc::channel();
        let (c2, k2) = (config.clone(), key.clone());
        let waiter = std::thread::spawn(move || {
            let second = HistoryStore::open(&c2, &k2).unwrap();
            tx.send(second.history().next_seq).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "opened while held"
        );
        drop(first);
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 1);
        waiter.join().unwrap();
    }

    #[test]
    fn test_open_after_remove_starts_a_fresh_history() {
        let t = tempfile::tempdir().unwrap();
        let config = config(t.path());
        let key = ContainerKey::new("ns", "c").unwrap();
        assert!(!HistoryStore::exists(&config, &key));
        let mut h = HistoryStore::open(&config, &key).unwrap();
        assert!(HistoryStore::exists(&config, &key), "its lock file");
        h.history_mut().next_seq = 7;
        h.save().unwrap();
        drop(h);
        assert_eq!(
            HistoryStore::open(&config, &key)
                .unwrap()
                .history()
                .next_seq,
            7
        );
        HistoryStore::open(&config, &key)
            .unwrap()
            .remove(&config, &key)
            .unwrap();
        assert!(!HistoryStore::exists(&config, &key));
        let h = HistoryStore::open(&config, &key).unwrap();
        assert_eq!(h.history().next_seq, 1);
        assert!(h.history().entries.is_empty());
    }

    #[test]
    fn test_waiter_on_a_removed_history_locks_the_new_file() {
        let t = tempfile::tempdir().unwrap();
        let config = config(t.path());
        let key = ContainerKey::new("ns", "c").unwrap();
        let first = HistoryStore::open(&config, &key).unwrap();
        let (c2, k2) = (config.clone(), key.clone());
        let waiter = std::thread::spawn(move || HistoryStore::open(&c2, &k2).unwrap());
        std::thread::sleep(Duration::from_millis(100));
        first.remove(&config, &key).unwrap();
        let second = waiter.join().unwrap();
        // The second holder's lock is on the file now in place: a third waits.
        let (tx, rx) = mpsc::channel();
        let third = std::thread::spawn(move || {
            let _h = HistoryStore::open(&config, &key).unwrap();
            tx.send(()).unwrap();
        });
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        drop(second);
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        third.join().unwrap();
    }
}
