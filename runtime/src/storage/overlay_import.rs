//! What an imported overlay snapshot may hold.
//!
//! An overlay snapshot is an upper dir and a `lower` file that lists the lower dirs
//! the upper dir goes over. Those lower dirs become the overlay's `lowerdir` when a
//! tree is made from the snapshot, so a `lower` file from another host is a list of
//! host paths to mount into a container: `/` would give it the host's root. An
//! imported snapshot may therefore name only layers the store already uses (the lower
//! dirs containerd gave it for a tree or a snapshot on this host), and must be exactly
//! what [`OverlayStore::export`](super::overlay::OverlayStore) writes: a directory
//! holding an `upper` directory, a regular `lower` file and, for an image without
//! layers, an `empty-lower` directory; nothing of it a symlink.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::dirs::{read_dir_lossy, PoolDirs};
use super::names::{CONTAINERS, SNAPSHOTS};
use crate::{Error, Result};

/// The lower dirs the store's trees and snapshots use.
pub(super) fn known_layers(dirs: &PoolDirs) -> BTreeSet<PathBuf> {
    let trees = dirs
        .by_namespace(CONTAINERS)
        .into_iter()
        .map(|(_, e)| e.path());
    let snapshots = dirs
        .by_namespace(SNAPSHOTS)
        .into_iter()
        .flat_map(|(_, c)| read_dir_lossy(&c.path()).map(|e| e.path()));
    trees
        .chain(snapshots)
        .filter_map(|p| std::fs::read_to_string(p.join("lower")).ok())
        .flat_map(|text| {
            text.lines()
                .filter(|l| !l.is_empty())
                .map(PathBuf::from)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn refused(message: String) -> Error {
    Error::ImportRefused(message)
}

/// Checks the snapshot `name` unpacked at `snap` against the layers the store
/// `known`; returns its lower dirs.
pub(super) fn check_snapshot(
    snap: &Path,
    name: &str,
    known: &BTreeSet<PathBuf>,
) -> Result<Vec<PathBuf>> {
    let kind = |p: &Path| std::fs::symlink_metadata(p).map(|m| m.file_type()).ok();
    if !kind(snap).is_some_and(|t| t.is_dir()) {
        return Err(refused(format!("{name:?} is not a directory")));
    }
    for e in read_dir_lossy(snap) {
        let entry = e.file_name().to_string_lossy().into_owned();
        let t = kind(&e.path());
        let fits = match entry.as_str() {
            "upper" | "empty-lower" => t.is_some_and(|t| t.is_dir()),
            "lower" => t.is_some_and(|t| t.is_file()),
            // Its size record: replaced by the importer's own measure.
            super::overlay_quota::BYTES_FILE => t.is_some_and(|t| t.is_file()),
            _ => false,
        };
        if !fits {
            return Err(refused(format!(
                "{name}/{entry} is not part of an overlay snapshot (a directory `upper`, \
                 a regular file `lower`)"
            )));
        }
    }
    if !kind(&snap.join("upper")).is_some_and(|t| t.is_dir()) {
        return Err(refused(format!("{name} has no upper directory")));
    }
    let lower = snap.join("lower");
    let text = std::fs::read_to_string(&lower)
        .map_err(|e| refused(format!("{name}/lower cannot be read as text: {e}")))?;
    let layers: Vec<PathBuf> = text
        .lines()
        .filter(|l| !l.is_empty())
        .map(PathBuf::from)
        .collect();
    for layer in &layers {
        if !known.contains(layer) {
            return Err(refused(format!(
                "{name}/lower names {} as a lower dir, which is not one of the image \
                 layers this store uses (run a container of the same image on this host \
                 first)",
                layer.display()
            )));
        }
    }
    Ok(layers)
}
