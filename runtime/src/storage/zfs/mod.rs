//! The ZFS store: datasets, snapshots and clones in a ZFS pool, driven by the standard
//! `zfs` command (kernel OpenZFS in production, zfs-fuse where the kernel has no ZFS).
//!
//! ```text
//! <root>/images/<key>@base               read-only copy of an image (never mounted)
//! <images>/<key>.layers                  what it was copied from, in the directory
//!                                        where `<root>/images` is mounted
//!                                        (`image_copies`)
//! <root>/containers/<ns>/<id>            the container's dataset: its writable tree (the
//!                                        rootfs), a clone of an image's @base or of a
//!                                        snapshot, or a received stream
//! <root>/containers/<ns>/<id>@<name>     its snapshots
//! <root>/containers/<ns>/<id>@.deleted.* deleted snapshots that clones still use; ZFS
//!                                        destroys them with their last clone
//! <root>/tmp/<pid>.<n>.<what>            in-flight work of process <pid> (datasets, and
//!                                        plain directories used as mount points)
//! <root>/retired/<pid>.<n>.retired       destroyed containers whose snapshots clones
//!                                        still use; removed once the clones are gone
//!
//! user properties of a container's dataset:
//! crab:owner=<path>                      containerd's writable layer the tree belongs to
//! crab:tree=none                         it holds imported snapshots but no tree yet
//! crab:rollback=<pid>:<name>             a rollback to <name> runs (or was interrupted)
//! ```
//!
//! `<root>` is the dataset the configuration names (`[storage] zfs_dataset`, by default
//! `crab/crab`, which `hack/zfs.sh` makes); it must have a mount point, which every
//! dataset below inherits. `images/`, `containers/`, `tmp/` and `retired/` are made
//! with `atime=off`: reading a tree then does not count as changing it (an incremental
//! `zfs receive` refuses a dataset changed since its last snapshot). Properties are set
//! with the dataset they describe (`zfs clone -o`) or before it is renamed into place,
//! and a `zfs set` is on disk when it returns: they are the markers crash recovery
//! reads.
//!
//! Rollback keeps every snapshot: natively to the latest one, otherwise by mirroring
//! the snapshot into the live tree (`rollback.rs`).
//!
//! A clone holds its origin snapshot: ZFS cannot destroy a snapshot that a container
//! made by [`Store::clone_snapshot`] still uses. [`Store::delete_snapshot`] of such a
//! snapshot renames it to a hidden `.deleted.*` name (freeing the name and removing it
//! from [`Store::list`]) and asks for its deferred destruction (`zfs destroy -d`): ZFS
//! destroys it when the last clone goes. [`Store::destroy`] of such a container renames
//! it under `retired/` (freeing the key at once) and destroys what no clone uses; the
//! rest goes when the clones go (`destroy` and `reconcile` collect it). Nothing is ever
//! promoted: `zfs promote` would move the origin's snapshots into the clone's list.
//!
//! Import receives a full stream under a temporary name and renames it into place, an
//! incremental one into the container's dataset (`streams.rs`).
//!
//! zfs-fuse (a user-space ZFS) differs from kernel OpenZFS in ways the store works
//! around with standard commands (`fuse.rs`).
//!
//! The code by concern: this file has the store, its names and [`Store`] calls;
//! `datasets.rs` the `zfs` command, datasets, their properties and clones;
//! `rollback.rs`; `streams.rs` (send and receive); `reconcile.rs` (crash recovery,
//! retired containers, collection); `fuse.rs` (the zfs-fuse differences).

mod datasets;
mod fuse;
mod reconcile;
mod rollback;
mod streams;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use self::datasets::{children, is_missing, value, zfs};
use self::fuse::{served_by_fuse, zfs_unmounted};
use self::streams::send;
use super::names::{
    self, snapshot_exists, snapshot_not_found, tree_exists, CONTAINERS, IMAGES, TMP,
};
use super::work::{self, Existing};
use super::{fault, ContainerKey, ImageSource, QuotaUsage, ReconcileReport, SnapshotInfo, Store};
use crate::config::Backend;
use crate::{Error, Result};

/// Longest dataset or snapshot name ZFS accepts.
const MAX_NAME: usize = 255;
/// Marks a running rollback: `<pid>:<snapshot>`.
const ROLLBACK: &str = "crab:rollback";
/// `none` on a dataset that holds imported snapshots but no tree.
const TREE: &str = "crab:tree";
/// containerd's writable layer that owns the tree.
const OWNER: &str = "crab:owner";
/// Prefix of deleted snapshots that clones still depend on.
const DELETED: &str = ".deleted.";
/// The snapshot of an image that containers are cloned from.
const BASE: &str = "base";
/// Where destroyed containers wait for the clones of their snapshots to go.
const RETIRED: &str = "retired";

/// A ZFS pool (more precisely: the dataset in one that holds everything Crab stores).
#[derive(Debug)]
pub struct ZfsStore {
    root: String,
    pool: String,
    /// Where `<root>/tmp` is mounted.
    tmp_dir: PathBuf,
    /// Whether ZFS serves its file systems through FUSE (zfs-fuse).
    fuse: bool,
    /// The `quota` of each container's dataset (its tree and its snapshots).
    tree_limit: Option<u64>,
}

fn check_len(name: &str) -> Result<()> {
    if name.len() > MAX_NAME {
        return Err(Error::Storage {
            operation: "name a dataset",
            message: format!("{name} is longer than the {MAX_NAME} characters ZFS allows"),
        });
    }
    Ok(())
}

impl ZfsStore {
    /// Opens the store in dataset `root` (e.g. `crab/crab`), which must exist and have
    /// a mount point, and makes its top-level datasets if they are missing.
    pub fn open(root: &str) -> Result<ZfsStore> {
        let bad = |message: String| Error::Storage {
            operation: "open zfs pool",
            message,
        };
        if root.is_empty() || root.starts_with('/') || root.contains('@') || root.ends_with('/') {
            return Err(bad(format!(
                "{root:?} is not a ZFS dataset name (like \"crab/crab\")"
            )));
        }
        check_len(root)?;
        match value(root, "type") {
            Ok(t) if t == "filesystem" => {}
            Ok(t) => return Err(bad(format!("{root} is a {t}, not a file system"))),
            Err(e) if is_missing(&e) => {
                return Err(bad(format!(
                    "dataset {root} does not exist (is its pool imported?)"
                )))
            }
            Err(e) => return Err(e),
        }
        let mut store = ZfsStore {
            root: root.to_string(),
            pool: root.split('/').next().unwrap_or(root).to_string(),
            tmp_dir: PathBuf::new(),
            fuse: false,
            tree_limit: None,
        };
        let at = store.mountpoint(root)?;
        store.fuse = served_by_fuse(&at)?;
        let have = children(root)?;
        for area in [IMAGES, CONTAINERS, TMP, RETIRED] {
            let ds = store.area(area);
            if !have.contains(&ds) {
                store.create_fs(&ds, &["-o", "atime=off"])?;
            }
        }
        store.tmp_dir = store.mountpoint(&store.area(TMP))?;
        Ok(store)
    }

    /// Gives every container dataset this store makes a ZFS `quota` of `bytes`
    /// (what its tree and its snapshots hold; the image's data it shares is not
    /// counted); `None`: no quota.
    pub fn with_tree_limit(mut self, bytes: Option<u64>) -> ZfsStore {
        self.tree_limit = bytes;
        self
    }

    /// The `quota=` property of a container's dataset, when it has one.
    fn quota_property(&self) -> Option<String> {
        self.tree_limit.map(|b| format!("quota={b}"))
    }

    /// The dataset the store keeps everything in.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The container's dataset name.
    pub fn dataset(&self, key: &ContainerKey) -> Result<String> {
        let ds = format!("{}/{}", self.root, key.place(CONTAINERS));
        check_len(&ds)?;
        Ok(ds)
    }

    /// `<root>/<area>`: one of the store's top-level datasets.
    fn area(&self, area: &str) -> String {
        format!("{}/{area}", self.root)
    }

    /// A fresh `<root>/tmp/<pid>.<n>.<what>`, for work of this process.
    fn tmp(&self, what: &str) -> String {
        format!("{}/{}", self.area(TMP), work::tmp_name(what))
    }

    fn snapshot_name(&self, key: &ContainerKey, name: &str) -> Result<String> {
        names::check_snapshot_name(name)?;
        let snap = format!("{}@{name}", self.dataset(key)?);
        check_len(&snap)?;
        Ok(snap)
    }

    /// The full name of an existing snapshot.
    fn existing_snapshot(&self, key: &ContainerKey, name: &str) -> Result<String> {
        let snap = self.snapshot_name(key, name)?;
        if !self.exists(&snap)? {
            return Err(snapshot_not_found(key, name));
        }
        Ok(snap)
    }
}

impl Store for ZfsStore {
    fn backend(&self) -> Backend {
        Backend::Zfs
    }

    fn prepare(&self, key: &ContainerKey, image: &ImageSource) -> Result<PathBuf> {
        let ds = self.dataset(key)?;
        if let Some(st) = self.state(&ds)? {
            match work::existing_tree(st.owner.as_deref(), image.owner.as_deref()) {
                Existing::Reuse if st.tree => return self.mount(&ds, &st),
                Existing::Replace => self.destroy(key)?,
                _ => return Err(tree_exists(key)),
            }
        }
        let copies = self.copies()?;
        let _using = copies.using()?;
        let base = self.image(image, &copies)?;
        self.clone_into(&base, key, image.owner.as_deref())
    }

    fn existing(&self, key: &ContainerKey, image: &ImageSource) -> Result<Option<Existing>> {
        let ds = self.dataset(key)?;
        Ok(self.state(&ds)?.map(|st| {
            match work::existing_tree(st.owner.as_deref(), image.owner.as_deref()) {
                // Reused only with its tree (see prepare).
                Existing::Reuse if !st.tree => Existing::Conflict,
                other => other,
            }
        }))
    }

    fn rootfs(&self, key: &ContainerKey) -> Result<PathBuf> {
        let ds = self.dataset(key)?;
        match self.state(&ds)? {
            Some(st) if st.tree => self.mount(&ds, &st),
            _ => Err(Error::NoTree(key.to_string())),
        }
    }

    fn snapshot(&self, key: &ContainerKey, name: &str) -> Result<SnapshotInfo> {
        let snap = self.snapshot_name(key, name)?;
        let ds = self.dataset(key)?;
        if !self.state(&ds)?.is_some_and(|st| st.tree) {
            return Err(Error::NoTree(key.to_string()));
        }
        if self.exists(&snap)? {
            return Err(snapshot_exists(key, name));
        }
        match zfs(&["snapshot", &snap]) {
            Ok(_) => {}
            Err(Error::Command { message, .. }) if message.contains("exists") => {
                return Err(snapshot_exists(key, name))
            }
            Err(e) => return Err(e),
        }
        self.info(key, name)
    }

    fn list(&self, key: &ContainerKey) -> Result<Vec<SnapshotInfo>> {
        let ds = self.dataset(key)?;
        Ok(self
            .snapshots(&ds)?
            .unwrap_or_default()
            .into_iter()
            .filter(|(name, _)| names::check_snapshot_name(name).is_ok())
            .map(|(name, created)| SnapshotInfo {
                name,
                created: UNIX_EPOCH + Duration::from_secs(created.max(0) as u64),
            })
            .collect())
    }

    fn rollback(&self, key: &ContainerKey, name: &str) -> Result<()> {
        self.rollback_to(key, name)
    }

    fn clone_snapshot(
        &self,
        key: &ContainerKey,
        name: &str,
        new_key: &ContainerKey,
    ) -> Result<PathBuf> {
        let snap = self.existing_snapshot(key, name)?;
        self.clone_into(&snap, new_key, None)
    }

    fn set_owner(&self, key: &ContainerKey, owner: &Path) -> Result<()> {
        let ds = self.dataset(key)?;
        let prop = format!("{OWNER}={}", owner.display());
        zfs(&["set", &prop, &ds]).map(|_| ())
    }

    fn delete_snapshot(&self, key: &ContainerKey, name: &str) -> Result<()> {
        let snap = self.existing_snapshot(key, name)?;
        if !self.dependents()?.contains_key(&snap) {
            return zfs(&["destroy", &snap]).map(drop);
        }
        // Clones use it: free the name now, let ZFS destroy it with the last clone.
        let hidden = format!(
            "{}@{DELETED}{}",
            self.dataset(key)?,
            work::tmp_name("snapshot")
        );
        zfs(&["rename", &snap, &hidden])?;
        fault::point("zfs.delete.renamed");
        zfs(&["destroy", "-d", &hidden]).map(drop)
    }

    fn destroy(&self, key: &ContainerKey) -> Result<()> {
        let ds = self.dataset(key)?;
        if let Some(snaps) = self.snapshots(&ds)? {
            let deps = self.dependents()?;
            let held = snaps
                .iter()
                .any(|(s, _)| deps.contains_key(&format!("{ds}@{s}")));
            if held {
                // Clones use some of its snapshots: move it out of the way; what the
                // clones do not use goes now, the rest with them.
                let retired = format!("{}/{}", self.area(RETIRED), work::tmp_name("retired"));
                self.unmount(&ds)?;
                zfs_unmounted(&["rename", &ds, &retired])?;
                fault::point("zfs.destroy.retired");
                let _ = zfs(&["set", "canmount=noauto", &retired]);
            } else {
                self.destroy_fs(&ds)?;
            }
        }
        // This container may have been the last clone of a retired one's snapshot.
        self.collect_retired().map(drop)
    }

    fn space_used(&self, key: &ContainerKey) -> Result<u64> {
        let ds = self.dataset(key)?;
        if !self.state(&ds)?.is_some_and(|st| st.tree) {
            return Err(Error::NoTree(key.to_string()));
        }
        let out = value(&ds, "referenced")?;
        out.parse::<u64>().map_err(|_| Error::Storage {
            operation: "read space used",
            message: format!("{ds}: {out:?}"),
        })
    }

    fn quota_usage(&self, key: &ContainerKey) -> Result<Option<QuotaUsage>> {
        let ds = self.dataset(key)?;
        if !self.state(&ds)?.is_some_and(|st| st.tree) {
            return Err(Error::NoTree(key.to_string()));
        }
        let number = |prop: &str| -> Result<u64> {
            let out = value(&ds, prop)?;
            out.parse().map_err(|_| Error::Storage {
                operation: "read quota",
                message: format!("{ds} {prop}: {out:?}"),
            })
        };
        let limit = number("quota")?;
        Ok(Some(QuotaUsage {
            used: number("used")?,
            limit: (limit != 0).then_some(limit),
        }))
    }

    fn export(
        &self,
        key: &ContainerKey,
        name: &str,
        parent: Option<&str>,
        out: &mut dyn Write,
    ) -> Result<()> {
        let snap = self.existing_snapshot(key, name)?;
        let parent = parent.map(|p| self.existing_snapshot(key, p)).transpose()?;
        send(&snap, parent.as_deref(), out)
    }

    fn import(&self, key: &ContainerKey, input: &mut dyn Read) -> Result<SnapshotInfo> {
        self.receive(key, input)
    }

    fn reconcile(&self) -> Result<ReconcileReport> {
        self.recover()
    }

    fn owner(&self, key: &ContainerKey) -> Result<Option<PathBuf>> {
        let ds = self.dataset(key)?;
        Ok(self.state(&ds)?.and_then(|st| st.owner))
    }

    fn collect(&self, scope: &Path) -> Result<Vec<ContainerKey>> {
        self.collect_orphans(scope)
    }

    fn collect_images(&self, scope: &Path) -> Result<Vec<String>> {
        self.collect_stale_images(scope)
    }

    fn owned_by(&self, owner: &Path) -> Result<Option<ContainerKey>> {
        self.owned_by_owner(owner)
    }

    fn written(&self, key: &ContainerKey) -> Result<u64> {
        Ok(self.quota_usage(key)?.map_or(0, |q| q.used))
    }
}
