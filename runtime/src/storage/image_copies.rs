//! The image copies of a btrfs or ZFS pool: what each was copied from, which may go,
//! and the lock that keeps a copy from going while a create makes a tree of it.
//!
//! ```text
//! <images>/<key>           the copy (a read-only subvolume, or a dataset's @base)
//! <images>/<key>.layers    its layer directories, top first, each ended by a NUL
//! <images>/.lock           held shared by creates, exclusively by a collect
//! ```
//!
//! A copy's key names its layers by path and identity ([`ImageSource::from_layers`]),
//! so a host that imports an image again (or whose containerd was set up afresh)
//! gets a new copy, and the old one would never be used again. A copy is stale
//! when containerd removed its layers, or put other ones at their paths: every
//! layer must belong to the collecting containerd's snapshotter (another's may be
//! out of this process's sight; Docker's `overlay2/l/<name>` links belong to its
//! `overlay2` dir) and one must be gone or changed. A copy made
//! before its record existed cannot be checked and is treated as stale: the next
//! create that needs it copies the image again, with a record.
//!
//! The record is written before the copy is published, so a published copy always
//! has one; a crash between the two leaves a record without a copy, which the next
//! collect removes.

use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::dirs::{mkdirs, read_dir_lossy};
use super::layers::ImageSource;
use super::work::layer_snapshotter;
use crate::file_lock::{lock, LockMode};
use crate::{Error, Result};

const RECORD: &str = ".layers";
const LOCK: &str = ".lock";

/// The directory of a pool's image copies (or of their records, for ZFS).
#[derive(Debug, Clone)]
pub(crate) struct ImageCopies {
    dir: PathBuf,
}

/// Held while a create looks up a copy and makes a tree of it, or while a collect
/// removes copies. Released when dropped.
#[derive(Debug)]
pub(crate) struct CopiesLock(#[allow(dead_code)] File);

impl ImageCopies {
    pub(crate) fn new(dir: PathBuf) -> ImageCopies {
        ImageCopies { dir }
    }

    fn record_path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}{RECORD}"))
    }

    fn lock_path(&self) -> PathBuf {
        self.dir.join(LOCK)
    }

    /// Taken by a create before it looks up (or makes) a copy, held until its tree
    /// is made: a collect waits for it, and a create waits for a running collect.
    pub(crate) fn using(&self) -> Result<CopiesLock> {
        mkdirs(&self.dir)?;
        let file =
            lock(&self.lock_path(), LockMode::Shared)?.expect("a blocking lock is always taken");
        Ok(CopiesLock(file))
    }

    /// Removes the copies among those `list` answers that are stale for the
    /// snapshotter `scope`, each with `remove` (which answers false for a copy it
    /// must keep, such as a ZFS copy a clone uses), and their records. Under the
    /// collect's lock, and not at all while a create holds the copies (the next
    /// collect does it). Answers the removed copies' keys.
    pub(crate) fn collect(
        &self,
        scope: &Path,
        list: impl Fn() -> Result<Vec<String>>,
        mut remove: impl FnMut(&str) -> Result<bool>,
    ) -> Result<Vec<String>> {
        if self.stale(&list()?, scope).is_empty() {
            return Ok(Vec::new());
        }
        let Some(_held) = self.collecting()? else {
            return Ok(Vec::new());
        };
        // Listed again under the lock: a create may have made or used a copy.
        let mut left = list()?;
        let mut removed = Vec::new();
        for key in self.stale(&left, scope) {
            if remove(&key)? {
                self.forget(&key)?;
                removed.push(key);
            }
        }
        left.retain(|k| !removed.contains(k));
        self.forget_orphans(&left)?;
        Ok(removed)
    }

    /// Taken by a collect; `None` while a create holds [`ImageCopies::using`]
    /// (the collect then leaves the copies to the next one).
    fn collecting(&self) -> Result<Option<CopiesLock>> {
        mkdirs(&self.dir)?;
        Ok(lock(&self.lock_path(), LockMode::TryExclusive)?.map(CopiesLock))
    }

    /// Records what `image`'s copy is made of; called before the copy is published.
    pub(crate) fn record(&self, image: &ImageSource) -> Result<()> {
        let mut text = Vec::new();
        for l in &image.layers {
            text.extend_from_slice(l.as_os_str().as_bytes());
            text.push(0);
        }
        let path = self.record_path(&image.key);
        std::fs::write(&path, text).map_err(Error::io(format!("write {}", path.display())))
    }

    /// Records what an existing copy is made of when it has no record yet (it was
    /// made before records were kept): a copy in use is then never taken for
    /// one that cannot be checked.
    pub(crate) fn record_if_missing(&self, image: &ImageSource) -> Result<()> {
        if self.recorded(&image.key).is_some() {
            return Ok(());
        }
        self.record(image)
    }

    /// The layers recorded for the copy `key`; `None` without a record. Records
    /// are not synced: an empty one (a crash right after its copy was published)
    /// counts as none.
    fn recorded(&self, key: &str) -> Option<Vec<PathBuf>> {
        let text = std::fs::read(self.record_path(key)).ok()?;
        if text.is_empty() {
            return None;
        }
        Some(
            text.split(|b| *b == 0)
                .filter(|p| !p.is_empty())
                .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p)))
                .collect(),
        )
    }

    /// Among the copies `keys`, those the collect of the snapshotter `scope` may
    /// remove (see the module's documentation).
    fn stale(&self, keys: &[String], scope: &Path) -> Vec<String> {
        keys.iter()
            .filter(|k| match self.recorded(k) {
                Some(layers) => layers_replaced(k, &layers, scope),
                None => true,
            })
            .cloned()
            .collect()
    }

    /// Removes the record of a copy that is gone.
    fn forget(&self, key: &str) -> Result<()> {
        let path = self.record_path(key);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io(format!("remove {}", path.display()))(e))
            }
            _ => Ok(()),
        }
    }

    /// Removes the records whose copy is not among `keys` (a create that died
    /// between its record and its copy); the caller holds
    /// [`ImageCopies::collecting`].
    fn forget_orphans(&self, keys: &[String]) -> Result<()> {
        for e in read_dir_lossy(&self.dir) {
            let name = e.file_name();
            let Some(key) = name.to_str().and_then(|n| n.strip_suffix(RECORD)) else {
                continue;
            };
            if !keys.iter().any(|k| k == key) {
                self.forget(key)?;
            }
        }
        Ok(())
    }
}

/// Whether the copy `key` of `layers` is of layers that the snapshotter `scope`
/// removed or replaced. A layer that cannot be looked at for another reason keeps
/// the copy.
fn layers_replaced(key: &str, layers: &[PathBuf], scope: &Path) -> bool {
    if layers.is_empty() || !layers.iter().all(|l| layer_snapshotter(l) == Some(scope)) {
        return false;
    }
    // Followed: Docker's link to a removed layer may outlive it.
    let gone = layers.iter().any(|l| {
        matches!(std::fs::metadata(l),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound)
    });
    gone || ImageSource::from_layers(layers.to_vec()).is_ok_and(|now| now.key != key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("crab-copies-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn test_a_copy_is_stale_once_its_layers_are_removed_or_replaced() {
        let root = scratch("stale");
        let snapshots = root.join("snapshots");
        let (l1, l2) = (snapshots.join("1/fs"), snapshots.join("2/fs"));
        std::fs::create_dir_all(&l1).unwrap();
        std::fs::create_dir_all(&l2).unwrap();
        let copies = ImageCopies::new(root.join("images"));
        std::fs::create_dir_all(root.join("images")).unwrap();
        let image = ImageSource::from_layers(vec![l2.clone(), l1.clone()]).unwrap();
        let only_top = ImageSource::from_layers(vec![l2.clone()]).unwrap();
        copies.record(&image).unwrap();
        copies.record(&only_top).unwrap();
        let keys = vec![image.key.clone(), only_top.key.clone(), "unrecorded".into()];
        assert_eq!(
            copies.recorded(&image.key).unwrap(),
            vec![l2.clone(), l1.clone()]
        );

        // Layers in place: only the copy without a record may go.
        assert_eq!(
            copies.stale(&keys, &snapshots),
            vec!["unrecorded".to_string()]
        );
        // Another snapshotter's collect never takes a recorded copy.
        std::fs::remove_dir_all(&l1).unwrap();
        assert_eq!(
            copies.stale(&keys, &root.join("elsewhere")),
            vec!["unrecorded".to_string()]
        );
        // A layer gone: the copies made of it go, the other stays.
        assert_eq!(
            copies.stale(&keys, &snapshots),
            vec![image.key.clone(), "unrecorded".to_string()]
        );
        // A layer replaced at the same path (a containerd set up afresh).
        std::fs::remove_dir_all(&l2).unwrap();
        std::fs::create_dir_all(&l2).unwrap();
        assert!(copies.stale(&keys, &snapshots).contains(&only_top.key));

        // A record a crash left empty counts as none, and a create writes it again.
        std::fs::write(copies.record_path(&image.key), b"").unwrap();
        assert!(copies
            .stale(&keys, &root.join("elsewhere"))
            .contains(&image.key));
        std::fs::create_dir_all(&l1).unwrap();
        let again = ImageSource {
            key: image.key.clone(),
            ..ImageSource::from_layers(vec![l2.clone(), l1.clone()]).unwrap()
        };
        copies.record_if_missing(&again).unwrap();
        assert_eq!(
            copies.recorded(&image.key).unwrap(),
            vec![l2.clone(), l1.clone()]
        );

        copies
            .forget_orphans(std::slice::from_ref(&only_top.key))
            .unwrap();
        assert!(copies.recorded(&image.key).is_none());
        assert!(copies.recorded(&only_top.key).is_some());
        copies.forget(&only_top.key).unwrap();
        copies.forget(&only_top.key).unwrap();
        assert!(copies.recorded(&only_top.key).is_none());
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn test_dockers_short_layer_links_belong_to_its_overlay2_dir() {
        let root = scratch("docker");
        let overlay2 = root.join("overlay2");
        let diff = overlay2.join("0123abcd/diff");
        std::fs::create_dir_all(&diff).unwrap();
        std::fs::create_dir_all(overlay2.join("l")).unwrap();
        let link = overlay2.join("l/SHORTNAME");
        std::os::unix::fs::symlink("../0123abcd/diff", &link).unwrap();
        assert_eq!(layer_snapshotter(&link), Some(overlay2.as_path()));
        assert_eq!(layer_snapshotter(&diff), Some(overlay2.as_path()));
        assert_eq!(layer_snapshotter(&root.join("l/SHORTNAME")), None);

        let copies = ImageCopies::new(root.join("images"));
        std::fs::create_dir_all(root.join("images")).unwrap();
        let image = ImageSource::from_layers(vec![link.clone()]).unwrap();
        copies.record(&image).unwrap();
        let keys = vec![image.key.clone()];
        assert!(copies.stale(&keys, &overlay2).is_empty());
        // `docker rmi`: the layer goes (its link too, later).
        std::fs::remove_dir_all(overlay2.join("0123abcd")).unwrap();
        assert_eq!(copies.stale(&keys, &overlay2), keys);
        std::fs::remove_file(&link).unwrap();
        assert_eq!(copies.stale(&keys, &overlay2), keys);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn test_a_collect_does_not_lock_while_a_create_uses_the_copies() {
        let root = scratch("lock");
        let copies = ImageCopies::new(root.clone());
        let using = copies.using().unwrap();
        let other = copies.using().unwrap();
        assert!(copies.collecting().unwrap().is_none());
        drop((using, other));
        let held = copies.collecting().unwrap();
        assert!(held.is_some());
        assert!(
            copies.collecting().unwrap().is_none(),
            "one collect at a time"
        );
        drop(held);
        let _ = std::fs::remove_dir_all(root);
    }
}
