//! The image a container starts from, as containerd's snapshotter mounts it.
//!
//! containerd hands the shim the mounts of the container's active snapshot: usually one
//! overlay whose `lowerdir`s are the image's committed layers and whose `upperdir` is
//! the (empty) writable layer. The image is identified by its lower layers; the store
//! copies it once per key and ignores containerd's writable layer.

use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// One mount as containerd describes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MountSpec {
    /// File-system type (`overlay`, `bind`, ...).
    pub kind: String,
    /// Source.
    pub source: String,
    /// Options (`lowerdir=...`, `ro`, `rbind`, ...).
    pub options: Vec<String>,
}

/// The read-only image layers a container starts from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageSource {
    /// Identifies the layer chain: the same layers give the same key.
    pub key: String,
    /// The layer directories, top first (overlay's `lowerdir` order).
    pub layers: Vec<PathBuf>,
    /// containerd's writable layer for this container. It lives as long as the
    /// containerd container does (across tasks), so the store keeps the container's
    /// tree exactly that long: same owner, same tree; owner gone, tree collected.
    pub owner: Option<PathBuf>,
}

impl ImageSource {
    /// Reads the image layers out of containerd's rootfs mounts.
    pub fn from_mounts(mounts: &[MountSpec]) -> Result<ImageSource> {
        let (layers, owner) = ImageSource::parse_mounts(mounts)?;
        Ok(ImageSource {
            owner,
            ..ImageSource::from_layers(layers)?
        })
    }

    /// The layer directories (top first) and the owner that containerd's rootfs
    /// mounts name, without looking at them.
    pub(crate) fn parse_mounts(mounts: &[MountSpec]) -> Result<(Vec<PathBuf>, Option<PathBuf>)> {
        let [m] = mounts else {
            return Err(unsupported(format!(
                "expected one rootfs mount, got {}",
                mounts.len()
            )));
        };
        let layers: Vec<PathBuf> = match m.kind.as_str() {
            "overlay" => m
                .options
                .iter()
                .find_map(|o| o.strip_prefix("lowerdir="))
                .map(|l| l.split(':').map(PathBuf::from).collect())
                .unwrap_or_default(),
            // A single-layer view (a committed snapshot, or `--rootfs` directories).
            "bind" | "rbind" | "none" if m.options.iter().any(|o| o == "ro") => {
                vec![PathBuf::from(&m.source)]
            }
            // A writable bind of an active snapshot with no parent: an empty image.
            "bind" | "rbind" | "none" => Vec::new(),
            other => return Err(unsupported(format!("rootfs mount type {other}"))),
        };
        let owner = match m.kind.as_str() {
            "overlay" => m
                .options
                .iter()
                .find_map(|o| o.strip_prefix("upperdir="))
                .map(PathBuf::from),
            _ if !m.options.iter().any(|o| o == "ro") => Some(PathBuf::from(&m.source)),
            _ => None,
        };
        Ok((layers, owner))
    }

    /// The snapshots directory of the snapshotter that made this rootfs (its
    /// owner's, or for a read-only view its top layer's): the scope of a collect.
    pub fn snapshotter(&self) -> Option<PathBuf> {
        let dir = self.owner.as_ref().or(self.layers.first())?;
        super::work::snapshotter_of(dir).map(Path::to_path_buf)
    }

    /// An image made of these layer directories (top first). The key names each
    /// directory by its path and by which directory it is (device, inode, change
    /// time): a containerd whose root was removed and made again numbers its
    /// snapshots from 1 again, and the same path would otherwise name the copy of
    /// another image. A layer that cannot be looked at is an error, not a key
    /// made of its path alone (which could name another image's copy).
    pub fn from_layers(layers: Vec<PathBuf>) -> Result<ImageSource> {
        use std::os::unix::fs::MetadataExt;
        let mut h = Sha256::new();
        for l in &layers {
            h.update(l.as_os_str().as_encoded_bytes());
            h.update([0]);
            let md = std::fs::metadata(l)
                .map_err(Error::io(format!("look at image layer {}", l.display())))?;
            for n in [
                md.dev(),
                md.ino(),
                md.ctime() as u64,
                md.ctime_nsec() as u64,
            ] {
                h.update(n.to_le_bytes());
            }
        }
        let key = h
            .finalize()
            .iter()
            .take(16)
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(ImageSource {
            key,
            layers,
            owner: None,
        })
    }

    /// Mounts the image read-only at `target` (an empty directory) and returns a guard
    /// that unmounts it. An image without layers mounts nothing.
    pub fn mount_readonly(&self, target: &Path) -> Result<MountGuard> {
        let sys = |what: String| Error::sys(what);
        match self.layers.as_slice() {
            [] => Ok(MountGuard { target: None }),
            [one] => {
                mount(
                    Some(one.as_path()),
                    target,
                    None::<&str>,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    None::<&str>,
                )
                .map_err(sys(format!(
                    "bind {} on {}",
                    one.display(),
                    target.display()
                )))?;
                let guard = MountGuard {
                    target: Some(target.to_path_buf()),
                };
                mount(
                    None::<&str>,
                    target,
                    None::<&str>,
                    MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                    None::<&str>,
                )
                .map_err(sys(format!("remount {} read-only", target.display())))?;
                Ok(guard)
            }
            many => {
                let lower: Vec<String> = many.iter().map(|p| p.display().to_string()).collect();
                let data = format!("lowerdir={}", lower.join(":"));
                mount(
                    Some("overlay"),
                    target,
                    Some("overlay"),
                    MsFlags::MS_RDONLY,
                    Some(data.as_str()),
                )
                .map_err(sys(format!("mount image overlay on {}", target.display())))?;
                Ok(MountGuard {
                    target: Some(target.to_path_buf()),
                })
            }
        }
    }
}

fn unsupported(message: String) -> Error {
    Error::Storage {
        operation: "read image layers",
        message,
    }
}

/// Unmounts on drop.
#[derive(Debug)]
pub struct MountGuard {
    target: Option<PathBuf>,
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        if let Some(t) = &self.target {
            let _ = umount2(t.as_path(), MntFlags::MNT_DETACH);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Layer directories `names` under a temporary directory, joined as
    /// overlay's `lowerdir` lists them.
    fn layer_dirs(names: &[&str]) -> (tempfile::TempDir, Vec<PathBuf>) {
        let dir = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = names.iter().map(|n| dir.path().join(n)).collect();
        for d in &dirs {
            std::fs::create_dir_all(d).unwrap();
        }
        (dir, dirs)
    }

    fn lower(dirs: &[&PathBuf]) -> String {
        let names: Vec<_> = dirs.iter().map(|d| d.display().to_string()).collect();
        names.join(":")
    }

    fn overlay(lower: &str) -> MountSpec {
        MountSpec {
            kind: "overlay".into(),
            source: "overlay".into(),
            options: vec![
                "index=off".into(),
                format!("lowerdir={lower}"),
                "upperdir=/u".into(),
                "workdir=/w".into(),
            ],
        }
    }

    #[test]
    fn test_overlay_layers_are_read_in_order() {
        let (_dir, l) = layer_dirs(&["2", "1"]);
        let img = ImageSource::from_mounts(&[overlay(&lower(&[&l[0], &l[1]]))]).unwrap();
        assert_eq!(img.layers, l);
    }

    #[test]
    fn test_key_depends_on_layers_not_on_the_writable_layer() {
        let (_dir, l) = layer_dirs(&["2", "1"]);
        let a = ImageSource::from_mounts(&[overlay(&lower(&[&l[0], &l[1]]))]).unwrap();
        let mut other_upper = overlay(&lower(&[&l[0], &l[1]]));
        other_upper.options[2] = "upperdir=/elsewhere".into();
        let b = ImageSource::from_mounts(&[other_upper]).unwrap();
        let c = ImageSource::from_mounts(&[overlay(&lower(&[&l[1], &l[0]]))]).unwrap();
        assert_eq!(a.key, b.key);
        assert_ne!(a.key, c.key);
        assert_eq!(a.key.len(), 32);
    }

    #[test]
    fn test_a_layer_made_again_at_the_same_path_is_another_image() {
        let dir = tempfile::tempdir().unwrap();
        let layer = dir.path().join("snapshots/1/fs");
        std::fs::create_dir_all(&layer).unwrap();
        let first = ImageSource::from_layers(vec![layer.clone()]).unwrap();
        let again = ImageSource::from_layers(vec![layer.clone()]).unwrap();
        assert_eq!(first.key, again.key);
        std::fs::remove_dir_all(dir.path().join("snapshots")).unwrap();
        // Another inode, or at least another change time.
        std::thread::sleep(std::time::Duration::from_millis(10));
        std::fs::create_dir_all(&layer).unwrap();
        assert_ne!(
            first.key,
            ImageSource::from_layers(vec![layer]).unwrap().key
        );
    }

    #[test]
    fn test_a_layer_that_cannot_be_looked_at_is_an_error_not_a_path_key() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("snapshots/9/fs");
        let e = ImageSource::from_layers(vec![gone]).unwrap_err();
        assert!(e.to_string().contains("snapshots/9/fs"), "{e}");
    }

    #[test]
    fn test_owner_is_containerds_writable_layer() {
        let (_dir, l) = layer_dirs(&["1"]);
        let img = ImageSource::from_mounts(&[overlay(&lower(&[&l[0]]))]).unwrap();
        assert_eq!(img.owner, Some(PathBuf::from("/u")));
        assert_eq!(ImageSource::from_layers(vec![]).unwrap().owner, None);
    }

    #[test]
    fn test_writable_bind_is_an_empty_image() {
        let m = MountSpec {
            kind: "bind".into(),
            source: "/s".into(),
            options: vec!["rbind".into(), "rw".into()],
        };
        assert!(ImageSource::from_mounts(&[m]).unwrap().layers.is_empty());
    }

    #[test]
    fn test_unknown_mount_type_is_an_error() {
        let m = MountSpec {
            kind: "nfs".into(),
            source: "x".into(),
            options: vec![],
        };
        assert!(ImageSource::from_mounts(&[m]).is_err());
        assert!(ImageSource::from_mounts(&[]).is_err());
    }
}
