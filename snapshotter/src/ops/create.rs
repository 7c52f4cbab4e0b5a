//! Prepare (an active snapshot) and View (a read-only one) on a committed parent.

use std::collections::BTreeMap;
use std::time::SystemTime;

use containerd_client::types::Mount;

use crate::error::{Error, Result};
use crate::meta::{Kind, Record};
use crate::snapshotter::{check_key, Snapshotter};

impl Snapshotter {
    /// Makes snapshot `key` of `kind` (active or view) on `parent` (empty: none)
    /// and returns its mounts.
    pub fn create(
        &self,
        kind: Kind,
        key: &str,
        parent: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<Vec<Mount>> {
        check_key("key", key)?;
        let mut meta = self.lock();
        if meta.snapshots.contains_key(key) {
            return Err(Error::AlreadyExists(key.to_string()));
        }
        let parent = if parent.is_empty() {
            None
        } else {
            check_key("parent", parent)?;
            if meta.get(parent)?.kind != Kind::Committed {
                return Err(Error::InvalidArgument(format!(
                    "parent {parent:?} is not committed"
                )));
            }
            Some(parent.to_string())
        };
        let id = meta.next_id;
        let dir = self.dir(id);
        let made = std::fs::create_dir(&dir)
            .and_then(|()| std::fs::create_dir(self.fs(id)))
            .and_then(|()| match kind {
                Kind::Active => std::fs::create_dir(self.work(id)),
                _ => Ok(()),
            })
            .map_err(Error::io(format!("mkdir {}", dir.display())));
        if let Err(e) = made {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        let now = SystemTime::now();
        meta.next_id += 1;
        meta.snapshots.insert(
            key.to_string(),
            Record {
                id,
                kind,
                parent,
                labels,
                created: now,
                updated: now,
                measured: None,
            },
        );
        if let Err(e) = self.save(&meta) {
            meta.snapshots.remove(key);
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        tracing::debug!(key, id, ?kind, "snapshot made");
        self.mounts_of(&meta, key)
    }

    /// The mounts of an existing snapshot.
    pub fn mounts(&self, key: &str) -> Result<Vec<Mount>> {
        check_key("key", key)?;
        self.mounts_of(&self.lock(), key)
    }
}
