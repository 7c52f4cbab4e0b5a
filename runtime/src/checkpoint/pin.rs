//! A restore's hold on the process image it reads.
//!
//! A restore from a history (a fork, `crabctl restore`) reads the entry at `Create`
//! and restores its processes at `Start`, with no lock held in between: a retention
//! or a `crabctl rm` of the source may delete the images in that window. So the
//! restore pins them at `Create`, under the history's lock: it hard-links every
//! file of the image into a work directory of its own (`<store>/.restores/<ns>/`,
//! named with the pid of the restoring process like the other work directories,
//! [`super::archive_work`]). A link keeps the data whatever the history deletes; it
//! costs one `link` per image file and no copy. The pin is removed once the
//! processes are back (its holder [`PinnedImage::keep`]s it until then), with the
//! value if the restore fails before that, and a dead shim's pin by the next
//! restore.

use std::path::{Path, PathBuf};

use super::engine::Dumped;
use super::history::Entry;
use super::history_store::HistoryStore;
use super::{archive_work, ops, CRIU_DIR};
use crate::config::Config;
use crate::storage::ContainerKey;
use crate::{Error, Result};

/// A checkpoint's process image, linked where no retention deletes it; the links
/// go when the value is dropped, unless [`PinnedImage::keep`] handed them over.
#[derive(Debug)]
pub struct PinnedImage {
    /// The history entry it belongs to.
    pub entry: Entry,
    /// The CRIU images (in the pin).
    pub images: PathBuf,
    /// What the restore needs to know about the dumped container.
    pub dumped: Dumped,
    /// The pin's directory (empty once kept).
    root: PathBuf,
}

impl PinnedImage {
    /// Hands the pin over to whoever restores from it: the images, what was
    /// dumped, and the directory to remove once the processes are back.
    pub fn keep(mut self) -> (PathBuf, Dumped, PathBuf) {
        (
            std::mem::take(&mut self.images),
            std::mem::take(&mut self.dumped),
            std::mem::take(&mut self.root),
        )
    }
}

impl Drop for PinnedImage {
    fn drop(&mut self) {
        if !self.root.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// Pins the process image of checkpoint `name` of `src`'s history for a restore
/// into container `restoring`. Fails with the kind of what is missing: no such
/// checkpoint (not found), a checkpoint of files alone (failed precondition).
pub fn pin(
    config: &Config,
    src: &ContainerKey,
    name: &str,
    restoring: &ContainerKey,
) -> Result<PinnedImage> {
    archive_work::discard_dead(config);
    let history = HistoryStore::open(config, src)?;
    let entry = history.find(name)?.clone();
    let (images, dumped) =
        ops::process_image(config, src, &entry)?.ok_or_else(|| Error::NoProcessImage {
            container: src.to_string(),
            checkpoint: entry.name.clone(),
        })?;
    let root = archive_work::restore_pin_dir(config, restoring);
    // Made before the links: a failure part of the way removes them with it.
    let pinned = PinnedImage {
        entry,
        images: root.join(CRIU_DIR),
        dumped,
        root,
    };
    link_tree(&images, &pinned.images)?;
    drop(history);
    Ok(pinned)
}

/// Makes `to` a tree of hard links to the files of `from` (directories made anew,
/// mode 0700: images hold process memory).
fn link_tree(from: &Path, to: &Path) -> Result<()> {
    super::history::create_private_dir(to)?;
    let entries = std::fs::read_dir(from).map_err(Error::io(format!("read {}", from.display())))?;
    for e in entries {
        let e = e.map_err(Error::io(format!("read {}", from.display())))?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let kind = e
            .file_type()
            .map_err(Error::io(format!("stat {}", src.display())))?;
        if kind.is_dir() {
            link_tree(&src, &dst)?;
        } else if kind.is_file() {
            std::fs::hard_link(&src, &dst).map_err(Error::io(format!(
                "link {} to {}",
                src.display(),
                dst.display()
            )))?;
        } else {
            // CRIU writes regular files and directories only; anything else in a
            // history is not Crab's.
            return Err(Error::BadCheckpoint {
                path: src,
                message: "not a regular file or directory".into(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_linked_tree_outlives_the_deleted_original() {
        let tmp = std::env::temp_dir().join(format!("crab-pin-{}", std::process::id()));
        let (from, to) = (tmp.join("from"), tmp.join("to"));
        std::fs::create_dir_all(from.join("sub")).unwrap();
        std::fs::write(from.join("pages-1.img"), b"pages").unwrap();
        std::fs::write(from.join("sub/inner.img"), b"inner").unwrap();
        link_tree(&from, &to).unwrap();
        std::fs::remove_dir_all(&from).unwrap();
        assert_eq!(std::fs::read(to.join("pages-1.img")).unwrap(), b"pages");
        assert_eq!(std::fs::read(to.join("sub/inner.img")).unwrap(), b"inner");
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn test_a_dropped_pin_removes_its_links_and_a_kept_one_hands_them_over() {
        let tmp = std::env::temp_dir().join(format!("crab-pin-keep-{}", std::process::id()));
        let pin = |root: &Path| {
            std::fs::create_dir_all(root.join(CRIU_DIR)).unwrap();
            PinnedImage {
                entry: Entry {
                    seq: 1,
                    name: "1".into(),
                    parent: None,
                    kind: crate::checkpoint::Kind::Full,
                    fs_snapshot: None,
                    process_image: Some(1),
                    created_ms: 0,
                    process_bytes: 0,
                    timings: Default::default(),
                    marked: false,
                },
                images: root.join(CRIU_DIR),
                dumped: Dumped::default(),
                root: root.to_path_buf(),
            }
        };
        drop(pin(&tmp.join("dropped")));
        assert!(!tmp.join("dropped").exists());
        let (images, _, root) = pin(&tmp.join("kept")).keep();
        assert!(images.is_dir(), "{}", images.display());
        assert_eq!(root, tmp.join("kept"));
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn test_a_symlink_in_an_image_is_refused() {
        let tmp = std::env::temp_dir().join(format!("crab-pin-link-{}", std::process::id()));
        let from = tmp.join("from");
        std::fs::create_dir_all(&from).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", from.join("pages-1.img")).unwrap();
        let err = link_tree(&from, &tmp.join("to")).unwrap_err();
        assert!(matches!(err, Error::BadCheckpoint { .. }), "{err}");
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
