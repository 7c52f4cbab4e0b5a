//! Store operations as the shim runs them: in the helper process.
//!
//! Stores exec tools (`zfs`, `btrfs send`, `tar`) whose exit status the shim's SIGCHLD
//! reaper would collect first (ECHILD: measured with every ZFS container create). The
//! helper is single-threaded and no reaper, so the shim sends it the whole operation,
//! the bind mount of the tree included (the helper shares the shim's mount namespace).

use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};
use serde::{Deserialize, Serialize};

use super::work::Existing;
use super::{ContainerKey, ImageSource, Store};
use crate::checkpoint::history_store::HistoryStore;
use crate::config::Config;
use crate::helper::{self, ChildStdio, Request};
use crate::{Error, Result};

/// What to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum StoreOp {
    /// Make (or reuse) the container's tree from `image` and bind it on `target`.
    Prepare {
        /// The container.
        key: ContainerKey,
        /// Its image.
        image: ImageSource,
        /// Where to bind it.
        target: PathBuf,
        /// Layers of this container alone (top first) applied onto a new tree over
        /// `image`: an adopted rootfs's ([`super::adopt`]).
        #[serde(default)]
        top: Vec<PathBuf>,
    },
    /// Make the container's tree a clone of `snapshot` of `src` (a fork), owned by the
    /// image's containerd layer, and bind it on `target`.
    Clone {
        /// The forked container.
        src: ContainerKey,
        /// Its snapshot.
        snapshot: String,
        /// The new container.
        key: ContainerKey,
        /// The new container's image (for its owner).
        image: ImageSource,
        /// Where to bind it.
        target: PathBuf,
    },
    /// Undo what prepare set up beside the bind mount (the caller unmounts).
    Release {
        /// The container.
        key: ContainerKey,
    },
    /// Destroy the trees of removed containers of one snapshotter (the caller's
    /// containerd's, [`super::work::collectable`]); answers their keys.
    Collect {
        /// That snapshotter's snapshots directory.
        scope: PathBuf,
    },
    /// The names that may differ from the image ([`super::Store::changed_since_image`]);
    /// answers a list, or null when the store cannot tell.
    ChangedSinceImage {
        /// The container.
        key: ContainerKey,
        /// Its image.
        image: ImageSource,
    },
    /// Finish or undo what crashes interrupted anywhere in the store
    /// ([`super::Store::reconcile`]: work of dead processes, rollbacks whose process
    /// died); answers what it removed and completed.
    Reconcile,
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
pub fn run(config: &Config, op: StoreOp) -> Result<serde_json::Value> {
    let config = config.clone();
    let reply = helper::run_reply(
        Box::new(move |_| Request::Store { config, op }),
        ChildStdio::default(),
    )?;
    Ok(reply.data)
}

/// [`run`] itself, in the helper.
pub(crate) fn serve(config: &Config, op: StoreOp) -> Result<serde_json::Value> {
    let store = super::open(config, config.storage.backend)?.ok_or_else(|| Error::Storage {
        operation: "open",
        message: "the passthrough backend has no store".into(),
    })?;
    let null = serde_json::Value::Null;
    match op {
        StoreOp::Prepare {
            key,
            image,
            target,
            top,
        } => {
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
            bind_at(&live, &target).map(|()| null)
        }
        StoreOp::Clone {
            src,
            snapshot,
            key,
            image,
            target,
        } => {
            forget_history(config, &key)?;
            // A tree of this id that containerd's snapshot no longer owns (a fork or
            // import discarded after a crash, whose snapshot containerd has not
            // collected yet), or that an earlier try of this same task cloned: a
            // clone's tree holds nothing yet, so it starts again.
            if matches!(
                store.existing(&key, &image)?,
                Some(Existing::Replace | Existing::Reuse)
            ) {
                store.destroy(&key)?;
            }
            let live = match store.clone_snapshot(&src, &snapshot, &key) {
                // A tree left by a removed container of the same id: collect, retry.
                Err(Error::AlreadyExists(_)) if image.snapshotter().is_some() => {
                    let scope = image.snapshotter().expect("checked");
                    collect(config, store.as_ref(), &scope)?;
                    store.clone_snapshot(&src, &snapshot, &key)?
                }
                other => other?,
            };
            if let Some(owner) = &image.owner {
                store.set_owner(&key, owner)?;
            }
            bind_at(&live, &target).map(|()| null)
        }
        StoreOp::Release { key } => {
            store.release(&key)?;
            // A tree without an owner (a read-only view's) cannot be found again
            // by the collect: it goes with its task. Nothing in it was written.
            if store
                .existing(&key, &ImageSource::from_layers(Vec::new()))?
                .is_some()
                && store.owner(&key)?.is_none()
            {
                store.destroy(&key)?;
                forget_history(config, &key)?;
            }
            Ok(null)
        }
        StoreOp::ChangedSinceImage { key, image } => Ok(store
            .changed_since_image(&key, &image)?
            .map(|paths| serde_json::to_value(paths).expect("paths serialize"))
            .unwrap_or(null)),
        StoreOp::Reconcile => {
            let report = store.reconcile()?;
            Ok(serde_json::json!({
                "removed": report.removed,
                "completed": report.completed,
            }))
        }
        StoreOp::Collect { scope } => {
            let keys = collect(config, store.as_ref(), &scope)?;
            Ok(
                serde_json::to_value(keys.iter().map(|k| k.to_string()).collect::<Vec<_>>())
                    .expect("keys serialize"),
            )
        }
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
fn bind_at(live: &Path, target: &Path) -> Result<()> {
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
