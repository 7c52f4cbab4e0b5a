//! Subvolumes a container made inside its own tree.
//!
//! Any process that can write a directory can make a subvolume in it
//! (`ioctl(BTRFS_IOC_SUBVOL_CREATE)`, no privilege needed). A snapshot does not descend
//! into nested subvolumes (each shows up as an empty directory), so a snapshot, a
//! checkpoint's file delta or an export of such a tree would silently lose what they
//! hold; and a subvolume that holds others cannot be deleted (`ENOTEMPTY`). So the
//! store refuses to snapshot a tree that has them, naming the first one, and deletes
//! them, deepest first, before the tree that holds them.
//!
//! They are found through the kernel's list of the subvolume's children
//! (`BTRFS_IOC_GET_SUBVOL_ROOTREF`) and their place through
//! `BTRFS_IOC_INO_LOOKUP_USER`, both a few system calls whatever the tree holds, so the
//! check costs nothing against a millisecond snapshot. Every directory on the way is
//! opened below the tree's root without following a symlink, so a container that
//! swaps a directory for a symlink meanwhile cannot make the store delete anything
//! outside its tree.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::btrfs_ioctl::{destroy_in, named};
use crate::checkpoint::beneath;
use crate::{Error, Result};

const BTRFS_IOCTL_MAGIC: u8 = 0x94;
const ROOTREF_BATCH: usize = 255;
const LOOKUP_PATH_MAX: usize = 3824;

#[repr(C)]
#[derive(Clone, Copy)]
struct RootRef {
    treeid: u64,
    dirid: u64,
}

#[repr(C)]
struct RootRefArgs {
    min_treeid: u64,
    rootref: [RootRef; ROOTREF_BATCH],
    num_items: u8,
    align: [u8; 7],
}

#[repr(C)]
struct LookupUserArgs {
    dirid: u64,
    treeid: u64,
    name: [u8; 256],
    path: [u8; LOOKUP_PATH_MAX],
}

nix::ioctl_readwrite!(get_subvol_rootref, BTRFS_IOCTL_MAGIC, 61, RootRefArgs);
nix::ioctl_readwrite!(ino_lookup_user, BTRFS_IOCTL_MAGIC, 62, LookupUserArgs);

/// A subvolume directly inside another: the directory that holds it (relative to
/// the outer subvolume's root, empty for the root) and its name there.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Child {
    dir: Vec<u8>,
    name: Vec<u8>,
}

impl Child {
    fn path(&self) -> Vec<u8> {
        let mut p = self.dir.clone();
        if !p.is_empty() && !p.ends_with(b"/") {
            p.push(b'/');
        }
        p.extend_from_slice(&self.name);
        p
    }
}

fn bytes_until_nul(b: &[u8]) -> Vec<u8> {
    CStr::from_bytes_until_nul(b)
        .map(|c| c.to_bytes().to_vec())
        .unwrap_or_else(|_| b.to_vec())
}

/// The subvolumes directly inside the subvolume whose root `root` is open on.
fn children(root: BorrowedFd, what: &Path) -> Result<Vec<Child>> {
    let mut refs = Vec::new();
    let mut min_treeid = 0;
    loop {
        // SAFETY: RootRefArgs is plain old data; all-zero is a valid value.
        let mut args: RootRefArgs = unsafe { std::mem::zeroed() };
        args.min_treeid = min_treeid;
        // SAFETY: the kernel reads and writes one RootRefArgs (its size is in the
        // request number) in a live local; `root` is an open descriptor.
        let r = unsafe { get_subvol_rootref(root.as_raw_fd(), &mut args) };
        let more = match r {
            Ok(_) => false,
            // More than one batch: the kernel filled this one and set where the next
            // starts.
            Err(nix::Error::EOVERFLOW) => true,
            Err(e) => {
                return Err(Error::sys(format!(
                    "list the subvolumes inside {}",
                    what.display()
                ))(e))
            }
        };
        let n = usize::from(args.num_items).min(ROOTREF_BATCH);
        refs.extend_from_slice(&args.rootref[..n]);
        if !more || n == 0 {
            break;
        }
        min_treeid = args.min_treeid;
    }
    refs.into_iter()
        .map(|r| {
            // SAFETY: LookupUserArgs is plain old data; all-zero is a valid value.
            let mut args: LookupUserArgs = unsafe { std::mem::zeroed() };
            args.dirid = r.dirid;
            args.treeid = r.treeid;
            // SAFETY: as above, one LookupUserArgs in a live local.
            unsafe { ino_lookup_user(root.as_raw_fd(), &mut args) }.map_err(Error::sys(
                format!("find subvolume {} inside {}", r.treeid, what.display()),
            ))?;
            Ok(Child {
                dir: bytes_until_nul(&args.path),
                name: bytes_until_nul(&args.name),
            })
        })
        .collect()
}

fn open_below(dir: BorrowedFd, rel: &[u8], what: &Path) -> Result<OwnedFd> {
    let rel: &[u8] = if rel.is_empty() { b"." } else { rel };
    beneath::open(dir, rel, libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(Error::io(format!(
        "open {} inside {}",
        String::from_utf8_lossy(rel),
        what.display()
    )))
}

fn lossy(p: &[u8]) -> PathBuf {
    PathBuf::from(String::from_utf8_lossy(p).into_owned())
}

/// The first subvolume found inside the tree at `root` (relative to it), if any.
pub fn first_nested(root: &Path) -> Result<Option<PathBuf>> {
    let fd = beneath::open_root(root).map_err(Error::io(format!("open {}", root.display())))?;
    Ok(children(beneath::fd(&fd), root)?
        .first()
        .map(|c| lossy(&c.path())))
}

/// The refusal of a snapshot of a tree that holds subvolume `nested`.
pub fn refuse(tree: &Path, nested: &Path) -> Error {
    Error::Storage {
        operation: "snapshot",
        message: format!(
            "the container made a btrfs subvolume at /{} inside its tree {}, which a \
             snapshot would silently leave empty; delete it (btrfs subvolume delete) \
             or make it a plain directory",
            nested.display(),
            tree.display()
        ),
    }
}

/// Deletes every subvolume inside the subvolume open on `root`, deepest first.
/// Returns how many were deleted.
fn delete_inside(root: BorrowedFd, what: &Path) -> Result<usize> {
    let mut deleted = 0;
    for child in children(root, what)? {
        let at = what.join(lossy(&child.path()));
        let parent = open_below(root, &child.dir, what)?;
        {
            let inner = open_below(beneath::fd(&parent), &child.name, &at)?;
            deleted += delete_inside(beneath::fd(&inner), &at)?;
        }
        let args = named(&child.name);
        // SAFETY: `args` is a valid VolArgs that outlives the call; `parent` is the
        // open directory that holds the subvolume it names.
        unsafe { destroy_in(parent.as_raw_fd(), &args) }
            .map_err(Error::sys(format!("delete subvolume {}", at.display())))?;
        deleted += 1;
    }
    Ok(deleted)
}

/// Deletes the subvolumes a container made inside its tree at `root` (so that the
/// tree itself can be deleted). Returns how many there were.
pub fn delete_nested(root: &Path) -> Result<usize> {
    let fd = beneath::open_root(root).map_err(Error::io(format!("open {}", root.display())))?;
    let n = delete_inside(beneath::fd(&fd), root)?;
    if n > 0 {
        tracing::info!(tree = %root.display(), subvolumes = n, "deleted nested subvolumes");
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_struct_sizes_match_the_kernel_abi() {
        assert_eq!(std::mem::size_of::<RootRefArgs>(), 4096);
        assert_eq!(std::mem::size_of::<LookupUserArgs>(), 4096);
    }

    #[test]
    fn test_a_child_path_joins_its_directory_and_name() {
        let c = Child {
            dir: b"a/b/".to_vec(),
            name: b"sub".to_vec(),
        };
        assert_eq!(c.path(), b"a/b/sub");
        let top = Child {
            dir: Vec::new(),
            name: b"sub".to_vec(),
        };
        assert_eq!(top.path(), b"sub");
    }
}
