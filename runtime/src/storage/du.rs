//! Disk usage of a directory as containerd's snapshotters measure a writable layer:
//! the blocks allocated to every inode below it (each hard-linked inode once), and
//! the number of those inodes. Crab's snapshotter reports this for the writable
//! layers whose data is there (runc's containers), so kubelet sees the same figures
//! as with containerd's own overlay snapshotter.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::{Error, Result};

/// Bytes allocated and inodes below a directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// Bytes allocated (`st_blocks` × 512), each inode once.
    pub bytes: u64,
    /// Inodes, the directory itself included.
    pub inodes: u64,
}

/// Walks `dir` without following symbolic links and without entering other file
/// systems mounted below it (a mount there is not the layer's data).
pub fn disk_usage(dir: &Path) -> Result<DiskUsage> {
    let top =
        std::fs::symlink_metadata(dir).map_err(Error::io(format!("stat {}", dir.display())))?;
    let dev = top.dev();
    let mut seen = HashSet::new();
    let mut usage = DiskUsage::default();
    let mut stack = vec![(dir.to_path_buf(), top)];
    while let Some((path, md)) = stack.pop() {
        if seen.insert(md.ino()) {
            usage.bytes += md.blocks() * 512;
            usage.inodes += 1;
        }
        if !md.is_dir() {
            continue;
        }
        let entries = match std::fs::read_dir(&path) {
            Ok(e) => e,
            // Removed while we walk: the layer changed under us, as `du` allows.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(format!("read {}", path.display()))(e)),
        };
        for e in entries.flatten() {
            match e.metadata() {
                Ok(md) if md.dev() == dev => stack.push((e.path(), md)),
                _ => {}
            }
        }
    }
    Ok(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_counts_allocated_blocks_and_inodes_once_per_hard_link() -> Result<()> {
        let dir = tempfile::tempdir().map_err(Error::io("tempdir"))?;
        let before = disk_usage(dir.path())?;
        std::fs::create_dir(dir.path().join("d")).map_err(Error::io("mkdir"))?;
        std::fs::write(dir.path().join("d/f"), vec![7u8; 1 << 20]).map_err(Error::io("write"))?;
        std::fs::hard_link(dir.path().join("d/f"), dir.path().join("g"))
            .map_err(Error::io("link"))?;
        // A sparse file allocates nothing for its hole.
        let sparse = std::fs::File::create(dir.path().join("s")).map_err(Error::io("create"))?;
        sparse.set_len(64 << 20).map_err(Error::io("truncate"))?;
        let after = disk_usage(dir.path())?;
        assert_eq!(after.inodes, before.inodes + 3);
        let grown = after.bytes - before.bytes;
        assert!(
            (1 << 20..(1 << 20) + (64 << 10)).contains(&grown),
            "{grown}"
        );
        Ok(())
    }
}
