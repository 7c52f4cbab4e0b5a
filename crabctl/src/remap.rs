//! An image's layers with their owners moved into a user namespace's range, as
//! `ctr run --uidmap` makes them (containerd's `WithRemappedSnapshot`): the committed
//! snapshot `<chain>-<uid>-<gid>` on the image's chain, every owner shifted by the
//! host ids the namespace's root maps to. An import of a sandbox with a user
//! namespace prepares its root on it, as the sandbox's own root was; an existing one
//! (ctr's, or an earlier import's) is used as it is.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use containerd_client::tonic::Code;
use nix::fcntl::AtFlags;
use nix::unistd::{fchownat, Gid, Uid};

use crate::containerd::Client;

/// The host (uid, gid) the spec's user namespace maps its root to; None without a
/// user namespace's mappings.
pub fn root_ids(spec: &serde_json::Value) -> Result<Option<(u32, u32)>> {
    let linux = &spec["linux"];
    let root = |key: &str| -> Result<Option<u32>> {
        let Some(maps) = linux[key].as_array().filter(|m| !m.is_empty()) else {
            return Ok(None);
        };
        let host = maps
            .iter()
            .find(|m| m["containerID"].as_u64() == Some(0))
            .and_then(|m| m["hostID"].as_u64())
            .and_then(|h| u32::try_from(h).ok());
        match host {
            Some(h) => Ok(Some(h)),
            None => bail!("linux.{key} maps no host id to the container's root"),
        }
    };
    match (root("uidMappings")?, root("gidMappings")?) {
        (Some(u), Some(g)) => Ok(Some((u, g))),
        (None, None) => Ok(None),
        _ => bail!("the spec maps only one of user and group ids"),
    }
}

/// How long the lease holding a remap's snapshots lasts if its caller dies.
const LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(3600);

/// The remapped snapshot of `chain` for root `(uid, gid)`, made if missing, and the
/// lease that holds it (and its work snapshot) from containerd's garbage collector
/// until the caller prepared its own snapshot on it and deletes the lease.
/// `scratch`: an empty directory to mount it on while its owners are shifted.
pub async fn remapped_parent(
    client: &Client,
    snapshotter: &str,
    chain: &str,
    ids: (u32, u32),
    scratch: &Path,
) -> Result<(String, String)> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let lease = format!("crab-remap-{}-{nanos}", std::process::id());
    client.create_lease(&lease, LEASE_TTL).await?;
    match remap(
        &client.under_lease(&lease),
        &lease,
        snapshotter,
        chain,
        ids,
        scratch,
    )
    .await
    {
        Ok(name) => Ok((name, lease)),
        Err(e) => {
            let _ = client.delete_lease(&lease).await;
            Err(e)
        }
    }
}

async fn remap(
    client: &Client,
    lease: &str,
    snapshotter: &str,
    chain: &str,
    (uid, gid): (u32, u32),
    scratch: &Path,
) -> Result<String> {
    let name = format!("{chain}-{uid}-{gid}");
    if client.stat_snapshot(snapshotter, &name).await?.is_some() {
        client.lease_snapshot(lease, snapshotter, &name).await?;
        return Ok(name);
    }
    let work = format!("{name}-remap");
    // A dead import's, or ctr's, unfinished remap.
    client.remove_snapshot(snapshotter, &work).await?;
    let mounts = client.prepare(snapshotter, &work, chain).await?;
    let dir = scratch.to_path_buf();
    let shifted = tokio::task::spawn_blocking(move || shift_mounted(&mounts, (uid, gid), &dir))
        .await
        .context("the remap task")?;
    if let Err(e) = shifted {
        let _ = client.remove_snapshot(snapshotter, &work).await;
        return Err(e);
    }
    match client.commit(snapshotter, &name, &work).await {
        Ok(()) => Ok(name),
        // Another import (or ctr) committed it first: theirs is used.
        Err(s) if s.code() == Code::AlreadyExists => {
            client.remove_snapshot(snapshotter, &work).await?;
            client.lease_snapshot(lease, snapshotter, &name).await?;
            Ok(name)
        }
        Err(s) => {
            let _ = client.remove_snapshot(snapshotter, &work).await;
            Err(anyhow::anyhow!(s)).with_context(|| format!("commit snapshot {name}"))
        }
    }
}

/// Mounts `mounts` on `dir`, shifts every owner below it, unmounts.
fn shift_mounted(
    mounts: &[containerd_client::types::Mount],
    ids: (u32, u32),
    dir: &Path,
) -> Result<u64> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let unmount = || {
        let _ = containerd_shim::mount::umount_recursive(dir.to_str(), libc::MNT_DETACH);
        let _ = std::fs::remove_dir(dir);
    };
    for m in mounts {
        if let Err(e) = containerd_shim::mount::mount_rootfs(
            Some(m.r#type.as_str()).filter(|s| !s.is_empty()),
            Some(m.source.as_str()).filter(|s| !s.is_empty()),
            &m.options,
            dir,
        ) {
            unmount();
            bail!(
                "mount {} ({}) on {}: {e}",
                m.source,
                m.r#type,
                dir.display()
            );
        }
    }
    let shifted = shift_tree(dir, ids);
    unmount();
    shifted
}

/// Adds `(uid, gid)` to the owner of every file below `root` (symlinks themselves,
/// never what they point at), keeping set-id bits and file capabilities, which a
/// chown clears ([`crate::file_caps`]). Answers how many files it changed.
pub fn shift_tree(root: &Path, ids: (u32, u32)) -> Result<u64> {
    shift_one(root, ids)?;
    let mut count = 1;
    let mut dirs: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
            let path = e.with_context(|| format!("read {}", dir.display()))?.path();
            count += 1;
            if shift_one(&path, ids)? {
                dirs.push(path);
            }
        }
    }
    Ok(count)
}

/// Shifts one file's owner (not following a symlink), keeping its set-id bits and
/// capabilities; answers whether it is a directory to descend into.
fn shift_one(path: &Path, (uid, gid): (u32, u32)) -> Result<bool> {
    let md = std::fs::symlink_metadata(path).with_context(|| format!("stat {}", path.display()))?;
    let kind = md.file_type();
    // Only a chown of a file that is not a directory drops its capabilities.
    let caps = if kind.is_file() {
        crate::file_caps::read(path)?
    } else {
        None
    };
    let (Some(u), Some(g)) = (md.uid().checked_add(uid), md.gid().checked_add(gid)) else {
        bail!(
            "{}: owner {}:{} shifted past the id range",
            path.display(),
            md.uid(),
            md.gid()
        );
    };
    fchownat(
        None,
        path,
        Some(Uid::from_raw(u)),
        Some(Gid::from_raw(g)),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .with_context(|| format!("chown {}", path.display()))?;
    if kind.is_symlink() {
        return Ok(false);
    }
    if md.mode() & 0o6000 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(md.mode() & 0o7777))
            .with_context(|| format!("chmod {}", path.display()))?;
    }
    if let Some(caps) = caps {
        crate::file_caps::write_shifted(path, &caps, uid)?;
    }
    Ok(kind.is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_roots_host_ids_come_from_the_mapping_of_container_id_0() {
        let spec = serde_json::json!({"linux": {
            "uidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
            "gidMappings": [{"containerID": 0, "hostID": 200000, "size": 65536}]}});
        assert_eq!(root_ids(&spec).unwrap(), Some((100000, 200000)));
        assert_eq!(root_ids(&serde_json::json!({"linux": {}})).unwrap(), None);
        let no_root = serde_json::json!({"linux": {
            "uidMappings": [{"containerID": 1, "hostID": 100000, "size": 10}],
            "gidMappings": [{"containerID": 0, "hostID": 100000, "size": 10}]}});
        assert!(root_ids(&no_root).is_err());
    }

    #[test]
    fn owners_shift_without_following_symlinks_and_set_id_bits_stay() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::fs::create_dir(root.join("bin")).unwrap();
        std::fs::write(root.join("bin/su"), b"x").unwrap();
        std::os::unix::fs::chown(root.join("bin/su"), Some(0), Some(5)).unwrap();
        std::fs::set_permissions(root.join("bin/su"), std::fs::Permissions::from_mode(0o4755))
            .unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("bin/host")).unwrap();
        // `setcap cap_net_raw+ep`: revision 2, effective, bit 13.
        std::fs::write(root.join("bin/ping"), b"x").unwrap();
        let net_raw: Vec<u8> = [0x0200_0001u32, 1 << 13, 0, 0, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        xattr::set(root.join("bin/ping"), "security.capability", &net_raw).unwrap();
        let n = shift_tree(root, (100000, 100000)).unwrap();
        assert_eq!(n, 5, "the root, bin, su, ping and the link");
        // The chown dropped them; they are back, as the namespace's root's
        // (revision 3, root id 100000), which is what the kernel keeps.
        let caps = xattr::get(root.join("bin/ping"), "security.capability")
            .unwrap()
            .expect("ping keeps its capabilities");
        let v3: Vec<u8> = [0x0300_0001u32, 1 << 13, 0, 0, 0, 100000]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        assert_eq!(caps, v3);
        assert_eq!(
            std::fs::metadata(root.join("bin/ping")).unwrap().uid(),
            100000
        );
        let su = std::fs::metadata(root.join("bin/su")).unwrap();
        assert_eq!(
            (su.uid(), su.gid(), su.mode() & 0o7777),
            (100000, 100005, 0o4755)
        );
        let link = std::fs::symlink_metadata(root.join("bin/host")).unwrap();
        assert_eq!(link.uid(), 100000);
        let host = std::fs::metadata(outside.path()).unwrap();
        assert_eq!(host.uid(), 0, "the link's target on the host is untouched");
        assert_eq!(std::fs::metadata(root).unwrap().uid(), 100000);
    }
}
