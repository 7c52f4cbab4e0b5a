//! Root file systems a client mounted itself, adopted into the store.
//!
//! Docker (overlay2 and the containerd image store alike) mounts each container's
//! root file system itself and creates the task with no rootfs mounts: the spec's
//! `root.path` is the overlay dockerd mounted. Used as it is, the container would
//! have no tree in the store, so no checkpoint, rollback, fork or turn. When that
//! path is the mount point of an overlay, its options say what containerd would
//! have sent: the lower dirs are the image (Docker's `-init` layer on top), the
//! upper dir is the client's writable layer, which lives exactly as long as the
//! client's container. The store's tree is made from them like a containerd
//! container's, owned by that upper dir, and bound over the client's overlay.
//!
//! The image the store copies is the lower dirs below the top one, so that every
//! container of an image shares one copy. The top lower dir (Docker's `-init`
//! layer: `/.dockerenv`, `/etc/hosts`, ...) and whatever the client wrote in the
//! upper dir before the start (a `WORKDIR`, volume mount points) belong to this
//! container alone: they are applied onto its new tree ([`apply_top`]).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use super::layers::{ImageSource, MountSpec};
use super::tree;
use crate::{Error, Result};

/// An overlay mounted by a client at a container's root path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopted {
    /// The mount's id in the reading process's mount namespace (mountinfo's first
    /// field): what lies below the store's tree once it is bound on top.
    pub mount_id: u64,
    /// The overlay's lower dirs, top first.
    pub lower: Vec<PathBuf>,
    /// Its upper dir: the client's writable layer, the tree's owner.
    pub upper: PathBuf,
}

impl Adopted {
    /// Finds, in a mountinfo table, the topmost mount at `root` and returns it if it
    /// is an overlay with an upper dir. Relative layer paths (Docker's overlay2 mounts
    /// with paths relative to its `overlay2` dir when the options would be too long)
    /// are taken relative to the directory two levels above `root`
    /// (`<overlay2>/<layer>/merged`).
    pub fn find(mountinfo: &str, root: &Path) -> Option<Adopted> {
        Adopted::of(&MountInfo::top(mountinfo, root)?, root)
    }

    /// The overlay of mount `id` at `root` in a mountinfo table, if it is still
    /// mounted there (below the store's tree, once adopted).
    pub fn find_mounted(mountinfo: &str, root: &Path, id: u64) -> Option<Adopted> {
        let m = mountinfo
            .lines()
            .filter_map(MountInfo::parse)
            .find(|m| m.id == id && m.mount_point == root)?;
        Adopted::of(&m, root)
    }

    fn of(top: &MountInfo, root: &Path) -> Option<Adopted> {
        if top.fstype != "overlay" {
            return None;
        }
        let base = root.parent().and_then(Path::parent).unwrap_or(root);
        let resolve = |p: &str| {
            let p = PathBuf::from(p);
            if p.is_absolute() {
                p
            } else {
                base.join(p)
            }
        };
        let mut lower = Vec::new();
        let mut upper = None;
        for o in &top.super_options {
            if let Some(l) = o.strip_prefix("lowerdir=") {
                lower.extend(l.split(':').filter(|s| !s.is_empty()).map(resolve));
            } else if let Some(l) = o.strip_prefix("lowerdir+=") {
                lower.push(resolve(l));
            } else if let Some(u) = o.strip_prefix("upperdir=") {
                upper = Some(resolve(u));
            }
        }
        Some(Adopted {
            mount_id: top.id,
            lower,
            upper: upper?,
        })
    }

    /// The overlay adopted for the tree whose owner (the client's upper dir) is
    /// `upper`, read again without its mount, which the store's tree covers once the
    /// container runs (an export needs the image to compute the file delta):
    /// Docker's overlay2 keeps a layer's lower dirs, top first, in the `lower` file
    /// beside its `diff`, named relative to the `overlay2` dir (`l/<short>`, links
    /// to the layers' `diff` dirs).
    pub fn from_owner(upper: &Path) -> Result<Adopted> {
        let layer = upper.parent().filter(|_| upper.ends_with("diff"));
        let (Some(layer), Some(overlay2)) = (layer, layer.and_then(Path::parent)) else {
            return Err(not_overlay2(upper, "not an overlay2 layer's diff dir"));
        };
        let file = layer.join("lower");
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            // The bottom layer of an image has no lower dirs.
            Err(e) if e.kind() == ErrorKind::NotFound => String::new(),
            Err(e) => return Err(Error::io(format!("read {}", file.display()))(e)),
        };
        let mut lower = Vec::new();
        for name in text.trim().split(':').filter(|s| !s.is_empty()) {
            let path = Path::new(name);
            if path.is_absolute()
                || path
                    .components()
                    .any(|c| !matches!(c, std::path::Component::Normal(_)))
            {
                return Err(not_overlay2(upper, &format!("lower dir {name:?}")));
            }
            lower.push(overlay2.join(path));
        }
        Ok(Adopted {
            mount_id: 0,
            lower,
            upper: upper.to_path_buf(),
        })
    }

    /// The image the store copies (an overlay of every lower dir but the top one,
    /// owned by the upper dir) and the layers of this container alone, top first,
    /// to apply onto a new tree: the upper dir when the client wrote in it, and the
    /// top lower dir.
    pub fn split(&self, upper_has_files: bool) -> (MountSpec, Vec<PathBuf>) {
        let (top, image) = match self.lower.as_slice() {
            [top, rest @ ..] if !rest.is_empty() => (vec![top.clone()], rest.to_vec()),
            all => (Vec::new(), all.to_vec()),
        };
        let mut layers = Vec::new();
        if upper_has_files {
            layers.push(self.upper.clone());
        }
        layers.extend(top);
        let lowerdir: Vec<String> = image.iter().map(|p| p.display().to_string()).collect();
        let spec = MountSpec {
            kind: "overlay".into(),
            source: "overlay".into(),
            options: vec![
                format!("lowerdir={}", lowerdir.join(":")),
                format!("upperdir={}", self.upper.display()),
            ],
        };
        (spec, layers)
    }
}

fn not_overlay2(upper: &Path, why: &str) -> Error {
    Error::Storage {
        operation: "find an adopted root's image",
        message: format!(
            "{}: {why} (only Docker's overlay2 layers are known)",
            upper.display()
        ),
    }
}

/// One line of `/proc/<pid>/mountinfo`, the fields the adoption reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// Mount id.
    pub id: u64,
    /// Where it is mounted (unescaped).
    pub mount_point: PathBuf,
    /// File-system type.
    pub fstype: String,
    /// The file system's own options, each unescaped.
    pub super_options: Vec<String>,
}

impl MountInfo {
    /// The topmost mount at `mount_point` in a mountinfo table (the last one listed).
    pub fn top(mountinfo: &str, mount_point: &Path) -> Option<MountInfo> {
        mountinfo
            .lines()
            .rev()
            .filter_map(MountInfo::parse)
            .find(|m| m.mount_point == mount_point)
    }

    /// Parses one line; `None` for a malformed one.
    pub fn parse(line: &str) -> Option<MountInfo> {
        let mut fields = line.split(' ');
        let id = fields.next()?.parse().ok()?;
        let mount_point = fields.nth(3)?;
        // Optional fields end at " - ".
        let mut rest = fields.skip_while(|f| *f != "-");
        rest.next()?;
        let fstype = rest.next()?;
        let _source = rest.next()?;
        let super_options = rest.next().unwrap_or("");
        Some(MountInfo {
            id,
            mount_point: PathBuf::from(unescape(mount_point)),
            fstype: unescape(fstype),
            super_options: super_options.split(',').map(unescape).collect(),
        })
    }
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\054` for a comma, ...).
/// The one parser of those escapes: the inspector's and the cgroup view's
/// mountinfo readers use it too.
pub(crate) fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let digits = &b[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Makes the new tree `live` (a copy of `image`) show what the overlay of `top`
/// (top first) over `image` shows: for every path in a `top` layer, the entry of
/// that overlay, with overlay's own whiteouts and opaque dirs, read through a
/// read-only overlay mount at `view` (an empty directory). Only the paths the top
/// layers name are visited, so the cost follows their size, not the image's.
pub fn apply_top(live: &Path, image: &ImageSource, top: &[PathBuf], view: &Path) -> Result<()> {
    if top.is_empty() {
        return Ok(());
    }
    let mut layers = top.to_vec();
    layers.extend(image.layers.iter().cloned());
    let _mounted = ImageSource::from_layers(layers)?.mount_readonly(view)?;
    let mut mirror = tree::Mirror::new();
    apply_dir(&mut mirror, view, live, top, Path::new(""))
}

fn apply_dir(
    mirror: &mut tree::Mirror,
    view: &Path,
    live: &Path,
    top: &[PathBuf],
    rel: &Path,
) -> Result<()> {
    let mut in_top = BTreeSet::new();
    for t in top {
        in_top.extend(names(&t.join(rel))?);
    }
    // A live entry the view lacks and no top layer names was hidden by an opaque dir.
    let mut all = in_top.clone();
    all.extend(names(&live.join(rel))?);
    for name in all {
        let p = rel.join(&name);
        let (v, l) = (view.join(&p), live.join(&p));
        let (vm, lm) = (std::fs::symlink_metadata(&v), std::fs::symlink_metadata(&l));
        if !in_top.contains(&name) {
            if matches!(&vm, Err(e) if e.kind() == ErrorKind::NotFound) {
                mirror.mirror_entry(&v, &l)?;
            }
            continue;
        }
        match (vm, lm) {
            (Ok(a), Ok(b)) if a.is_dir() && b.is_dir() => {
                tree::copy_metadata(&v, &l)?;
                apply_dir(mirror, view, live, top, &p)?;
            }
            _ => mirror.mirror_entry(&v, &l)?,
        }
    }
    Ok(())
}

/// The names in `dir`; none when it is missing or no directory.
fn names(dir: &Path) -> Result<Vec<OsString>> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()
            .map_err(Error::io(format!("read {}", dir.display()))),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
            Ok(Vec::new())
        }
        Err(e) => Err(Error::io(format!("read {}", dir.display()))(e)),
    }
}

/// Whether directory `dir` holds anything (a missing one does not).
pub fn has_files(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real lines: Docker 26's overlay2 (abridged ids), then the shim's bind on top.
    const DOCKER: &str = "\
24 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
311 24 254:0 /var/lib/crab/docker /var/lib/crab/docker rw,relatime shared:140 - ext4 /dev/vda rw
402 311 0:61 / /var/lib/crab/docker/overlay2/6f1e/merged rw,relatime shared:150 - overlay overlay rw,lowerdir=/var/lib/crab/docker/overlay2/l/ABC:/var/lib/crab/docker/overlay2/l/DEF:/var/lib/crab/docker/overlay2/l/GHI,upperdir=/var/lib/crab/docker/overlay2/6f1e/diff,workdir=/var/lib/crab/docker/overlay2/6f1e/work,index=off
";

    fn merged() -> &'static Path {
        Path::new("/var/lib/crab/docker/overlay2/6f1e/merged")
    }

    #[test]
    fn test_dockers_overlay_is_found_with_its_layers_and_upper_dir() {
        let a = Adopted::find(DOCKER, merged()).unwrap();
        assert_eq!(a.mount_id, 402);
        assert_eq!(
            a.lower,
            ["ABC", "DEF", "GHI"]
                .map(|l| PathBuf::from(format!("/var/lib/crab/docker/overlay2/l/{l}")))
        );
        assert_eq!(
            a.upper,
            PathBuf::from("/var/lib/crab/docker/overlay2/6f1e/diff")
        );
        assert_eq!(
            Adopted::find(DOCKER, Path::new("/var/lib/crab/docker")),
            None
        );
        assert_eq!(Adopted::find(DOCKER, Path::new("/elsewhere")), None);
    }

    #[test]
    fn test_the_topmost_mount_decides() {
        let bound = format!(
            "{DOCKER}777 402 0:40 /containers/moby/x /var/lib/crab/docker/overlay2/6f1e/merged rw shared:150 - btrfs /dev/loop0 rw\n"
        );
        assert_eq!(Adopted::find(&bound, merged()), None);
    }

    #[test]
    fn test_the_clients_overlay_is_found_by_its_id_below_the_stores_tree() {
        let bound = format!(
            "{DOCKER}777 402 0:40 /containers/moby/x /var/lib/crab/docker/overlay2/6f1e/merged rw shared:150 - btrfs /dev/loop0 rw\n"
        );
        let a = Adopted::find_mounted(&bound, merged(), 402).unwrap();
        assert_eq!(Some(a), Adopted::find(DOCKER, merged()));
        assert_eq!(
            Adopted::find_mounted(&bound, merged(), 777),
            None,
            "not an overlay"
        );
        assert_eq!(
            Adopted::find_mounted(&bound, Path::new("/elsewhere"), 402),
            None
        );
        assert_eq!(
            Adopted::find_mounted(DOCKER, merged(), 403),
            None,
            "unmounted"
        );
    }

    #[test]
    fn test_relative_layers_and_lowerdir_plus_and_escapes() {
        let line = "90 24 0:70 / /d/overlay2/abc/merged rw - overlay overlay rw,lowerdir+=l/A,lowerdir+=/abs\\054x,upperdir=abc/diff,workdir=abc/work\n";
        let a = Adopted::find(line, Path::new("/d/overlay2/abc/merged")).unwrap();
        assert_eq!(
            a.lower,
            [PathBuf::from("/d/overlay2/l/A"), PathBuf::from("/abs,x")]
        );
        assert_eq!(a.upper, PathBuf::from("/d/overlay2/abc/diff"));
        let spaced =
            "91 24 0:71 / /a\\040b rw - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w";
        assert!(Adopted::find(spaced, Path::new("/a b")).is_some());
    }

    #[test]
    fn test_an_overlay_without_upper_dir_is_not_adopted() {
        let line = "92 24 0:72 / /ro rw - overlay overlay ro,lowerdir=/a:/b";
        assert_eq!(Adopted::find(line, Path::new("/ro")), None);
    }

    #[test]
    fn test_split_shares_the_image_and_keeps_the_init_layer_and_writes_apart() {
        let a = Adopted::find(DOCKER, merged()).unwrap();
        let (spec, top) = a.split(false);
        let (layers, owner) = ImageSource::parse_mounts(&[spec]).unwrap();
        assert_eq!(layers, a.lower[1..]);
        assert_eq!(owner.as_ref(), Some(&a.upper));
        assert_eq!(top, [a.lower[0].clone()]);
        let (_, top) = a.split(true);
        assert_eq!(top, [a.upper.clone(), a.lower[0].clone()]);
        // One lower dir: the image itself.
        let one = Adopted {
            lower: vec!["/l".into()],
            ..a
        };
        let (spec, top) = one.split(false);
        assert_eq!(
            ImageSource::parse_mounts(&[spec]).unwrap().0,
            [PathBuf::from("/l")]
        );
        assert!(top.is_empty());
    }

    #[test]
    fn test_apply_top_makes_a_new_tree_show_the_containers_own_layers() {
        use std::fs;
        let d = tempfile::tempdir().unwrap();
        let (image, top, live, view) = (
            d.path().join("image"),
            d.path().join("top"),
            d.path().join("live"),
            d.path().join("view"),
        );
        for dir in [&image, &top, &live, &view] {
            fs::create_dir(dir).unwrap();
        }
        for (p, text) in [
            ("etc/a", "image"),
            ("etc/b", "kept"),
            ("gone", "x"),
            ("opq/x", "x"),
        ] {
            fs::create_dir_all(image.join(p).parent().unwrap()).unwrap();
            fs::write(image.join(p), text).unwrap();
        }
        // Docker's init layer and the client's writes: a changed file, a new one, a
        // whiteout and an opaque dir.
        fs::create_dir_all(top.join("etc")).unwrap();
        fs::write(top.join("etc/a"), "top").unwrap();
        fs::write(top.join(".dockerenv"), "").unwrap();
        nix::sys::stat::mknod(
            &top.join("gone"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::empty(),
            0,
        )
        .unwrap();
        fs::create_dir(top.join("opq")).unwrap();
        fs::write(top.join("opq/y"), "y").unwrap();
        xattr::set(top.join("opq"), "trusted.overlay.opaque", b"y").unwrap();
        tree::copy(&image, &live).unwrap();

        let img = ImageSource::from_layers(vec![image.clone()]).unwrap();
        apply_top(&live, &img, std::slice::from_ref(&top), &view).unwrap();
        let read = |p: &str| fs::read_to_string(live.join(p)).ok();
        assert_eq!(read("etc/a").as_deref(), Some("top"));
        assert_eq!(read("etc/b").as_deref(), Some("kept"));
        assert_eq!(read(".dockerenv").as_deref(), Some(""));
        assert_eq!(read("gone"), None, "whiteout");
        assert_eq!(read("opq/x"), None, "hidden by the opaque dir");
        assert_eq!(read("opq/y").as_deref(), Some("y"));
        assert_eq!(fs::read_to_string(image.join("etc/a")).unwrap(), "image");
        assert!(
            fs::read_dir(&view).unwrap().next().is_none(),
            "view unmounted"
        );
    }

    #[test]
    fn test_the_adopted_overlay_is_read_again_from_its_owners_lower_file() {
        use std::fs;
        let tmp = tempfile::tempdir().unwrap();
        let overlay2 = tmp.path().join("overlay2");
        let upper = overlay2.join("6f1e/diff");
        fs::create_dir_all(&upper).unwrap();
        fs::write(overlay2.join("6f1e/lower"), "l/ABC:l/DEF:l/GHI\n").unwrap();
        let a = Adopted::from_owner(&upper).unwrap();
        let found = Adopted::find(DOCKER, merged()).unwrap();
        let relative = |a: &Adopted| -> Vec<PathBuf> {
            a.lower
                .iter()
                .map(|l| {
                    l.iter()
                        .rev()
                        .take(2)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect()
                })
                .collect()
        };
        assert_eq!(
            relative(&a),
            relative(&found),
            "the mount's layers, top first"
        );
        assert_eq!(a.lower[0], overlay2.join("l/ABC"));
        assert_eq!(a.upper, upper);
        // An image's bottom layer has no lower file; a name out of overlay2 and a
        // dir that is no layer's diff are refused.
        fs::remove_file(overlay2.join("6f1e/lower")).unwrap();
        assert!(Adopted::from_owner(&upper).unwrap().lower.is_empty());
        fs::write(overlay2.join("6f1e/lower"), "l/ABC:../../etc").unwrap();
        assert!(Adopted::from_owner(&upper).is_err());
        fs::write(overlay2.join("6f1e/lower"), "/etc").unwrap();
        assert!(Adopted::from_owner(&upper).is_err());
        assert!(Adopted::from_owner(&overlay2.join("6f1e")).is_err());
    }

    #[test]
    fn test_unescape() {
        assert_eq!(unescape("a\\040b\\134c"), "a b\\c");
        assert_eq!(unescape("tail\\04"), "tail\\04");
    }
}
