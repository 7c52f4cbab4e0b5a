//! The btrfs store: subvolumes and snapshots on a mounted btrfs file system.
//!
//! ```text
//! <pool>/images/<key>                       read-only copy of an image
//! <pool>/images/<key>.layers                what it was copied from (`image_copies`)
//! <pool>/containers/<ns>/<id>               the container's writable tree (its rootfs)
//! <pool>/containers/<ns>/<id>.rollback      marker: a rollback to the named snapshot runs
//! <pool>/snapshots/<ns>/<id>/<name>         read-only snapshots
//! <pool>/tmp/<pid>.<n>.<what>               in-flight work of process <pid>
//! ```

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::dirs::{
    complete_snapshots, link_owner, mkdirs, read_dir_lossy, write_durably, PoolDirs,
};
use super::image_copies::ImageCopies;
use super::names::{CONTAINERS, IMAGES, SNAPSHOTS, TMP};
use super::{
    btrfs_ioctl as ioctl, btrfs_nested, btrfs_quota, btrfs_receive, cmd, fault, names, send_stream,
    tree, work, ContainerKey, ImageSource, QuotaUsage, ReconcileReport, SnapshotInfo, Store,
};
use crate::config::Backend;
use crate::{Error, Result};

const BTRFS_SUPER_MAGIC: i64 = 0x9123_683E;

/// A btrfs pool.
#[derive(Debug)]
pub struct BtrfsStore {
    dirs: PoolDirs,
    /// The image copies' records and lock.
    copies: ImageCopies,
    /// What each container tree may own in the pool ([`btrfs_quota`]).
    tree_limit: Option<u64>,
}

impl BtrfsStore {
    /// Opens the pool mounted at `root` (which must be a btrfs file system).
    pub fn open(root: impl AsRef<Path>) -> Result<BtrfsStore> {
        let root = root.as_ref().to_path_buf();
        let fs = nix::sys::statfs::statfs(&root)
            .map_err(Error::sys(format!("statfs {}", root.display())))?;
        if fs.filesystem_type().0 != BTRFS_SUPER_MAGIC {
            return Err(Error::Storage {
                operation: "open btrfs pool",
                message: format!("{} is not a btrfs file system", root.display()),
            });
        }
        let dirs = PoolDirs::open(root, &[IMAGES, CONTAINERS, SNAPSHOTS, TMP])?;
        Ok(BtrfsStore {
            copies: ImageCopies::new(dirs.area(IMAGES)),
            dirs,
            tree_limit: None,
        })
    }

    /// Limits every container tree this store makes to owning `bytes` of the pool
    /// (btrfs simple quotas, turned on when first needed); `None`: no limit.
    pub fn with_tree_limit(mut self, bytes: Option<u64>) -> BtrfsStore {
        self.tree_limit = bytes;
        self
    }

    /// Makes a container's writable tree at `live` as a snapshot of `src`, under the
    /// store's limit: every way a container gets a tree passes here.
    fn new_tree(&self, src: &Path, live: &Path) -> Result<()> {
        mkdirs(live.parent().expect("has a parent"))?;
        let Some(bytes) = self.tree_limit else {
            return ioctl::snapshot(src, live, false);
        };
        btrfs_quota::ensure_enabled(self.dirs.root())?;
        ioctl::snapshot(src, live, false)?;
        if let Err(e) = btrfs_quota::limit(live, Some(bytes)) {
            // An unbounded tree must not be handed out.
            let _ = ioctl::delete(live);
            return Err(e);
        }
        Ok(())
    }

    fn live(&self, key: &ContainerKey) -> PathBuf {
        self.dirs.container(key)
    }

    fn marker(&self, key: &ContainerKey) -> PathBuf {
        self.dirs.beside(key, "rollback")
    }

    /// Records which containerd writable layer the tree belongs to.
    fn owner_file(&self, key: &ContainerKey) -> PathBuf {
        self.dirs.beside(key, "owner")
    }

    fn existing_snapshot(&self, key: &ContainerKey, name: &str) -> Result<PathBuf> {
        let p = self.dirs.snapshot(key, name)?;
        if !is_snapshot(&p) {
            return Err(names::snapshot_not_found(key, name));
        }
        Ok(p)
    }

    fn tmp(&self, what: &str) -> PathBuf {
        self.dirs.tmp(what)
    }

    /// The read-only copy of the image with key `image`.
    fn image_copy(&self, image: &str) -> PathBuf {
        self.dirs.area(IMAGES).join(image)
    }

    /// The read-only copy of `image`, made on first use; the caller holds
    /// [`ImageCopies::using`] until its tree is made of it.
    fn image(&self, image: &ImageSource) -> Result<PathBuf> {
        let dst = self.image_copy(&image.key);
        if ioctl::is_subvolume(&dst) {
            self.copies.record_if_missing(image)?;
            return Ok(dst);
        }
        let work = self.tmp(&format!("image-{}", image.key));
        let mnt = self.tmp("mnt");
        mkdirs(&mnt)?;
        let result = (|| {
            ioctl::create(&work)?;
            {
                let _mounted = image.mount_readonly(&mnt)?;
                tree::copy(&mnt, &work)?;
            }
            fault::point("btrfs.image.copied");
            self.copies.record(image)?;
            // A read-only snapshot under the final name publishes the copy atomically
            // (a read-only subvolume itself cannot be renamed).
            let published = ioctl::snapshot(&work, &dst, true);
            ioctl::delete(&work)?;
            match published {
                Ok(()) => Ok(()),
                // Another shim copied the same image meanwhile: use theirs.
                Err(_) if ioctl::is_subvolume(&dst) => Ok(()),
                Err(e) => Err(e),
            }
        })();
        let _ = std::fs::remove_dir(&mnt);
        if result.is_err() && ioctl::is_subvolume(&work) {
            let _ = ioctl::delete(&work);
        }
        result.map(|()| dst)
    }

    /// The names that differ between the read-only subvolume `from` and the live
    /// tree `live`, out of a send stream without data to a read-only snapshot of
    /// `live`: btrfs compares the two b-trees and skips every block they share, so
    /// the cost follows the changes. `None` when the stream cannot be had or read.
    fn names_changed(&self, from: &Path, live: &Path) -> Result<Option<BTreeSet<String>>> {
        let now = self.tmp("now");
        mkdirs(now.parent().expect("has a parent"))?;
        ioctl::snapshot(live, &now, true)?;
        let (f, n) = (from.display().to_string(), now.display().to_string());
        let mut stream = Vec::new();
        let sent = cmd::run_with_output(
            "btrfs",
            &["send", "-q", "--no-data", "-p", &f, &n],
            &mut stream,
        );
        let _ = ioctl::delete(&now);
        Ok(sent.ok().and_then(|()| send_stream::changed_paths(&stream)))
    }

    /// Rolls back only the paths that differ, as btrfs itself finds them (a send
    /// stream without data from the snapshot to a snapshot of the live tree). Returns
    /// false, having changed nothing, when that does not apply: the caller then
    /// mirrors the whole trees.
    fn rollback_changed(&self, snap: &Path, live: &Path) -> Result<bool> {
        let Some(paths) = self.names_changed(snap, live)? else {
            return Ok(false);
        };
        // A hard-linked file among the changes could get its links back only by
        // finding its other names: compare the whole trees then.
        let linked = paths.iter().any(|p| {
            std::fs::symlink_metadata(snap.join(p))
                .map(|m| !m.is_dir() && std::os::unix::fs::MetadataExt::nlink(&m) > 1)
                .unwrap_or(false)
        });
        if linked {
            return Ok(false);
        }
        let mut mirror = tree::Mirror::new();
        let mut whole: Vec<&str> = Vec::new();
        for (n, p) in paths.iter().enumerate() {
            if whole.iter().any(|w| p.starts_with(&format!("{w}/"))) {
                continue; // inside a subtree already rewritten whole
            }
            let (sp, lp) = (snap.join(p), live.join(p));
            let (sm, lm) = (
                std::fs::symlink_metadata(&sp),
                std::fs::symlink_metadata(&lp),
            );
            match (sm, lm) {
                (Ok(a), Ok(b)) if a.is_dir() && b.is_dir() => tree::copy_metadata(&sp, &lp)?,
                _ => {
                    mirror.mirror_entry(&sp, &lp)?;
                    whole.push(p);
                }
            }
            if n == 2 {
                fault::point("btrfs.rollback.mid");
            }
        }
        Ok(true)
    }

    fn info(&self, key: &ContainerKey, name: &str) -> Result<SnapshotInfo> {
        let p = self.existing_snapshot(key, name)?;
        Ok(SnapshotInfo {
            name: name.to_string(),
            created: ioctl::created(&p)?,
        })
    }
}

impl Store for BtrfsStore {
    /// The names a send stream gives from the image's read-only copy to the live
    /// tree ([`BtrfsStore::names_changed`]).
    fn changed_since_image(
        &self,
        key: &ContainerKey,
        image: &ImageSource,
    ) -> Result<Option<BTreeSet<String>>> {
        let (base, live) = (self.image_copy(&image.key), self.live(key));
        if !ioctl::is_subvolume(&base) || !ioctl::is_subvolume(&live) {
            return Ok(None);
        }
        // The stream would not show what a nested subvolume holds.
        refuse_nested(&live)?;
        self.names_changed(&base, &live)
    }

    fn backend(&self) -> Backend {
        Backend::Btrfs
    }

    fn prepare(&self, key: &ContainerKey, image: &ImageSource) -> Result<PathBuf> {
        let live = self.live(key);
        match self.existing(key, image)? {
            Some(work::Existing::Reuse) => return Ok(live),
            Some(work::Existing::Replace) => self.destroy(key)?,
            Some(work::Existing::Conflict) => return Err(names::tree_exists(key)),
            None => {}
        }
        let _using = self.copies.using()?;
        let base = self.image(image)?;
        mkdirs(live.parent().expect("has a parent"))?;
        if let Some(owner) = &image.owner {
            write_durably(&self.owner_file(key), owner.as_os_str().as_encoded_bytes())?;
        }
        self.new_tree(&base, &live)?;
        Ok(live)
    }

    fn rootfs(&self, key: &ContainerKey) -> Result<PathBuf> {
        let live = self.live(key);
        if ioctl::is_subvolume(&live) {
            Ok(live)
        } else {
            Err(Error::NoTree(key.to_string()))
        }
    }

    fn snapshot(&self, key: &ContainerKey, name: &str) -> Result<SnapshotInfo> {
        let dst = self.dirs.snapshot(key, name)?;
        let live = self.rootfs(key)?;
        if dst.exists() {
            return Err(names::snapshot_exists(key, name));
        }
        refuse_nested(&live)?;
        mkdirs(&self.dirs.snapshots(key))?;
        ioctl::snapshot(&live, &dst, true)?;
        self.info(key, name)
    }

    fn list(&self, key: &ContainerKey) -> Result<Vec<SnapshotInfo>> {
        let dir = self.dirs.snapshots(key);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(format!("read {}", dir.display()))(e)),
        };
        complete_snapshots(
            entries.map(|e| e.map_err(Error::io(format!("read {}", dir.display())))),
            is_snapshot,
            |name| self.info(key, name),
        )
    }

    fn rollback(&self, key: &ContainerKey, name: &str) -> Result<()> {
        let snap = self.existing_snapshot(key, name)?;
        let live = self.live(key);
        if !ioctl::is_subvolume(&live) {
            return self.new_tree(&snap, &live);
        }
        let marker = self.marker(key);
        write_durably(&marker, work::rollback_mark(name).as_bytes())?;
        fault::point("btrfs.rollback.marked");
        // No snapshot holds a nested subvolume (a snapshot of a tree with one is
        // refused), so the tree rolled back holds none either.
        btrfs_nested::delete_nested(&live)?;
        if !self.rollback_changed(&snap, &live)? {
            tree::mirror_with_fault(&snap, &live, "btrfs.rollback.mid")?;
        }
        std::fs::remove_file(&marker).map_err(Error::io(format!("remove {}", marker.display())))
    }

    fn clone_snapshot(
        &self,
        key: &ContainerKey,
        name: &str,
        new_key: &ContainerKey,
    ) -> Result<PathBuf> {
        let snap = self.existing_snapshot(key, name)?;
        let live = self.live(new_key);
        if live.exists() {
            return Err(names::tree_exists(new_key));
        }
        self.new_tree(&snap, &live)?;
        Ok(live)
    }

    fn standby_tree(&self, key: &ContainerKey, name: &str) -> Result<PathBuf> {
        let snap = self.existing_snapshot(key, name)?;
        let tree = self.tmp("standby");
        // Under the same limit as the container's own tree: it becomes that tree.
        self.new_tree(&snap, &tree)?;
        Ok(tree)
    }

    fn exchange_tree(&self, key: &ContainerKey, tree: &Path) -> Result<()> {
        let live = self.rootfs(key)?;
        if !ioctl::is_subvolume(tree) || !tree.starts_with(self.dirs.area(TMP)) {
            return Err(Error::Storage {
                operation: "exchange trees",
                message: format!("{} is not a standby tree of this pool", tree.display()),
            });
        }
        nix::fcntl::renameat2(
            None,
            tree,
            None,
            &live,
            nix::fcntl::RenameFlags::RENAME_EXCHANGE,
        )
        .map_err(Error::sys(format!(
            "exchange {} with {}",
            tree.display(),
            live.display()
        )))
    }

    fn take_tree(&self, key: &ContainerKey, tree: &Path, owner: Option<&Path>) -> Result<PathBuf> {
        if !ioctl::is_subvolume(tree) || !tree.starts_with(self.dirs.area(TMP)) {
            return Err(Error::Storage {
                operation: "take a standby tree",
                message: format!("{} is not a standby tree of this pool", tree.display()),
            });
        }
        let live = self.live(key);
        mkdirs(live.parent().expect("has a parent"))?;
        // Checked before the owner is recorded: a tree already there keeps its own.
        if live.symlink_metadata().is_ok() {
            return Err(names::tree_exists(key));
        }
        // Not synced: on btrfs an fsync after a subvolume's rename commits the
        // whole transaction (2 ms on a quiet pool, 3 to 11 ms for each fork of a
        // burst of ten). The link is in the rename's transaction or an earlier
        // one, so the rename is never durable without it. A crash that loses
        // both leaves the tree in the replicas' area, which reconciliation
        // removes; the fork's restore then clones the snapshot the replica was
        // made of, the same files.
        if let Some(owner) = owner {
            link_owner(&self.owner_file(key), owner)?;
        }
        // NOREPLACE: a tree already there is the caller's bug, never overwritten.
        nix::fcntl::renameat2(
            None,
            tree,
            None,
            &live,
            nix::fcntl::RenameFlags::RENAME_NOREPLACE,
        )
        .map_err(|e| match e {
            nix::errno::Errno::EEXIST => names::tree_exists(key),
            e => Error::sys(format!("move {} to {}", tree.display(), live.display()))(e),
        })?;
        Ok(live)
    }

    fn discard_tree(&self, tree: &Path) -> Result<()> {
        if !tree.starts_with(self.dirs.area(TMP)) {
            return Err(Error::Storage {
                operation: "discard a standby tree",
                message: format!("{} is not in this pool's in-flight area", tree.display()),
            });
        }
        if !ioctl::is_subvolume(tree) {
            return Ok(());
        }
        btrfs_nested::delete_nested(tree)?;
        ioctl::delete(tree)
    }

    fn delete_snapshot(&self, key: &ContainerKey, name: &str) -> Result<()> {
        let p = self.existing_snapshot(key, name)?;
        ioctl::delete(&p)
    }

    fn existing(&self, key: &ContainerKey, image: &ImageSource) -> Result<Option<work::Existing>> {
        let (live, owner) = (self.live(key), self.owner_file(key));
        Ok(work::existing_at(&live, &owner, image.owner.as_deref()))
    }

    fn set_owner(&self, key: &ContainerKey, owner: &Path) -> Result<()> {
        self.rootfs(key)?;
        write_durably(&self.owner_file(key), owner.as_os_str().as_encoded_bytes())
    }

    fn destroy(&self, key: &ContainerKey) -> Result<()> {
        let dir = self.dirs.snapshots(key);
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if ioctl::is_subvolume(&e.path()) {
                    ioctl::delete(&e.path())?;
                }
            }
            let _ = std::fs::remove_dir(&dir);
        }
        let live = self.live(key);
        if ioctl::is_subvolume(&live) {
            // A subvolume that holds others cannot be deleted (ENOTEMPTY).
            btrfs_nested::delete_nested(&live)?;
            ioctl::delete(&live)?;
        }
        let _ = std::fs::remove_file(self.marker(key));
        let _ = std::fs::remove_file(self.owner_file(key));
        Ok(())
    }

    fn space_used(&self, key: &ContainerKey) -> Result<u64> {
        // Exact exclusive figures need btrfs quotas, which cost on every write; the
        // data the live tree references is what `btrfs filesystem du` gives cheaply.
        let live = self.rootfs(key)?.display().to_string();
        let out = cmd::run("btrfs", &["filesystem", "du", "-s", "--raw", &live])?;
        // Columns: Total, Exclusive, Set shared, Filename.
        out.lines()
            .nth(1)
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .ok_or_else(|| Error::Storage {
                operation: "space used",
                message: format!("unexpected `btrfs filesystem du` output: {out}"),
            })
    }

    fn quota_usage(&self, key: &ContainerKey) -> Result<Option<QuotaUsage>> {
        let live = self.rootfs(key)?;
        if btrfs_quota::mode(self.dirs.root())?.is_none() {
            return Ok(None);
        }
        let (used, limit) = btrfs_quota::usage(self.dirs.root(), &live)?;
        Ok(Some(QuotaUsage { used, limit }))
    }

    fn export(
        &self,
        key: &ContainerKey,
        name: &str,
        parent: Option<&str>,
        out: &mut dyn Write,
    ) -> Result<()> {
        let snap = self.existing_snapshot(key, name)?.display().to_string();
        let parent = parent
            .map(|p| {
                self.existing_snapshot(key, p)
                    .map(|p| p.display().to_string())
            })
            .transpose()?;
        let mut args = vec!["send", "-q"];
        if let Some(p) = &parent {
            args.extend(["-p", p.as_str()]);
        }
        args.push(&snap);
        cmd::run_with_output("btrfs", &args, out)
    }

    fn import(&self, key: &ContainerKey, input: &mut dyn Read) -> Result<SnapshotInfo> {
        let dir = self.dirs.snapshots(key);
        mkdirs(&dir)?;
        let name = btrfs_receive::receive(&dir, input)?;
        self.info(key, &name)
    }

    fn owner(&self, key: &ContainerKey) -> Result<Option<PathBuf>> {
        Ok(work::read_owner(&self.owner_file(key)))
    }

    fn owned_by(&self, owner: &Path) -> Result<Option<ContainerKey>> {
        for (ns, e) in self.dirs.by_namespace(CONTAINERS) {
            let file = e.file_name().to_string_lossy().into_owned();
            let Some(id) = file.strip_suffix(".owner") else {
                continue;
            };
            if work::read_owner(&e.path()).as_deref() == Some(owner) {
                return ContainerKey::new(&ns, id).map(Some);
            }
        }
        Ok(None)
    }

    fn written(&self, key: &ContainerKey) -> Result<u64> {
        let live = self.rootfs(key)?;
        if btrfs_quota::mode(self.dirs.root())?.as_deref() == Some("squota") {
            return Ok(btrfs_quota::usage(self.dirs.root(), &live)?.0);
        }
        // Without simple quotas: the extents no image, snapshot or fork shares.
        let out = cmd::run(
            "btrfs",
            &[
                "filesystem",
                "du",
                "-s",
                "--raw",
                &live.display().to_string(),
            ],
        )?;
        out.lines()
            .nth(1)
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .ok_or_else(|| Error::Storage {
                operation: "written bytes",
                message: format!("unexpected `btrfs filesystem du` output: {out}"),
            })
    }

    fn collect(&self, scope: &Path) -> Result<Vec<ContainerKey>> {
        let mut gone = Vec::new();
        for (ns, e) in self.dirs.by_namespace(CONTAINERS) {
            let file = e.file_name().to_string_lossy().into_owned();
            let Some(id) = file.strip_suffix(".owner") else {
                continue;
            };
            let Some(owner) = work::read_owner(&e.path()) else {
                continue;
            };
            if !work::collectable(&owner, scope) {
                continue;
            }
            let key = ContainerKey::new(&ns, id)?;
            self.destroy(&key)?;
            gone.push(key);
        }
        Ok(gone)
    }

    fn collect_images(&self, scope: &Path) -> Result<Vec<String>> {
        let list = || {
            Ok(read_dir_lossy(&self.dirs.area(IMAGES))
                .filter(|e| ioctl::is_subvolume(&e.path()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect())
        };
        // A copy goes even while trees made of it live: each is a snapshot of its own.
        self.copies.collect(scope, list, |key| {
            ioctl::delete(&self.image_copy(key)).map(|()| true)
        })
    }

    fn reconcile(&self) -> Result<ReconcileReport> {
        let mut report = ReconcileReport::default();
        for e in self.dirs.dead_work()? {
            remove_work(&e.path())?;
            report.removed.push(e.path().display().to_string());
        }
        // Writable subvolumes among snapshots are receives that died (see `import`).
        for (_, c) in self.dirs.by_namespace(SNAPSHOTS) {
            let busy = read_dir_lossy(&c.path()).any(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.strip_prefix(".receiving-")
                    .and_then(|p| p.parse::<i32>().ok())
                    .is_some_and(work::pid_alive)
            });
            if busy {
                continue;
            }
            for e in read_dir_lossy(&c.path()) {
                let p = e.path();
                if ioctl::is_subvolume(&p) && !is_snapshot(&p) {
                    ioctl::delete(&p)?;
                    report.removed.push(p.display().to_string());
                } else if e.file_name().to_string_lossy().starts_with(".receiving-") {
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
        for (ns, e) in self.dirs.by_namespace(CONTAINERS) {
            let file = e.file_name().to_string_lossy().into_owned();
            let Some(id) = file.strip_suffix(".rollback") else {
                continue;
            };
            let key = ContainerKey::new(&ns, id)?;
            let mark = std::fs::read_to_string(e.path())
                .map_err(Error::io(format!("read {}", e.path().display())))?;
            let Some(snap) = work::dead_rollback(&mark) else {
                continue; // its process still runs
            };
            self.rollback(&key, &snap)?;
            report
                .completed
                .push(format!("rollback of {key} to {snap}"));
        }
        Ok(report)
    }
}

/// Fails, naming it, when the container made a subvolume inside its tree `live`: a
/// snapshot of the tree would silently hold an empty directory in its place.
fn refuse_nested(live: &Path) -> Result<()> {
    match btrfs_nested::first_nested(live)? {
        Some(nested) => Err(btrfs_nested::refuse(live, &nested)),
        None => Ok(()),
    }
}

/// A complete snapshot: a read-only subvolume.
fn is_snapshot(p: &Path) -> bool {
    ioctl::is_subvolume(p) && ioctl::is_readonly(p).unwrap_or(false)
}

/// Removes in-flight work: a subvolume, a mount point, or a directory of either.
fn remove_work(p: &Path) -> Result<()> {
    let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
    if ioctl::is_subvolume(p) {
        btrfs_nested::delete_nested(p)?;
        return ioctl::delete(p);
    }
    if let Ok(entries) = std::fs::read_dir(p) {
        for e in entries.flatten() {
            if ioctl::is_subvolume(&e.path()) {
                ioctl::delete(&e.path())?;
            }
        }
    }
    let md = std::fs::symlink_metadata(p);
    match md {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(_) => Ok(()),
    }
    .map_err(Error::io(format!("remove {}", p.display())))
}
