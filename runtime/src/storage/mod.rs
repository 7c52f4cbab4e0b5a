//! Snapshot-capable root file systems.
//!
//! Every container gets its root file system from a [`Store`]: a pool (a btrfs file
//! system, a ZFS pool, or a plain directory for overlay) holding
//! - one read-only copy of each image, keyed by its layer chain ([`ImageSource::key`]);
//! - one writable tree per container, made from the image copy in O(1) (a btrfs snapshot,
//!   a `zfs clone`) and bind-mounted as the container's rootfs;
//! - the container's named, read-only snapshots.
//!
//! Snapshots, rollbacks and clones cost milliseconds whatever the container holds. A
//! rollback changes the tree the container's running processes see (the container is
//! frozen around it). Export/import move a snapshot to another host as a byte stream.
//!
//! Every multi-step operation works under a temporary name and finishes with an atomic
//! rename, or leaves a marker it removes when done; [`Store::reconcile`] finishes or
//! undoes what a crash interrupted. What exists in the pool is the record: there is no
//! second bookkeeping that could disagree with it.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::config::{Backend, Config};
use crate::{Error, Result};

pub mod adopt;
pub mod btrfs;
mod btrfs_ioctl;
mod btrfs_nested;
pub(crate) mod btrfs_quota;
mod btrfs_receive;
pub(crate) mod cmd;
mod dirs;
pub mod du;
pub mod fault;
mod image_copies;
pub mod in_helper;
pub mod layers;
pub mod names;
pub mod overlay;
mod overlay_import;
mod overlay_quota;
mod send_stream;
mod send_stream_check;
pub mod tree;
pub mod usage;
pub mod work;
pub mod write_back;
pub mod zfs;

pub use layers::ImageSource;
pub use names::ContainerKey;

/// A named, read-only snapshot of a container's tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Its name, unique per container.
    pub name: String,
    /// When it was taken.
    pub created: SystemTime,
}

/// A container's bytes against its pool quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaUsage {
    /// What its tree and snapshots hold.
    pub used: u64,
    /// Its quota (`None`: none).
    pub limit: Option<u64>,
}

/// What a reconciliation found and fixed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReconcileReport {
    /// Leftovers of interrupted operations that were removed.
    pub removed: Vec<String>,
    /// Interrupted operations that were completed.
    pub completed: Vec<String>,
}

/// A pool of snapshot-capable container trees. All calls block; they are safe to make
/// from several processes at once (each container's tree is changed by its own shim).
pub trait Store: Send + Sync {
    /// Which backend this is.
    fn backend(&self) -> Backend;

    /// Makes the writable tree of container `key` from `image` (copying the image into
    /// the pool the first time it is seen) and returns its path, to be bind-mounted as
    /// the rootfs. A tree made earlier for the same owner (a new task of the same
    /// containerd container) is returned as it is, with the writes it holds; a tree
    /// whose owner is gone is replaced; any other existing tree is an error.
    fn prepare(&self, key: &ContainerKey, image: &ImageSource) -> Result<PathBuf>;

    /// The path of the container's writable tree (it must exist).
    fn rootfs(&self, key: &ContainerKey) -> Result<PathBuf>;

    /// Takes a read-only snapshot named `name` of the container's tree.
    fn snapshot(&self, key: &ContainerKey, name: &str) -> Result<SnapshotInfo>;

    /// The container's snapshots, oldest first.
    fn list(&self, key: &ContainerKey) -> Result<Vec<SnapshotInfo>>;

    /// Makes the container's tree equal to snapshot `name`, in place: processes that
    /// have the tree open see the rolled-back content. The caller freezes or stops the
    /// container around it. Creates the tree when the container has none (after import).
    fn rollback(&self, key: &ContainerKey, name: &str) -> Result<()>;

    /// Makes a new container `new_key` whose tree starts as snapshot `name` of `key`.
    fn clone_snapshot(
        &self,
        key: &ContainerKey,
        name: &str,
        new_key: &ContainerKey,
    ) -> Result<PathBuf>;

    /// Records that the container's tree belongs to containerd's writable layer
    /// `owner` (as [`Store::prepare`] does), for a tree made by
    /// [`Store::clone_snapshot`]: it is then reused by the same owner and collected
    /// when that owner is gone.
    fn set_owner(&self, key: &ContainerKey, owner: &std::path::Path) -> Result<()>;

    /// What [`Store::prepare`] would do with the container's existing tree for
    /// `image` (`None`: the container has no tree, so prepare makes one).
    fn existing(&self, key: &ContainerKey, image: &ImageSource) -> Result<Option<work::Existing>>;

    /// Deletes one snapshot.
    fn delete_snapshot(&self, key: &ContainerKey, name: &str) -> Result<()>;

    /// Deletes the container's tree and all its snapshots. Absent is not an error.
    fn destroy(&self, key: &ContainerKey) -> Result<()>;

    /// Bytes of data the container's writable tree references (extents it shares with
    /// the image and its snapshots included), as cheaply as the backend can tell.
    fn space_used(&self, key: &ContainerKey) -> Result<u64>;

    /// Bytes the container's tree holds beyond its image: what the container wrote
    /// that the pool still keeps (btrfs: what its subvolume owns under simple quotas,
    /// else its exclusive extents; ZFS: the clone's `used`; overlay: the upper
    /// directory's blocks). Kubelet's ephemeral-storage accounting gets this figure
    /// through Crab's snapshotter ([`usage`]).
    fn written(&self, key: &ContainerKey) -> Result<u64>;

    /// The container whose tree was made for containerd's writable layer `owner`
    /// ([`Store::prepare`], [`Store::set_owner`]); `None`: none in this store.
    fn owned_by(&self, owner: &std::path::Path) -> Result<Option<ContainerKey>>;

    /// What the container holds against its pool quota, as the backend accounts it
    /// (`None`: the backend does not account it as it goes, as overlay).
    fn quota_usage(&self, _key: &ContainerKey) -> Result<Option<QuotaUsage>> {
        Ok(None)
    }

    /// Writes snapshot `name` as a byte stream; with `parent`, only the difference from
    /// that earlier snapshot (which the receiving side must already have).
    fn export(
        &self,
        key: &ContainerKey,
        name: &str,
        parent: Option<&str>,
        out: &mut dyn Write,
    ) -> Result<()>;

    /// Reads a stream written by [`Store::export`] into a snapshot of container `key`
    /// (an incremental stream needs its parent imported first). Returns its info; use
    /// [`Store::rollback`] or [`Store::clone_snapshot`] to get a tree from it.
    fn import(&self, key: &ContainerKey, input: &mut dyn Read) -> Result<SnapshotInfo>;

    /// Finishes or undoes operations a crash interrupted.
    fn reconcile(&self) -> Result<ReconcileReport>;

    /// Destroys the trees (and snapshots) of containers whose owner no longer exists
    /// (containerd removed the container), among those of the snapshotter `scope`
    /// ([`work::collectable`]). Returns their keys.
    fn collect(&self, _scope: &std::path::Path) -> Result<Vec<ContainerKey>> {
        Ok(Vec::new())
    }

    /// Removes the image copies that the snapshotter `scope` no longer has the
    /// layers of ([`image_copies`]), unless a create is using the copies at the
    /// moment (the next collect then does it). Returns the removed copies' keys.
    fn collect_images(&self, _scope: &std::path::Path) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    /// The owner recorded for the container's tree (`None`: no tree, or a tree
    /// made without one, such as a read-only view's).
    fn owner(&self, key: &ContainerKey) -> Result<Option<std::path::PathBuf>>;

    /// The names (relative to the tree's root, `""` for the root) that may differ
    /// between the container's tree and the image it was made from, as the backend
    /// finds them without walking the tree; `None` when it cannot (the caller then
    /// compares whole trees). The caller freezes the container around it.
    fn changed_since_image(
        &self,
        _key: &ContainerKey,
        _image: &ImageSource,
    ) -> Result<Option<std::collections::BTreeSet<String>>> {
        Ok(None)
    }

    /// A writable tree made from snapshot `name` of the container, away from the
    /// container's own place (a standby replica's root, see `crate::standby`). It
    /// lives in the pool's in-flight area, so a crash of its maker leaves nothing
    /// [`Store::reconcile`] does not remove. Backends that cannot exchange trees
    /// atomically answer an error: the caller then keeps to the slow path.
    fn standby_tree(&self, key: &ContainerKey, _name: &str) -> Result<PathBuf> {
        Err(no_standby(self.backend(), key))
    }

    /// Exchanges the container's tree with `tree` (made by [`Store::standby_tree`])
    /// in one step: the container's place then holds `tree`'s files, and `tree`'s
    /// path the old ones, for [`Store::discard_tree`]. A crash leaves one or the
    /// other in place, never neither.
    fn exchange_tree(&self, key: &ContainerKey, _tree: &Path) -> Result<()> {
        Err(no_standby(self.backend(), key))
    }

    /// Makes `tree` (made by [`Store::standby_tree`]) the tree of `key`, which has
    /// none, owned by containerd's writable layer `owner` (as
    /// [`Store::set_owner`] records it): a fork takes its replica's tree instead
    /// of a clone of the same snapshot. The owner is recorded before the tree
    /// moves, in an order a crash keeps: a tree without its owner could be
    /// neither reused nor collected, an owner without a tree is ignored. Answers
    /// the tree's new path.
    fn take_tree(
        &self,
        key: &ContainerKey,
        _tree: &Path,
        _owner: Option<&Path>,
    ) -> Result<PathBuf> {
        Err(no_standby(self.backend(), key))
    }

    /// Deletes a tree made by [`Store::standby_tree`] (or exchanged out by
    /// [`Store::exchange_tree`]). Absent is not an error.
    fn discard_tree(&self, _tree: &Path) -> Result<()> {
        Ok(())
    }

    /// Undoes what [`Store::prepare`] or [`Store::rootfs`] set up for a running
    /// container (such as a mount) when its task ends; the tree itself stays.
    fn release(&self, _key: &ContainerKey) -> Result<()> {
        Ok(())
    }
}

/// A backend without standby trees.
fn no_standby(backend: Backend, key: &ContainerKey) -> Error {
    Error::Storage {
        operation: "make a standby tree",
        message: format!(
            "the {backend:?} store cannot exchange trees ({key}): standbys need btrfs"
        ),
    }
}

/// Opens the store the configuration selects (`None` for `passthrough`: containers
/// use the rootfs containerd mounted, without snapshots).
pub fn open(config: &Config, backend: Backend) -> Result<Option<Box<dyn Store>>> {
    match backend {
        Backend::Passthrough => Ok(None),
        Backend::Btrfs => Ok(Some(Box::new(
            btrfs::BtrfsStore::open(&config.storage.pool)?
                .with_tree_limit(config.quota.sandbox_pool_limit()),
        ))),
        Backend::Overlay => Ok(Some(Box::new(
            overlay::OverlayStore::open(&config.storage.overlay_dir)?
                .with_tree_limit(config.quota.sandbox_pool_limit()),
        ))),
        Backend::Zfs => Ok(Some(Box::new(
            zfs::ZfsStore::open(&config.storage.zfs_dataset)?
                .with_tree_limit(config.quota.sandbox_pool_limit()),
        ))),
    }
}

/// The OCI annotation that picks a container's backend, overriding the host default.
pub const BACKEND_ANNOTATION: &str = "io.crab.storage.backend";
