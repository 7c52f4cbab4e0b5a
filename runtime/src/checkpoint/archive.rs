//! Migration archives: one file holding a checkpoint for another host.
//!
//! An archive is a tar of a checkpoint directory in the layout containerd's restore
//! uses ([`crate::checkpoint`]: CRIU images, the file-system delta against the image,
//! the manifest) plus [`RECORD`], what the receiving containerd needs to create the
//! container (image, runtime, spec). The image itself is not in it: the receiving host
//! pulls or imports it, as for any container.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::engine::Dumped;
use super::history::{self, create_private_dir, Entry};
use super::{dir_bytes, fs_diff, sync_path, FsPart, Kind, Manifest, Timings, CRIU_DIR, FS_DIFF};
use crate::config::Config;
use crate::storage::{self, tree, work, ContainerKey, ImageSource};
use crate::{Error, Result};

/// The container record's file name inside an archive.
pub const RECORD: &str = "container.json";

/// What containerd knows about the container, to create it again elsewhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRecord {
    /// The image reference.
    pub image: String,
    /// The runtime (`io.containerd.crab.v2`).
    pub runtime: String,
    /// The spec's protobuf type URL.
    pub spec_type: String,
    /// The OCI spec (JSON).
    pub spec: serde_json::Value,
    /// The snapshotter.
    pub snapshotter: String,
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportReport {
    /// The archive's size.
    pub bytes: u64,
    /// Entries in the file-system delta.
    pub changed: usize,
    /// Milliseconds it took.
    pub ms: u64,
}

/// Writes checkpoint `entry` of container `key` (its process image, and its files as
/// a delta against `image`) with `record` into the archive `out`.
pub fn export(
    config: &Config,
    key: &ContainerKey,
    entry: &Entry,
    image: &ImageSource,
    record: &ContainerRecord,
    out: &Path,
) -> Result<ExportReport> {
    let started = Instant::now();
    let (images, dumped) =
        super::ops::process_image(config, key, entry)?.ok_or_else(|| Error::BadCheckpoint {
            path: history::dir(config, key),
            message: format!("checkpoint {} holds no processes", entry.name),
        })?;
    let snapshot = entry
        .fs_snapshot
        .clone()
        .ok_or_else(|| Error::BadCheckpoint {
            path: history::dir(config, key),
            message: format!("checkpoint {} holds no files", entry.name),
        })?;
    let staging = config
        .checkpoint
        .store
        .join(".exports")
        .join(work::tmp_name("export"));
    create_private_dir(&staging)?;
    let result = (|| -> Result<ExportReport> {
        std::fs::create_dir_all(staging.join(CRIU_DIR))
            .map_err(Error::io(format!("create {}", staging.display())))?;
        tree::copy(&images, &staging.join(CRIU_DIR))?;
        let fs = write_delta(config, key, &snapshot, image, &staging)?;
        let manifest = Manifest {
            version: super::VERSION,
            kind: Kind::Full,
            namespace: key.namespace().to_string(),
            id: dumped_id(&dumped, key),
            created_ms: entry.created_ms,
            stdio: dumped.stdio.clone(),
            fs: Some(fs.clone()),
            process_bytes: dir_bytes(&staging.join(CRIU_DIR)),
            terminal: dumped.stdio.tty.is_some(),
            timings: Timings::default(),
            criu_files: super::engine::image_files(&staging.join(CRIU_DIR)),
            network_by_hooks: dumped.network_by_hooks,
        };
        manifest.write(&staging, false)?;
        let json = serde_json::to_vec_pretty(record).expect("record serializes");
        std::fs::write(staging.join(RECORD), json)
            .map_err(Error::io(format!("write {}", RECORD)))?;
        run_tar(
            &[
                "-C",
                &staging.display().to_string(),
                "-cf",
                &out.display().to_string(),
                ".",
            ],
            "write the archive",
        )?;
        // It holds process memory, secrets included.
        std::fs::set_permissions(out, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(Error::io(format!("chmod {}", out.display())))?;
        sync_path(out)?;
        Ok(ExportReport {
            bytes: std::fs::metadata(out).map(|m| m.len()).unwrap_or(0),
            changed: fs.changed,
            ms: started.elapsed().as_millis() as u64,
        })
    })();
    let _ = std::fs::remove_dir_all(&staging);
    result
}

fn dumped_id(d: &Dumped, key: &ContainerKey) -> String {
    if d.id.is_empty() {
        key.id().to_string()
    } else {
        d.id.clone()
    }
}

/// The file-system delta of `snapshot` against the image, read from a temporary clone
/// of the snapshot (every store can clone; not every store shows a snapshot as a tree).
fn write_delta(
    config: &Config,
    key: &ContainerKey,
    snapshot: &str,
    image: &ImageSource,
    staging: &Path,
) -> Result<FsPart> {
    let store = storage::open(config, config.storage.backend)?.ok_or_else(|| Error::Storage {
        operation: "export",
        message: "the passthrough backend keeps no snapshots".into(),
    })?;
    let view = ContainerKey::new(key.namespace(), &work::tmp_name("export").replace('.', "-"))?;
    let tree = store.clone_snapshot(key, snapshot, &view)?;
    let mnt = staging.join(".image");
    let result = (|| {
        std::fs::create_dir_all(&mnt).map_err(Error::io(format!("create {}", mnt.display())))?;
        let _mounted = image.mount_readonly(&mnt)?;
        let diff = fs_diff::diff(Some(&mnt), &tree)?;
        let bytes = fs_diff::write_tar(&tree, &diff, &staging.join(FS_DIFF))?;
        Ok(FsPart {
            changed: diff.changed.len(),
            deleted: diff.deleted,
            bytes,
        })
    })();
    let _ = std::fs::remove_dir(&mnt);
    let _ = store.release(&view);
    if let Err(e) = store.destroy(&view) {
        tracing::warn!(%view, error = %e, "remove the export's temporary clone");
    }
    result
}

/// Unpacks the archive `file` into `dir` (made, mode 0700) and checks it; returns the
/// container record.
pub fn unpack(file: &Path, dir: &Path) -> Result<ContainerRecord> {
    if dir.exists() {
        return Err(Error::AlreadyExists(format!(
            "{} (an earlier import)",
            dir.display()
        )));
    }
    create_private_dir(dir)?;
    let result = (|| {
        run_tar(
            &[
                "-C",
                &dir.display().to_string(),
                "-xf",
                &file.display().to_string(),
            ],
            "unpack the archive",
        )?;
        Manifest::read(dir)?;
        let text = std::fs::read(dir.join(RECORD)).map_err(|e| Error::BadCheckpoint {
            path: file.to_path_buf(),
            message: format!("no {RECORD}: {e}"),
        })?;
        serde_json::from_slice(&text).map_err(|e| Error::BadCheckpoint {
            path: file.to_path_buf(),
            message: format!("{RECORD}: {e}"),
        })
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
}

/// Where imports of `namespace/id` are unpacked.
pub fn import_dir(config: &Config, key: &ContainerKey) -> PathBuf {
    config
        .checkpoint
        .store
        .join(".imports")
        .join(key.namespace())
        .join(key.id())
}

fn run_tar(args: &[&str], what: &str) -> Result<()> {
    let out = std::process::Command::new("tar")
        .args(args)
        .output()
        .map_err(Error::io(format!("{what}: run tar")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::Command {
        command: format!("tar ({what})"),
        message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}
