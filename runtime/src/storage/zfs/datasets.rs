//! Datasets: the `zfs` command, what `zfs get` says about a dataset, mounting, the
//! snapshots of a dataset and the clones that depend on them, image copies, and the
//! clones that become containers' datasets.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use super::fuse::{zfs_unmounted, DaemonTurn};
use super::{ZfsStore, BASE, OWNER, TREE};
use crate::storage::image_copies::ImageCopies;
use crate::storage::names::{snapshot_not_found, tree_exists, CONTAINERS, IMAGES};
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

/// The value of property `prop` of dataset or snapshot `name` (numbers exact).
pub(super) fn value(name: &str, prop: &str) -> Result<String> {
    zfs(&["get", "-H", "-p", "-o", "value", prop, name]).map(|v| v.trim().to_string())
}

/// `zfs get -r` of property `prop` on `ds` and everything below it, snapshots
/// included, narrowed by `options` (`-d 1`, `-s local`): each one's name and value.
pub(super) fn values_below(
    ds: &str,
    prop: &str,
    options: &[&str],
) -> Result<Vec<(String, String)>> {
    let mut args = vec!["get", "-H", "-p", "-r"];
    args.extend_from_slice(options);
    args.extend(["-o", "name,value", prop, ds]);
    Ok(zfs(&args)?
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect())
}

/// `zfs list` of the file systems below `parent` (not `parent` itself), down to `depth`
/// levels (all of them with `None`): each one's name and the value of `column` (empty
/// without one).
fn file_systems(
    parent: &str,
    depth: Option<&str>,
    column: Option<&str>,
) -> Result<Vec<(String, String)>> {
    let columns = column.map_or("name".to_string(), |c| format!("name,{c}"));
    let mut args = vec!["list", "-H", "-o", &columns, "-t", "filesystem", "-r"];
    if let Some(d) = depth {
        args.extend(["-d", d]);
    }
    args.push(parent);
    Ok(zfs(&args)?
        .lines()
        .map(|l| l.split_once('\t').unwrap_or((l, "")))
        .filter(|(name, _)| *name != parent)
        .map(|(name, v)| (name.to_string(), v.to_string()))
        .collect())
}

/// The file systems right below `parent`.
pub(super) fn children(parent: &str) -> Result<Vec<String>> {
    Ok(file_systems(parent, Some("1"), None)?
        .into_iter()
        .map(|(name, _)| name)
        .collect())
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
        match value(name, "type") {
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
        if value(ds, "mounted")? == "yes" {
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
        let created = match values_below(ds, "creation", &["-d", "1"]) {
            Ok(v) => v,
            Err(e) if is_missing(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let prefix = format!("{ds}@");
        let mut snaps = Vec::new();
        for (name, value) in created {
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
        let mut deps: HashMap<String, Vec<String>> = HashMap::new();
        for (name, origin) in file_systems(&self.pool, None, Some("origin"))? {
            if origin != "-" {
                deps.entry(origin).or_default().push(name);
            }
        }
        Ok(deps)
    }

    pub(super) fn info(&self, key: &ContainerKey, name: &str) -> Result<SnapshotInfo> {
        let snap = self.snapshot_name(key, name)?;
        let created = match value(&snap, "creation") {
            Ok(v) => v,
            Err(e) if is_missing(&e) => return Err(snapshot_not_found(key, name)),
            Err(e) => return Err(e),
        };
        let secs = created.parse::<u64>().map_err(|_| Error::Storage {
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
        let ns = format!("{}/{}", self.area(CONTAINERS), key.namespace());
        if self.exists(&ns)? {
            return Ok(());
        }
        self.create_fs(&ns, &[])
    }

    /// The records and lock of the image copies ([`ImageCopies`]), in the
    /// directory where `<root>/images` is mounted.
    pub(super) fn copies(&self) -> Result<ImageCopies> {
        Ok(ImageCopies::new(self.mountpoint(&self.area(IMAGES))?))
    }

    /// The keys of the image copies.
    pub(super) fn image_keys(&self) -> Result<Vec<String>> {
        let prefix = format!("{}/", self.area(IMAGES));
        Ok(children(&self.area(IMAGES))?
            .into_iter()
            .filter_map(|ds| ds.strip_prefix(&prefix).map(str::to_string))
            .collect())
    }

    /// The `@base` snapshot of the image's copy, made on first use and recorded
    /// in `copies`; the caller holds [`ImageCopies::using`] until its clone is
    /// made.
    pub(super) fn image(&self, image: &ImageSource, copies: &ImageCopies) -> Result<String> {
        let dst = format!("{}/{}", self.area(IMAGES), image.key);
        let base = format!("{dst}@{BASE}");
        if self.exists(&base)? {
            copies.record_if_missing(image)?;
            return Ok(base);
        }
        let work = self.tmp(&format!("image-{}", image.key));
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
            copies.record(image)?;
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
            return Err(tree_exists(key));
        }
        self.ensure_parent(key)?;
        let owner = owner.map(|o| format!("{OWNER}={}", o.display()));
        let quota = self.quota_property();
        let mut args = vec!["clone"];
        for o in owner.iter().chain(&quota) {
            args.extend(["-o", o.as_str()]);
        }
        args.extend([origin, ds.as_str()]);
        match zfs(&args) {
            Ok(_) => {}
            Err(e) if !matches!(e, Error::PoolFull { .. }) && self.exists(&ds)? => {
                return Err(tree_exists(key))
            }
            Err(e) => return Err(e),
        }
        self.mountpoint(&ds)
    }
}
