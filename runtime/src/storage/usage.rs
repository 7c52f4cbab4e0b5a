//! What a containerd writable layer holds when Crab's store keeps its data.
//!
//! A crab container writes into its tree in Crab's pool, never into the snapshot
//! containerd prepared for it, so that snapshot stays empty and containerd's CRI
//! plugin, which reports a container's writable layer from its snapshotter's
//! `Usage`, would tell kubelet 4 KiB. Crab's snapshotter asks this module instead:
//! the tree recorded for the snapshot's writable directory (its owner, see
//! [`Store::set_owner`]) and what that tree wrote ([`Store::written`]).

use std::path::Path;

use super::{open, ContainerKey, Store};
use crate::config::{Backend, Config};
use crate::Result;

/// The stores of this host whose pools can be opened.
pub struct Trees {
    stores: Vec<Box<dyn Store>>,
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
    /// The backends of `config` whose pools exist here (a backend this host does not
    /// use, such as ZFS without a pool, is left out).
    pub fn open(config: &Config) -> Trees {
        let mut stores = Vec::new();
        for backend in [Backend::Btrfs, Backend::Overlay, Backend::Zfs] {
            let present = match backend {
                Backend::Btrfs => Path::new(&config.storage.pool).is_dir(),
                Backend::Overlay => config.storage.overlay_dir.is_dir(),
                _ => true,
            };
            if !present {
                continue;
            }
            match open(config, backend) {
                Ok(Some(store)) => stores.push(store),
                Ok(None) => {}
                Err(e) => tracing::debug!(?backend, error = %e, "store not opened"),
            }
        }
        Trees { stores }
    }

    /// Trees of the given stores (tests).
    pub fn of(stores: Vec<Box<dyn Store>>) -> Trees {
        Trees { stores }
    }

    /// The tree made for the writable layer `owner` and what it wrote; `None` when
    /// no store has a tree for it (the layer holds its own data, as runc's).
    pub fn written_for(&self, owner: &Path) -> Result<Option<TreeWritten>> {
        for store in &self.stores {
            if let Some(key) = store.owned_by(owner)? {
                let bytes = store.written(&key)?;
                return Ok(Some(TreeWritten { key, bytes }));
            }
        }
        Ok(None)
    }
}
