//! Rollback keeps every snapshot (never `zfs rollback -r`). To the latest snapshot it is
//! the native `zfs rollback`, atomic and online: open files and working directories see
//! the snapshot's content. To an older one (and on zfs-fuse, see [`super::fuse`], to any
//! one while the tree is mounted) it mirrors the snapshot into the live tree in place
//! ([`tree::mirror`]) from a readable view of it: `.zfs/snapshot/<name>` where ZFS
//! serves it (kernel OpenZFS), otherwise a temporary read-only clone. Processes see the
//! result as on btrfs: directories (a cwd, a root) show the snapshot's entries, a file
//! changed since the snapshot is replaced (whoever holds the old one open keeps it).
//! The `crab:rollback` property marks the mirror; [`Store::reconcile`] redoes it.
//!
//! [`Store::reconcile`]: crate::storage::Store::reconcile

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::datasets::zfs;
use super::fuse::{coarse_times, drop_changed_since};
use super::{ZfsStore, ROLLBACK, TREE};
use crate::storage::names::snapshot_not_found;
use crate::storage::{fault, tree, work, ContainerKey};
use crate::{Error, Result};

impl ZfsStore {
    /// Makes the tree of `key` equal to its snapshot `name`, keeping every snapshot.
    pub(super) fn rollback_to(&self, key: &ContainerKey, name: &str) -> Result<()> {
        let snap = self.snapshot_name(key, name)?;
        let ds = self.dataset(key)?;
        let st = self
            .state(&ds)?
            .ok_or_else(|| snapshot_not_found(key, name))?;
        let snaps = self
            .snapshots(&ds)?
            .ok_or_else(|| snapshot_not_found(key, name))?;
        let Some(pos) = snaps.iter().position(|s| s.0 == name) else {
            return Err(snapshot_not_found(key, name));
        };
        // zfs-fuse rolls a mounted file system back under the kernel's FUSE caches:
        // entries still cached (a process's cwd, a file open a moment ago) then name
        // objects that no longer exist, and a later unmount can hang the daemon. There,
        // a mounted tree is always mirrored, through the mount.
        let native = pos + 1 == snaps.len() && !(self.fuse && st.mounted);
        let mut done = false;
        if native {
            match zfs(&["rollback", &snap]) {
                Ok(_) => done = true,
                // A snapshot was taken meanwhile: mirror instead.
                Err(Error::Command { message, .. }) if message.contains("more recent") => {}
                Err(e) => return Err(e),
            }
        }
        if done {
            // A mark left by an interrupted mirror must not outlive this rollback.
            self.clear_rollback_mark(&ds)?;
            self.mount(&ds, &st)?;
        } else {
            let live = self.mount(&ds, &st)?;
            self.mirror_rollback(&ds, &live, &snap, name, snaps[pos].1)?;
        }
        if !st.tree {
            // An imported dataset becomes a container's tree here: under its quota.
            if let Some(q) = self.quota_property() {
                zfs(&["set", &q, &ds])?;
            }
            zfs(&["inherit", TREE, &ds])?;
        }
        Ok(())
    }

    /// Rolls back by mirroring the snapshot into the live tree.
    fn mirror_rollback(
        &self,
        ds: &str,
        live: &Path,
        snap: &str,
        name: &str,
        created: i64,
    ) -> Result<()> {
        // Kernel ZFS serves the snapshot at `.zfs/snapshot/<name>` (a mount of its own).
        // Under zfs-fuse, `.zfs` would be an ordinary name the container can create.
        let served = live.join(".zfs").join("snapshot").join(name);
        let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
        let (view, clone) = if !self.fuse && served.is_dir() && dev(&served) != dev(live) {
            (served, None)
        } else {
            let clone = self.tmp("view");
            zfs(&["clone", "-o", "readonly=on", snap, &clone])?;
            match self.mountpoint(&clone) {
                Ok(p) => (p, Some(clone)),
                Err(e) => {
                    let _ = self.destroy_fs(&clone);
                    return Err(e);
                }
            }
        };
        let result = (|| {
            // From here on the live tree changes: mark it first.
            let mark = format!("{ROLLBACK}={}", work::rollback_mark(name));
            zfs(&["set", &mark, ds])?;
            fault::point("zfs.rollback.marked");
            if coarse_times(live)? {
                drop_changed_since(live, created)?;
            }
            tree::mirror_with_fault(&view, live, "zfs.rollback.mid").map(drop)
        })();
        let cleaned = match &clone {
            Some(c) => self.destroy_fs(c),
            None => Ok(()),
        };
        result?;
        cleaned?;
        zfs(&["inherit", ROLLBACK, ds]).map(drop)
    }

    /// Removes a rollback mark from `ds` if it has one.
    pub(super) fn clear_rollback_mark(&self, ds: &str) -> Result<()> {
        let v = zfs(&["get", "-H", "-s", "local", "-o", "value", ROLLBACK, ds])?;
        if !v.trim().is_empty() && v.trim() != "-" {
            zfs(&["inherit", ROLLBACK, ds])?;
        }
        Ok(())
    }
}
