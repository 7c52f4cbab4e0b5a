//! Usage: what containerd's CRI plugin reports to kubelet as a container's
//! writable layer (it asks every active snapshot, every `stats_collect_period`).
//!
//! A committed layer reports what it held when committed. An active one reports
//! what its upper directory holds, as containerd's overlay snapshotter does, unless
//! Crab's store made a container's tree for it: the container then writes there,
//! the upper directory stays empty, and the tree's written bytes are the answer.

use crab_runtime::storage::du::disk_usage;

use crate::error::{Error, Result};
use crate::meta::{Kind, Measured};
use crate::snapshotter::{check_key, Snapshotter};

impl Snapshotter {
    /// Bytes and inodes snapshot `key` uses.
    pub fn usage(&self, key: &str) -> Result<Measured> {
        check_key("key", key)?;
        // Measured without the lock: a walk or a store query may take a while.
        let rec = self.lock().get(key)?.clone();
        match rec.kind {
            Kind::Committed => Ok(rec.measured.unwrap_or_default()),
            Kind::View => Ok(Measured::default()),
            Kind::Active => {
                let upper = self.fs(rec.id);
                let du = disk_usage(&upper).map_err(|e| Error::Measure {
                    path: upper.clone(),
                    message: e.to_string(),
                })?;
                let tree = self
                    .trees
                    .written_for(&upper)
                    .map_err(|message| Error::TreeUsage {
                        layer: upper.clone(),
                        message,
                    })?;
                Ok(match tree {
                    Some(bytes) => Measured {
                        bytes: du.bytes + bytes,
                        inodes: du.inodes,
                    },
                    None => Measured {
                        bytes: du.bytes,
                        inodes: du.inodes,
                    },
                })
            }
        }
    }
}
