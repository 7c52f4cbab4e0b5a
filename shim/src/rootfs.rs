//! The container's root file system: from the configured store (a btrfs subvolume, a
//! ZFS dataset, ...) bind-mounted on `bundle/rootfs` (or, for a root the client
//! mounted itself, over that root: [`crate::adopt`]), or, with the `passthrough`
//! backend, the mounts containerd's snapshotter prepared.

use std::path::Path;

use containerd_shim::protos::api::Mount;
use crab_runtime::config::{Backend, Config};
use crab_runtime::storage::in_helper::{
    self, CloneSnapshot, Collect, Prepare, Reconcile, Release, StoreCall,
};
use crab_runtime::storage::layers::MountSpec;
use crab_runtime::storage::{self, ContainerKey, ImageSource};

use crate::error::{ShimError, ShimResult};

/// The backend a container uses: the OCI annotation `io.crab.storage.backend` if the
/// spec has one, else the configuration's.
pub fn backend_for(config: &Config, spec: &oci_spec::runtime::Spec) -> ShimResult<Backend> {
    let Some(name) = spec
        .annotations()
        .as_ref()
        .and_then(|a| a.get(storage::BACKEND_ANNOTATION))
    else {
        return Ok(config.storage.backend);
    };
    let quoted = format!("\"{name}\"");
    serde_json::from_str::<Backend>(&quoted).map_err(|_| {
        ShimError::InvalidArgument(format!(
            "annotation {}: unknown storage backend {name:?} (passthrough, overlay, btrfs, zfs)",
            storage::BACKEND_ANNOTATION
        ))
    })
}

/// containerd's mounts as the store reads them.
pub fn mount_specs(mounts: &[Mount]) -> Vec<MountSpec> {
    mounts
        .iter()
        .map(|m| MountSpec {
            kind: m.type_.clone(),
            source: m.source.clone(),
            options: m.options.clone(),
        })
        .collect()
}

/// Makes `target` the container's root file system. Returns whether the shim mounted
/// something there (and must unmount it).
pub async fn prepare(
    config: &Config,
    key: &ContainerKey,
    mounts: &[Mount],
    target: &Path,
) -> ShimResult<bool> {
    if config.storage.backend == Backend::Passthrough {
        return mount_all(mounts, target).await;
    }
    // No mounts: the client mounted the root itself (Docker). An overlay there is
    // adopted into the store; anything else (`ctr run --rootfs DIR`) is used as it is.
    if mounts.is_empty() {
        let bundle = target.parent().unwrap_or(target);
        return Ok(match crate::adopt::prepare(config, key, bundle).await? {
            Some(spec) => {
                collect(config, &[crate::adopt::as_mount(&spec)]);
                true
            }
            None => false,
        });
    }
    let image = ImageSource::from_mounts(&mount_specs(mounts))?;
    let op = Prepare {
        key: key.clone(),
        image,
        target: target.to_path_buf(),
        top: Vec::new(),
    };
    store_op(config, op).await.map(|_| true)
}

/// Runs a store operation in the helper process.
pub(crate) async fn store_op<O>(config: &Config, op: O) -> ShimResult<O::Reply>
where
    O: StoreCall + Send + 'static,
    O::Reply: Send + 'static,
{
    let config = config.clone();
    tokio::task::spawn_blocking(move || in_helper::run(&config, op))
        .await
        .map_err(|e| ShimError::Other(format!("store task: {e}")))?
        .map_err(ShimError::from)
}

/// A fork's tree taken from its replica (the replica's tree holds the snapshot
/// [`prepare_clone`] would clone), bound on `target` as a clone is; answers that
/// the rootfs is mounted. In the shim's process: a rename and a bind, no helper.
pub async fn prepare_taken(
    config: &Config,
    key: &ContainerKey,
    tree: &Path,
    mounts: &[Mount],
    target: &Path,
) -> ShimResult<bool> {
    let image = ImageSource::from_mounts(&mount_specs(mounts))?;
    let (config, key) = (config.clone(), key.clone());
    let (tree, target) = (tree.to_path_buf(), target.to_path_buf());
    crate::task::blocking(move || {
        crab_runtime::storage::in_helper::take_tree(&config, &key, &image, &tree, &target)
    })
    .await
    .map(|()| true)
}

/// Unmounts the rootfs. A store-backed tree stays in the store, with its writes and
/// snapshots, as long as containerd's container exists: a later task of the same
/// container gets it back. [`collect`] removes the trees of removed containers.
pub async fn release(config: &Config, key: &ContainerKey, target: &Path, mounted: bool) {
    if mounted {
        unmount(target).await;
    }
    crate::adopt::release(target.parent().unwrap_or(target)).await;
    if config.storage.backend == Backend::Passthrough {
        return;
    }
    if let Err(e) = store_op(config, Release { key: key.clone() }).await {
        tracing::warn!(error = %e, "release the container's tree");
    }
}

/// Destroys, in the background, the trees of containers containerd has removed,
/// among those of the snapshotter that made `mounts` (this containerd's: another
/// containerd on the host collects its own).
pub fn collect(config: &Config, mounts: &[Mount]) {
    if config.storage.backend == Backend::Passthrough {
        return;
    }
    reconcile(config);
    let Some(scope) = ImageSource::from_mounts(&mount_specs(mounts))
        .ok()
        .and_then(|image| image.snapshotter())
    else {
        return;
    };
    let config = config.clone();
    tokio::spawn(async move {
        match store_op(&config, Collect { scope }).await {
            Ok(gone) => {
                if !gone.containers.is_empty() {
                    let keys: Vec<String> =
                        gone.containers.iter().map(ToString::to_string).collect();
                    tracing::info!(
                        ?keys,
                        "removed the trees and checkpoints of removed containers"
                    )
                }
                if !gone.images.is_empty() {
                    tracing::info!(keys = ?gone.images, "removed the copies of removed images")
                }
            }
            Err(e) => tracing::warn!(error = %e, "collect removed containers' trees"),
        }
    });
}

/// Finishes or undoes, in the background, what crashes left in the store (at most once
/// a minute on the host, and at the first container after a reboot): the work of dead
/// processes and rollbacks whose process died. Live work is left alone.
fn reconcile(config: &Config) {
    if !in_helper::reconcile_due(config) {
        return;
    }
    let config = config.clone();
    tokio::spawn(async move {
        match store_op(&config, Reconcile).await {
            Ok(report) => {
                if !report.removed.is_empty() || !report.completed.is_empty() {
                    tracing::warn!(
                        removed = ?report.removed,
                        completed = ?report.completed,
                        "reconciled what crashes left in the store"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "reconcile the store"),
        }
    });
}

/// Mounts `mounts` (in order) on `target`. Returns whether anything was mounted; on
/// failure, whatever was mounted is unmounted again.
pub async fn mount_all(mounts: &[Mount], target: &Path) -> ShimResult<bool> {
    if mounts.is_empty() {
        return Ok(false);
    }
    std::fs::create_dir_all(target)
        .map_err(|e| ShimError::Other(format!("create {}: {e}", target.display())))?;
    let mounts = mounts.to_vec();
    let dst = target.to_path_buf();
    let result = tokio::task::spawn_blocking(move || {
        for m in &mounts {
            containerd_shim::mount::mount_rootfs(
                Some(m.type_.as_str()).filter(|s| !s.is_empty()),
                Some(m.source.as_str()).filter(|s| !s.is_empty()),
                &m.options,
                &dst,
            )
            .map_err(|e| format!("mount {} ({}) on {}: {e}", m.source, m.type_, dst.display()))?;
        }
        Ok::<(), String>(())
    })
    .await
    .map_err(|e| ShimError::Other(format!("mount task: {e}")))?;
    if let Err(e) = result {
        unmount(target).await;
        return Err(ShimError::Other(e));
    }
    Ok(true)
}

/// Unmounts everything at or below `target`.
pub async fn unmount(target: &Path) {
    let t = target.display().to_string();
    let r = tokio::task::spawn_blocking(move || {
        containerd_shim::mount::umount_recursive(Some(&t), libc::MNT_DETACH)
    })
    .await;
    match r {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(target = %target.display(), error = %e, "unmount rootfs"),
        Err(e) => tracing::warn!(error = %e, "unmount task"),
    }
}

/// Makes `target` the rootfs of container `key` as a clone of snapshot `snapshot` of
/// container `src` (a fork), owned by containerd's writable layer in `mounts`.
pub async fn prepare_clone(
    config: &Config,
    src: &ContainerKey,
    snapshot: &str,
    key: &ContainerKey,
    mounts: &[Mount],
    target: &Path,
) -> ShimResult<bool> {
    if config.storage.backend == Backend::Passthrough {
        return Err(ShimError::FailedPrecondition(
            "forks need a store with snapshots (btrfs, zfs or overlay), not passthrough".into(),
        ));
    }
    let image = ImageSource::from_mounts(&mount_specs(mounts))?;
    let op = CloneSnapshot {
        src: src.clone(),
        snapshot: snapshot.to_string(),
        key: key.clone(),
        image,
        target: target.to_path_buf(),
    };
    store_op(config, op).await.map(|_| true)
}
