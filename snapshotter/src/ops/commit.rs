//! Commit: an active snapshot becomes a committed layer under a new name, with its
//! usage measured once.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crab_runtime::storage::du::disk_usage;

use crate::error::{Error, Result};
use crate::meta::{Kind, Measured};
use crate::snapshotter::{check_key, Snapshotter};

impl Snapshotter {
    /// Commits active snapshot `key` as `name`.
    pub fn commit(&self, name: &str, key: &str, labels: BTreeMap<String, String>) -> Result<()> {
        check_key("name", name)?;
        check_key("key", key)?;
        let mut meta = self.lock();
        let rec = meta.get(key)?.clone();
        if rec.kind != Kind::Active {
            return Err(Error::FailedPrecondition(format!(
                "snapshot {key:?} is not active"
            )));
        }
        if meta.snapshots.contains_key(name) {
            return Err(Error::AlreadyExists(name.to_string()));
        }
        let du = disk_usage(&self.fs(rec.id)).map_err(|e| Error::Measure {
            path: self.fs(rec.id),
            message: e.to_string(),
        })?;
        let mut committed = rec.clone();
        committed.kind = Kind::Committed;
        committed.labels = labels;
        committed.updated = SystemTime::now();
        committed.measured = Some(Measured {
            bytes: du.bytes,
            inodes: du.inodes,
        });
        meta.snapshots.remove(key);
        meta.snapshots.insert(name.to_string(), committed);
        if let Err(e) = self.save(&meta) {
            meta.snapshots.remove(name);
            meta.snapshots.insert(key.to_string(), rec);
            return Err(e);
        }
        // Overlay's work directory is no use to a layer that is only ever a lower.
        let _ = std::fs::remove_dir_all(self.work(meta.get(name)?.id));
        Ok(())
    }
}
