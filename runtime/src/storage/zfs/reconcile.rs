//! Crash recovery and collection: the work of dead processes, interrupted rollbacks,
//! deleted snapshots whose deferred destruction was not asked for yet, retired
//! containers that no clone needs any more, and trees whose containerd container is gone.

use std::path::Path;

use super::datasets::{children, is_missing, values_below, zfs};
use super::{ZfsStore, BASE, DELETED, OWNER, RETIRED, ROLLBACK};
use crate::storage::dirs::dead_work_in;
use crate::storage::names::{self, CONTAINERS, IMAGES, TMP};
use crate::storage::work::{dead_rollback, owner_alive};
use crate::storage::{ContainerKey, ReconcileReport, Store};
use crate::{Error, Result};

impl ZfsStore {
    /// Destroys what retired containers hold that no clone uses any more. Returns the
    /// names of what it destroyed.
    pub(super) fn collect_retired(&self) -> Result<Vec<String>> {
        let datasets = children(&self.area(RETIRED))?;
        let mut removed = Vec::new();
        if datasets.is_empty() {
            return Ok(removed);
        }
        let deps = self.dependents()?;
        // Another process may collect the same datasets at the same time.
        let gone_too = |r: Result<()>| match r {
            Err(e) if is_missing(&e) => Ok(false),
            other => other.map(|()| true),
        };
        for ds in &datasets {
            let mut left = 0;
            for (s, _) in self.snapshots(ds)?.unwrap_or_default() {
                let snap = format!("{ds}@{s}");
                if deps.contains_key(&snap) {
                    left += 1;
                } else if gone_too(zfs(&["destroy", &snap]).map(drop))? {
                    removed.push(snap);
                }
            }
            if left == 0 && gone_too(self.destroy_fs(ds))? {
                removed.push(ds.to_string());
            }
        }
        Ok(removed)
    }

    /// Container datasets with a local value of `property` → that value.
    fn marked(&self, property: &str) -> Result<Vec<(String, String)>> {
        Ok(
            values_below(&self.area(CONTAINERS), property, &["-s", "local"])?
                .into_iter()
                .filter(|(ds, _)| !ds.contains('@'))
                .collect(),
        )
    }

    /// The container whose dataset records `owner` ([`Store::owned_by`]).
    pub(super) fn owned_by_owner(&self, owner: &Path) -> Result<Option<ContainerKey>> {
        Ok(self
            .marked(OWNER)?
            .into_iter()
            .find(|(_, o)| Path::new(o) == owner)
            .and_then(|(ds, _)| self.key_of(&ds)))
    }

    /// The key of a container dataset name.
    fn key_of(&self, ds: &str) -> Option<ContainerKey> {
        let rest = ds.strip_prefix(&format!("{}/", self.area(CONTAINERS)))?;
        let (ns, id) = rest.split_once('/')?;
        ContainerKey::new(ns, id).ok()
    }

    /// [`Store::reconcile`]: finishes or undoes what a crash interrupted.
    pub(super) fn recover(&self) -> Result<ReconcileReport> {
        let mut report = ReconcileReport::default();
        // Work of dead processes: datasets first (their mount points go with them),
        // then plain directories (the mount points of image copies).
        for ds in children(&self.area(TMP))? {
            let short = ds.rsplit('/').next().unwrap_or(&ds);
            if owner_alive(short) {
                continue;
            }
            match self.destroy_fs(&ds) {
                Ok(()) => report.removed.push(ds),
                Err(e) if is_missing(&e) => {} // another reconcile was quicker
                Err(e) => return Err(e),
            }
        }
        for e in dead_work_in(&self.tmp_dir).unwrap_or_default() {
            let p = e.path();
            let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
            // Only ever an empty mount point: never remove what is in it (an image
            // layer could still be mounted there).
            match std::fs::remove_dir(&p) {
                Ok(()) => report.removed.push(p.display().to_string()),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(Error::io(format!("remove {}", p.display()))(err)),
            }
        }
        // Interrupted rollbacks.
        for (ds, value) in self.marked(ROLLBACK)? {
            let Some(name) = dead_rollback(&value) else {
                continue; // still running
            };
            let Some(key) = self.key_of(&ds) else {
                continue;
            };
            if names::check_snapshot_name(&name).is_err()
                || !self.exists(&format!("{ds}@{name}"))?
            {
                zfs(&["inherit", ROLLBACK, &ds])?;
                report
                    .removed
                    .push(format!("rollback mark of {key} (snapshot {name} is gone)"));
                continue;
            }
            self.rollback_to(&key, &name)?;
            self.clear_rollback_mark(&ds)?;
            report
                .completed
                .push(format!("rollback of {key} to {name}"));
        }
        // Deleted snapshots whose deferred destruction was not asked for yet.
        for (snap, value) in values_below(&self.area(CONTAINERS), "defer_destroy", &[])? {
            if snap.contains(&format!("@{DELETED}")) && value.trim() == "off" {
                zfs(&["destroy", "-d", &snap])?;
                report.completed.push(format!("deletion of {snap}"));
            }
        }
        report.removed.extend(self.collect_retired()?);
        Ok(report)
    }

    /// [`Store::collect_images`]: destroys the image copies whose layers are gone
    /// and that no clone uses (a retired container's may still).
    pub(super) fn collect_stale_images(&self, scope: &Path) -> Result<Vec<String>> {
        let mut deps = None;
        self.copies()?.collect(
            scope,
            || self.image_keys(),
            |key| {
                let ds = format!("{}/{key}", self.area(IMAGES));
                let deps = match &mut deps {
                    Some(d) => d,
                    None => deps.insert(self.dependents()?),
                };
                if deps.contains_key(&format!("{ds}@{BASE}")) {
                    return Ok(false);
                }
                self.destroy_fs(&ds).map(|()| true)
            },
        )
    }

    /// [`Store::collect`]: destroys the trees whose owner is gone.
    pub(super) fn collect_orphans(&self, scope: &Path) -> Result<Vec<ContainerKey>> {
        let mut gone = Vec::new();
        for (ds, owner) in self.marked(OWNER)? {
            if !crate::storage::work::collectable(Path::new(&owner), scope) {
                continue;
            }
            let Some(key) = self.key_of(&ds) else {
                continue;
            };
            self.destroy(&key)?;
            gone.push(key);
        }
        Ok(gone)
    }
}
