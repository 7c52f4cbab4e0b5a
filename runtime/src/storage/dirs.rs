//! The directories of the stores that keep a pool on a mounted file system (btrfs,
//! overlay), and the file helpers they share:
//!
//! ```text
//! <pool>/containers/<ns>/<id>...            the container's tree and what the store
//!                                           records beside it
//! <pool>/snapshots/<ns>/<id>/<name>         its snapshots
//! <pool>/tmp/<pid>.<n>.<what>               in-flight work of process <pid>
//! ```

use std::fs::DirEntry;
use std::path::{Path, PathBuf};

use super::names::{self, CONTAINERS, SNAPSHOTS, TMP};
use super::{work, ContainerKey, SnapshotInfo};
use crate::{Error, Result};

/// A pool's directories.
#[derive(Debug)]
pub(crate) struct PoolDirs {
    root: PathBuf,
}

impl PoolDirs {
    /// The pool at `root`, with its directories `areas` made if missing, and made
    /// root-only (0700): they hold every container's files, 0600 ones included,
    /// and setuid programs a container placed in its tree. A container reaches its
    /// tree through the bind mount at its bundle, never through these paths.
    pub(crate) fn open(root: PathBuf, areas: &[&str]) -> Result<PoolDirs> {
        for area in areas {
            crate::checkpoint::history::create_private_dir(&root.join(area))?;
        }
        Ok(PoolDirs { root })
    }

    /// The pool's mount point.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// `<pool>/<area>`.
    pub(crate) fn area(&self, area: &str) -> PathBuf {
        self.root.join(area)
    }

    /// `<pool>/containers/<ns>/<id>`.
    pub(crate) fn container(&self, key: &ContainerKey) -> PathBuf {
        self.root.join(key.place(CONTAINERS))
    }

    /// `<pool>/containers/<ns>/<id>.<suffix>`: a file beside the container's tree.
    pub(crate) fn beside(&self, key: &ContainerKey, suffix: &str) -> PathBuf {
        let mut p = self.container(key).into_os_string();
        p.push(format!(".{suffix}"));
        PathBuf::from(p)
    }

    /// `<pool>/snapshots/<ns>/<id>`.
    pub(crate) fn snapshots(&self, key: &ContainerKey) -> PathBuf {
        self.root.join(key.place(SNAPSHOTS))
    }

    /// `<pool>/snapshots/<ns>/<id>/<name>`, for a valid snapshot name.
    pub(crate) fn snapshot(&self, key: &ContainerKey, name: &str) -> Result<PathBuf> {
        names::check_snapshot_name(name)?;
        Ok(self.snapshots(key).join(name))
    }

    /// A fresh `<pool>/tmp/<pid>.<n>.<what>`.
    pub(crate) fn tmp(&self, what: &str) -> PathBuf {
        self.root.join(TMP).join(work::tmp_name(what))
    }

    /// Every `<pool>/<area>/<ns>/<entry>`, with its namespace; what cannot be read is
    /// passed over.
    pub(crate) fn by_namespace(&self, area: &str) -> Vec<(String, DirEntry)> {
        let mut out = Vec::new();
        for ns in read_dir_lossy(&self.area(area)) {
            let name = ns.file_name().to_string_lossy().into_owned();
            for e in read_dir_lossy(&ns.path()) {
                out.push((name.clone(), e));
            }
        }
        out
    }

    /// The entries of `<pool>/tmp` whose process no longer runs.
    pub(crate) fn dead_work(&self) -> Result<Vec<DirEntry>> {
        dead_work_in(&self.area(TMP))
    }
}

/// The snapshots among the `entries` of a container's snapshots directory: those with
/// a valid name that `complete` accepts, with their `info`, oldest first.
pub(crate) fn complete_snapshots(
    entries: impl Iterator<Item = Result<DirEntry>>,
    complete: impl Fn(&Path) -> bool,
    info: impl Fn(&str) -> Result<SnapshotInfo>,
) -> Result<Vec<SnapshotInfo>> {
    let mut out = Vec::new();
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if names::check_snapshot_name(&name).is_ok() && complete(&e.path()) {
            out.push(info(&name)?);
        }
    }
    out.sort_by(|a, b| a.created.cmp(&b.created).then(a.name.cmp(&b.name)));
    Ok(out)
}

/// The entries of a directory of in-flight work (named by [`work::tmp_name`]) whose
/// process no longer runs.
pub(crate) fn dead_work_in(dir: &Path) -> Result<Vec<DirEntry>> {
    Ok(std::fs::read_dir(dir)
        .map_err(Error::io(format!("read {}", dir.display())))?
        .flatten()
        .filter(|e| !work::owner_alive(&e.file_name().to_string_lossy()))
        .collect())
}

/// The entries of `dir`; none if it cannot be read.
pub(crate) fn read_dir_lossy(dir: &Path) -> impl Iterator<Item = DirEntry> {
    std::fs::read_dir(dir).into_iter().flatten().flatten()
}

/// Makes `p` and its missing parents.
pub(crate) fn mkdirs(p: &Path) -> Result<()> {
    std::fs::create_dir_all(p).map_err(Error::io(format!("create {}", p.display())))
}

/// Writes `data` to `path` and makes it durable (file and directory entry).
pub(crate) fn write_durably(path: &Path, data: &[u8]) -> Result<()> {
    use std::io::Write as _;
    let ctx = || format!("write {}", path.display());
    let mut f = std::fs::File::create(path).map_err(Error::io(ctx()))?;
    f.write_all(data).map_err(Error::io(ctx()))?;
    f.sync_all().map_err(Error::io(ctx()))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(Error::io(ctx()))?;
    }
    Ok(())
}

/// Records `owner` at `path` as the target of a symbolic link, made beside it
/// and renamed over it (an earlier record is replaced in one step), with no
/// sync. For a record that must be durable whenever a later change to the same
/// file system is: a link's target is metadata, written with the link in the
/// same transaction (btrfs stores it inline in the link's inode, where a file's
/// text waits for writeback), and a file system that commits its changes in
/// order (btrfs's transactions, ext4's journal) never keeps the later change
/// without it. [`super::work::read_owner`] reads either form.
pub(crate) fn link_owner(path: &Path, owner: &Path) -> Result<()> {
    let ctx = || format!("record the owner {} at {}", owner.display(), path.display());
    let mut staged = path.as_os_str().to_owned();
    staged.push(".new");
    let staged = PathBuf::from(staged);
    match std::fs::remove_file(&staged) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io(ctx())(e)),
        _ => {}
    }
    std::os::unix::fs::symlink(owner, &staged).map_err(Error::io(ctx()))?;
    std::fs::rename(&staged, path).map_err(Error::io(ctx()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_paths_of_a_container() {
        let d = PoolDirs {
            root: PathBuf::from("/pool"),
        };
        let k = ContainerKey::new("ns", "c1").unwrap();
        assert_eq!(d.container(&k), Path::new("/pool/containers/ns/c1"));
        assert_eq!(
            d.beside(&k, "owner"),
            Path::new("/pool/containers/ns/c1.owner")
        );
        assert_eq!(d.snapshots(&k), Path::new("/pool/snapshots/ns/c1"));
        assert_eq!(
            d.snapshot(&k, "s").unwrap(),
            Path::new("/pool/snapshots/ns/c1/s")
        );
        assert!(d.snapshot(&k, "../x").is_err());
        assert!(d.tmp("w").starts_with("/pool/tmp"));
    }
}
