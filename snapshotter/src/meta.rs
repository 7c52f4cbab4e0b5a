//! The snapshots' records: one JSON file, `<root>/metadata.json`, replaced atomically
//! (written beside, synced, renamed) after every change. A snapshot's data lives in
//! `<root>/snapshots/<id>/`, named by a number the snapshotter chose, never by the
//! key containerd sent, so no key can name a path.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A snapshot's kind, as containerd's snapshotters have them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A read-only view of a committed snapshot.
    View,
    /// Writable: a container's writable layer, or a layer being unpacked.
    Active,
    /// Read-only, and a parent for others (an image layer).
    Committed,
}

/// Bytes and inodes of a committed snapshot, measured when it was committed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Measured {
    /// Bytes allocated.
    pub bytes: u64,
    /// Inodes.
    pub inodes: u64,
}

/// One snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Its directory's number.
    pub id: u64,
    /// Its kind.
    pub kind: Kind,
    /// The key of its parent (committed), if any.
    pub parent: Option<String>,
    /// containerd's labels.
    pub labels: BTreeMap<String, String>,
    /// When it was made.
    pub created: SystemTime,
    /// When it last changed.
    pub updated: SystemTime,
    /// Its usage, once committed.
    pub measured: Option<Measured>,
}

/// All records, and the next directory number.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Meta {
    /// The next snapshot's number.
    pub next_id: u64,
    /// By key.
    pub snapshots: BTreeMap<String, Record>,
}

/// The metadata file of the snapshotter at `root`.
pub fn file(root: &Path) -> PathBuf {
    root.join("metadata.json")
}

impl Meta {
    /// Reads `<root>/metadata.json` (none yet: empty).
    pub fn load(root: &Path) -> Result<Meta> {
        let path = file(root);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| Error::Metadata {
                path,
                message: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Meta::default()),
            Err(e) => Err(Error::io(format!("read {}", path.display()))(e)),
        }
    }

    /// Replaces `<root>/metadata.json` with these records, durably.
    pub fn save(&self, root: &Path) -> Result<()> {
        let path = file(root);
        let tmp = root.join("metadata.json.tmp");
        let bytes = serde_json::to_vec(self).map_err(|e| Error::Metadata {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let mut f =
            std::fs::File::create(&tmp).map_err(Error::io(format!("create {}", tmp.display())))?;
        f.write_all(&bytes)
            .and_then(|()| f.sync_all())
            .map_err(Error::io(format!("write {}", tmp.display())))?;
        std::fs::rename(&tmp, &path).map_err(Error::io(format!("rename to {}", path.display())))?;
        std::fs::File::open(root)
            .and_then(|d| d.sync_all())
            .map_err(Error::io(format!("sync {}", root.display())))
    }

    /// The record of `key`.
    pub fn get(&self, key: &str) -> Result<&Record> {
        self.snapshots
            .get(key)
            .ok_or_else(|| Error::NotFound(key.to_string()))
    }

    /// Whether any snapshot has `key` as its parent.
    pub fn has_children(&self, key: &str) -> bool {
        self.snapshots
            .values()
            .any(|r| r.parent.as_deref() == Some(key))
    }

    /// The keys from `key`'s parent down to the base layer.
    pub fn ancestors(&self, key: &str) -> Result<Vec<&Record>> {
        let mut out = Vec::new();
        let mut next = self.get(key)?.parent.clone();
        while let Some(p) = next {
            let r = self.get(&p)?;
            out.push(r);
            next = r.parent.clone();
        }
        Ok(out)
    }
}
