//! A root file system the client mounted itself (Docker's), adopted into the store.
//!
//! Docker creates its tasks with no rootfs mounts: the spec's `root.path` is an
//! overlay dockerd mounted. Without this, such a container ran on that overlay as it
//! was and had no tree in the store, so no checkpoint, rollback, fork or turn.
//! Here the overlay's own options become the mount containerd would have sent
//! ([`crab_runtime::storage::adopt`]), the store's tree is made from it like any
//! containerd container's (owned by the client's writable layer, so it goes when
//! the client removes its container), and the tree is bound over the spec's root
//! path, on top of the client's overlay, in the shim's mount namespace (where the
//! client's mount is visible: Docker's data root is a shared mount).
//!
//! A record in the bundle names the client's overlay, so that the shim's unmount
//! takes off exactly what it stacked above it and leaves the client's mount to the
//! client, even after a shim crash.

use std::path::{Path, PathBuf};

use containerd_shim::protos::api::Mount;
use crab_runtime::config::Config;
use crab_runtime::storage::adopt::{self, Adopted, MountInfo};
use crab_runtime::storage::in_helper::{Prepare, WriteBack};
use crab_runtime::storage::layers::MountSpec;
use crab_runtime::storage::{ContainerKey, ImageSource};
use nix::mount::{umount2, MntFlags};

use crate::error::{ShimError, ShimResult};

/// The bundle file that records an adopted root: the root path, then the id of the
/// client's mount below the store's tree.
const RECORD: &str = "crab-adopted-root";

/// The overlay at `root` in this process's mount namespace, if there is one.
fn find(root: &Path) -> Option<Adopted> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    Adopted::find(&table, root)
}

/// The spec's root path, absolute.
fn root_path(bundle: &Path) -> ShimResult<PathBuf> {
    let spec = crab_runtime::container::load_spec(bundle)?;
    let root = spec
        .root()
        .as_ref()
        .map(|r| r.path().clone())
        .unwrap_or_else(|| PathBuf::from("rootfs"));
    Ok(if root.is_absolute() {
        root
    } else {
        bundle.join(root)
    })
}

/// Adopts the overlay at the spec's root path of `bundle` into the store: makes (or
/// reuses) the container's tree from it and binds it there. Returns the mount
/// containerd would have sent (for the collect's scope), or `None`, having done
/// nothing, when the root path is no overlay with an upper dir (`ctr run --rootfs`
/// of a plain directory): the root is then used as it is.
pub async fn prepare(
    config: &Config,
    key: &ContainerKey,
    bundle: &Path,
) -> ShimResult<Option<MountSpec>> {
    let root = root_path(bundle)?;
    let Some(adopted) = find(&root) else {
        tracing::info!(root = %root.display(), "no rootfs mounts and no overlay at the root: used as it is");
        return Ok(None);
    };
    let (spec, top) = adopted.split(adopt::has_files(&adopted.upper));
    let image = ImageSource::from_mounts(std::slice::from_ref(&spec))?;
    tracing::info!(root = %root.display(), owner = %adopted.upper.display(),
        image = ?image.layers, ?top, "adopting the client's rootfs into the store");
    // Recorded before the bind: whatever a crash leaves above the client's mount
    // is taken off by `release`.
    let record = format!("{}\n{}\n", root.display(), adopted.mount_id);
    std::fs::write(bundle.join(RECORD), record)
        .map_err(|e| ShimError::Other(format!("write {RECORD}: {e}")))?;
    let op = Prepare {
        key: key.clone(),
        image,
        target: root.clone(),
        top,
    };
    if let Err(e) = crate::rootfs::store_op(config, op).await {
        release(bundle).await;
        return Err(e);
    }
    Ok(Some(spec))
}

/// Takes off what the shim stacked on an adopted root (recorded in `bundle`), down
/// to the client's own mount, and forgets the record. Nothing without a record.
pub async fn release(bundle: &Path) {
    let file = bundle.join(RECORD);
    if !file.exists() {
        return;
    }
    let Some((root, below)) = read_record(bundle) else {
        tracing::warn!(file = %file.display(), "unreadable record of an adopted root");
        let _ = std::fs::remove_file(&file);
        return;
    };
    let r = tokio::task::spawn_blocking(move || unstack(&root, below)).await;
    match r {
        Ok(Ok(())) => {
            let _ = std::fs::remove_file(&file);
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "unmount the adopted root's tree"),
        Err(e) => tracing::warn!(error = %e, "unmount task"),
    }
}

/// The record of an adopted root in `bundle`: the root path and the id of the
/// client's mount below the store's tree; `None` without a readable one.
fn read_record(bundle: &Path) -> Option<(PathBuf, u64)> {
    let text = std::fs::read_to_string(bundle.join(RECORD)).ok()?;
    let mut lines = text.lines();
    let root = PathBuf::from(lines.next()?);
    let below = lines.next()?.parse().ok()?;
    Some((root, below))
}

/// Unmounts the topmost mount at `root` until the one on top is `below` (or
/// nothing is mounted there any more).
fn unstack(root: &Path, below: u64) -> Result<(), String> {
    for _ in 0..16 {
        let table = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("read mountinfo: {e}"))?;
        let top = MountInfo::top(&table, root);
        match top {
            Some(m) if m.id != below => {
                umount2(root, MntFlags::MNT_DETACH)
                    .map_err(|e| format!("unmount {}: {e}", root.display()))?;
                tracing::info!(root = %root.display(), mount = m.id, "unmounted the adopted tree");
            }
            _ => return Ok(()),
        }
    }
    Err(format!(
        "{} still has mounts above the client's",
        root.display()
    ))
}

/// Writes the changes of an adopted container's tree back into the client's
/// writable layer, where the client reads them (`docker commit`, `docker diff`;
/// [`crab_runtime::storage::write_back`]). The layers are those of the client's
/// overlay the record names, still mounted below the tree (Docker's overlay2 and
/// its containerd image store alike). Nothing for a root that was not adopted.
pub async fn write_back(config: &Config, key: &ContainerKey, bundle: &Path) -> ShimResult<()> {
    let Some((root, below)) = read_record(bundle) else {
        return Ok(());
    };
    let table = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| ShimError::Other(format!("read mountinfo: {e}")))?;
    let Some(adopted) = Adopted::find_mounted(&table, &root, below) else {
        return Err(ShimError::Other(format!(
            "the client's overlay at {} (mount {below}) is no longer there",
            root.display()
        )));
    };
    let started = std::time::Instant::now();
    let op = WriteBack {
        key: key.clone(),
        lower: adopted.lower,
        upper: adopted.upper,
    };
    let written = crate::rootfs::store_op(config, op).await?;
    tracing::info!(%key, changed = written.changed, deleted = written.deleted,
        ms = started.elapsed().as_millis() as u64,
        "wrote the tree's changes back into the client's writable layer");
    Ok(())
}

/// containerd's form of an adopted mount, for the collect.
pub fn as_mount(spec: &MountSpec) -> Mount {
    Mount {
        type_: spec.kind.clone(),
        source: spec.source.clone(),
        options: spec.options.clone(),
        ..Default::default()
    }
}
