//! The overlay store: works on any host file system. containerd's image layers stay
//! the overlay's lower dirs; the container writes to an upper dir that this store
//! snapshots by copying it (reflinks where the file system has them, xfs and btrfs;
//! plain copies elsewhere), so every cost grows with what the container changed, never
//! with the image.
//!
//! ```text
//! <pool>/containers/<ns>/<id>/{upper,work,merged}   the live overlay, mounted on merged
//! <pool>/containers/<ns>/<id>/lower                 the lower dirs, one per line
//! <pool>/containers/<ns>/<id>/owner                 containerd's writable layer
//! <pool>/containers/<ns>/<id>/rollback              marker: a rollback runs
//! <pool>/snapshots/<ns>/<id>/<name>/{upper,lower}   snapshots (complete when renamed in)
//! <pool>/tmp/<pid>.<n>.<what>                       in-flight work
//! ```
//!
//! A rollback changes the live tree through the mounted overlay, because an overlay's
//! upper dir must not change under a mounted overlay. It compares the snapshot's upper
//! dir with the live one (both hold only changes) and, for every path that differs,
//! makes the live view equal to the snapshot's view (the snapshot's upper over the same
//! lower dirs, mounted read-only for the purpose). Two entries count as equal by the
//! quick check rsync uses: type, size, mtime, mode, owner and xattrs.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use super::dirs::{complete_snapshots, mkdirs, read_dir_lossy, write_durably, PoolDirs};
use super::names::{CONTAINERS, SNAPSHOTS, TMP};
use super::{
    cmd, fault, names, overlay_import, overlay_quota, tree, work, ContainerKey, ImageSource,
    ReconcileReport, SnapshotInfo, Store,
};
use crate::config::Backend;
use crate::{Error, Result};

/// An overlay pool: a directory on any file system.
#[derive(Debug)]
pub struct OverlayStore {
    dirs: PoolDirs,
    /// The pool quota of each container, measured ([`overlay_quota`]).
    tree_limit: Option<u64>,
}

fn read_lower(file: &Path) -> Result<Vec<PathBuf>> {
    let text =
        std::fs::read_to_string(file).map_err(Error::io(format!("read {}", file.display())))?;
    Ok(text
        .lines()
        .filter(|l| !l.is_empty())
        .map(PathBuf::from)
        .collect())
}

fn write_lower(file: &Path, layers: &[PathBuf]) -> Result<()> {
    let text: String = layers
        .iter()
        .map(|l| format!("{}\n", l.display()))
        .collect();
    write_durably(file, text.as_bytes())
}

fn is_mounted(p: &Path) -> bool {
    let want = match std::fs::canonicalize(p) {
        Ok(c) => c,
        Err(_) => return false,
    };
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(4).map(Path::new) == Some(want.as_path()))
}

/// Mounts an overlay of `upper` (read-write with `work`, or as the top lower dir when
/// `work` is None) over `lower` on `target`.
fn mount_overlay(
    lower: &[PathBuf],
    upper: &Path,
    work: Option<&Path>,
    target: &Path,
) -> Result<()> {
    let mut lowers: Vec<String> = Vec::new();
    let data = match work {
        Some(work) => {
            lowers.extend(lower.iter().map(|l| l.display().to_string()));
            if lowers.is_empty() {
                // An overlay needs a lower dir: an empty image gets an empty one.
                let empty = upper.with_file_name("empty-lower");
                mkdirs(&empty)?;
                lowers.push(empty.display().to_string());
            }
            format!(
                "lowerdir={},upperdir={},workdir={},index=off",
                lowers.join(":"),
                upper.display(),
                work.display()
            )
        }
        None => {
            lowers.push(upper.display().to_string());
            lowers.extend(lower.iter().map(|l| l.display().to_string()));
            if lowers.len() == 1 {
                let empty = upper.with_file_name("empty-lower");
                mkdirs(&empty)?;
                lowers.push(empty.display().to_string());
            }
            format!("lowerdir={}", lowers.join(":"))
        }
    };
    let flags = if work.is_none() {
        MsFlags::MS_RDONLY
    } else {
        MsFlags::empty()
    };
    mount(
        Some("overlay"),
        target,
        Some("overlay"),
        flags,
        Some(data.as_str()),
    )
    .map_err(Error::sys(format!("mount overlay on {}", target.display())))
}

fn unmount(p: &Path) {
    let _ = umount2(p, MntFlags::MNT_DETACH);
}

impl OverlayStore {
    /// Opens (creating its directories) the pool at `root`.
    pub fn open(root: impl AsRef<Path>) -> Result<OverlayStore> {
        let dirs = PoolDirs::open(root.as_ref().to_path_buf(), &[CONTAINERS, SNAPSHOTS, TMP])?;
        Ok(OverlayStore {
            dirs,
            tree_limit: None,
        })
    }

    /// Refuses snapshots that would bring a container past `bytes` of upper
    /// directory and snapshots ([`overlay_quota`]); `None`: no limit.
    pub fn with_tree_limit(mut self, bytes: Option<u64>) -> OverlayStore {
        self.tree_limit = bytes;
        self
    }

    fn dir(&self, key: &ContainerKey) -> PathBuf {
        self.dirs.container(key)
    }

    fn existing_snapshot(&self, key: &ContainerKey, name: &str) -> Result<PathBuf> {
        let p = self.dirs.snapshot(key, name)?;
        if !p.join("lower").exists() {
            return Err(names::snapshot_not_found(key, name));
        }
        Ok(p)
    }

    fn tmp(&self, what: &str) -> PathBuf {
        self.dirs.tmp(what)
    }

    /// Makes the container's directory from an upper dir to copy (or an empty one)
    /// and mounts it; the directory appears under its final name only when complete.
    fn create_tree(
        &self,
        key: &ContainerKey,
        lower: &[PathBuf],
        upper_from: Option<&Path>,
    ) -> Result<PathBuf> {
        let dir = self.dir(key);
        let work = self.tmp("tree");
        mkdirs(&work.join("upper"))?;
        mkdirs(&work.join("work"))?;
        mkdirs(&work.join("merged"))?;
        let built = (|| {
            if let Some(src) = upper_from {
                tree::copy(src, &work.join("upper"))?;
                fault::point("overlay.tree.copied");
            }
            write_lower(&work.join("lower"), lower)?;
            mkdirs(dir.parent().expect("has a parent"))?;
            std::fs::rename(&work, &dir).map_err(Error::io(format!("rename to {}", dir.display())))
        })();
        if let Err(e) = built {
            let _ = std::fs::remove_dir_all(&work);
            return Err(e);
        }
        self.ensure_mounted(key)
    }

    fn ensure_mounted(&self, key: &ContainerKey) -> Result<PathBuf> {
        let dir = self.dir(key);
        let merged = dir.join("merged");
        if !is_mounted(&merged) {
            let lower = read_lower(&dir.join("lower"))?;
            mount_overlay(&lower, &dir.join("upper"), Some(&dir.join("work")), &merged)?;
        }
        Ok(merged)
    }

    /// Brings the live view to the snapshot's, path by path (see the module docs).
    fn rollback_in_place(&self, key: &ContainerKey, snap: &Path) -> Result<()> {
        let dir = self.dir(key);
        let merged = self.ensure_mounted(key)?;
        let view = self.tmp("view");
        mkdirs(&view)?;
        let lower = read_lower(&snap.join("lower"))?;
        mount_overlay(&lower, &snap.join("upper"), None, &view)?;
        let result = Sync {
            snap_upper: snap.join("upper"),
            live_upper: dir.join("upper"),
            view: view.clone(),
            merged,
            steps: 0,
            mirror: tree::Mirror::new(),
        }
        .dir(Path::new(""));
        unmount(&view);
        let _ = std::fs::remove_dir(&view);
        result
    }
}

struct Sync {
    snap_upper: PathBuf,
    live_upper: PathBuf,
    view: PathBuf,
    merged: PathBuf,
    steps: u64,
    mirror: tree::Mirror,
}

fn entries(dir: &Path) -> BTreeSet<OsString> {
    read_dir_lossy(dir).map(|e| e.file_name()).collect()
}

fn xattrs(p: &Path) -> Vec<(OsString, Option<Vec<u8>>)> {
    let mut v: Vec<(OsString, Option<Vec<u8>>)> = xattr::list(p)
        .map(|l| {
            l.map(|n| (n.clone(), xattr::get(p, &n).ok().flatten()))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn quick_equal(a: &Path, am: &std::fs::Metadata, b: &Path, bm: &std::fs::Metadata) -> bool {
    am.file_type() == bm.file_type()
        && am.size() == bm.size()
        && am.mtime() == bm.mtime()
        && am.mtime_nsec() == bm.mtime_nsec()
        && am.mode() == bm.mode()
        && am.uid() == bm.uid()
        && am.gid() == bm.gid()
        && am.rdev() == bm.rdev()
        && xattrs(a) == xattrs(b)
}

impl Sync {
    fn dir(&mut self, rel: &Path) -> Result<()> {
        let mut names = entries(&self.snap_upper.join(rel));
        names.extend(entries(&self.live_upper.join(rel)));
        for n in names {
            let p = rel.join(&n);
            let (s, u) = (self.snap_upper.join(&p), self.live_upper.join(&p));
            let (sm, um) = (
                std::fs::symlink_metadata(&s).ok(),
                std::fs::symlink_metadata(&u).ok(),
            );
            match (&sm, &um) {
                (Some(a), Some(b)) if a.is_dir() && b.is_dir() && xattrs(&s) == xattrs(&u) => {
                    self.dir(&p)?;
                    if !quick_equal(&s, a, &u, b) {
                        tree::copy_metadata(&self.view.join(&p), &self.merged.join(&p))?;
                    }
                }
                // Hard-linked entries are always rewritten, so links are re-made.
                (Some(a), Some(b))
                    if !a.is_dir() && a.nlink() == 1 && quick_equal(&s, a, &u, b) => {}
                _ => {
                    self.mirror
                        .mirror_entry(&self.view.join(&p), &self.merged.join(&p))?;
                    self.steps += 1;
                    if self.steps == 2 {
                        fault::point("overlay.rollback.mid");
                    }
                }
            }
        }
        if rel.as_os_str().is_empty() {
            tree::copy_metadata(&self.view, &self.merged)?;
        }
        Ok(())
    }
}

impl Store for OverlayStore {
    fn backend(&self) -> Backend {
        Backend::Overlay
    }

    fn prepare(&self, key: &ContainerKey, image: &ImageSource) -> Result<PathBuf> {
        let dir = self.dir(key);
        match self.existing(key, image)? {
            Some(work::Existing::Reuse) => return self.ensure_mounted(key),
            Some(work::Existing::Replace) => self.destroy(key)?,
            Some(work::Existing::Conflict) => return Err(names::tree_exists(key)),
            None => {}
        }
        let merged = self.create_tree(key, &image.layers, None)?;
        if let Some(owner) = &image.owner {
            write_durably(&dir.join("owner"), owner.as_os_str().as_encoded_bytes())?;
        }
        Ok(merged)
    }

    fn rootfs(&self, key: &ContainerKey) -> Result<PathBuf> {
        if !self.dir(key).join("lower").exists() {
            return Err(Error::NoTree(key.to_string()));
        }
        self.ensure_mounted(key)
    }

    fn snapshot(&self, key: &ContainerKey, name: &str) -> Result<SnapshotInfo> {
        let dst = self.dirs.snapshot(key, name)?;
        self.rootfs(key)?;
        if dst.exists() {
            return Err(names::snapshot_exists(key, name));
        }
        let dir = self.dir(key);
        let work = self.tmp("snapshot");
        mkdirs(&work.join("upper"))?;
        let made = (|| {
            let copied = tree::copy(&dir.join("upper"), &work.join("upper"))?.bytes;
            overlay_quota::admit(key, self.tree_limit, copied, &self.dirs.snapshots(key))?;
            std::fs::write(work.join(overlay_quota::BYTES_FILE), copied.to_string())
                .map_err(Error::io(format!("write {}", work.display())))?;
            fault::point("overlay.snapshot.copied");
            write_lower(&work.join("lower"), &read_lower(&dir.join("lower"))?)?;
            // Durable before it is named, and named durably: a checkpoint records
            // it next. One syncfs of the store's file system instead of an fsync
            // per copied file.
            sync_fs(&work)?;
            mkdirs(&self.dirs.snapshots(key))?;
            std::fs::rename(&work, &dst)
                .map_err(Error::io(format!("rename to {}", dst.display())))?;
            sync_fs(&self.dirs.snapshots(key))
        })();
        if let Err(e) = made {
            let _ = std::fs::remove_dir_all(&work);
            return Err(e);
        }
        self.info(key, name)
    }

    fn list(&self, key: &ContainerKey) -> Result<Vec<SnapshotInfo>> {
        complete_snapshots(
            read_dir_lossy(&self.dirs.snapshots(key)).map(Ok),
            |p| p.join("lower").exists(),
            |name| self.info(key, name),
        )
    }

    fn rollback(&self, key: &ContainerKey, name: &str) -> Result<()> {
        let snap = self.existing_snapshot(key, name)?;
        let dir = self.dir(key);
        if !dir.join("lower").exists() {
            self.create_tree(
                key,
                &read_lower(&snap.join("lower"))?,
                Some(&snap.join("upper")),
            )?;
            return Ok(());
        }
        let marker = dir.join("rollback");
        write_durably(&marker, work::rollback_mark(name).as_bytes())?;
        self.rollback_in_place(key, &snap)?;
        std::fs::remove_file(&marker).map_err(Error::io(format!("remove {}", marker.display())))
    }

    fn clone_snapshot(
        &self,
        key: &ContainerKey,
        name: &str,
        new_key: &ContainerKey,
    ) -> Result<PathBuf> {
        let snap = self.existing_snapshot(key, name)?;
        if self.dir(new_key).exists() {
            return Err(names::tree_exists(new_key));
        }
        self.create_tree(
            new_key,
            &read_lower(&snap.join("lower"))?,
            Some(&snap.join("upper")),
        )
    }

    fn existing(&self, key: &ContainerKey, image: &ImageSource) -> Result<Option<work::Existing>> {
        let dir = self.dir(key);
        Ok(work::existing_at(
            &dir,
            &dir.join("owner"),
            image.owner.as_deref(),
        ))
    }

    fn set_owner(&self, key: &ContainerKey, owner: &Path) -> Result<()> {
        self.rootfs(key)?;
        write_durably(
            &self.dir(key).join("owner"),
            owner.as_os_str().as_encoded_bytes(),
        )
    }

    fn delete_snapshot(&self, key: &ContainerKey, name: &str) -> Result<()> {
        let p = self.existing_snapshot(key, name)?;
        // Unpublish first (rename away), then remove: a crash never leaves half a
        // snapshot under its name.
        let gone = self.tmp("deleted");
        std::fs::rename(&p, &gone).map_err(Error::io(format!("remove {}", p.display())))?;
        std::fs::remove_dir_all(&gone).map_err(Error::io(format!("remove {}", gone.display())))
    }

    fn destroy(&self, key: &ContainerKey) -> Result<()> {
        let dir = self.dir(key);
        if dir.exists() {
            unmount(&dir.join("merged"));
            let gone = self.tmp("destroyed");
            std::fs::rename(&dir, &gone).map_err(Error::io(format!("remove {}", dir.display())))?;
            std::fs::remove_dir_all(&gone)
                .map_err(Error::io(format!("remove {}", gone.display())))?;
        }
        let snaps = self.dirs.snapshots(key);
        if snaps.exists() {
            let gone = self.tmp("destroyed");
            std::fs::rename(&snaps, &gone)
                .map_err(Error::io(format!("remove {}", snaps.display())))?;
            std::fs::remove_dir_all(&gone)
                .map_err(Error::io(format!("remove {}", gone.display())))?;
        }
        Ok(())
    }

    fn space_used(&self, key: &ContainerKey) -> Result<u64> {
        self.rootfs(key)?;
        let mut total = 0;
        let mut stack = vec![self.dir(key).join("upper")];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                if let Ok(m) = e.metadata() {
                    total += m.blocks() * 512;
                    if m.is_dir() {
                        stack.push(e.path());
                    }
                }
            }
        }
        Ok(total.max(1))
    }

    fn export(
        &self,
        key: &ContainerKey,
        name: &str,
        parent: Option<&str>,
        out: &mut dyn Write,
    ) -> Result<()> {
        // A snapshot here is already a delta against the image (the upper dir): the
        // parent is checked for the caller's sake and the stream is the whole delta.
        if let Some(p) = parent {
            self.existing_snapshot(key, p)?;
        }
        let snap = self.existing_snapshot(key, name)?;
        let base = self.dirs.snapshots(key).display().to_string();
        cmd::run_with_output(
            "tar",
            &[
                "-C",
                &base,
                "--xattrs",
                "--xattrs-include=*",
                "--numeric-owner",
                "-cf",
                "-",
                name,
            ],
            out,
        )?;
        let _ = snap;
        Ok(())
    }

    fn import(&self, key: &ContainerKey, input: &mut dyn Read) -> Result<SnapshotInfo> {
        let work = self.tmp("receive");
        mkdirs(&work)?;
        let w = work.display().to_string();
        let result = (|| {
            cmd::run_with_input(
                "tar",
                &[
                    "-C",
                    &w,
                    "--xattrs",
                    "--xattrs-include=*",
                    "--numeric-owner",
                    "-xf",
                    "-",
                ],
                input,
            )?;
            let found: Vec<OsString> = entries(&work).into_iter().collect();
            let [name] = found.as_slice() else {
                return Err(Error::Storage {
                    operation: "import",
                    message: "the stream must hold exactly one snapshot".into(),
                });
            };
            let name = name.to_string_lossy().into_owned();
            let dst = self.dirs.snapshot(key, &name)?;
            let known = overlay_import::known_layers(&self.dirs);
            overlay_import::check_snapshot(&work.join(&name), &name, &known)?;
            // What the archive says of its size is not trusted: measured here.
            overlay_quota::record(&work.join(&name))?;
            if dst.exists() {
                return Err(names::snapshot_exists(key, &name));
            }
            mkdirs(&self.dirs.snapshots(key))?;
            std::fs::rename(work.join(&name), &dst)
                .map_err(Error::io(format!("rename to {}", dst.display())))?;
            self.info(key, &name)
        })();
        let _ = std::fs::remove_dir_all(&work);
        result
    }

    fn reconcile(&self) -> Result<ReconcileReport> {
        let mut report = ReconcileReport::default();
        for e in self.dirs.dead_work()? {
            unmount(&e.path());
            if let Ok(m) = std::fs::symlink_metadata(e.path().join("merged")) {
                if m.is_dir() {
                    unmount(&e.path().join("merged"));
                }
            }
            std::fs::remove_dir_all(e.path())
                .map_err(Error::io(format!("remove {}", e.path().display())))?;
            report.removed.push(e.path().display().to_string());
        }
        for (ns, c) in self.dirs.by_namespace(CONTAINERS) {
            let marker = c.path().join("rollback");
            let Ok(mark) = std::fs::read_to_string(&marker) else {
                continue;
            };
            let Some(snap) = work::dead_rollback(&mark) else {
                continue; // its process still runs
            };
            let key = ContainerKey::new(&ns, &c.file_name().to_string_lossy())?;
            self.rollback(&key, &snap)?;
            report
                .completed
                .push(format!("rollback of {key} to {snap}"));
        }
        Ok(report)
    }

    fn owner(&self, key: &ContainerKey) -> Result<Option<PathBuf>> {
        Ok(work::read_owner(&self.dir(key).join("owner")))
    }

    fn owned_by(&self, owner: &Path) -> Result<Option<ContainerKey>> {
        for (ns, c) in self.dirs.by_namespace(CONTAINERS) {
            if work::read_owner(&c.path().join("owner")).as_deref() == Some(owner) {
                return ContainerKey::new(&ns, &c.file_name().to_string_lossy()).map(Some);
            }
        }
        Ok(None)
    }

    fn written(&self, key: &ContainerKey) -> Result<u64> {
        let upper = self.dir(key).join("upper");
        if !upper.is_dir() {
            return Err(Error::NoTree(key.to_string()));
        }
        Ok(super::du::disk_usage(&upper)?.bytes)
    }

    fn collect(&self, scope: &Path) -> Result<Vec<ContainerKey>> {
        let mut gone = Vec::new();
        for (ns, c) in self.dirs.by_namespace(CONTAINERS) {
            let Some(owner) = work::read_owner(&c.path().join("owner")) else {
                continue;
            };
            if !work::collectable(&owner, scope) {
                continue;
            }
            let key = ContainerKey::new(&ns, &c.file_name().to_string_lossy())?;
            self.destroy(&key)?;
            gone.push(key);
        }
        Ok(gone)
    }

    fn release(&self, key: &ContainerKey) -> Result<()> {
        let merged = self.dir(key).join("merged");
        if is_mounted(&merged) {
            umount2(merged.as_path(), MntFlags::MNT_DETACH)
                .map_err(Error::sys(format!("unmount {}", merged.display())))?;
        }
        Ok(())
    }
}

impl OverlayStore {
    fn info(&self, key: &ContainerKey, name: &str) -> Result<SnapshotInfo> {
        let p = self.existing_snapshot(key, name)?;
        let md = std::fs::metadata(p.join("lower"))
            .map_err(Error::io(format!("stat {}", p.display())))?;
        Ok(SnapshotInfo {
            name: name.to_string(),
            created: md
                .modified()
                .map_err(Error::io(format!("stat {}", p.display())))?,
        })
    }
}

/// Flushes the file system holding `p` (syncfs(2)).
fn sync_fs(p: &Path) -> Result<()> {
    let f = std::fs::File::open(p).map_err(Error::io(format!("open {}", p.display())))?;
    nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&f))
        .map_err(Error::sys(format!("syncfs {}", p.display())))
}
