//! Remove (a snapshot no other has as parent) and Cleanup (directories no record
//! names: what a crash between a record's change and its directory's left).

use std::collections::HashSet;

use crate::error::{Error, Result};
use crate::snapshotter::{check_key, Snapshotter};

impl Snapshotter {
    /// Removes snapshot `key` and its files.
    pub fn remove(&self, key: &str) -> Result<()> {
        check_key("key", key)?;
        let mut meta = self.lock();
        if meta.has_children(key) {
            return Err(Error::FailedPrecondition(format!(
                "snapshot {key:?} is the parent of others"
            )));
        }
        let rec = meta
            .snapshots
            .remove(key)
            .ok_or_else(|| Error::NotFound(key.to_string()))?;
        if let Err(e) = self.save(&meta) {
            meta.snapshots.insert(key.to_string(), rec);
            return Err(e);
        }
        drop(meta);
        let dir = self.dir(rec.id);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            // The record is gone; Cleanup removes the directory later.
            tracing::warn!(dir = %dir.display(), error = %e, "snapshot directory left behind");
        }
        Ok(())
    }

    /// Removes the directories under `<root>/snapshots` that no record names.
    pub fn cleanup(&self) -> Result<Vec<String>> {
        let meta = self.lock();
        let known: HashSet<String> = meta.snapshots.values().map(|r| r.id.to_string()).collect();
        let dir = self.root.join("snapshots");
        let entries =
            std::fs::read_dir(&dir).map_err(Error::io(format!("read {}", dir.display())))?;
        let mut removed = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if known.contains(&name) {
                continue;
            }
            match std::fs::remove_dir_all(e.path()) {
                Ok(()) => removed.push(name),
                // A Remove that dropped its record is removing it too.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(Error::io(format!("remove {}", e.path().display()))(err)),
            }
        }
        Ok(removed)
    }
}
