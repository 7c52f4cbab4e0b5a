//! Store operations as the shim runs them: in the helper process.
//!
//! Stores exec tools (`zfs`, `btrfs send`, `tar`) whose exit status the shim's SIGCHLD
//! reaper would collect first (ECHILD: measured with every ZFS container create). The
//! helper is single-threaded and no reaper, so the shim sends it the whole operation,
//! the bind mount of the tree included (the helper shares the shim's mount namespace).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::work::Existing;
use super::{ContainerKey, ImageSource, ReconcileReport, Store};
use crate::checkpoint::history_store::HistoryStore;
use crate::config::Config;
use crate::helper::{self, Call, ChildStdio, Request};
use crate::{Error, Result};

/// A store operation, run in the helper, and what it answers.
pub trait StoreCall: Into<StoreOp> {
    /// What the operation answers.
    type Reply: Serialize + DeserializeOwned;
    /// The operation itself, in the helper, on the configured store.
    fn serve(self, config: &Config, store: &dyn Store) -> Result<Self::Reply>;
}

/// The store operations, as the helper receives them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum StoreOp {
    /// See [`Prepare`].
    Prepare(Prepare),
    /// See [`CloneSnapshot`].
    Clone(CloneSnapshot),
    /// See [`Release`].
    Release(Release),
    /// See [`Collect`].
    Collect(Collect),
    /// See [`ChangedSinceImage`].
    ChangedSinceImage(ChangedSinceImage),
    /// See [`Reconcile`].
    Reconcile(Reconcile),
    /// See [`WriteBack`].
    WriteBack(WriteBack),
}

/// Make (or reuse) the container's tree from `image` and bind it on `target`;
/// answers nothing.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Prepare {
    /// The container.
    pub key: ContainerKey,
    /// Its image.
    pub image: ImageSource,
    /// Where to bind it.
    pub target: PathBuf,
    /// Layers of this container alone (top first) applied onto a new tree over
    /// `image`: an adopted rootfs's ([`super::adopt`]).
    #[serde(default)]
    pub top: Vec<PathBuf>,
}

/// Make the container's tree a clone of `snapshot` of `src` (a fork), owned by the
/// image's containerd layer, and bind it on `target`; answers nothing.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CloneSnapshot {
    /// The forked container.
    pub src: ContainerKey,
    /// Its snapshot.
    pub snapshot: String,
    /// The new container.
    pub key: ContainerKey,
    /// The new container's image (for its owner).
    pub image: ImageSource,
    /// Where to bind it.
    pub target: PathBuf,
}

/// Undo what prepare set up beside the bind mount (the caller unmounts); answers
/// nothing.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Release {
    /// The container.
    pub key: ContainerKey,
}

/// Destroy the trees of removed containers of one snapshotter (the caller's
/// containerd's, [`super::work::collectable`]), then the image copies of layers
/// it removed ([`super::Store::collect_images`]); answers what went.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Collect {
    /// That snapshotter's snapshots directory.
    pub scope: PathBuf,
}

/// What a [`Collect`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Collected {
    /// The removed containers' keys (their trees, snapshots and histories went).
    pub containers: Vec<ContainerKey>,
    /// The removed image copies' keys.
    pub images: Vec<String>,
}

/// The names that may differ from the image ([`super::Store::changed_since_image`]);
/// answers them, or `None` when the store cannot tell.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChangedSinceImage {
    /// The container.
    pub key: ContainerKey,
    /// Its image.
    pub image: ImageSource,
}

/// Finish or undo what crashes interrupted anywhere in the store
/// ([`super::Store::reconcile`]: work of dead processes, rollbacks whose process
/// died); answers what it removed and completed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reconcile;

/// Write the tree of an adopted container back into the client's writable
/// layer ([`super::write_back`]); answers what went in.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WriteBack {
    /// The container.
    pub key: ContainerKey,
    /// The client's lower dirs, top first.
    pub lower: Vec<PathBuf>,
    /// The client's writable layer: the tree's owner.
    pub upper: PathBuf,
}

helper::travels_as!(
    StoreOp:
    Prepare => Prepare,
    CloneSnapshot => Clone,
    Release => Release,
    Collect => Collect,
    ChangedSinceImage => ChangedSinceImage,
    Reconcile => Reconcile,
    WriteBack => WriteBack
);

/// A store operation `op`, on the store `config` names.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OnStore<O> {
    /// The configuration (which store).
    pub config: Config,
    /// What to do.
    pub op: O,
}

impl<O> OnStore<O> {
    /// The configuration, and the operation apart.
    pub(crate) fn split(self) -> (OnStore<()>, O) {
        (
            OnStore {
                config: self.config,
                op: (),
            },
            self.op,
        )
    }
}

impl OnStore<()> {
    /// Operation `op` on this store.
    pub(crate) fn with<P>(self, op: P) -> OnStore<P> {
        OnStore {
            config: self.config,
            op,
        }
    }
}

impl<O: Into<StoreOp>> From<OnStore<O>> for Request {
    fn from(call: OnStore<O>) -> Request {
        let (at, op) = call.split();
        Request::Store(at.with(op.into()))
    }
}

impl<O: StoreCall> Call for OnStore<O> {
    type Reply = O::Reply;
    const OPERATION: &'static str = "operate the store";

    fn serve(self) -> Result<O::Reply> {
        crate::storage::fault::choose_from(self.config.fault_file.as_deref());
        let store = super::open(&self.config, self.config.storage.backend)?.ok_or_else(|| {
            Error::Storage {
                operation: "open",
                message: "the passthrough backend has no store".into(),
            }
        })?;
        self.op.serve(&self.config, store.as_ref())
    }
}

/// How often shims reconcile the store on their own (at most; a new state dir, as
/// after a reboot, makes the next one due at once).
const RECONCILE_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether a shim starting a container should reconcile the store now: none did in
/// the last [`RECONCILE_EVERY`] on this host (a stamp in the state dir, renewed here).
pub fn reconcile_due(config: &Config) -> bool {
    let stamp = config
        .state_dir
        .join(format!(".reconciled-{:?}", config.storage.backend).to_lowercase());
    let fresh = std::fs::metadata(&stamp)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age < RECONCILE_EVERY);
    if fresh {
        return false;
    }
    // Renewed before the run: shims starting together do not all reconcile.
    std::fs::create_dir_all(&config.state_dir).is_ok() && std::fs::write(&stamp, b"").is_ok()
}

/// Runs `op` on the configured store in a helper process; answers what it answers.
pub fn run<O: StoreCall>(config: &Config, op: O) -> Result<O::Reply> {
    let call = OnStore {
        config: config.clone(),
        op,
    };
    helper::run(|_| call, ChildStdio::default())
}

impl StoreCall for Prepare {
    type Reply = ();
    fn serve(self, config: &Config, store: &dyn Store) -> Result<()> {
        let Prepare {
            key,
            image,
            target,
            top,
        } = self;
        // A new tree is a new container (perhaps under the id of a removed
        // one): its history starts afresh. Removed first, so that a crash in
        // between leaves no history beside a tree it does not describe.
        let new = match store.existing(&key, &image)? {
            None | Some(Existing::Replace) => {
                forget_history(config, &key)?;
                true
            }
            // The same container's tree; or another's, which prepare refuses.
            Some(Existing::Reuse | Existing::Conflict) => false,
        };
        let live = store.prepare(&key, &image)?;
        if new && !top.is_empty() {
            let view = std::env::temp_dir().join(super::work::tmp_name("adopt-view"));
            std::fs::create_dir_all(&view)
                .map_err(Error::io(format!("create {}", view.display())))?;
            let applied = super::adopt::apply_top(&live, &image, &top, &view);
            let _ = std::fs::remove_dir(&view);
            if let Err(e) = applied {
                let _ = store.destroy(&key);
                return Err(e);
            }
        }
        bind_at(&live, &target)
    }
}

impl StoreCall for CloneSnapshot {
    type Reply = ();
    fn serve(self, config: &Config, store: &dyn Store) -> Result<()> {
        let CloneSnapshot {
            src,
            snapshot,
            key,
            image,
            target,
        } = self;
        clear_for_new_tree(config, store, &key, &image)?;
        let live = match store.clone_snapshot(&src, &snapshot, &key) {
            // A tree left by a removed container of the same id: collect, retry.
            Err(Error::AlreadyExists(_)) if image.snapshotter().is_some() => {
                let scope = image.snapshotter().expect("checked");
                collect(config, store, &scope)?;
                store.clone_snapshot(&src, &snapshot, &key)?
            }
            other => other?,
        };
        if let Some(owner) = &image.owner {
            store.set_owner(&key, owner)?;
        }
        bind_at(&live, &target)
    }
}

/// Readies `key` for a tree of its own: forgets the history of an earlier
/// container of that id, and removes a tree of this id that containerd's snapshot
/// no longer owns (a fork or import discarded after a crash, whose snapshot
/// containerd has not collected yet), or that an earlier try of this same task
/// made: a new tree holds nothing yet, so it starts again.
fn clear_for_new_tree(
    config: &Config,
    store: &dyn Store,
    key: &ContainerKey,
    image: &ImageSource,
) -> Result<()> {
    forget_history(config, key)?;
    if matches!(
        store.existing(key, image)?,
        Some(Existing::Replace | Existing::Reuse)
    ) {
        store.destroy(key)?;
    }
    Ok(())
}

/// Makes `tree`, a replica's (made by [`Store::standby_tree`] from the snapshot
/// a fork would clone; its processes never ran, so it holds that snapshot's
/// files), the tree of the new container `key`, owned by `image`'s layer, and
/// binds it on `target`: what [`CloneSnapshot`] makes, without the clone. Runs
/// in the calling process: the stores that make replicas (btrfs) exec nothing
/// here, so the shim's reaper cannot take a tool's exit status.
pub fn take_tree(
    config: &Config,
    key: &ContainerKey,
    image: &ImageSource,
    tree: &Path,
    target: &Path,
) -> Result<()> {
    let store = crate::container::Container::open_store(config)?;
    clear_for_new_tree(config, &*store, key, image)?;
    let live = store.take_tree(key, tree, image.owner.as_deref())?;
    bind_at(&live, target)
}

impl StoreCall for Release {
    type Reply = ();
    fn serve(self, config: &Config, store: &dyn Store) -> Result<()> {
        let key = self.key;
        store.release(&key)?;
        // A tree without an owner (a read-only view's) cannot be found again
        // by the collect: it goes with its task. Nothing in it was written.
        if store
            .existing(&key, &ImageSource::from_layers(Vec::new())?)?
            .is_some()
            && store.owner(&key)?.is_none()
        {
            store.destroy(&key)?;
            forget_history(config, &key)?;
        }
        Ok(())
    }
}

impl StoreCall for Collect {
    type Reply = Collected;
    fn serve(self, config: &Config, store: &dyn Store) -> Result<Collected> {
        let containers = collect(config, store, &self.scope)?;
        // After the trees: a removed container's layers may have been the last
        // reason containerd kept them.
        let images = store.collect_images(&self.scope)?;
        Ok(Collected { containers, images })
    }
}

impl StoreCall for ChangedSinceImage {
    type Reply = Option<BTreeSet<String>>;
    fn serve(self, _: &Config, store: &dyn Store) -> Result<Option<BTreeSet<String>>> {
        store.changed_since_image(&self.key, &self.image)
    }
}

impl StoreCall for WriteBack {
    type Reply = super::write_back::WrittenBack;
    fn serve(self, config: &Config, store: &dyn Store) -> Result<Self::Reply> {
        super::write_back::write_back_adopted(config, store, &self.key, &self.lower, &self.upper)
    }
}

impl StoreCall for Reconcile {
    type Reply = ReconcileReport;
    fn serve(self, _: &Config, store: &dyn Store) -> Result<ReconcileReport> {
        store.reconcile()
    }
}

/// The store's collect, with the removed containers' checkpoint histories (their
/// snapshots already went with their trees).
fn collect(config: &Config, store: &dyn Store, scope: &Path) -> Result<Vec<ContainerKey>> {
    let keys = store.collect(scope)?;
    for key in &keys {
        if let Err(e) = forget_history(config, key) {
            tracing::warn!(%key, error = %e, "remove the history of a removed container");
        }
    }
    Ok(keys)
}

/// Removes the checkpoint history of `key` (its process images and manifest), under
/// its lock. A key that never had one (most new containers) costs two stats, not a
/// lock file made and removed.
fn forget_history(config: &Config, key: &ContainerKey) -> Result<()> {
    if !HistoryStore::exists(config, key) {
        return Ok(());
    }
    let history = HistoryStore::open(config, key)?;
    tracing::info!(%key, entries = history.history().entries.len(),
        "the history of a container that had this id is removed");
    history.remove(config, key)
}

/// Bind-mounts the store's tree `live` on `target` (made if missing).
pub(crate) fn bind_at(live: &Path, target: &Path) -> Result<()> {
    std::fs::create_dir_all(target).map_err(Error::io(format!("create {}", target.display())))?;
    mount(
        Some(live),
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(Error::sys(format!(
        "bind {} on {}",
        live.display(),
        target.display()
    )))?;
    // The pool is mounted nosuid,nodev, and a bind keeps its source's flags: the
    // container's own view of its tree gets what runc's gives a container (its
    // setuid programs work inside), at the bundle, which only root can reach.
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(Error::sys(format!("remount {} suid,dev", target.display())))
}
