//! The ZFS store: datasets, snapshots and clones in a ZFS pool, driven by the standard
//! `zfs` command (kernel OpenZFS in production, zfs-fuse where the kernel has no ZFS).
//!
//! ```text
//! <root>/images/<key>@base               read-only copy of an image (never mounted)
//! <root>/containers/<ns>/<id>            the container's writable tree (its rootfs): a
//!                                        clone of an image's @base, of a snapshot, or
//!                                        a received stream
//! <root>/containers/<ns>/<id>@<name>     its snapshots
//! <root>/containers/<ns>/<id>@.deleted.* deleted snapshots that clones still use;
//!                                        ZFS destroys them with their last clone
//! <root>/tmp/<pid>.<n>.<what>            in-flight work of process <pid> (datasets,
//!                                        and plain directories used as mount points)
//! <root>/retired/<pid>.<n>               destroyed containers whose snapshots clones
//!                                        still use; removed once the clones are gone
//! crab:rollback=<pid>:<name>             property of a container: a rollback to
//!                                        snapshot <name> runs (or was interrupted)
//! ```
//!
//! `<root>` is the dataset the configuration names (`[storage] pool`, e.g. `crab/crab`);
//! it must have a mount point, and every dataset below inherits its mount point from it.
//! `images/`, `containers/`, `tmp/` and `retired/` are made with `atime=off`, so that
//! reading a tree does not count as changing it (an incremental `zfs receive` refuses a
//! tree changed since its last snapshot).
//!
//! Rollback keeps every snapshot (never `zfs rollback -r`). To the latest snapshot it is
//! the native `zfs rollback`, atomic and online: open files and working directories see
//! the snapshot's content. To an older snapshot it mirrors the snapshot into the live
//! tree in place ([`tree::mirror`]) from a readable view of it: `.zfs/snapshot/<name>`
//! where ZFS serves it (kernel OpenZFS), otherwise a temporary read-only clone. The
//! `crab:rollback` property marks the mirror (a `zfs set` is durable when it returns);
//! [`Store::reconcile`] redoes marked rollbacks.
//!
//! Clones hold their origin snapshot: ZFS cannot destroy a snapshot that a clone (a
//! container made by [`Store::clone_snapshot`]) still uses. `delete_snapshot` of such a
//! snapshot renames it to a hidden `.deleted.*` name (freeing the name, removing it from
//! [`Store::list`]) and marks it for deferred destruction (`zfs destroy -d`): ZFS
//! destroys it when the last clone goes. `destroy` of such a container renames it under
//! `retired/` (freeing the key at once) and destroys what no clone uses; the rest goes
//! when the clones go (`destroy` and `reconcile` collect it). No operation promotes a
//! clone: `zfs promote` would move the origin's snapshots into the clone's list.
//!
//! Import: a full stream is received under a temporary name and renamed into place, so
//! the container's name never holds a half-received tree; it makes the container's tree
//! (equal to the received snapshot), so the container must have none. An incremental
//! stream is received into the container's dataset (ZFS makes the new snapshot appear
//! atomically); it needs the parent to be the container's latest snapshot and the tree
//! unchanged since. The stream's first record is read before `zfs receive` runs, to
//! give clear errors (and because zfs-fuse receives an incremental stream aimed at a
//! dataset that does not exist into the stream's source dataset, if that is in the
//! pool).
//!
//! zfs-fuse differences handled here (all with standard commands):
//! - `zfs rename` / `zfs destroy` of a mounted dataset fail with "dataset is busy": the
//!   command unmounts, but the daemon still holds the mount. Datasets are unmounted
//!   with `zfs unmount` first (harmless on kernel ZFS).
//! - no `.zfs` directory: older snapshots are read through a temporary clone.
//! - timestamps have whole-second resolution, which [`tree::mirror`]'s "same inode,
//!   ctime, mtime, size: unchanged" test cannot rely on for files changed in the second
//!   the snapshot was taken: before mirroring, files whose ctime is not older than the
//!   snapshot are removed from the live tree, so the mirror copies them again.
//! - `zfs list -p` is missing (numbers come from `zfs get -Hp`), as are the `clones`
//!   and `createtxg` properties (dependent clones come from `origin`; `zfs get -r` lists
//!   snapshots in creation order).
//! - `zfs rollback` drops the host's page cache (`/proc/sys/vm/drop_caches`) so that the
//!   kernel's FUSE caches forget the old content: 0.1 to 1 s depending on the host.
//! - extended attributes need the daemon started with `--enable-xattr`.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{cmd, names, tree, ContainerKey, ImageSource, ReconcileReport, SnapshotInfo, Store};
use crate::config::Backend;
use crate::{Error, Result};

/// Longest dataset or snapshot name ZFS accepts.
const MAX_NAME: usize = 255;
/// The property that marks a running rollback.
const ROLLBACK_PROPERTY: &str = "crab:rollback";
/// Prefix of deleted snapshots that clones still depend on.
const DELETED: &str = ".deleted.";
/// The snapshot of an image that containers are cloned from.
const BASE: &str = "base";

/// A ZFS pool (more precisely: a dataset in one, holding everything Crab stores).
#[derive(Debug)]
pub struct ZfsStore {
    root: String,
    pool: String,
    /// Where `<root>/tmp` is mounted.
    tmp_dir: PathBuf,
}

static NONCE: AtomicU64 = AtomicU64::new(0);

fn zfs(args: &[&str]) -> Result<String> {
    cmd::run("zfs", args)
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

fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The owner of a `<pid>.<n>.<what>` name, if it is still running.
fn owner_alive(name: &str) -> bool {
    name.split('.')
        .next()
        .and_then(|p| p.parse::<i32>().ok())
        .is_some_and(pid_alive)
}

fn unique() -> String {
    format!(
        "{}.{}",
        std::process::id(),
        NONCE.fetch_add(1, Ordering::Relaxed)
    )
}

impl ZfsStore {
    /// Opens the store in dataset `root` (e.g. `crab/crab`), which must exist and have
    /// a mount point, and makes its top-level datasets if they are missing.
    pub fn open(root: &str) -> Result<ZfsStore> {
        let bad = |message: String| Error::Storage {
            operation: "open zfs pool",
            message,
        };
        if root.is_empty() || root.starts_with('/') || root.contains('@') || root.ends_with('/')
        {
            return Err(bad(format!(
                "{root:?} is not a ZFS dataset name (like \"crab/crab\")"
            )));
        }
        check_len(root)?;
        let pool = root.split('/').next().unwrap_or(root).to_string();
        match zfs(&["get", "-H", "-o", "value", "type", root]) {
            Ok(t) if t.trim() == "filesystem" => {}
            Ok(t) => return Err(bad(format!("{root} is a {}, not a file system", t.trim()))),
            Err(e) if is_missing(&e) => {
                return Err(bad(format!(
                    "dataset {root} does not exist (is the pool imported?)"
                )))
            }
            Err(e) => return Err(e),
        }
        let mut store = ZfsStore {
            root: root.to_string(),
            pool,
            tmp_dir: PathBuf::new(),
        };
        store.mountpoint(root)?;
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

    /// Creates a file system; one that another process created meanwhile is fine.
    fn create_fs(&self, ds: &str, options: &[&str]) -> Result<()> {
        let mut args = vec!["create"];
        args.extend_from_slice(options);
        args.push(ds);
        match zfs(&args) {
            Ok(_) => Ok(()),
            Err(e) if self.exists(ds)? => {
                let _ = e;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn live(&self, key: &ContainerKey) -> Result<String> {
        let ds = format!("{}/containers/{}/{}", self.root, key.namespace(), key.id());
        check_len(&ds)?;
        Ok(ds)
    }

    fn snapshot_name(&self, key: &ContainerKey, name: &str) -> Result<String> {
        names::check_snapshot_name(name)?;
        let snap = format!("{}@{name}", self.live(key)?);
        check_len(&snap)?;
        Ok(snap)
    }

    fn not_found(key: &ContainerKey, name: &str) -> Error {
        Error::SnapshotNotFound {
            container: key.to_string(),
            name: name.to_string(),
        }
    }

    /// The full name of an existing snapshot.
    fn existing_snapshot(&self, key: &ContainerKey, name: &str) -> Result<String> {
        let snap = self.snapshot_name(key, name)?;
        if !self.exists(&snap)? {
            return Err(Self::not_found(key, name));
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

    /// Where `ds` is mounted; mounts it if it is not.
    fn mountpoint(&self, ds: &str) -> Result<PathBuf> {
        let out = zfs(&["get", "-H", "-o", "property,value", "mountpoint,mounted", ds])?;
        let mut mountpoint = None;
        let mut mounted = false;
        for line in out.lines() {
            match line.split_once('\t') {
                Some(("mountpoint", v)) => mountpoint = Some(v.to_string()),
                Some(("mounted", v)) => mounted = v == "yes",
                _ => {}
            }
        }
        let mountpoint = match mountpoint {
            Some(m) if m.starts_with('/') => PathBuf::from(m),
            other => {
                return Err(Error::Storage {
                    operation: "find a dataset's mount point",
                    message: format!(
                        "{ds} has mount point {}: it needs a path (set one on {})",
                        other.as_deref().unwrap_or("-"),
                        self.root
                    ),
                })
            }
        };
        if !mounted {
            zfs(&["mount", ds])?;
        }
        Ok(mountpoint)
    }

    /// Unmounts `ds` if it is mounted (zfs-fuse cannot rename or destroy it otherwise).
    fn unmount(&self, ds: &str) -> Result<()> {
        let mounted = zfs(&["get", "-H", "-o", "value", "mounted", ds])?;
        if mounted.trim() == "yes" {
            zfs(&["unmount", ds])?;
        }
        Ok(())
    }

    /// Unmounts and destroys a file system with its snapshots (never its clones).
    fn destroy_fs(&self, ds: &str) -> Result<()> {
        self.unmount(ds)?;
        zfs(&["destroy", "-r", ds]).map(drop)
    }

    /// The snapshots of `ds` (short names, hidden ones included) with their creation
    /// times, oldest first; `None` if `ds` does not exist.
    fn snapshots(&self, ds: &str) -> Result<Option<Vec<(String, i64)>>> {
        let out = match zfs(&[
            "get", "-H", "-p", "-r", "-d", "1", "-o", "name,value", "creation", ds,
        ]) {
            Ok(out) => out,
            Err(e) if is_missing(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let prefix = format!("{ds}@");
        let mut snaps = Vec::new();
        for line in out.lines() {
            let Some((name, value)) = line.split_once('\t') else { continue };
            let Some(short) = name.strip_prefix(&prefix) else { continue };
            let created = value.trim().parse::<i64>().map_err(|_| Error::Storage {
                operation: "list snapshots",
                message: format!("creation time of {name} is {value:?}"),
            })?;
            snaps.push((short.to_string(), created));
        }
        // `zfs get -r` lists snapshots in creation order; the stable sort only guards.
        snaps.sort_by_key(|s| s.1);
        Ok(Some(snaps))
    }

    /// Snapshots that clones depend on → those clones (in the whole pool).
    fn dependents(&self) -> Result<HashMap<String, Vec<String>>> {
        let out = zfs(&[
            "list", "-H", "-o", "name,origin", "-t", "filesystem", "-r", &self.pool,
        ])?;
        let mut deps: HashMap<String, Vec<String>> = HashMap::new();
        for line in out.lines() {
            if let Some((name, origin)) = line.split_once('\t') {
                if origin != "-" {
                    deps.entry(origin.to_string()).or_default().push(name.to_string());
                }
            }
        }
        Ok(deps)
    }

    fn info(&self, key: &ContainerKey, name: &str) -> Result<SnapshotInfo> {
        let snap = self.snapshot_name(key, name)?;
        let created = match zfs(&["get", "-H", "-p", "-o", "value", "creation", &snap]) {
            Ok(v) => v,
            Err(e) if is_missing(&e) => return Err(Self::not_found(key, name)),
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
        let work = format!("{}/tmp/{}.image-{}", self.root, unique(), image.key);
        let mnt = self.tmp_dir.join(format!("{}.mnt", unique()));
        std::fs::create_dir_all(&mnt).map_err(Error::io(format!("create {}", mnt.display())))?;
        let result = (|| {
            // Never mounted again once copied: containers are clones of @base.
            zfs(&["create", "-o", "canmount=noauto", &work])?;
            let tree_dir = self.mountpoint(&work)?;
            {
                let _mounted = image.mount_readonly(&mnt)?;
                tree::copy(&mnt, &tree_dir)?;
            }
            zfs(&["snapshot", &format!("{work}@{BASE}")])?;
            self.unmount(&work)?;
            match zfs(&["rename", &work, &dst]) {
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

    /// Clones `origin` as container `key`'s tree and returns where it is mounted.
    fn clone_into(&self, origin: &str, key: &ContainerKey) -> Result<PathBuf> {
        let ds = self.live(key)?;
        let exists = || Error::AlreadyExists(format!("{key} (its tree in the store)"));
        if self.exists(&ds)? {
            return Err(exists());
        }
        self.ensure_parent(key)?;
        match zfs(&["clone", origin, &ds]) {
            Ok(_) => {}
            Err(e) if !matches!(e, Error::PoolFull { .. }) && self.exists(&ds)? => {
                return Err(exists())
            }
            Err(e) => return Err(e),
        }
        self.mountpoint(&ds)
    }

    /// Makes the tree of `key` equal to its snapshot `name`, keeping every snapshot.
    fn rollback_to(&self, key: &ContainerKey, name: &str) -> Result<()> {
        let snap = self.snapshot_name(key, name)?;
        let ds = self.live(key)?;
        let snaps = self
            .snapshots(&ds)?
            .ok_or_else(|| Self::not_found(key, name))?;
        let Some(pos) = snaps.iter().position(|s| s.0 == name) else {
            return Err(Self::not_found(key, name));
        };
        if pos + 1 == snaps.len() {
            match zfs(&["rollback", &snap]) {
                Ok(_) => return Ok(()),
                // A snapshot was taken meanwhile: mirror instead.
                Err(Error::Command { message, .. }) if message.contains("more recent") => {}
                Err(e) => return Err(e),
            }
        }
        self.mirror_rollback(&ds, &snap, name, snaps[pos].1)
    }

    /// Rolls back to an older snapshot by mirroring it into the live tree.
    fn mirror_rollback(&self, ds: &str, snap: &str, name: &str, created: i64) -> Result<()> {
        let live = self.mountpoint(ds)?;
        let marker = format!("{ROLLBACK_PROPERTY}={}:{name}", std::process::id());
        zfs(&["set", &marker, ds])?;
        let served = live.join(".zfs").join("snapshot").join(name);
        let (view, clone) = if served.is_dir() {
            (served, None)
        } else {
            let clone = format!("{}/tmp/{}.view", self.root, unique());
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
            if coarse_times(&live)? {
                drop_changed_since(&live, created)?;
            }
            tree::mirror(&view, &live).map(drop)
        })();
        let cleaned = match &clone {
            Some(c) => self.destroy_fs(c),
            None => Ok(()),
        };
        result?;
        cleaned?;
        zfs(&["inherit", ROLLBACK_PROPERTY, ds]).map(drop)
    }

    /// Destroys what retired containers hold that no clone uses any more. Returns the
    /// names of what it destroyed.
    fn collect_retired(&self) -> Result<Vec<String>> {
        let retired = format!("{}/retired", self.root);
        let list = zfs(&["list", "-H", "-o", "name", "-t", "filesystem", "-d", "1", "-r", &retired])?;
        let datasets: Vec<&str> = list.lines().filter(|l| *l != retired).collect();
        let mut removed = Vec::new();
        if datasets.is_empty() {
            return Ok(removed);
        }
        let deps = self.dependents()?;
        for ds in datasets {
            let mut left = 0;
            for (s, _) in self.snapshots(ds)?.unwrap_or_default() {
                let snap = format!("{ds}@{s}");
                if deps.contains_key(&snap) {
                    left += 1;
                } else {
                    zfs(&["destroy", &snap])?;
                    removed.push(snap);
                }
            }
            if left == 0 {
                self.destroy_fs(ds)?;
                removed.push(ds.to_string());
            }
        }
        Ok(removed)
    }
}

/// Whether the file system only keeps whole seconds (zfs-fuse): its root's ctime and
/// mtime have no fraction. (On a nanosecond file system this misjudges one in 10^18
/// trees, which then only costs a slower mirror.)
fn coarse_times(p: &Path) -> Result<bool> {
    let m = std::fs::symlink_metadata(p).map_err(Error::io(format!("lstat {}", p.display())))?;
    Ok(m.ctime_nsec() == 0 && m.mtime_nsec() == 0)
}

/// Removes every non-directory below `dir` (on its file system) whose ctime is not
/// older than `since` (seconds): with whole-second timestamps, such a file may have
/// changed after a snapshot taken at `since` without its times showing it.
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
const STREAM_MAGIC: u64 = 0x2F5B_ACBAC;

/// Parses the `DRR_BEGIN` record: u32 type (0), u32 payload length, u64 magic, u64
/// version info, u64 creation time, u32 objset type, u32 flags, u64 to-guid, u64
/// from-guid (0 for a full stream), char[256] to-name (`pool/fs@snap`), in the sending
/// host's byte order (the magic tells which).
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
    let drr_type = if le {
        u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"))
    } else {
        u32::from_be_bytes(b[0..4].try_into().expect("4 bytes"))
    };
    if drr_type != 0 {
        return Err(bad("the ZFS stream does not start with a BEGIN record"));
    }
    let incremental = u64_at(48, le) != 0;
    let raw = &b[56..];
    let end = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
    let toname = String::from_utf8_lossy(&raw[..end]);
    let Some((_, name)) = toname.split_once('@') else {
        return Err(bad("the ZFS stream names no snapshot (a replication stream?)"));
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

/// Adds what an error means for an import, keeping pool-full errors as they are.
fn import_error(e: Error, hint: String) -> Error {
    match e {
        Error::Command { command, message } => Error::Storage {
            operation: "import",
            message: format!("{hint} ({command}: {message})"),
        },
        other => other,
    }
}

impl Store for ZfsStore {
    fn backend(&self) -> Backend {
        Backend::Zfs
    }

    fn prepare(&self, key: &ContainerKey, image: &ImageSource) -> Result<PathBuf> {
        let ds = self.live(key)?;
        if self.exists(&ds)? {
            return Err(Error::AlreadyExists(format!("{key} (its tree in the store)")));
        }
        let base = self.image(image)?;
        self.clone_into(&base, key)
    }

    fn rootfs(&self, key: &ContainerKey) -> Result<PathBuf> {
        let ds = self.live(key)?;
        if !self.exists(&ds)? {
            return Err(Error::NoTree(key.to_string()));
        }
        self.mountpoint(&ds)
    }

    fn snapshot(&self, key: &ContainerKey, name: &str) -> Result<SnapshotInfo> {
        let snap = self.snapshot_name(key, name)?;
        let ds = self.live(key)?;
        if !self.exists(&ds)? {
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
            Err(Error::Command { message, .. }) if message.contains("already exists") => {
                return Err(taken())
            }
            Err(e) => return Err(e),
        }
        self.info(key, name)
    }

    fn list(&self, key: &ContainerKey) -> Result<Vec<SnapshotInfo>> {
        let ds = self.live(key)?;
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
        self.clone_into(&snap, new_key)
    }

    fn delete_snapshot(&self, key: &ContainerKey, name: &str) -> Result<()> {
        let snap = self.existing_snapshot(key, name)?;
        if !self.dependents()?.contains_key(&snap) {
            return zfs(&["destroy", &snap]).map(drop);
        }
        // Clones use it: free the name now, let ZFS destroy it with the last clone.
        let hidden = format!("{}@{DELETED}{}", self.live(key)?, unique());
        zfs(&["rename", &snap, &hidden])?;
        zfs(&["destroy", "-d", &hidden]).map(drop)
    }

    fn destroy(&self, key: &ContainerKey) -> Result<()> {
        let ds = self.live(key)?;
        if let Some(snaps) = self.snapshots(&ds)? {
            let deps = self.dependents()?;
            let held = snaps
                .iter()
                .any(|(s, _)| deps.contains_key(&format!("{ds}@{s}")));
            if held {
                // Clones use some of its snapshots: move it out of the way; what the
                // clones do not use goes now, the rest with them.
                let retired = format!("{}/retired/{}", self.root, unique());
                self.unmount(&ds)?;
                zfs(&["rename", &ds, &retired])?;
                let _ = zfs(&["set", "canmount=noauto", &retired]);
            } else {
                self.destroy_fs(&ds)?;
            }
        }
        // This container may have been the last clone of a retired one's snapshot.
        self.collect_retired().map(drop)
    }

    fn space_used(&self, key: &ContainerKey) -> Result<u64> {
        let ds = self.live(key)?;
        let out = match zfs(&["get", "-H", "-p", "-o", "value", "used", &ds]) {
            Ok(out) => out,
            Err(e) if is_missing(&e) => return Err(Error::NoTree(key.to_string())),
            Err(e) => return Err(e),
        };
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
        let parent = parent
            .map(|p| self.existing_snapshot(key, p))
            .transpose()?;
        let mut args = vec!["send"];
        if let Some(p) = &parent {
            args.extend(["-i", p.as_str()]);
        }
        args.push(&snap);
        cmd::run_with_output("zfs", &args, out)
    }

    fn import(&self, key: &ContainerKey, input: &mut dyn Read) -> Result<SnapshotInfo> {
        let ds = self.live(key)?;
        let head_bytes = read_stream_head(input)?;
        let head = parse_stream_head(&head_bytes)?;
        let snap = self.snapshot_name(key, &head.name)?;
        let mut stream = (&head_bytes[..]).chain(input);
        let exists = self.exists(&ds)?;
        if head.incremental {
            if !exists {
                return Err(Error::Storage {
                    operation: "import",
                    message: format!(
                        "{} is an incremental stream: import its parent into {key} first",
                        head.name
                    ),
                });
            }
            if self.exists(&snap)? {
                return Err(Error::SnapshotExists {
                    container: key.to_string(),
                    name: head.name,
                });
            }
            cmd::run_with_input("zfs", &["receive", &ds], &mut stream).map_err(|e| {
                import_error(
                    e,
                    format!(
                        "{} applies only to {key}'s latest snapshot being its parent, and \
                         to a tree unchanged since",
                        head.name
                    ),
                )
            })?;
            return self.info(key, &head.name);
        }
        if exists {
            return Err(Error::Storage {
                operation: "import",
                message: format!(
                    "{} is a full stream, which makes the container's tree: {key} has one \
                     already (destroy it, or import into a new container)",
                    head.name
                ),
            });
        }
        let work = format!("{}/tmp/{}.receive", self.root, unique());
        let result = (|| {
            cmd::run_with_input("zfs", &["receive", &work], &mut stream)?;
            self.ensure_parent(key)?;
            self.unmount(&work)?;
            match zfs(&["rename", &work, &ds]) {
                Ok(_) => {}
                Err(e) if !matches!(e, Error::PoolFull { .. }) && self.exists(&ds)? => {
                    return Err(Error::AlreadyExists(format!("{key} (its tree in the store)")))
                }
                Err(e) => return Err(e),
            }
            self.mountpoint(&ds)?;
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
        // then plain directories (mount points of image copies).
        let tmp = format!("{}/tmp", self.root);
        let list = zfs(&["list", "-H", "-o", "name", "-t", "filesystem", "-d", "1", "-r", &tmp])?;
        for ds in list.lines().filter(|l| *l != tmp) {
            let short = ds.rsplit('/').next().unwrap_or(ds);
            if owner_alive(short) {
                continue;
            }
            self.destroy_fs(ds)?;
            report.removed.push(ds.to_string());
        }
        if let Ok(entries) = std::fs::read_dir(&self.tmp_dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if owner_alive(&name) {
                    continue;
                }
                let p = e.path();
                let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
                // Only ever an empty mount point: never remove a directory's content
                // (it could be an image layer still mounted there).
                match std::fs::remove_dir(&p) {
                    Ok(()) => report.removed.push(p.display().to_string()),
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                    Err(err) => return Err(Error::io(format!("remove {}", p.display()))(err)),
                }
            }
        }
        // Interrupted rollbacks.
        let containers = format!("{}/containers/", self.root);
        let marked = zfs(&[
            "get", "-H", "-r", "-s", "local", "-o", "name,value", ROLLBACK_PROPERTY,
            containers.trim_end_matches('/'),
        ])?;
        for line in marked.lines() {
            let Some((ds, value)) = line.split_once('\t') else { continue };
            if ds.contains('@') {
                continue;
            }
            let (owner, name) = match value.split_once(':') {
                Some((pid, name)) => (pid.parse::<i32>().ok(), name),
                None => (None, value),
            };
            if owner.is_some_and(pid_alive) {
                continue; // still running
            }
            let Some((ns, id)) = ds
                .strip_prefix(&containers)
                .and_then(|rest| rest.split_once('/'))
            else {
                continue;
            };
            let key = ContainerKey::new(ns, id)?;
            let snap = format!("{ds}@{name}");
            if names::check_snapshot_name(name).is_err() || !self.exists(&snap)? {
                zfs(&["inherit", ROLLBACK_PROPERTY, ds])?;
                report
                    .removed
                    .push(format!("rollback mark of {key} (snapshot {name} is gone)"));
                continue;
            }
            self.rollback_to(&key, name)?;
            zfs(&["inherit", ROLLBACK_PROPERTY, ds])?;
            report.completed.push(format!("rollback of {key} to {name}"));
        }
        // Deleted snapshots whose deferred destruction was not yet asked for.
        let deferred = zfs(&[
            "get", "-H", "-r", "-o", "name,value", "defer_destroy",
            containers.trim_end_matches('/'),
        ])?;
        for line in deferred.lines() {
            let Some((snap, value)) = line.split_once('\t') else { continue };
            if snap.contains(&format!("@{DELETED}")) && value.trim() == "off" {
                zfs(&["destroy", "-d", snap])?;
                if !self.exists(snap)? {
                    report.removed.push(snap.to_string());
                }
            }
        }
        report.removed.extend(self.collect_retired()?);
        Ok(report)
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
            assert!(parse_stream_head(&head(le, 7, "p/a@t2")).unwrap().incremental);
        }
    }

    #[test]
    fn test_garbage_is_not_a_stream() {
        let e = parse_stream_head(&[7u8; STREAM_HEAD_LEN]).unwrap_err();
        assert!(e.to_string().contains("not a ZFS send stream"), "{e}");
        let e = parse_stream_head(&head(true, 0, "p/fs")).unwrap_err();
        assert!(e.to_string().contains("names no snapshot"), "{e}");
    }

    #[test]
    fn test_owner_of_work_names() {
        assert!(owner_alive(&format!("{}.3.view", std::process::id())));
        assert!(!owner_alive("x.3.view"));
    }
}
