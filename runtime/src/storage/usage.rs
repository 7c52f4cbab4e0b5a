//! What a containerd writable layer holds when Crab's store keeps its data.
//!
//! A crab container writes into its tree in Crab's pool, never into the snapshot
//! containerd prepared for it, so that snapshot stays empty and containerd's CRI
//! plugin, which reports a container's writable layer from its snapshotter's
//! `Usage`, would tell kubelet 4 KiB. Crab's snapshotter asks this module instead:
//! the tree recorded for the snapshot's writable directory (its owner, see
//! [`Store::set_owner`]) and what that tree wrote ([`Store::written`]).

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{open, ContainerKey, Store};
use crate::config::{Backend, Config};
use crate::Result;

/// How long a backend whose pool could not be opened is left before trying again
/// (the snapshotter may start before the pool is mounted or imported).
const RETRY: Duration = Duration::from_secs(30);

/// The stores of this host, each opened once its pool is there.
pub struct Trees {
    config: Option<Config>,
    slots: Mutex<Vec<Slot>>,
}

struct Slot {
    backend: Backend,
    store: Option<Box<dyn Store>>,
    tried: Option<Instant>,
}

/// A tree found for a writable layer, and what it wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeWritten {
    /// The container the tree belongs to.
    pub key: ContainerKey,
    /// Bytes it wrote that the pool keeps.
    pub bytes: u64,
}

impl Trees {
    /// The backends of `config`; each is opened at the first lookup that finds its
    /// pool (a backend this host does not use, such as ZFS without a pool, is
    /// tried again every 30 s and costs nothing else).
    pub fn open(config: &Config) -> Trees {
        let slots = [Backend::Btrfs, Backend::Overlay, Backend::Zfs]
            .into_iter()
            .map(|backend| Slot {
                backend,
                store: None,
                tried: None,
            })
            .collect();
        Trees {
            config: Some(config.clone()),
            slots: Mutex::new(slots),
        }
    }

    /// Trees of the given stores (tests).
    pub fn of(stores: Vec<Box<dyn Store>>) -> Trees {
        let slots = stores
            .into_iter()
            .map(|store| Slot {
                backend: store.backend(),
                store: Some(store),
                tried: None,
            })
            .collect();
        Trees {
            config: None,
            slots: Mutex::new(slots),
        }
    }

    /// The tree made for the writable layer `owner` and what it wrote; `None` when
    /// no store has a tree for it (the layer holds its own data, as runc's).
    pub fn written_for(&self, owner: &Path) -> Result<Option<TreeWritten>> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        for slot in slots.iter_mut() {
            self.try_open(slot);
            let Some(store) = &slot.store else {
                continue;
            };
            // A store that cannot be searched (a ZFS daemon that does not answer)
            // must not cost the layers of the others (and runc's) their usage.
            match store.owned_by(owner) {
                Ok(Some(key)) => {
                    let bytes = store.written(&key)?;
                    return Ok(Some(TreeWritten { key, bytes }));
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(backend = ?slot.backend, error = %e, "store not searched")
                }
            }
        }
        Ok(None)
    }

    fn try_open(&self, slot: &mut Slot) {
        let Some(config) = &self.config else {
            return;
        };
        if slot.store.is_some() || slot.tried.is_some_and(|t| t.elapsed() < RETRY) {
            return;
        }
        slot.tried = Some(Instant::now());
        let present = match slot.backend {
            Backend::Btrfs => Path::new(&config.storage.pool).is_dir(),
            Backend::Overlay => config.storage.overlay_dir.is_dir(),
            _ => true,
        };
        if !present {
            return;
        }
        match open(config, slot.backend) {
            Ok(store) => slot.store = store,
            Err(e) => tracing::debug!(backend = ?slot.backend, error = %e, "store not opened yet"),
        }
    }
}
