//! Crab's own checkpoints of a running container (`crabctl checkpoint / ls / rm /
//! rollback`): what runs in the helper process, next to the container.
//!
//! A checkpoint freezes the container once: the file-system snapshot (milliseconds)
//! and the CRIU dump (leave running) see the same instant. Its CRIU images are written
//! under a temporary name, fsync-ed and renamed; the history entry is recorded after
//! that; retention removes older checkpoints only after the new entry is durable.
//! Retention counts checkpoints and bytes ([`super::byte_quota`]).

use std::path::Path;
use std::time::Instant;

use libcontainer::container::ContainerStatus;
use serde::{Deserialize, Serialize};

use super::engine::{dump_request, image_files, stdio_keys, Dumped};
use super::history::{self, create_private_dir, Entry, History};
use super::history_store::HistoryStore;
use super::{dir_bytes, sync_path, sync_tree, Kind, Timings, CRIU_DIR};
use crate::config::{Config, Durability};
use crate::container::{load_spec, Container};
use crate::inspect::{self, Freeze};
use crate::storage::{self, fault, names, ContainerKey, Store};
use crate::{criu, Error, Result};

/// The stdio keys of a process image, beside its CRIU images.
const STDIO_FILE: &str = "dumped.json";

/// What to checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRequest {
    /// Which parts.
    pub kind: Kind,
    /// A name (default: the seq).
    pub name: Option<String>,
    /// Keep it whatever the retention.
    pub mark: bool,
}

impl Container {
    pub(crate) fn open_store(config: &Config) -> Result<Box<dyn Store>> {
        storage::open(config, config.storage.backend)?.ok_or_else(|| Error::Storage {
            operation: "checkpoint",
            message: "the passthrough backend keeps no snapshots: use btrfs, zfs or overlay".into(),
        })
    }

    pub(super) fn checkpoint_into_history(
        &self,
        config: &Config,
        req: &CheckpointRequest,
    ) -> Result<Entry> {
        let key = self.key()?;
        let store = Container::open_store(config)?;
        // Held until the entry is recorded and retention has run.
        let mut locked = HistoryStore::open(config, &key)?;
        let dir = locked.dir().to_path_buf();
        create_private_dir(&dir)?;
        let history = locked.history_mut();
        let seq = history.next_seq;
        let name = req.name.clone().unwrap_or_else(|| seq.to_string());
        names::check_snapshot_name(&name)?;
        if history.find(&name).is_ok() {
            return Err(Error::SnapshotExists {
                container: key.to_string(),
                name,
            });
        }
        let prev = history.latest().cloned();
        if req.kind == Kind::Skip
            && prev
                .as_ref()
                .is_none_or(|p| p.fs_snapshot.is_none() || p.process_image.is_none())
        {
            return Err(Error::WrongState {
                id: key.id().to_string(),
                state: "without an earlier full checkpoint".into(),
                operation: "record a skipped turn",
            });
        }
        if req.kind == Kind::ProcessOnly
            && prev.as_ref().and_then(|p| p.fs_snapshot.as_ref()).is_none()
        {
            return Err(Error::WrongState {
                id: key.id().to_string(),
                state: "without an earlier checkpoint of its files".into(),
                operation: "take a process-only checkpoint",
            });
        }
        let (with_fs, with_proc) = match req.kind {
            Kind::Full => (true, true),
            Kind::FsOnly => (true, false),
            Kind::ProcessOnly => (false, true),
            Kind::Skip => (false, false),
        };
        // Read before the freeze: a dump no restore could use is refused here.
        let spec = if with_proc {
            let spec = load_spec(&self.state.bundle)?;
            crate::userns::joined::refuse_process_dump(key.id(), &spec)?;
            Some(spec)
        } else {
            None
        };
        let status = self.status()?;
        let pid = match (status, self.lc()?.pid()) {
            (ContainerStatus::Running | ContainerStatus::Paused, Some(p)) => p.as_raw(),
            _ => {
                return Err(Error::WrongState {
                    id: key.id().to_string(),
                    state: format!("{status:?}").to_lowercase(),
                    operation: "checkpoint",
                })
            }
        };
        let started = Instant::now();
        let mut timings = Timings::default();
        let snapshot = history::snapshot_name(seq);
        let tmp = dir.join(format!(".{seq}.tmp"));
        let froze = status == ContainerStatus::Running && req.kind != Kind::Skip;
        // A checkpoint that died before its entry was recorded left its parts under
        // this seq (no entry names it yet): they go before the seq is reused.
        discard_half_made(&dir, seq, store.as_ref(), &key)?;
        // And what a crash kept an earlier removal from deleting (saved as
        // uncollected; the save below records it done).
        if !history.uncollected.is_empty() {
            collect(history, &dir, store.as_ref(), &key);
        }
        let freeze = Freeze::begin(self, froze, true)?;
        timings.freeze_ms = started.elapsed().as_millis() as u64;
        fault::point("checkpoint.frozen");
        let frozen = (|| -> Result<()> {
            if with_fs {
                let t = Instant::now();
                store.snapshot(&key, &snapshot)?;
                timings.fs_ms = t.elapsed().as_millis() as u64;
                fault::point("checkpoint.snapshotted");
            }
            if let Some(spec) = &spec {
                let t = Instant::now();
                let _ = std::fs::remove_dir_all(&tmp);
                create_private_dir(&tmp.join(CRIU_DIR))?;
                let stdio = stdio_keys(pid);
                let request = dump_request(
                    criu::Tool::from_config(config),
                    pid,
                    tmp.join(CRIU_DIR),
                    true,
                    &self.cgroup_path()?,
                    &self.state.tracking_cgroup,
                    spec,
                    &stdio,
                    true,
                );
                criu::dump(&request)?;
                timings.dump_ms = t.elapsed().as_millis() as u64;
                let dumped = Dumped {
                    id: key.id().to_string(),
                    stdio,
                    files: image_files(&tmp.join(CRIU_DIR)),
                    // A history's checkpoint keeps the network images: an
                    // in-place rollback re-attaches nothing.
                    network_by_hooks: false,
                    foreign_mounts: false,
                    held_network: request.held_network,
                };
                std::fs::write(
                    tmp.join(STDIO_FILE),
                    serde_json::to_vec(&dumped).expect("json"),
                )
                .map_err(Error::io(format!("write {}", tmp.display())))?;
                fault::point("checkpoint.dumped");
            }
            // Still frozen: the inspector forgets exactly what was captured.
            if req.kind != Kind::Skip {
                if let Err(e) = inspect::captured(self, req.kind, pid) {
                    tracing::warn!(id = %key, error = %e, "inspector reset after checkpoint");
                }
            }
            Ok(())
        })();
        let dumped_at = Instant::now();
        // Else synced in the background once recorded (`super::durability`).
        let host_durable = config.checkpoint.durability == Durability::Host;
        freeze.end(self, with_proc, frozen.is_ok());
        let durable = frozen.and_then(|()| {
            if !with_proc {
                return Ok(0);
            }
            let bytes = dir_bytes(&tmp);
            super::byte_quota::admit(history, config, &key, &dir, bytes, req.mark)?;
            if host_durable {
                sync_tree(&tmp)?;
            }
            std::fs::rename(&tmp, history::image_dir(&dir, seq))
                .map_err(Error::io(format!("rename {}", tmp.display())))?;
            if host_durable {
                sync_path(&dir)?;
            }
            fault::point("checkpoint.renamed");
            Ok(bytes)
        });
        timings.sync_ms = dumped_at.elapsed().as_millis() as u64;
        let process_bytes = match durable {
            Ok(bytes) => bytes,
            Err(e) => {
                // The inspector forgot changes this failed checkpoint did not keep:
                // make the next classification take everything.
                inspect::taint(self);
                let _ = std::fs::remove_dir_all(&tmp);
                if with_fs {
                    let _ = store.delete_snapshot(&key, &snapshot);
                }
                return Err(e);
            }
        };
        timings.total_ms = started.elapsed().as_millis() as u64;
        let entry = Entry {
            seq,
            name,
            parent: prev.as_ref().map(|p| p.seq),
            kind: req.kind,
            fs_snapshot: if with_fs {
                Some(snapshot)
            } else {
                prev.as_ref().and_then(|p| p.fs_snapshot.clone())
            },
            process_image: if with_proc {
                Some(seq)
            } else {
                prev.as_ref().and_then(|p| p.process_image)
            },
            created_ms: super::Manifest::now_ms(),
            process_bytes,
            timings,
            marked: req.mark,
        };
        history.entries.push(entry.clone());
        history.next_seq = seq + 1;
        let sync_later = with_proc && !host_durable;
        if sync_later {
            history.unsynced.insert(seq, super::durability::boot_id());
        }
        // Synced by the caller of the helper this runs in, which lives on
        // ([`Container::take_checkpoint`]).
        history.save(&dir)?;
        fault::point("checkpoint.recorded");
        // Only now, with the new entry durable, may older ones go.
        let dropped = super::byte_quota::retain(history, config, &dir);
        if !dropped.is_empty() {
            history.save(&dir)?;
            fault::point("checkpoint.retained");
            collect(history, &dir, store.as_ref(), &key);
            super::journal::prune(&super::journal::dir(config, &key), &history.entries);
        }
        Ok(entry)
    }

    pub(super) fn remove_checkpoint(&self, config: &Config, name: &str) -> Result<Entry> {
        let key = self.key()?;
        let store = Container::open_store(config)?;
        let mut locked = HistoryStore::open(config, &key)?;
        let removed = locked.history_mut().remove(name)?;
        locked.save()?;
        let dir = locked.dir().to_path_buf();
        collect(locked.history_mut(), &dir, store.as_ref(), &key);
        super::journal::prune(
            &super::journal::dir(config, &key),
            &locked.history().entries,
        );
        Ok(removed)
    }
}

/// Deletes the process images and snapshots of `dropped` that no remaining entry uses.
/// Deletes the process images and snapshots of the history's uncollected entries that
/// no remaining entry uses, and forgets them (the next save records that).
/// Idempotent: after a crash, the saved list is collected again.
fn collect(history: &mut History, dir: &Path, store: &dyn Store, key: &ContainerKey) {
    let (images, snapshots) = history.referenced();
    for e in std::mem::take(&mut history.uncollected) {
        if let Some(seq) = e.process_image.filter(|s| !images.contains(s)) {
            let _ = std::fs::remove_dir_all(history::image_dir(dir, seq));
        }
        if let Some(s) = e.fs_snapshot.as_ref().filter(|s| !snapshots.contains(*s)) {
            // Gone already when a crash interrupted an earlier collection.
            if store
                .list(key)
                .is_ok_and(|l| l.iter().any(|i| &i.name == s))
            {
                if let Err(err) = store.delete_snapshot(key, s) {
                    tracing::warn!(%key, snapshot = %s, error = %err, "delete snapshot");
                }
            }
        }
    }
}

/// What a rollback to `entry` restores the processes from, if anything.
pub fn process_image(
    config: &Config,
    key: &ContainerKey,
    entry: &Entry,
) -> Result<Option<(std::path::PathBuf, Dumped)>> {
    let Some(seq) = entry.process_image else {
        return Ok(None);
    };
    let dir = history::image_dir(&history::dir(config, key), seq);
    let file = dir.join(STDIO_FILE);
    let text = std::fs::read(&file).map_err(|e| Error::BadCheckpoint {
        path: dir.clone(),
        message: format!("{STDIO_FILE}: {e}"),
    })?;
    let dumped: Dumped = serde_json::from_slice(&text).map_err(|e| Error::BadCheckpoint {
        path: dir.clone(),
        message: format!("{STDIO_FILE}: {e}"),
    })?;
    if !dir.join(CRIU_DIR).join("inventory.img").is_file() {
        return Err(Error::BadCheckpoint {
            path: dir,
            message: format!("{CRIU_DIR}/inventory.img is missing"),
        });
    }
    Ok(Some((dir.join(CRIU_DIR), dumped)))
}

/// Removes what a checkpoint that died before recording its entry left at `seq`, the
/// next one (no entry names it): its temporary or renamed process images and its
/// file-system snapshot.
fn discard_half_made(dir: &Path, seq: u64, store: &dyn Store, key: &ContainerKey) -> Result<()> {
    let mut found = false;
    for images in [
        dir.join(format!(".{seq}.tmp")),
        history::image_dir(dir, seq),
    ] {
        if images.exists() {
            std::fs::remove_dir_all(&images)
                .map_err(Error::io(format!("remove {}", images.display())))?;
            found = true;
        }
    }
    let snapshot = history::snapshot_name(seq);
    if store.list(key)?.iter().any(|s| s.name == snapshot) {
        store.delete_snapshot(key, &snapshot)?;
        found = true;
    }
    if found {
        tracing::warn!(%key, seq, "discarded a checkpoint a crash left unrecorded");
    }
    Ok(())
}
