//! A CRIU image directory restored into a user namespace.
//!
//! CRIU opens the image directory as the host's root, then makes the namespace, and
//! the restored tasks open some images themselves: early ones (`timens-0.img`) while
//! a task is still host uid 0 inside the new namespace (whose maps its parent may not
//! have written yet), later ones (`tty-info.img`) once it has become the namespace's
//! root, a host id of the mappings. A directory of host root's, mode 0700, refuses
//! the later lookups (EACCES: capabilities inside the namespace count only for files
//! whose owner is mapped in it); one handed to the namespace's root refuses the early
//! ones whenever they come before the maps (parallel forks hit it). So the directory
//! and its files stay host root's and get the namespace root's gid as their group,
//! with group read (and search, for the directory) added: both kinds of task get in,
//! nobody else does. The directories above stay root's, mode 0700, and the sandbox
//! never sees the store.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::Mappings;
use crate::{Error, Result};

/// Gives the group of `images` (a directory of regular files, checked before) and of
/// its files to the mapped root group of `maps`, with group read (and search).
/// Answers how many entries changed.
pub fn hand_to_namespace_root(images: &Path, maps: &Mappings) -> Result<usize> {
    let Some(gid) = maps.root_gid() else {
        return Ok(0);
    };
    let mut changed = 0;
    let mut give = |p: &Path, bits: u32| -> Result<()> {
        let meta =
            std::fs::symlink_metadata(p).map_err(Error::io(format!("lstat {}", p.display())))?;
        if meta.file_type().is_symlink() {
            return Err(Error::io(format!(
                "hand {} to the namespace's root",
                p.display()
            ))(std::io::Error::other(
                "a symlink among CRIU's images",
            )));
        }
        if meta.gid() != gid {
            std::os::unix::fs::lchown(p, None, Some(gid))
                .map_err(Error::io(format!("chgrp {} to {gid}", p.display())))?;
            changed += 1;
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & bits != bits {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode | bits))
                .map_err(Error::io(format!("chmod {}", p.display())))?;
        }
        Ok(())
    };
    give(images, 0o050)?;
    for entry in
        std::fs::read_dir(images).map_err(Error::io(format!("read {}", images.display())))?
    {
        let entry = entry.map_err(Error::io(format!("read {}", images.display())))?;
        give(&entry.path(), 0o040)?;
    }
    Ok(changed)
}
