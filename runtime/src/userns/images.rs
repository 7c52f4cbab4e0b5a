//! A CRIU image directory restored into a user namespace.
//!
//! CRIU opens the image directory as the host's root, then makes the namespace,
//! switches the restored tasks to its root (a host id of the mappings) and opens
//! some images from those tasks (`tty-info.img`, for one). A lookup in a directory
//! owned by host root, mode 0700, then fails (EACCES): capabilities inside the
//! namespace count only for files whose owner is mapped in it. The restore hands the
//! image directory and its files to the namespace's root (owner only, no mode
//! widened); the directories above stay root's and 0700, so nobody else reaches
//! them, and the sandbox itself never sees the store.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::Mappings;
use crate::{Error, Result};

/// Gives `images` (a directory of regular files, checked before) and its files to the
/// mapped root of `maps`. Answers how many entries changed owner.
pub fn hand_to_namespace_root(images: &Path, maps: &Mappings) -> Result<usize> {
    let (Some(uid), Some(gid)) = (maps.root_uid(), maps.root_gid()) else {
        return Ok(0);
    };
    let mut changed = 0;
    let mut give = |p: &Path| -> Result<()> {
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
        if (meta.uid(), meta.gid()) != (uid, gid) {
            std::os::unix::fs::lchown(p, Some(uid), Some(gid))
                .map_err(Error::io(format!("chown {} to {uid}:{gid}", p.display())))?;
            changed += 1;
        }
        Ok(())
    };
    give(images)?;
    for entry in
        std::fs::read_dir(images).map_err(Error::io(format!("read {}", images.display())))?
    {
        let entry = entry.map_err(Error::io(format!("read {}", images.display())))?;
        give(&entry.path())?;
    }
    Ok(changed)
}
