//! Datasets: the `zfs` command, what `zfs get` says about a dataset, mounting, the
//! snapshots of a dataset and the clones that depend on them, image copies, and the
//! clones that become containers' datasets.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use super::fuse::{zfs_unmounted, DaemonTurn};
use super::{already_exists, not_found, ZfsStore, BASE, OWNER, TREE};
use crate::storage::{cmd, fault, tree, work, ContainerKey, ImageSource, SnapshotInfo};
use crate::{Error, Result};

/// What `zfs get` says about a container's dataset.
#[derive(Debug)]
pub(super) struct DsState {
    pub(super) mountpoint: String,
    pub(super) mounted: bool,
    /// False while it holds imported snapshots only.
    pub(super) tree: bool,
    pub(super) owner: Option<PathBuf>,
}

/// Runs `zfs args` in the daemon's turn (see [`DaemonTurn`]); returns its output.
pub(super) fn zfs(args: &[&str]) -> Result<String> {
    let _turn = DaemonTurn::take()?;
    cmd::run("zfs", args)
}

/// Whether `e` is the `zfs` command saying that a dataset does not exist.
pub(super) fn is_missing(e: &Error) -> bool {
    matches!(e, Error::Command { message, .. } if message.contains("does not exist"))
}

impl ZfsStore {
    /// Creates a file system; one that another process created meanwhile is fine.
    pub(super) fn create_fs(&self, ds: &str, options: &[&str]) -> Result<()> {
        let mut args = vec!["create"];
        args.extend_from_slice(options);
        args.push(ds);
        match zfs(&args) {
            Ok(_) => Ok(()),
            Err(_) if self.exists(ds)? => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Whether a dataset or snapshot exists.
    pub(super) fn exists(&self, name: &str) -> Result<bool> {
        match zfs(&["get", "-H", "-o", "value", "type", name]) {
            Ok(_) => Ok(true),
            Err(e) if is_missing(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The state of a file system, `None` if it does not exist.
    pub(super) fn state(&self, ds: &str) -> Result<Option<DsState>> {
        let props = format!("mountpoint,mounted,{TREE},{OWNER}");
        let out = match zfs(&["get", "-H", "-o", "property,value", &props, ds]) {
            Ok(out) => out,
            Err(e) if is_missing(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut st = DsState {
            mountpoint: String::new(),
            mounted: false,
            tree: true,
            owner: None,
        };
        for line in out.lines() {
            match line.split_once('\t') {
                Some(("mountpoint", v)) => st.mountpoint = v.to_string(),
                Some(("mounted", v)) => st.mounted = v == "yes",
                Some((TREE, v)) => st.tree = v != "none",
                Some((OWNER, v)) if v.starts_with('/') => st.owner = Some(PathBuf::from(v)),
                _ => {}
            }
        }
        Ok(Some(st))
    }

    /// Mounts `ds` if it is not mounted; returns where it is.
    pub(super) fn mount(&self, ds: &str, st: &DsState) -> Result<PathBuf> {
        if !st.mountpoint.starts_with('/') {
            return Err(Error::Storage {
                operation: "mount a dataset",
                message: format!(
                    "{ds} has mount point {:?}: it needs a path (inherited from {})",
                    st.mountpoint, self.root
                ),
            });
        }
        if !st.mounted {
            zfs(&["mount", ds])?;
        }
        Ok(PathBuf::from(&st.mountpoint))
    }

    /// Where the file system `ds` is mounted; mounts it if it is not.
    pub(super) fn mountpoint(&self, ds: &str) -> Result<PathBuf> {
        let st = self.state(ds)?.ok_or_else(|| Error::Storage {
            operation: "mount a dataset",
            message: format!("{ds} does not exist"),
        })?;
        self.mount(ds, &st)
    }

    /// Unmounts `ds` if it is mounted (zfs-fuse cannot rename or destroy it otherwise).
    pub(super) fn unmount(&self, ds: &str) -> Result<()> {
        let mounted = zfs(&["get", "-H", "-o", "value", "mounted", ds])?;
        if mounted.trim() == "yes" {
            zfs(&["unmount", ds])?;
        }
        Ok(())
    }

    /// Unmounts and destroys a file system with its snapshots (never with clones).
    pub(super) fn destroy_fs(&self, ds: &str) -> Result<()> {
        self.unmount(ds)?;
        zfs_unmounted(&["destroy", "-r", ds]).map(drop)
    }

    /// The snapshots of `ds` (short names, hidden ones included) with their creation
    /// times, oldest first; `None` if `ds` does not exist.
    pub(super) fn snapshots(&self, ds: &str) -> Result<Option<Vec<(String, i64)>>> {
        let out = match zfs(&[
            "get",
            "-H",
            "-p",
            "-r",
            "-d",
            "1",
            "-o",
            "name,value",
            "creation",
            ds,
        ]) {
            Ok(out) => out,
            Err(e) if is_missing(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let prefix = format!("{ds}@");
        let mut snaps = Vec::new();
        for line in out.lines() {
            let Some((name, value)) = line.split_once('\t') else {
                continue;
            };
            let Some(short) = name.strip_prefix(&prefix) else {
                continue;
            };
            let created = value.trim().parse::<i64>().map_err(|_| Error::Storage {
                operation: "list snapshots",
                message: format!("creation time of {name} is {value:?}"),
            })?;
            snaps.push((short.to_string(), created));
        }
        // `zfs get -r` lists a dataset's snapshots in creation order (by transaction,
        // finer than the creation time's seconds); the stable sort only guards it.
        snaps.sort_by_key(|s| s.1);
        Ok(Some(snaps))
    }

    /// Snapshots that clones depend on → those clones (in the whole pool).
    pub(super) fn dependents(&self) -> Result<HashMap<String, Vec<String>>> {
        let out = zfs(&[
            "list",
            "-H",
            "-o",
            "name,origin",
            "-t",
            "filesystem",
            "-r",
            &self.pool,
        ])?;
        let mut deps: HashMap<String, Vec<String>> = HashMap::new();
        for line in out.lines() {
            if let Some((name, origin)) = line.split_once('\t') {
                if origin != "-" {
                    deps.entry(origin.to_string())
                        .or_default()
                        .push(name.to_string());
                }
            }
        }
        Ok(deps)
    }

    pub(super) fn info(&self, key: &ContainerKey, name: &str) -> Result<SnapshotInfo> {
        let snap = self.snapshot_name(key, name)?;
        let created = match zfs(&["get", "-H", "-p", "-o", "value", "creation", &snap]) {
            Ok(v) => v,
            Err(e) if is_missing(&e) => return Err(not_found(key, name)),
            Err(e) => return Err(e),
        };
        let secs = created.trim().parse::<u64>().map_err(|_| Error::Storage {
            operation: "read a snapshot's creation time",
            message: format!("{snap}: {created:?}"),
        })?;
        Ok(SnapshotInfo {
            name: name.to_string(),
            created: UNIX_EPOCH + Duration::from_secs(secs),
        })
    }

    /// Makes `<root>/containers/<ns>` for `key`.
    pub(super) fn ensure_parent(&self, key: &ContainerKey) -> Result<()> {
        let ns = format!("{}/containers/{}", self.root, key.namespace());
        if self.exists(&ns)? {
            return Ok(());
        }
        self.create_fs(&ns, &[])
    }

    /// The `@base` snapshot of the image's copy, made on first use.
    pub(super) fn image(&self, image: &ImageSource) -> Result<String> {
        let dst = format!("{}/images/{}", self.root, image.key);
        let base = format!("{dst}@{BASE}");
        if self.exists(&base)? {
            return Ok(base);
        }
        let work = format!(
            "{}/tmp/{}",
            self.root,
            work::tmp_name(&format!("image-{}", image.key))
        );
        let mnt = self.tmp_dir.join(work::tmp_name("mnt"));
        std::fs::create_dir_all(&mnt).map_err(Error::io(format!("create {}", mnt.display())))?;
        let result = (|| {
            // Never mounted once copied: containers are clones of @base.
            zfs(&["create", "-o", "canmount=noauto", &work])?;
            let copy = self.mountpoint(&work)?;
            {
                let _mounted = image.mount_readonly(&mnt)?;
                tree::copy(&mnt, &copy)?;
            }
            fault::point("zfs.image.copied");
            zfs(&["snapshot", &format!("{work}@{BASE}")])?;
            self.unmount(&work)?;
            match zfs_unmounted(&["rename", &work, &dst]) {
                Ok(_) => Ok(()),
                // Another shim copied the same image meanwhile: use theirs.
                Err(_) if self.exists(&base)? => self.destroy_fs(&work),
                Err(e) => Err(e),
            }
        })();
        let _ = std::fs::remove_dir(&mnt);
        if result.is_err() && self.exists(&work).unwrap_or(false) {
            let _ = self.destroy_fs(&work);
        }
        result.map(|()| base)
    }

    /// Clones `origin` as container `key`'s dataset; returns where its tree is.
    pub(super) fn clone_into(
        &self,
        origin: &str,
        key: &ContainerKey,
        owner: Option<&Path>,
    ) -> Result<PathBuf> {
        let ds = self.dataset(key)?;
        if self.exists(&ds)? {
            return Err(already_exists(key));
        }
        self.ensure_parent(key)?;
        let owner = owner.map(|o| format!("{OWNER}={}", o.display()));
        let mut args = vec!["clone"];
        if let Some(o) = &owner {
            args.extend(["-o", o.as_str()]);
        }
        args.extend([origin, ds.as_str()]);
        match zfs(&args) {
            Ok(_) => {}
            Err(e) if !matches!(e, Error::PoolFull { .. }) && self.exists(&ds)? => {
                return Err(already_exists(key))
            }
            Err(e) => return Err(e),
        }
        self.mountpoint(&ds)
    }
}
