//! An adopted tree's changes, written back into the client's writable layer.
//!
//! Docker reads a container's changes from its graph driver's writable layer
//! (overlay2's upper dir): `docker commit` and `docker diff` do. An adopted
//! container ([`super::adopt`]) writes into Crab's tree instead, bound over
//! Docker's overlay, so that layer keeps only what it held at the start, and a
//! commit missed every write. The shim writes the tree's changes back, in
//! overlay's own format, when Docker may read them: when the container is paused
//! (`docker commit` pauses it first) and when its task is deleted (a commit of a
//! stopped container).
//!
//! What goes in: every entry of the tree that differs from the overlay of the
//! client's lower dirs (the comparison of [`crate::checkpoint::fs_diff`]: type,
//! mode, owner, size, modification time, a link's target), with each directory
//! above it as the tree has it (a copied-up directory keeps its mode and owner),
//! and a whiteout (a 0/0 character device) for each entry of the lower dirs the
//! tree lacks. The layer is built beside the old one and exchanged with it by one
//! rename (`RENAME_EXCHANGE`): a reader sees the old layer or the new, whole. A
//! crash leaves at most the staging directory, which the next write-back removes;
//! the tree, not the layer, is what Crab keeps.
//!
//! Names come from the tree, which the sandbox wrote: the staging directory is
//! filled by [`crate::checkpoint::fs_diff::apply`], which resolves every name
//! inside it and never through a symlink, and the tree is read by `tar` without
//! following links.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::adopt::Adopted;
use super::{ContainerKey, ImageSource, Store};
use crate::checkpoint::beneath;
use crate::checkpoint::fs_diff::{self, Diff, RelPath};
use crate::config::Config;
use crate::{Error, Result};

/// What one write-back put into the layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WrittenBack {
    /// Entries the tree changed or made (directories above them not counted).
    pub changed: usize,
    /// Whiteouts: entries of the lower dirs the tree removed.
    pub deleted: usize,
}

/// Writes the tree of container `key`, adopted from a client's overlay of
/// `lower` (top first) and `upper`, back into `upper`, which must be the tree's
/// owner. Run in the helper: the lower dirs' overlay is mounted in a mount
/// namespace of its own, which goes with the helper, so that a crash leaves no
/// mount behind.
pub fn write_back_adopted(
    config: &Config,
    store: &dyn Store,
    key: &ContainerKey,
    lower: &[PathBuf],
    upper: &Path,
) -> Result<WrittenBack> {
    if store.owner(key)?.as_deref() != Some(upper) {
        return Err(Error::Storage {
            operation: "write back an adopted tree",
            message: format!("{key}: the tree is not owned by {}", upper.display()),
        });
    }
    let tree = store.rootfs(key)?;
    // The names the store finds changed since the image copy the tree was made
    // from (the lower dirs but the top one, as the adoption split them), which
    // include what the adoption applied from the top one: only those are compared.
    let adopted = Adopted {
        mount_id: 0,
        lower: lower.to_vec(),
        upper: upper.to_path_buf(),
    };
    let image = ImageSource::from_mounts(&[adopted.split(false).0])?;
    let named = store.changed_since_image(key, &image).unwrap_or_else(|e| {
        tracing::debug!(%key, error = %e, "no list of changed names: the whole tree is compared");
        None
    });
    private_mounts()?;
    let view = config
        .state_dir
        .join("write-back")
        .join(super::work::tmp_name("lowers"));
    std::fs::create_dir_all(&view).map_err(Error::io(format!("create {}", view.display())))?;
    let result = (|| {
        let _mounted = ImageSource::from_layers(lower.to_vec())?.mount_readonly(&view)?;
        write_back(&tree, &view, upper, named.as_ref())
    })();
    let _ = std::fs::remove_dir(&view);
    result
}

/// A mount namespace of this process's own, whose mounts reach no other.
fn private_mounts() -> Result<()> {
    use nix::mount::{mount, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(Error::sys("unshare the mount namespace"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(Error::sys("make the mounts private"))
}

/// Makes `upper` (the client's writable layer over `base`, the overlay of its
/// lower dirs, mounted read-only by the caller) hold the changes of `tree`.
/// `named`, when given, lists every name that may differ from `base`
/// ([`fs_diff::diff_paths`]); else the whole tree is compared.
pub fn write_back(
    tree: &Path,
    base: &Path,
    upper: &Path,
    named: Option<&BTreeSet<String>>,
) -> Result<WrittenBack> {
    let listed = match named {
        Some(names) => fs_diff::diff_paths(base, tree, names)?,
        None => None,
    };
    let diff = match listed {
        Some(diff) => diff,
        None => fs_diff::diff(Some(base), tree)?,
    };
    let staging = beside(upper, "new")?;
    let tar = beside(upper, "new.tar")?;
    remove_if_there(&staging)?;
    std::fs::create_dir(&staging).map_err(Error::io(format!("create {}", staging.display())))?;
    let filled = (|| {
        // The layer's own root keeps what the client made it with, unless the tree
        // changed its root.
        super::tree::copy_metadata(upper, &staging)?;
        let entries = Diff {
            changed: with_parents(&diff),
            deleted: Vec::new(),
        };
        fs_diff::write_tar(tree, &entries, &tar)?;
        fs_diff::apply(&staging, &[], &tar)?;
        let whiteouts = whiteouts(&diff);
        put_whiteouts(&staging, &whiteouts)?;
        Ok(whiteouts.len())
    })();
    let _ = std::fs::remove_file(&tar);
    let deleted = match filled {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    nix::fcntl::renameat2(
        None,
        &staging,
        None,
        upper,
        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
    )
    .map_err(Error::sys(format!(
        "exchange {} with {}",
        staging.display(),
        upper.display()
    )))?;
    // The old layer, under the staging name now.
    remove_if_there(&staging)?;
    Ok(WrittenBack {
        changed: diff.changed.iter().filter(|p| p.as_bytes() != b".").count(),
        deleted,
    })
}

/// `<parent>/.<name>.crab-<what>`: beside `upper`, on its file system.
fn beside(upper: &Path, what: &str) -> Result<PathBuf> {
    let (Some(parent), Some(name)) = (upper.parent(), upper.file_name()) else {
        return Err(Error::Storage {
            operation: "write back an adopted tree",
            message: format!("{}: no parent directory", upper.display()),
        });
    };
    let mut staged = OsString::from(".");
    staged.push(name);
    staged.push(format!(".crab-{what}"));
    Ok(parent.join(staged))
}

fn remove_if_there(p: &Path) -> Result<()> {
    match std::fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("remove {}", p.display()))(e)),
    }
}

/// The changed entries and every directory above a changed or deleted one,
/// parents first (a byte-wise order puts `a` before `a/b`).
fn with_parents(diff: &Diff) -> Vec<RelPath> {
    let mut all: BTreeSet<Vec<u8>> = BTreeSet::new();
    for p in diff.changed.iter().chain(&diff.deleted) {
        let bytes = p.as_bytes();
        for (i, b) in bytes.iter().enumerate() {
            if *b == b'/' {
                all.insert(bytes[..i].to_vec());
            }
        }
    }
    all.extend(diff.changed.iter().map(|p| p.as_bytes().to_vec()));
    all.into_iter()
        .filter(|p| !p.is_empty())
        .map(RelPath)
        .collect()
}

/// The deleted entries that nothing new took the place of.
fn whiteouts(diff: &Diff) -> Vec<RelPath> {
    let changed: BTreeSet<&[u8]> = diff.changed.iter().map(RelPath::as_bytes).collect();
    diff.deleted
        .iter()
        .filter(|p| !changed.contains(p.as_bytes()))
        .cloned()
        .collect()
}

/// A 0/0 character device at each of `paths` below `root` (their directories are
/// there already), owned by root as overlay makes them.
fn put_whiteouts(root: &Path, paths: &[RelPath]) -> Result<()> {
    let dir_fd = beneath::open_root(root).map_err(Error::io(format!("open {}", root.display())))?;
    for p in paths {
        let put = || -> std::io::Result<()> {
            let comps = beneath::components(p.as_bytes()).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a relative path")
            })?;
            let Some((last, parents)) = comps.split_last() else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "the root",
                ));
            };
            let parent = beneath::dir(beneath::fd(&dir_fd), parents, false)?;
            beneath::mknod(beneath::fd(&parent), last, libc::S_IFCHR, 0)
        };
        put().map_err(Error::io(format!(
            "whiteout {} in {}",
            std::ffi::OsStr::from_bytes(p.as_bytes()).to_string_lossy(),
            root.display()
        )))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

    /// `base` stands for the lower dirs' overlay, `tree` for the container's tree
    /// (a copy of it, then changed), `upper` for Docker's layer with what it held at
    /// the start.
    // Whiteouts are device nodes: root only.
    #[cfg(feature = "host-tests")]
    #[test]
    fn the_layer_holds_the_trees_changes_in_overlays_format_and_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        let (base, tree, layer) = (
            d.path().join("base"),
            d.path().join("tree"),
            d.path().join("l"),
        );
        let upper = layer.join("diff");
        for dir in [&base, &tree, &upper] {
            fs::create_dir_all(dir).unwrap();
        }
        for (p, text) in [
            ("etc/kept", "same"),
            ("etc/changed", "old"),
            ("etc/gone", "x"),
            ("usr/share/doc/a", "a"),
            ("bin/tool", "t"),
        ] {
            fs::create_dir_all(base.join(p).parent().unwrap()).unwrap();
            fs::write(base.join(p), text).unwrap();
        }
        fs::set_permissions(base.join("usr/share"), fs::Permissions::from_mode(0o751)).unwrap();
        let copy = std::process::Command::new("cp")
            .args(["-a", "--"])
            .arg(format!("{}/.", base.display()))
            .arg(&tree)
            .status()
            .unwrap();
        assert!(copy.success());
        fs::write(tree.join("etc/changed"), "new").unwrap();
        fs::remove_file(tree.join("etc/gone")).unwrap();
        fs::write(tree.join("usr/share/doc/new"), "n").unwrap();
        fs::remove_file(tree.join("bin/tool")).unwrap();
        fs::create_dir(tree.join("bin/tool")).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", tree.join("link")).unwrap();
        // What Docker's layer held at the start: gone after the write-back.
        fs::write(upper.join("stale"), "s").unwrap();

        let w = write_back(&tree, &base, &upper, None).unwrap();
        assert_eq!(
            w,
            WrittenBack {
                changed: 4,
                deleted: 1
            }
        );
        assert_eq!(
            fs::read_to_string(upper.join("etc/changed")).unwrap(),
            "new"
        );
        assert_eq!(
            fs::read_to_string(upper.join("usr/share/doc/new")).unwrap(),
            "n"
        );
        assert!(
            !upper.join("etc/kept").exists(),
            "unchanged files stay below"
        );
        assert!(!upper.join("usr/share/doc/a").exists());
        assert!(!upper.join("stale").exists());
        let gone = fs::symlink_metadata(upper.join("etc/gone")).unwrap();
        assert!(
            gone.file_type().is_char_device() && gone.rdev() == 0,
            "a whiteout"
        );
        assert!(
            upper.join("bin/tool").is_dir(),
            "a directory where a file was"
        );
        assert_eq!(
            fs::read_link(upper.join("link")).unwrap(),
            Path::new("/etc/shadow"),
            "a link is copied, not followed"
        );
        // A parent copied up keeps the tree's mode.
        let share = fs::metadata(upper.join("usr/share")).unwrap();
        assert_eq!(share.mode() & 0o7777, 0o751);
        // The store's list of changed names gives the same layer.
        let listed = layer.join("listed");
        fs::create_dir(&listed).unwrap();
        let names: BTreeSet<String> = [
            "etc/changed",
            "etc/gone",
            "usr/share/doc/new",
            "bin/tool",
            "link",
        ]
        .map(String::from)
        .into();
        let w = write_back(&tree, &base, &listed, Some(&names)).unwrap();
        assert_eq!(
            w,
            WrittenBack {
                changed: 4,
                deleted: 1
            }
        );
        assert_eq!(entries(&listed), entries(&upper));
        fs::remove_dir_all(&listed).unwrap();
        // Nothing left beside the layer.
        let mut names: Vec<_> = fs::read_dir(&layer)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["diff"]);

        // Again, after a rollback-like change: the layer follows the tree.
        fs::write(tree.join("etc/changed"), "old").unwrap();
        let base_time = fs::metadata(base.join("etc/changed"))
            .unwrap()
            .modified()
            .unwrap();
        fs::File::options()
            .write(true)
            .open(tree.join("etc/changed"))
            .unwrap()
            .set_modified(base_time)
            .unwrap();
        let w = write_back(&tree, &base, &upper, None).unwrap();
        assert_eq!(w.changed, 3);
        assert!(!upper.join("etc/changed").exists());
    }

    /// The sandbox replaces a directory of the image by a symlink out of its tree,
    /// and plants a link to the host's files: the layer gets the links as links,
    /// and nothing is written or removed through them.
    #[cfg(feature = "host-tests")]
    #[test]
    fn links_the_sandbox_planted_are_copied_never_followed() {
        let d = tempfile::tempdir().unwrap();
        let (base, tree, upper, outside) = (
            d.path().join("base"),
            d.path().join("tree"),
            d.path().join("l/diff"),
            d.path().join("outside"),
        );
        for dir in [&base, &tree, &upper, &outside] {
            fs::create_dir_all(dir).unwrap();
        }
        fs::create_dir_all(base.join("x")).unwrap();
        fs::write(base.join("x/y"), "image").unwrap();
        fs::write(outside.join("y"), "host").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("x")).unwrap();
        std::os::unix::fs::symlink(outside.join("y"), tree.join("z")).unwrap();
        let w = write_back(&tree, &base, &upper, None).unwrap();
        assert_eq!(
            w,
            WrittenBack {
                changed: 2,
                deleted: 0
            }
        );
        assert_eq!(fs::read_link(upper.join("x")).unwrap(), outside);
        assert_eq!(fs::read_link(upper.join("z")).unwrap(), outside.join("y"));
        assert_eq!(fs::read_to_string(outside.join("y")).unwrap(), "host");
        assert_eq!(entries(&outside).len(), 1, "nothing added beside it");
    }

    /// Every entry below `root`: its name, kind and mode.
    #[cfg(feature = "host-tests")]
    fn entries(root: &Path) -> Vec<(PathBuf, u32)> {
        let mut out = Vec::new();
        let mut dirs = vec![root.to_path_buf()];
        while let Some(d) = dirs.pop() {
            for e in fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let m = fs::symlink_metadata(&p).unwrap();
                if m.is_dir() {
                    dirs.push(p.clone());
                }
                out.push((p.strip_prefix(root).unwrap().to_path_buf(), m.mode()));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_leftover_staging_directory_is_replaced() {
        let d = tempfile::tempdir().unwrap();
        let (base, tree, upper) = (
            d.path().join("b"),
            d.path().join("t"),
            d.path().join("diff"),
        );
        for dir in [&base, &tree, &upper] {
            fs::create_dir_all(dir).unwrap();
        }
        let staging = beside(&upper, "new").unwrap();
        fs::create_dir_all(staging.join("junk")).unwrap();
        fs::write(tree.join("f"), "x").unwrap();
        write_back(&tree, &base, &upper, None).unwrap();
        assert_eq!(fs::read_to_string(upper.join("f")).unwrap(), "x");
        assert!(!staging.exists());
    }

    #[test]
    fn parents_come_before_their_entries() {
        let diff = Diff {
            changed: vec!["a/b/c".into(), "a-b".into()],
            deleted: vec!["x/y".into()],
        };
        let got: Vec<String> = with_parents(&diff)
            .iter()
            .map(|p| String::from_utf8(p.as_bytes().to_vec()).unwrap())
            .collect();
        assert_eq!(got, ["a", "a-b", "a/b", "a/b/c", "x"]);
    }
}
