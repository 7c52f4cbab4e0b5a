//! The ZFS store: datasets, snapshots and clones in a ZFS pool, driven by the standard
//! `zfs` command (kernel OpenZFS in production, zfs-fuse where the kernel has no ZFS).
//!
//! ```text
//! <root>/images/<key>@base               read-only copy of an image (never mounted)
//! <root>/containers/<ns>/<id>            the container's dataset: its writable tree (the
//!                                        rootfs), a clone of an image's @base or of a
//!                                        snapshot, or a received stream
//! <root>/containers/<ns>/<id>@<name>     its snapshots
//! <root>/containers/<ns>/<id>@.deleted.* deleted snapshots that clones still use; ZFS
//!                                        destroys them with their last clone
//! <root>/tmp/<pid>.<n>.<what>            in-flight work of process <pid> (datasets, and
//!                                        plain directories used as mount points)
//! <root>/retired/<pid>.<n>.retired       destroyed containers whose snapshots clones
//!                                        still use; removed once the clones are gone
//!
//! user properties of a container's dataset:
//! crab:owner=<path>                      containerd's writable layer the tree belongs to
//! crab:tree=none                         it holds imported snapshots but no tree yet
//! crab:rollback=<pid>:<name>             a rollback to <name> runs (or was interrupted)
//! ```
//!
//! `<root>` is the dataset the configuration names (`[storage] zfs_dataset`, by default
//! `crab/crab`, which `hack/zfs.sh` makes); it must have a mount point, which every
//! dataset below inherits. `images/`, `containers/`, `tmp/` and `retired/` are made
//! with `atime=off`: reading a tree then does not count as changing it (an incremental
//! `zfs receive` refuses a dataset changed since its last snapshot). Properties are set
//! with the dataset they describe (`zfs clone -o`) or before it is renamed into place,
//! and a `zfs set` is on disk when it returns: they are the markers crash recovery
//! reads.
//!
//! Rollback keeps every snapshot (never `zfs rollback -r`). To the latest snapshot it is
//! the native `zfs rollback`, atomic and online: open files and working directories see
//! the snapshot's content. To an older one (and on zfs-fuse, see below, to any one while
//! the tree is mounted) it mirrors the snapshot into the live tree in place
//! ([`tree::mirror`]) from a readable view of it: `.zfs/snapshot/<name>` where ZFS
//! serves it (kernel OpenZFS), otherwise a temporary read-only clone. Processes see the
//! result as on btrfs: directories (a cwd, a root) show the snapshot's entries, a file
//! changed since the snapshot is replaced (whoever holds the old one open keeps it).
//! The `crab:rollback` property marks the mirror; [`Store::reconcile`] redoes it.
//!
//! A clone holds its origin snapshot: ZFS cannot destroy a snapshot that a container
//! made by [`Store::clone_snapshot`] still uses. [`Store::delete_snapshot`] of such a
//! snapshot renames it to a hidden `.deleted.*` name (freeing the name and removing it
//! from [`Store::list`]) and asks for its deferred destruction (`zfs destroy -d`): ZFS
//! destroys it when the last clone goes. [`Store::destroy`] of such a container renames
//! it under `retired/` (freeing the key at once) and destroys what no clone uses; the
//! rest goes when the clones go (`destroy` and `reconcile` collect it). Nothing is ever
//! promoted: `zfs promote` would move the origin's snapshots into the clone's list.
//!
//! Import: a full stream is received under a temporary name, marked `crab:tree=none` and
//! renamed into place, so the container's name never holds a half-received dataset; the
//! container must not have a dataset yet. [`Store::rollback`] then makes the tree. An
//! incremental stream is received into the container's dataset (ZFS makes the new
//! snapshot appear atomically); its parent must be the container's latest snapshot and
//! the tree unchanged since. The stream's first record is read before `zfs receive`
//! runs, for clear errors, and because zfs-fuse receives an incremental stream aimed at
//! a dataset that does not exist into the stream's source dataset if that is in the
//! pool.
//!
//! zfs-fuse differences, all handled with standard commands (zfs-fuse is recognised by
//! its mounts being FUSE file systems):
//! - `zfs rollback` and `zfs receive` change a mounted file system under the kernel's
//!   FUSE caches, which zfs-fuse only flushes with a host-wide `drop_caches` that spares
//!   entries in use: a process's cwd, a file open a moment ago then name objects that no
//!   longer exist (ENOENT on open), and a later unmount of the dataset hangs the daemon
//!   (every FUSE request waits, for good). So a mounted tree is never rolled back
//!   natively there (it is mirrored, through the mount), and an incremental stream is
//!   received with the tree unmounted (refused if it is in use).
//! - `zfs rename` / `zfs destroy` of a mounted dataset fail with "dataset is busy" (the
//!   command unmounts, but the daemon still holds the mount), and so do they for a
//!   moment after `zfs unmount`: datasets are unmounted with `zfs unmount` first, and
//!   "busy" is retried for up to 5 s.
//! - no `.zfs` directory: snapshots are read through a temporary clone.
//! - timestamps have whole seconds only, so [`tree::mirror`]'s "same inode, ctime,
//!   mtime and size: unchanged" test misses a file changed in the second its snapshot
//!   was taken: before mirroring, files whose ctime is not older than the snapshot are
//!   removed from the live tree (the mirror copies them again).
//! - `zfs list -p` is missing (numbers come from `zfs get -Hp`), as are the `clones`,
//!   `createtxg` and `written` properties (clones are found by their `origin`; `zfs get
//!   -r` lists snapshots in creation order).
//! - extended attributes need the daemon started with `--enable-xattr`.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use super::work::{self, owner_alive, pid_alive, Existing};
use super::{
    cmd, fault, names, tree, ContainerKey, ImageSource, ReconcileReport, SnapshotInfo, Store,
};
use crate::config::Backend;
use crate::{Error, Result};

/// Longest dataset or snapshot name ZFS accepts.
const MAX_NAME: usize = 255;
/// Marks a running rollback: `<pid>:<snapshot>`.
const ROLLBACK: &str = "crab:rollback";
/// `none` on a dataset that holds imported snapshots but no tree.
const TREE: &str = "crab:tree";
/// containerd's writable layer that owns the tree.
const OWNER: &str = "crab:owner";
/// Prefix of deleted snapshots that clones still depend on.
const DELETED: &str = ".deleted.";
/// The snapshot of an image that containers are cloned from.
const BASE: &str = "base";
/// `statfs` type of FUSE file systems: zfs-fuse's mounts.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// A ZFS pool (more precisely: the dataset in one that holds everything Crab stores).
#[derive(Debug)]
pub struct ZfsStore {
    root: String,
    pool: String,
    /// Where `<root>/tmp` is mounted.
    tmp_dir: PathBuf,
    /// Whether ZFS serves its file systems through FUSE (zfs-fuse).
    fuse: bool,
}

/// What `zfs get` says about a container's dataset.
#[derive(Debug)]
struct DsState {
    mountpoint: String,
    mounted: bool,
    /// False while it holds imported snapshots only.
    tree: bool,
    owner: Option<PathBuf>,
}

fn zfs(args: &[&str]) -> Result<String> {
    let _turn = DaemonTurn::take()?;
    cmd::run("zfs", args)
}

/// zfs-fuse, the user-space daemon, can deadlock when many commands reach it at once
/// (measured here: two runs of fifty concurrent containers hung it, and every later
/// `zfs` command with it). So where ZFS is that daemon, the `zfs` commands of every
/// process on the host take turns, through an exclusive `flock` on one file. Kernel
/// OpenZFS (`/sys/module/zfs`) needs no turns.
struct DaemonTurn(#[allow(dead_code)] Option<std::fs::File>);

impl DaemonTurn {
    fn take() -> Result<DaemonTurn> {
        use std::os::fd::AsRawFd;
        if Path::new("/sys/module/zfs").exists() {
            return Ok(DaemonTurn(None));
        }
        let path = Path::new("/run/crab-zfs-fuse.lock");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(Error::io(format!("open {}", path.display())))?;
        // SAFETY: flock on an fd this function owns; no memory is passed.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(Error::sys(format!("lock {}", path.display()))(
                nix::Error::last(),
            ));
        }
        Ok(DaemonTurn(Some(f)))
    }
}

/// Runs a `zfs rename` or `zfs destroy` of an unmounted dataset. zfs-fuse answers
/// "dataset is busy" for a moment after an unmount, while the kernel still sends it the
/// releases of files that were open: this waits that out (up to 5 s).
fn zfs_unmounted(args: &[&str]) -> Result<String> {
    let start = std::time::Instant::now();
    loop {
        match zfs(args) {
            Err(Error::Command { message, .. })
                if message.contains("busy") && start.elapsed() < Duration::from_secs(5) =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// Whether `e` is the `zfs` command saying that a dataset does not exist.
fn is_missing(e: &Error) -> bool {
    matches!(e, Error::Command { message, .. } if message.contains("does not exist"))
}

fn check_len(name: &str) -> Result<()> {
    if name.len() > MAX_NAME {
        return Err(Error::Storage {
            operation: "name a dataset",
            message: format!("{name} is longer than the {MAX_NAME} characters ZFS allows"),
        });
    }
    Ok(())
}

fn already_exists(key: &ContainerKey) -> Error {
    Error::AlreadyExists(format!("{key} (its tree in the store)"))
}

fn not_found(key: &ContainerKey, name: &str) -> Error {
    Error::SnapshotNotFound {
        container: key.to_string(),
        name: name.to_string(),
    }
}

impl ZfsStore {
    /// Opens the store in dataset `root` (e.g. `crab/crab`), which must exist and have
    /// a mount point, and makes its top-level datasets if they are missing.
    pub fn open(root: &str) -> Result<ZfsStore> {
        let bad = |message: String| Error::Storage {
            operation: "open zfs pool",
            message,
        };
        if root.is_empty() || root.starts_with('/') || root.contains('@') || root.ends_with('/') {
            return Err(bad(format!(
                "{root:?} is not a ZFS dataset name (like \"crab/crab\")"
            )));
        }
        check_len(root)?;
        match zfs(&["get", "-H", "-o", "value", "type", root]) {
            Ok(t) if t.trim() == "filesystem" => {}
            Ok(t) => return Err(bad(format!("{root} is a {}, not a file system", t.trim()))),
            Err(e) if is_missing(&e) => {
                return Err(bad(format!(
                    "dataset {root} does not exist (is its pool imported?)"
                )))
            }
            Err(e) => return Err(e),
        }
        let mut store = ZfsStore {
            root: root.to_string(),
            pool: root.split('/').next().unwrap_or(root).to_string(),
            tmp_dir: PathBuf::new(),
            fuse: false,
        };
        let at = store.mountpoint(root)?;
        store.fuse = nix::sys::statfs::statfs(&at)
            .map_err(Error::sys(format!("statfs {}", at.display())))?
            .filesystem_type()
            .0
            == FUSE_SUPER_MAGIC;
        let have: HashSet<String> = zfs(&["list", "-H", "-o", "name", "-d", "1", "-r", root])?
            .lines()
            .map(str::to_string)
            .collect();
        for child in ["images", "containers", "tmp", "retired"] {
            let ds = format!("{root}/{child}");
            if !have.contains(&ds) {
                store.create_fs(&ds, &["-o", "atime=off"])?;
            }
        }
        store.tmp_dir = store.mountpoint(&format!("{root}/tmp"))?;
        Ok(store)
    }

    /// The dataset the store keeps everything in.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The container's dataset name.
    pub fn dataset(&self, key: &ContainerKey) -> Result<String> {
        let ds = format!("{}/containers/{}/{}", self.root, key.namespace(), key.id());
        check_len(&ds)?;
        Ok(ds)
    }

    /// Creates a file system; one that another process created meanwhile is fine.
    fn create_fs(&self, ds: &str, options: &[&str]) -> Result<()> {
        let mut args = vec!["create"];
        args.extend_from_slice(options);
        args.push(ds);
        match zfs(&args) {
            Ok(_) => Ok(()),
            Err(_) if self.exists(ds)? => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn snapshot_name(&self, key: &ContainerKey, name: &str) -> Result<String> {
        names::check_snapshot_name(name)?;
        let snap = format!("{}@{name}", self.dataset(key)?);
        check_len(&snap)?;
        Ok(snap)
    }

    /// The full name of an existing snapshot.
    fn existing_snapshot(&self, key: &ContainerKey, name: &str) -> Result<String> {
        let snap = self.snapshot_name(key, name)?;
        if !self.exists(&snap)? {
            return Err(not_found(key, name));
        }
        Ok(snap)
    }

    /// Whether a dataset or snapshot exists.
    fn exists(&self, name: &str) -> Result<bool> {
        match zfs(&["get", "-H", "-o", "value", "type", name]) {
            Ok(_) => Ok(true),
            Err(e) if is_missing(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The state of a file system, `None` if it does not exist.
    fn state(&self, ds: &str) -> Result<Option<DsState>> {
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
    fn mount(&self, ds: &str, st: &DsState) -> Result<PathBuf> {
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
    fn mountpoint(&self, ds: &str) -> Result<PathBuf> {
        let st = self.state(ds)?.ok_or_else(|| Error::Storage {
            operation: "mount a dataset",
            message: format!("{ds} does not exist"),
        })?;
        self.mount(ds, &st)
    }

    /// Unmounts `ds` if it is mounted (zfs-fuse cannot rename or destroy it otherwise).
    fn unmount(&self, ds: &str) -> Result<()> {
        let mounted = zfs(&["get", "-H", "-o", "value", "mounted", ds])?;
        if mounted.trim() == "yes" {
            zfs(&["unmount", ds])?;
        }
        Ok(())
    }

    /// Unmounts and destroys a file system with its snapshots (never with clones).
    fn destroy_fs(&self, ds: &str) -> Result<()> {
        self.unmount(ds)?;
        zfs_unmounted(&["destroy", "-r", ds]).map(drop)
    }

    /// The snapshots of `ds` (short names, hidden ones included) with their creation
    /// times, oldest first; `None` if `ds` does not exist.
    fn snapshots(&self, ds: &str) -> Result<Option<Vec<(String, i64)>>> {
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
    fn dependents(&self) -> Result<HashMap<String, Vec<String>>> {
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

    fn info(&self, key: &ContainerKey, name: &str) -> Result<SnapshotInfo> {
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
    fn ensure_parent(&self, key: &ContainerKey) -> Result<()> {
        let ns = format!("{}/containers/{}", self.root, key.namespace());
        if self.exists(&ns)? {
            return Ok(());
        }
        self.create_fs(&ns, &[])
    }

    /// The `@base` snapshot of the image's copy, made on first use.
    fn image(&self, image: &ImageSource) -> Result<String> {
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
    fn clone_into(
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

    /// Makes the tree of `key` equal to its snapshot `name`, keeping every snapshot.
    fn rollback_to(&self, key: &ContainerKey, name: &str) -> Result<()> {
        let snap = self.snapshot_name(key, name)?;
        let ds = self.dataset(key)?;
        let st = self.state(&ds)?.ok_or_else(|| not_found(key, name))?;
        let snaps = self.snapshots(&ds)?.ok_or_else(|| not_found(key, name))?;
        let Some(pos) = snaps.iter().position(|s| s.0 == name) else {
            return Err(not_found(key, name));
        };
        // zfs-fuse rolls a mounted file system back under the kernel's FUSE caches:
        // entries still cached (a process's cwd, a file open a moment ago) then name
        // objects that no longer exist, and a later unmount can hang the daemon. There,
        // a mounted tree is always mirrored, through the mount.
        let native = pos + 1 == snaps.len() && !(self.fuse && st.mounted);
        let mut done = false;
        if native {
            match zfs(&["rollback", &snap]) {
                Ok(_) => done = true,
                // A snapshot was taken meanwhile: mirror instead.
                Err(Error::Command { message, .. }) if message.contains("more recent") => {}
                Err(e) => return Err(e),
            }
        }
        if done {
            // A mark left by an interrupted mirror must not outlive this rollback.
            self.clear_rollback_mark(&ds)?;
            self.mount(&ds, &st)?;
        } else {
            let live = self.mount(&ds, &st)?;
            self.mirror_rollback(&ds, &live, &snap, name, snaps[pos].1)?;
        }
        if !st.tree {
            zfs(&["inherit", TREE, &ds])?;
        }
        Ok(())
    }

    /// Rolls back by mirroring the snapshot into the live tree.
    fn mirror_rollback(
        &self,
        ds: &str,
        live: &Path,
        snap: &str,
        name: &str,
        created: i64,
    ) -> Result<()> {
        // Kernel ZFS serves the snapshot at `.zfs/snapshot/<name>` (a mount of its own).
        // Under zfs-fuse, `.zfs` would be an ordinary name the container can create.
        let served = live.join(".zfs").join("snapshot").join(name);
        let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
        let (view, clone) = if !self.fuse && served.is_dir() && dev(&served) != dev(live) {
            (served, None)
        } else {
            let clone = format!("{}/tmp/{}", self.root, work::tmp_name("view"));
            zfs(&["clone", "-o", "readonly=on", snap, &clone])?;
            match self.mountpoint(&clone) {
                Ok(p) => (p, Some(clone)),
                Err(e) => {
                    let _ = self.destroy_fs(&clone);
                    return Err(e);
                }
            }
        };
        let result = (|| {
            // From here on the live tree changes: mark it first.
            let mark = format!("{ROLLBACK}={}:{name}", std::process::id());
            zfs(&["set", &mark, ds])?;
            fault::point("zfs.rollback.marked");
            if coarse_times(live)? {
                drop_changed_since(live, created)?;
            }
            tree::mirror_with_fault(&view, live, "zfs.rollback.mid").map(drop)
        })();
        let cleaned = match &clone {
            Some(c) => self.destroy_fs(c),
            None => Ok(()),
        };
        result?;
        cleaned?;
        zfs(&["inherit", ROLLBACK, ds]).map(drop)
    }

    /// Removes a rollback mark from `ds` if it has one.
    fn clear_rollback_mark(&self, ds: &str) -> Result<()> {
        let v = zfs(&["get", "-H", "-s", "local", "-o", "value", ROLLBACK, ds])?;
        if !v.trim().is_empty() && v.trim() != "-" {
            zfs(&["inherit", ROLLBACK, ds])?;
        }
        Ok(())
    }

    /// Destroys what retired containers hold that no clone uses any more. Returns the
    /// names of what it destroyed.
    fn collect_retired(&self) -> Result<Vec<String>> {
        let retired = format!("{}/retired", self.root);
        let list = zfs(&[
            "list",
            "-H",
            "-o",
            "name",
            "-t",
            "filesystem",
            "-d",
            "1",
            "-r",
            &retired,
        ])?;
        let datasets: Vec<&str> = list.lines().filter(|l| *l != retired).collect();
        let mut removed = Vec::new();
        if datasets.is_empty() {
            return Ok(removed);
        }
        let deps = self.dependents()?;
        // Another process may collect the same datasets at the same time.
        let gone_too = |r: Result<()>| match r {
            Err(e) if is_missing(&e) => Ok(false),
            other => other.map(|()| true),
        };
        for ds in datasets {
            let mut left = 0;
            for (s, _) in self.snapshots(ds)?.unwrap_or_default() {
                let snap = format!("{ds}@{s}");
                if deps.contains_key(&snap) {
                    left += 1;
                } else if gone_too(zfs(&["destroy", &snap]).map(drop))? {
                    removed.push(snap);
                }
            }
            if left == 0 && gone_too(self.destroy_fs(ds))? {
                removed.push(ds.to_string());
            }
        }
        Ok(removed)
    }

    /// Container datasets with a local value of `property` → that value.
    fn marked(&self, property: &str) -> Result<Vec<(String, String)>> {
        let containers = format!("{}/containers", self.root);
        let out = zfs(&[
            "get",
            "-H",
            "-r",
            "-s",
            "local",
            "-o",
            "name,value",
            property,
            &containers,
        ])?;
        Ok(out
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .filter(|(ds, _)| !ds.contains('@'))
            .map(|(ds, v)| (ds.to_string(), v.to_string()))
            .collect())
    }

    /// The key of a container dataset name.
    fn key_of(&self, ds: &str) -> Option<ContainerKey> {
        let rest = ds.strip_prefix(&format!("{}/containers/", self.root))?;
        let (ns, id) = rest.split_once('/')?;
        ContainerKey::new(ns, id).ok()
    }
}

/// Whether the file system only keeps whole seconds (zfs-fuse): the root's ctime and
/// mtime have no fraction. (On a nanosecond file system this misjudges about one tree
/// in 10^18, which then only costs a slower rollback.)
fn coarse_times(p: &Path) -> Result<bool> {
    let m = std::fs::symlink_metadata(p).map_err(Error::io(format!("lstat {}", p.display())))?;
    Ok(m.ctime_nsec() == 0 && m.mtime_nsec() == 0)
}

/// Removes every non-directory below `dir` (on its file system) whose ctime is not older
/// than `since` (seconds): with whole-second timestamps, such a file may have changed
/// after a snapshot taken at `since` without its times showing it.
fn drop_changed_since(dir: &Path, since: i64) -> Result<()> {
    let dev = std::fs::symlink_metadata(dir)
        .map_err(Error::io(format!("lstat {}", dir.display())))?
        .dev();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries =
            std::fs::read_dir(&d).map_err(Error::io(format!("read dir {}", d.display())))?;
        for e in entries {
            let e = e.map_err(Error::io(format!("read dir {}", d.display())))?;
            let p = e.path();
            let m = match std::fs::symlink_metadata(&p) {
                Ok(m) => m,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(err) => return Err(Error::io(format!("lstat {}", p.display()))(err)),
            };
            if m.dev() != dev {
                continue;
            }
            if m.is_dir() {
                stack.push(p);
            } else if m.ctime() >= since {
                match std::fs::remove_file(&p) {
                    Ok(()) => {}
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                    Err(err) => return Err(Error::io(format!("remove {}", p.display()))(err)),
                }
            }
        }
    }
    Ok(())
}

/// What the first record of a `zfs send` stream says.
#[derive(Debug, PartialEq, Eq)]
struct StreamHead {
    /// The snapshot's short name.
    name: String,
    /// Whether it is incremental (needs its parent on the receiving side).
    incremental: bool,
}

/// The size of `dmu_replay_record`, whose first instance is the `DRR_BEGIN` record.
const STREAM_HEAD_LEN: usize = 312;
/// `DMU_BACKUP_MAGIC`.
const STREAM_MAGIC: u64 = 0x2_F5BA_CBAC;

/// Parses the `DRR_BEGIN` record: u32 type (0), u32 payload length, u64 magic, u64
/// version info, u64 creation time, u32 objset type, u32 flags, u64 to-guid, u64
/// from-guid (0 for a full stream), char[256] to-name (`pool/fs@snap`), in the sending
/// host's byte order (the magic tells which). This layout is the same in every ZFS.
fn parse_stream_head(b: &[u8; STREAM_HEAD_LEN]) -> Result<StreamHead> {
    let bad = |message: &str| Error::Storage {
        operation: "import",
        message: message.to_string(),
    };
    let u64_at = |off: usize, le: bool| {
        let a: [u8; 8] = b[off..off + 8].try_into().expect("8 bytes");
        if le {
            u64::from_le_bytes(a)
        } else {
            u64::from_be_bytes(a)
        }
    };
    let le = if u64_at(8, true) == STREAM_MAGIC {
        true
    } else if u64_at(8, false) == STREAM_MAGIC {
        false
    } else {
        return Err(bad("the input is not a ZFS send stream"));
    };
    let t: [u8; 4] = b[0..4].try_into().expect("4 bytes");
    let drr_type = if le {
        u32::from_le_bytes(t)
    } else {
        u32::from_be_bytes(t)
    };
    if drr_type != 0 {
        return Err(bad("the ZFS stream does not start with a BEGIN record"));
    }
    let incremental = u64_at(48, le) != 0;
    let raw = &b[56..];
    let end = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
    let toname = String::from_utf8_lossy(&raw[..end]);
    let Some((_, name)) = toname.split_once('@') else {
        return Err(bad(
            "the ZFS stream names no snapshot (a replication stream?)",
        ));
    };
    Ok(StreamHead {
        name: name.to_string(),
        incremental,
    })
}

/// Reads exactly the stream's first record.
fn read_stream_head(input: &mut dyn Read) -> Result<[u8; STREAM_HEAD_LEN]> {
    let mut b = [0u8; STREAM_HEAD_LEN];
    input.read_exact(&mut b).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::Storage {
                operation: "import",
                message: "the input is too short to be a ZFS send stream".into(),
            }
        } else {
            Error::io("read the stream to import")(e)
        }
    })?;
    Ok(b)
}

impl Store for ZfsStore {
    fn backend(&self) -> Backend {
        Backend::Zfs
    }

    fn prepare(&self, key: &ContainerKey, image: &ImageSource) -> Result<PathBuf> {
        let ds = self.dataset(key)?;
        if let Some(st) = self.state(&ds)? {
            match work::existing_tree(st.owner.as_deref(), image.owner.as_deref()) {
                Existing::Reuse if st.tree => return self.mount(&ds, &st),
                Existing::Replace => self.destroy(key)?,
                _ => return Err(already_exists(key)),
            }
        }
        let base = self.image(image)?;
        self.clone_into(&base, key, image.owner.as_deref())
    }

    fn existing(&self, key: &ContainerKey, image: &ImageSource) -> Result<Option<Existing>> {
        let ds = self.dataset(key)?;
        Ok(self.state(&ds)?.map(|st| {
            match work::existing_tree(st.owner.as_deref(), image.owner.as_deref()) {
                // Reused only with its tree (see prepare).
                Existing::Reuse if !st.tree => Existing::Conflict,
                other => other,
            }
        }))
    }

    fn rootfs(&self, key: &ContainerKey) -> Result<PathBuf> {
        let ds = self.dataset(key)?;
        match self.state(&ds)? {
            Some(st) if st.tree => self.mount(&ds, &st),
            _ => Err(Error::NoTree(key.to_string())),
        }
    }

    fn snapshot(&self, key: &ContainerKey, name: &str) -> Result<SnapshotInfo> {
        let snap = self.snapshot_name(key, name)?;
        let ds = self.dataset(key)?;
        if !self.state(&ds)?.is_some_and(|st| st.tree) {
            return Err(Error::NoTree(key.to_string()));
        }
        let taken = || Error::SnapshotExists {
            container: key.to_string(),
            name: name.to_string(),
        };
        if self.exists(&snap)? {
            return Err(taken());
        }
        match zfs(&["snapshot", &snap]) {
            Ok(_) => {}
            Err(Error::Command { message, .. }) if message.contains("exists") => {
                return Err(taken())
            }
            Err(e) => return Err(e),
        }
        self.info(key, name)
    }

    fn list(&self, key: &ContainerKey) -> Result<Vec<SnapshotInfo>> {
        let ds = self.dataset(key)?;
        Ok(self
            .snapshots(&ds)?
            .unwrap_or_default()
            .into_iter()
            .filter(|(name, _)| names::check_snapshot_name(name).is_ok())
            .map(|(name, created)| SnapshotInfo {
                name,
                created: UNIX_EPOCH + Duration::from_secs(created.max(0) as u64),
            })
            .collect())
    }

    fn rollback(&self, key: &ContainerKey, name: &str) -> Result<()> {
        self.rollback_to(key, name)
    }

    fn clone_snapshot(
        &self,
        key: &ContainerKey,
        name: &str,
        new_key: &ContainerKey,
    ) -> Result<PathBuf> {
        let snap = self.existing_snapshot(key, name)?;
        self.clone_into(&snap, new_key, None)
    }

    fn set_owner(&self, key: &ContainerKey, owner: &Path) -> Result<()> {
        let ds = self.dataset(key)?;
        let prop = format!("{OWNER}={}", owner.display());
        zfs(&["set", &prop, &ds]).map(|_| ())
    }

    fn delete_snapshot(&self, key: &ContainerKey, name: &str) -> Result<()> {
        let snap = self.existing_snapshot(key, name)?;
        if !self.dependents()?.contains_key(&snap) {
            return zfs(&["destroy", &snap]).map(drop);
        }
        // Clones use it: free the name now, let ZFS destroy it with the last clone.
        let hidden = format!(
            "{}@{DELETED}{}",
            self.dataset(key)?,
            work::tmp_name("snapshot")
        );
        zfs(&["rename", &snap, &hidden])?;
        fault::point("zfs.delete.renamed");
        zfs(&["destroy", "-d", &hidden]).map(drop)
    }

    fn destroy(&self, key: &ContainerKey) -> Result<()> {
        let ds = self.dataset(key)?;
        if let Some(snaps) = self.snapshots(&ds)? {
            let deps = self.dependents()?;
            let held = snaps
                .iter()
                .any(|(s, _)| deps.contains_key(&format!("{ds}@{s}")));
            if held {
                // Clones use some of its snapshots: move it out of the way; what the
                // clones do not use goes now, the rest with them.
                let retired = format!("{}/retired/{}", self.root, work::tmp_name("retired"));
                self.unmount(&ds)?;
                zfs_unmounted(&["rename", &ds, &retired])?;
                fault::point("zfs.destroy.retired");
                let _ = zfs(&["set", "canmount=noauto", &retired]);
            } else {
                self.destroy_fs(&ds)?;
            }
        }
        // This container may have been the last clone of a retired one's snapshot.
        self.collect_retired().map(drop)
    }

    fn space_used(&self, key: &ContainerKey) -> Result<u64> {
        let ds = self.dataset(key)?;
        if !self.state(&ds)?.is_some_and(|st| st.tree) {
            return Err(Error::NoTree(key.to_string()));
        }
        let out = zfs(&["get", "-H", "-p", "-o", "value", "referenced", &ds])?;
        out.trim().parse::<u64>().map_err(|_| Error::Storage {
            operation: "read space used",
            message: format!("{ds}: {out:?}"),
        })
    }

    fn export(
        &self,
        key: &ContainerKey,
        name: &str,
        parent: Option<&str>,
        out: &mut dyn Write,
    ) -> Result<()> {
        let snap = self.existing_snapshot(key, name)?;
        let parent = parent.map(|p| self.existing_snapshot(key, p)).transpose()?;
        let mut args = vec!["send"];
        if let Some(p) = &parent {
            args.extend(["-i", p.as_str()]);
        }
        args.push(&snap);
        let _turn = DaemonTurn::take()?;
        cmd::run_with_output("zfs", &args, out)
    }

    fn import(&self, key: &ContainerKey, input: &mut dyn Read) -> Result<SnapshotInfo> {
        let ds = self.dataset(key)?;
        let head_bytes = read_stream_head(input)?;
        let head = parse_stream_head(&head_bytes)?;
        let snap = self.snapshot_name(key, &head.name)?;
        let mut stream = (&head_bytes[..]).chain(input);
        let exists = self.exists(&ds)?;
        let refuse = |message: String| Error::Storage {
            operation: "import",
            message,
        };
        if head.incremental {
            if !exists {
                return Err(refuse(format!(
                    "{} is an incremental stream: import its parent into {key} first",
                    head.name
                )));
            }
            if self.exists(&snap)? {
                return Err(Error::SnapshotExists {
                    container: key.to_string(),
                    name: head.name,
                });
            }
            // Receiving changes the file system in place: on zfs-fuse, not under the
            // kernel's caches of a mounted tree (see `rollback_to`).
            let remount = self.fuse && self.state(&ds)?.is_some_and(|st| st.mounted);
            if remount {
                zfs(&["unmount", &ds]).map_err(|e| {
                    refuse(format!(
                        "{key}'s tree is in use, and zfs-fuse receives only into an \
                         unmounted file system ({e})"
                    ))
                })?;
            }
            let received = {
                let _turn = DaemonTurn::take()?;
                cmd::run_with_input("zfs", &["receive", &ds], &mut stream)
            };
            if remount {
                zfs(&["mount", &ds])?;
            }
            return match received {
                Ok(_) => self.info(key, &head.name),
                Err(Error::Command { command, message }) => Err(refuse(format!(
                    "{} applies only when its parent is {key}'s latest snapshot and the \
                     tree is unchanged since ({command}: {message})",
                    head.name
                ))),
                Err(e) => Err(e),
            };
        }
        if exists {
            return Err(refuse(format!(
                "{} is a full stream, which makes the container's dataset, and {key} has \
                 one (destroy it, or import into another container)",
                head.name
            )));
        }
        let work = format!("{}/tmp/{}", self.root, work::tmp_name("receive"));
        let result = (|| {
            {
                let _turn = DaemonTurn::take()?;
                cmd::run_with_input("zfs", &["receive", &work], &mut stream)?;
            }
            // It holds a snapshot; the tree is made by a rollback to it.
            zfs(&["set", &format!("{TREE}=none"), &work])?;
            fault::point("zfs.import.received");
            self.ensure_parent(key)?;
            self.unmount(&work)?;
            match zfs_unmounted(&["rename", &work, &ds]) {
                Ok(_) => {}
                Err(e) if !matches!(e, Error::PoolFull { .. }) && self.exists(&ds)? => {
                    return Err(already_exists(key))
                }
                Err(e) => return Err(e),
            }
            self.info(key, &head.name)
        })();
        if result.is_err() && self.exists(&work).unwrap_or(false) {
            let _ = self.destroy_fs(&work);
        }
        result
    }

    fn reconcile(&self) -> Result<ReconcileReport> {
        let mut report = ReconcileReport::default();
        // Work of dead processes: datasets first (their mount points go with them),
        // then plain directories (the mount points of image copies).
        let tmp = format!("{}/tmp", self.root);
        let list = zfs(&[
            "list",
            "-H",
            "-o",
            "name",
            "-t",
            "filesystem",
            "-d",
            "1",
            "-r",
            &tmp,
        ])?;
        for ds in list.lines().filter(|l| *l != tmp) {
            let short = ds.rsplit('/').next().unwrap_or(ds);
            if owner_alive(short) {
                continue;
            }
            match self.destroy_fs(ds) {
                Ok(()) => report.removed.push(ds.to_string()),
                Err(e) if is_missing(&e) => {} // another reconcile was quicker
                Err(e) => return Err(e),
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.tmp_dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if owner_alive(&name) {
                    continue;
                }
                let p = e.path();
                let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
                // Only ever an empty mount point: never remove what is in it (an image
                // layer could still be mounted there).
                match std::fs::remove_dir(&p) {
                    Ok(()) => report.removed.push(p.display().to_string()),
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                    Err(err) => return Err(Error::io(format!("remove {}", p.display()))(err)),
                }
            }
        }
        // Interrupted rollbacks.
        for (ds, value) in self.marked(ROLLBACK)? {
            let (owner, name) = match value.split_once(':') {
                Some((pid, name)) => (pid.parse::<i32>().ok(), name.to_string()),
                None => (None, value.clone()),
            };
            if owner.is_some_and(pid_alive) {
                continue; // still running
            }
            let Some(key) = self.key_of(&ds) else {
                continue;
            };
            if names::check_snapshot_name(&name).is_err()
                || !self.exists(&format!("{ds}@{name}"))?
            {
                zfs(&["inherit", ROLLBACK, &ds])?;
                report
                    .removed
                    .push(format!("rollback mark of {key} (snapshot {name} is gone)"));
                continue;
            }
            self.rollback_to(&key, &name)?;
            self.clear_rollback_mark(&ds)?;
            report
                .completed
                .push(format!("rollback of {key} to {name}"));
        }
        // Deleted snapshots whose deferred destruction was not asked for yet.
        let containers = format!("{}/containers", self.root);
        let deferred = zfs(&[
            "get",
            "-H",
            "-r",
            "-o",
            "name,value",
            "defer_destroy",
            &containers,
        ])?;
        for line in deferred.lines() {
            let Some((snap, value)) = line.split_once('\t') else {
                continue;
            };
            if snap.contains(&format!("@{DELETED}")) && value.trim() == "off" {
                zfs(&["destroy", "-d", snap])?;
                report.completed.push(format!("deletion of {snap}"));
            }
        }
        report.removed.extend(self.collect_retired()?);
        Ok(report)
    }

    fn collect(&self) -> Result<Vec<ContainerKey>> {
        let mut gone = Vec::new();
        for (ds, owner) in self.marked(OWNER)? {
            if !owner.starts_with('/') || Path::new(&owner).exists() {
                continue;
            }
            let Some(key) = self.key_of(&ds) else {
                continue;
            };
            self.destroy(&key)?;
            gone.push(key);
        }
        Ok(gone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(le: bool, fromguid: u64, toname: &str) -> [u8; STREAM_HEAD_LEN] {
        let mut b = [0u8; STREAM_HEAD_LEN];
        let put = |b: &mut [u8; STREAM_HEAD_LEN], off: usize, v: u64| {
            let bytes = if le { v.to_le_bytes() } else { v.to_be_bytes() };
            b[off..off + 8].copy_from_slice(&bytes);
        };
        put(&mut b, 8, STREAM_MAGIC);
        put(&mut b, 48, fromguid);
        b[56..56 + toname.len()].copy_from_slice(toname.as_bytes());
        b
    }

    #[test]
    fn test_stream_head_gives_name_and_kind_in_both_byte_orders() {
        for le in [true, false] {
            let full = parse_stream_head(&head(le, 0, "p/c/a@turn-1")).unwrap();
            assert_eq!(
                full,
                StreamHead {
                    name: "turn-1".into(),
                    incremental: false
                }
            );
            assert!(
                parse_stream_head(&head(le, 7, "p/a@t2"))
                    .unwrap()
                    .incremental
            );
        }
    }

    #[test]
    fn test_garbage_is_not_a_stream() {
        let e = parse_stream_head(&[7u8; STREAM_HEAD_LEN]).unwrap_err();
        assert!(e.to_string().contains("not a ZFS send stream"), "{e}");
        let e = parse_stream_head(&head(true, 0, "p/fs")).unwrap_err();
        assert!(e.to_string().contains("names no snapshot"), "{e}");
    }
}
