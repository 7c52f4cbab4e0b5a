//! Mounting the root file system containerd's snapshotter prepared.

use std::path::Path;

use containerd_shim::protos::api::Mount;

use crate::error::{ShimError, ShimResult};

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

/// Unmounts everything at or below `target`; errors are logged, not returned, because
/// this runs on cleanup paths that must go on.
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
