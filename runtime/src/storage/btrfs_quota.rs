//! Byte quotas of the btrfs pool: btrfs *simple quotas* (kernel 6.7 and later).
//!
//! With simple quotas every data extent belongs to the subvolume that wrote it, for
//! as long as anything (the tree, a snapshot, a fork's tree) still references it. A
//! limit on a container tree's level-0 qgroup therefore bounds everything the
//! container wrote that the pool still holds: its live files and whatever its
//! checkpoints' snapshots pin. Snapshots write nothing, so they own nothing, and a
//! rollback mirrors the snapshot into the same tree, which keeps its qgroup. A write
//! past the limit fails in the container with `EDQUOT` ("Disk quota exceeded"), and
//! the pool's other containers keep their space.
//!
//! Full (non-simple) qgroups are left as they are when an operator enabled them; their
//! limits then count what the tree references, and snapshots are not charged.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::btrfs_ioctl;
use crate::{Error, Result};

const BTRFS_IOCTL_MAGIC: u8 = 0x94;
/// `BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA`.
const ENABLE_SIMPLE_QUOTA: u64 = 4;
/// `BTRFS_QGROUP_LIMIT_MAX_RFER` (with simple quotas referenced and exclusive are
/// the same figure, what the subvolume owns).
const LIMIT_MAX_RFER: u64 = 1;
/// The limit value that clears a limit.
const CLEAR: u64 = u64::MAX;

#[repr(C)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

#[repr(C)]
#[derive(Default)]
struct QgroupLimit {
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    lim: QgroupLimit,
}

#[repr(C)]
struct FsInfoArgs {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; 16],
    rest: [u8; 992],
}

nix::ioctl_readwrite!(quota_ctl, BTRFS_IOCTL_MAGIC, 40, QuotaCtlArgs);
nix::ioctl_read!(qgroup_limit, BTRFS_IOCTL_MAGIC, 43, QgroupLimitArgs);
nix::ioctl_read!(fs_info, BTRFS_IOCTL_MAGIC, 31, FsInfoArgs);

fn open(p: &Path) -> Result<File> {
    File::open(p).map_err(Error::io(format!("open {}", p.display())))
}

/// The pool's directory in sysfs, `/sys/fs/btrfs/<fsid>`.
fn sysfs_dir(pool: &Path) -> Result<PathBuf> {
    let dir = open(pool)?;
    // SAFETY: FsInfoArgs is plain old data; all-zero is a valid value.
    let mut args: FsInfoArgs = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes an FsInfoArgs (its size, 1024, is encoded in the
    // request number) into our local.
    unsafe { fs_info(dir.as_raw_fd(), &mut args) }.map_err(Error::sys(format!(
        "file system info of {}",
        pool.display()
    )))?;
    let hex: String = args.fsid.iter().map(|b| format!("{b:02x}")).collect();
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    );
    Ok(Path::new("/sys/fs/btrfs").join(uuid))
}

/// The pool's quota mode: `None` when quotas are off, else `qgroup` or `squota`.
pub fn mode(pool: &Path) -> Result<Option<String>> {
    let file = sysfs_dir(pool)?.join("qgroups/mode");
    match std::fs::read_to_string(&file) {
        Ok(m) => Ok(Some(m.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("read {}", file.display()))(e)),
    }
}

/// Turns simple quotas on for the pool unless quotas are on already.
pub fn ensure_enabled(pool: &Path) -> Result<()> {
    if mode(pool)?.is_some() {
        return Ok(());
    }
    let dir = open(pool)?;
    let mut args = QuotaCtlArgs {
        cmd: ENABLE_SIMPLE_QUOTA,
        status: 0,
    };
    // SAFETY: `args` is a valid QuotaCtlArgs that outlives the call.
    unsafe { quota_ctl(dir.as_raw_fd(), &mut args) }.map_err(|e| Error::Storage {
        operation: "enable btrfs simple quotas",
        message: format!(
            "{}: {e} (a pool byte quota needs btrfs simple quotas, kernel 6.7 or later; \
             set quota.sandbox_pool_bytes = \"none\" to run without)",
            pool.display()
        ),
    })?;
    tracing::info!(pool = %pool.display(), "btrfs simple quotas enabled");
    Ok(())
}

/// Limits what subvolume `tree` may own to `bytes` (`None`: no limit).
pub fn limit(tree: &Path, bytes: Option<u64>) -> Result<()> {
    let id = btrfs_ioctl::subvolume_id(tree)?;
    let dir = open(tree)?;
    let mut args = QgroupLimitArgs {
        qgroupid: id,
        lim: QgroupLimit {
            flags: LIMIT_MAX_RFER,
            max_rfer: bytes.unwrap_or(CLEAR),
            ..Default::default()
        },
    };
    // SAFETY: `args` is a valid QgroupLimitArgs that outlives the call; the kernel
    // reads it (the request number says "read" for historical reasons).
    unsafe { qgroup_limit(dir.as_raw_fd(), &mut args) }
        .map(drop)
        .map_err(Error::sys(format!(
            "limit qgroup 0/{id} of {}",
            tree.display()
        )))
}

/// What subvolume `tree` owns, and its limit, as the kernel accounts them.
pub fn usage(pool: &Path, tree: &Path) -> Result<(u64, Option<u64>)> {
    let id = btrfs_ioctl::subvolume_id(tree)?;
    let dir = sysfs_dir(pool)?.join(format!("qgroups/0_{id}"));
    let read = |name: &str| -> Result<u64> {
        let f = dir.join(name);
        let text =
            std::fs::read_to_string(&f).map_err(Error::io(format!("read {}", f.display())))?;
        text.trim().parse().map_err(|_| Error::Storage {
            operation: "read btrfs quota",
            message: format!("{}: {text:?} is not a number", f.display()),
        })
    };
    let used = read("referenced")?;
    let max = read("max_referenced")?;
    Ok((used, (max != 0 && max != CLEAR).then_some(max)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_struct_sizes_match_the_kernel_abi() {
        assert_eq!(std::mem::size_of::<QuotaCtlArgs>(), 16);
        assert_eq!(std::mem::size_of::<QgroupLimitArgs>(), 48);
        assert_eq!(std::mem::size_of::<FsInfoArgs>(), 1024);
    }
}
