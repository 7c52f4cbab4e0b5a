//! A container's checkpoints: a versioned manifest and the process images it names.
//!
//! Layout under `checkpoint.store` (root-only, mode 0700):
//! ```text
//! <namespace>/<id>/history.json   the manifest (written last, atomically, fsync-ed)
//! <namespace>/<id>/<seq>/criu/    CRIU images of checkpoint <seq>
//! ```
//! The file-system half of a checkpoint is a snapshot in the container's store
//! (`ckpt-<seq>`). An fs-only checkpoint shares the process image of an earlier one,
//! a process-only checkpoint its file-system snapshot: both record what they share.
//! An entry is recorded only once everything it names is durable, and nothing is
//! deleted before the entry that replaces it is recorded.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Kind, Timings};
use crate::config::Config;
use crate::storage::ContainerKey;
use crate::{Error, Result};

/// The manifest's file name.
pub const HISTORY: &str = "history.json";
/// Format version of the manifest.
pub const HISTORY_VERSION: u32 = 1;

/// One checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Sequence number, unique per container, increasing.
    pub seq: u64,
    /// Its name (`crabctl` accepts a name or a seq).
    pub name: String,
    /// The checkpoint before it.
    pub parent: Option<u64>,
    /// What it captured itself.
    pub kind: Kind,
    /// The file-system snapshot to roll back to (possibly an earlier checkpoint's).
    pub fs_snapshot: Option<String>,
    /// The seq whose process image this checkpoint uses (possibly an earlier one).
    pub process_image: Option<u64>,
    /// When (milliseconds since the epoch).
    pub created_ms: u64,
    /// Bytes of CRIU images written by this checkpoint.
    pub process_bytes: u64,
    /// Where the time went.
    pub timings: Timings,
    /// Kept by retention whatever its age.
    pub marked: bool,
}

/// The manifest of one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// Format version.
    pub version: u32,
    /// containerd namespace.
    pub namespace: String,
    /// Container id.
    pub id: String,
    /// The next sequence number.
    pub next_seq: u64,
    /// Checkpoints, oldest first.
    pub entries: Vec<Entry>,
    /// Entries removed from `entries` whose process images and snapshots may not be
    /// deleted yet: saved with the removal, so that a crash before the deletion
    /// leaks nothing (the next checkpoint deletes them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uncollected: Vec<Entry>,
    /// Process images (by seq) reported before they were synced, with the boot
    /// they were written in (`[checkpoint] durability = "shim"`,
    /// [`super::durability`]).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub unsynced: std::collections::BTreeMap<u64, String>,
}

/// The directory of a container's checkpoints.
pub fn dir(config: &Config, key: &ContainerKey) -> PathBuf {
    config.checkpoint.store.join(key.namespace()).join(key.id())
}

/// The process image directory of checkpoint `seq`.
pub fn image_dir(dir: &Path, seq: u64) -> PathBuf {
    dir.join(seq.to_string())
}

/// Prefix of the checkpoints' own snapshot names.
const SNAPSHOT_PREFIX: &str = "ckpt-";

/// The name of the file-system snapshot of checkpoint `seq`.
pub fn snapshot_name(seq: u64) -> String {
    format!("{SNAPSHOT_PREFIX}{seq}")
}

/// The seq of a checkpoint's snapshot name (`None`: not a checkpoint's).
pub fn snapshot_seq(name: &str) -> Option<u64> {
    name.strip_prefix(SNAPSHOT_PREFIX)?.parse().ok()
}

/// Refuses, for a snapshot taken or deleted by hand, a name the checkpoints use: the
/// next checkpoint would take it for one a crash left behind.
pub fn check_hand_snapshot_name(name: &str) -> Result<()> {
    if name.starts_with(SNAPSHOT_PREFIX) {
        return Err(Error::ReservedName {
            name: name.to_string(),
        });
    }
    Ok(())
}

impl History {
    /// The manifest in `dir`, or an empty one.
    pub fn load(dir: &Path, key: &ContainerKey) -> Result<History> {
        let file = dir.join(HISTORY);
        let text = match std::fs::read(&file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(History {
                    version: HISTORY_VERSION,
                    namespace: key.namespace().to_string(),
                    id: key.id().to_string(),
                    next_seq: 1,
                    entries: Vec::new(),
                    uncollected: Vec::new(),
                    unsynced: Default::default(),
                })
            }
            Err(e) => return Err(Error::io(format!("read {}", file.display()))(e)),
        };
        let h: History = serde_json::from_slice(&text).map_err(|e| Error::BadCheckpoint {
            path: file.clone(),
            message: e.to_string(),
        })?;
        if h.version != HISTORY_VERSION {
            return Err(Error::BadCheckpoint {
                path: file,
                message: format!(
                    "manifest version {} (this Crab reads {HISTORY_VERSION})",
                    h.version
                ),
            });
        }
        Ok(h)
    }

    /// Writes the manifest durably (temp file, fsync, rename, fsync of the dir).
    pub fn save(&self, dir: &Path) -> Result<()> {
        create_private_dir(dir)?;
        let tmp = dir.join(format!(".{HISTORY}.tmp"));
        let json = serde_json::to_vec_pretty(self).expect("history serializes");
        std::fs::write(&tmp, json).map_err(Error::io(format!("write {}", tmp.display())))?;
        super::sync_path(&tmp)?;
        std::fs::rename(&tmp, dir.join(HISTORY))
            .map_err(Error::io(format!("rename {}", tmp.display())))?;
        super::sync_path(dir)
    }

    /// The newest checkpoint.
    pub fn latest(&self) -> Option<&Entry> {
        self.entries.last()
    }

    /// The checkpoint called `name`, or whose seq is `name`.
    pub fn find(&self, name: &str) -> Result<&Entry> {
        self.entries
            .iter()
            .rev()
            .find(|e| e.name == name || e.seq.to_string() == name)
            .ok_or_else(|| Error::SnapshotNotFound {
                container: format!("{}/{}", self.namespace, self.id),
                name: name.to_string(),
            })
    }

    /// Removes the entry `name` from the manifest, to [`History::uncollected`] (the
    /// caller saves, then collects).
    pub fn remove(&mut self, name: &str) -> Result<Entry> {
        let seq = self.find(name)?.seq;
        let at = self
            .entries
            .iter()
            .position(|e| e.seq == seq)
            .expect("found");
        let removed = self.entries.remove(at);
        self.uncollected.push(removed.clone());
        Ok(removed)
    }

    /// Drops unmarked entries beyond the newest `keep_last`, to
    /// [`History::uncollected`]; returns them.
    pub fn retain_last(&mut self, keep_last: usize) -> Vec<Entry> {
        let n = self.entries.len();
        let mut dropped = Vec::new();
        let mut i = 0;
        self.entries.retain(|e| {
            let keep = e.marked || i + keep_last >= n;
            i += 1;
            if !keep {
                dropped.push(e.clone());
            }
            keep
        });
        self.uncollected.extend(dropped.iter().cloned());
        dropped
    }

    /// Process images and snapshots still referenced by an entry.
    pub fn referenced(&self) -> (BTreeSet<u64>, BTreeSet<String>) {
        (
            self.entries
                .iter()
                .filter_map(|e| e.process_image)
                .collect(),
            self.entries
                .iter()
                .filter_map(|e| e.fs_snapshot.clone())
                .collect(),
        )
    }
}

/// Makes `dir` (and its parents) with mode 0700: checkpoints hold process memory.
pub fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(Error::io(format!("create {}", dir.display())))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(Error::io(format!("chmod {}", dir.display())))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A full checkpoint's entry, with its own snapshot and images.
    pub(crate) fn entry(seq: u64, marked: bool) -> Entry {
        Entry {
            seq,
            name: seq.to_string(),
            parent: seq.checked_sub(1).filter(|s| *s > 0),
            kind: Kind::Full,
            fs_snapshot: Some(snapshot_name(seq)),
            process_image: Some(seq),
            created_ms: seq,
            process_bytes: 0,
            timings: Timings::default(),
            marked,
        }
    }

    #[test]
    fn retention_keeps_the_newest_and_the_marked() {
        let key = ContainerKey::new("ns", "c").unwrap();
        let t = tempfile::tempdir().unwrap();
        let mut h = History::load(t.path(), &key).unwrap();
        h.entries = (1..=6).map(|s| entry(s, s == 2)).collect();
        let dropped: Vec<u64> = h.retain_last(3).iter().map(|e| e.seq).collect();
        assert_eq!(dropped, vec![1, 3]);
        let kept: Vec<u64> = h.entries.iter().map(|e| e.seq).collect();
        assert_eq!(kept, vec![2, 4, 5, 6]);
        h.save(t.path()).unwrap();
        assert_eq!(History::load(t.path(), &key).unwrap(), h);
        assert_eq!(h.find("5").unwrap().seq, 5);
        assert!(h.find("1").is_err());
    }

    #[test]
    fn removed_and_dropped_entries_are_saved_as_uncollected() {
        let key = ContainerKey::new("ns", "c").unwrap();
        let t = tempfile::tempdir().unwrap();
        let mut h = History::load(t.path(), &key).unwrap();
        h.entries = (1..=4).map(|s| entry(s, false)).collect();
        h.remove("2").unwrap();
        h.retain_last(2);
        h.save(t.path()).unwrap();
        let saved = History::load(t.path(), &key).unwrap();
        let uncollected: Vec<u64> = saved.uncollected.iter().map(|e| e.seq).collect();
        assert_eq!(uncollected, vec![2, 1]);
        let kept: Vec<u64> = saved.entries.iter().map(|e| e.seq).collect();
        assert_eq!(kept, vec![3, 4]);
    }

    #[test]
    fn hand_snapshots_may_not_take_a_checkpoints_name() {
        assert!(check_hand_snapshot_name("before-upgrade").is_ok());
        let e = check_hand_snapshot_name(&snapshot_name(3)).unwrap_err();
        assert!(e.to_string().contains("reserved"), "{e}");
        assert_eq!(snapshot_seq("ckpt-12"), Some(12));
        assert_eq!(snapshot_seq("ckpt-x"), None);
    }
}
