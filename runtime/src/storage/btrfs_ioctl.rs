//! The few btrfs ioctls the store needs. Snapshots and deletions through ioctls cost a
//! system call, not the exec of `btrfs`, which matters for millisecond snapshots.

use std::ffi::CStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::{Error, Result};

const BTRFS_IOCTL_MAGIC: u8 = 0x94;
const NAME_MAX_V1: usize = 4088;
const NAME_MAX_V2: usize = 4040;
const SUBVOL_RDONLY: u64 = 1 << 1;

#[repr(C)]
pub(super) struct VolArgs {
    fd: i64,
    name: [u8; NAME_MAX_V1],
}

#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; NAME_MAX_V2],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Timespec {
    sec: u64,
    nsec: u32,
}

#[repr(C)]
struct SubvolInfo {
    treeid: u64,
    name: [u8; 256],
    parent_id: u64,
    dirid: u64,
    generation: u64,
    flags: u64,
    uuid: [u8; 16],
    parent_uuid: [u8; 16],
    received_uuid: [u8; 16],
    ctransid: u64,
    otransid: u64,
    stransid: u64,
    rtransid: u64,
    ctime: Timespec,
    otime: Timespec,
    stime: Timespec,
    rtime: Timespec,
    reserved: [u64; 8],
}

nix::ioctl_write_ptr!(subvol_create, BTRFS_IOCTL_MAGIC, 14, VolArgs);
nix::ioctl_write_ptr!(snap_destroy, BTRFS_IOCTL_MAGIC, 15, VolArgs);
pub(super) use snap_destroy as destroy_in;
nix::ioctl_write_ptr!(snap_create_v2, BTRFS_IOCTL_MAGIC, 23, VolArgsV2);
nix::ioctl_read!(subvol_getflags, BTRFS_IOCTL_MAGIC, 25, u64);
nix::ioctl_read!(get_subvol_info, BTRFS_IOCTL_MAGIC, 60, SubvolInfo);

fn open_dir(p: &Path) -> Result<File> {
    File::open(p).map_err(Error::io(format!("open {}", p.display())))
}

fn split(p: &Path) -> Result<(File, &[u8])> {
    let parent = p.parent().ok_or_else(|| Error::Storage {
        operation: "btrfs",
        message: format!("{} has no parent", p.display()),
    })?;
    let name = p
        .file_name()
        .map(|n| n.as_encoded_bytes())
        .unwrap_or_default();
    Ok((open_dir(parent)?, name))
}

fn fill<const N: usize>(name: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = name.len().min(N - 1);
    out[..n].copy_from_slice(&name[..n]);
    out
}

/// The arguments that name the subvolume `name` in the directory they are used on.
pub(super) fn named(name: &[u8]) -> VolArgs {
    VolArgs {
        fd: 0,
        name: fill(name),
    }
}

/// The parent directory of `path`, open, and the arguments that name `path` in it.
fn vol_args(path: &Path) -> Result<(File, VolArgs)> {
    let (parent, name) = split(path)?;
    let args = VolArgs {
        fd: 0,
        name: fill(name),
    };
    Ok((parent, args))
}

/// Creates an empty subvolume at `path`.
pub fn create(path: &Path) -> Result<()> {
    let (parent, args) = vol_args(path)?;
    // SAFETY: `args` is a valid, initialised VolArgs that outlives the call; the kernel
    // only reads it.
    unsafe { subvol_create(parent.as_raw_fd(), &args) }
        .map(drop)
        .map_err(Error::sys(format!("create subvolume {}", path.display())))
}

/// Snapshots subvolume `src` at `dst` (read-only when `readonly`).
pub fn snapshot(src: &Path, dst: &Path, readonly: bool) -> Result<()> {
    let source = open_dir(src)?;
    let (parent, name) = split(dst)?;
    let args = VolArgsV2 {
        fd: source.as_raw_fd() as i64,
        transid: 0,
        flags: if readonly { SUBVOL_RDONLY } else { 0 },
        unused: [0; 4],
        name: fill(name),
    };
    // SAFETY: `args` is valid for the call and names an fd we hold open.
    unsafe { snap_create_v2(parent.as_raw_fd(), &args) }
        .map(drop)
        .map_err(Error::sys(format!(
            "snapshot {} at {}",
            src.display(),
            dst.display()
        )))
}

/// Deletes the subvolume at `path` (with everything in it).
pub fn delete(path: &Path) -> Result<()> {
    let (parent, args) = vol_args(path)?;
    // SAFETY: `args` is valid for the call; the kernel only reads it.
    unsafe { snap_destroy(parent.as_raw_fd(), &args) }
        .map(drop)
        .map_err(Error::sys(format!("delete subvolume {}", path.display())))
}

/// Whether the subvolume at `path` is read-only.
pub fn is_readonly(path: &Path) -> Result<bool> {
    let dir = open_dir(path)?;
    let mut flags: u64 = 0;
    // SAFETY: the kernel writes one u64 into a live local.
    unsafe { subvol_getflags(dir.as_raw_fd(), &mut flags) }
        .map_err(Error::sys(format!("flags of {}", path.display())))?;
    Ok(flags & SUBVOL_RDONLY != 0)
}

/// The id of the subvolume at `path` (its level-0 qgroup is `0/<id>`).
pub fn subvolume_id(path: &Path) -> Result<u64> {
    Ok(info(path)?.treeid)
}

fn info(path: &Path) -> Result<SubvolInfo> {
    let dir = open_dir(path)?;
    // SAFETY: SubvolInfo is plain old data; all-zero is a valid value.
    let mut info: SubvolInfo = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes a SubvolInfo (its size is encoded in the request
    // number, so a layout mismatch fails with ENOTTY) into our local.
    unsafe { get_subvol_info(dir.as_raw_fd(), &mut info) }
        .map_err(Error::sys(format!("subvolume info of {}", path.display())))?;
    Ok(info)
}

/// When the subvolume at `path` was created.
pub fn created(path: &Path) -> Result<SystemTime> {
    let info = info(path)?;
    let _ = CStr::from_bytes_until_nul(&info.name);
    Ok(SystemTime::UNIX_EPOCH + Duration::new(info.otime.sec, info.otime.nsec.min(999_999_999)))
}

/// The UUIDs by which a send stream can name the subvolume at `path` as its parent
/// or a clone source: its own, and the one it was received as (if any).
pub fn uuids(path: &Path) -> Result<Vec<[u8; 16]>> {
    let info = info(path)?;
    Ok([info.uuid, info.received_uuid]
        .into_iter()
        .filter(|u| u != &[0u8; 16])
        .collect())
}

/// Whether `path` is the root of a subvolume (btrfs gives those inode 256).
pub fn is_subvolume(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .map(|m| m.is_dir() && m.ino() == 256)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_struct_sizes_match_the_kernel_abi() {
        assert_eq!(std::mem::size_of::<VolArgs>(), 4096);
        assert_eq!(std::mem::size_of::<VolArgsV2>(), 4096);
        assert_eq!(std::mem::size_of::<SubvolInfo>(), 504);
    }
}
