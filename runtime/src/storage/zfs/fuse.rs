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
//!   "busy" is retried for up to 5 s ([`zfs_unmounted`]).
//! - no `.zfs` directory: snapshots are read through a temporary clone.
//! - timestamps have whole seconds only, so [`tree::mirror`]'s "same inode, ctime,
//!   mtime and size: unchanged" test misses a file changed in the second its snapshot
//!   was taken: before mirroring, files whose ctime is not older than the snapshot are
//!   removed from the live tree (the mirror copies them again: [`drop_changed_since`]).
//! - `zfs list -p` is missing (numbers come from `zfs get -Hp`), as are the `clones`,
//!   `createtxg` and `written` properties (clones are found by their `origin`; `zfs get
//!   -r` lists snapshots in creation order).
//! - extended attributes need the daemon started with `--enable-xattr`.
//! - the daemon can deadlock when many commands reach it at once: `zfs` commands take
//!   turns ([`DaemonTurn`]).
//!
//! [`tree::mirror`]: crate::storage::tree::mirror

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use super::datasets::zfs;
use crate::{Error, Result};

/// `statfs` type of FUSE file systems: zfs-fuse's mounts.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// Whether the file system mounted at `at` is served through FUSE (zfs-fuse).
pub(super) fn served_by_fuse(at: &Path) -> Result<bool> {
    Ok(nix::sys::statfs::statfs(at)
        .map_err(Error::sys(format!("statfs {}", at.display())))?
        .filesystem_type()
        .0
        == FUSE_SUPER_MAGIC)
}

/// zfs-fuse, the user-space daemon, can deadlock when many commands reach it at once
/// (measured here: two runs of fifty concurrent containers hung it, and every later
/// `zfs` command with it). So where ZFS is that daemon, the `zfs` commands of every
/// process on the host take turns, through an exclusive `flock` on one file. Kernel
/// OpenZFS (`/sys/module/zfs`) needs no turns.
pub(super) struct DaemonTurn(#[allow(dead_code)] Option<std::fs::File>);

impl DaemonTurn {
    pub(super) fn take() -> Result<DaemonTurn> {
        if Path::new("/sys/module/zfs").exists() {
            return Ok(DaemonTurn(None));
        }
        let path = Path::new("/run/crab-zfs-fuse.lock");
        let f = crate::file_lock::lock(path, crate::file_lock::LockMode::Exclusive)?
            .expect("a blocking lock is always taken");
        Ok(DaemonTurn(Some(f)))
    }
}

/// Runs a `zfs rename` or `zfs destroy` of an unmounted dataset. zfs-fuse answers
/// "dataset is busy" for a moment after an unmount, while the kernel still sends it the
/// releases of files that were open: this waits that out (up to 5 s).
pub(super) fn zfs_unmounted(args: &[&str]) -> Result<String> {
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

/// Whether the file system only keeps whole seconds (zfs-fuse): the root's ctime and
/// mtime have no fraction. (On a nanosecond file system this misjudges about one tree
/// in 10^18, which then only costs a slower rollback.)
pub(super) fn coarse_times(p: &Path) -> Result<bool> {
    let m = std::fs::symlink_metadata(p).map_err(Error::io(format!("lstat {}", p.display())))?;
    Ok(m.ctime_nsec() == 0 && m.mtime_nsec() == 0)
}

/// Removes every non-directory below `dir` (on its file system) whose ctime is not older
/// than `since` (seconds): with whole-second timestamps, such a file may have changed
/// after a snapshot taken at `since` without its times showing it.
pub(super) fn drop_changed_since(dir: &Path, since: i64) -> Result<()> {
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
