//! The container's file-system delta against its image, as a tar.
//!
//! The diff walks the container's tree beside the image's (both read-only at that
//! moment: the container is frozen) and compares what `rsync` compares: type, mode,
//! owner, size, modification time (to the precision both sides keep), a symlink's
//! target, a device's number. An entry the image lacks, or that differs, goes into the
//! tar (GNU tar: hard links, sparse files, xattrs and owners kept); an image entry the
//! container lacks, or replaced by another type, is listed as deleted. A restore deletes
//! those, then unpacks the tar over a fresh copy of the image.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path};
use std::process::Command;

use crate::{Error, Result};

/// What differs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    /// Entries to write (relative, `.` for the root itself), parents before children.
    pub changed: Vec<String>,
    /// Image entries to remove first (top-most only).
    pub deleted: Vec<String>,
}

/// Compares `current` with `base` (`None`: an empty image, everything is new).
pub fn diff(base: Option<&Path>, current: &Path) -> Result<Diff> {
    let mut out = Diff::default();
    let root = meta(current)?;
    if base
        .map(|b| meta(b).map(|m| !same(&m, &root)))
        .transpose()?
        != Some(false)
    {
        out.changed.push(".".into());
    }
    walk(base, current, "", root.dev(), &mut out)?;
    Ok(out)
}

/// As [`diff`], but only for the entries `paths` names: a store's list of what may
/// differ from the image (relative, `""` for the root), every other entry being the
/// image's. A directory that is new, or replaced another kind of entry, is walked
/// whole as [`diff`] walks it: one moved in arrives in a send stream as a single
/// rename, its entries unnamed. Nothing below a name that is gone, or is not a
/// directory of this tree, is looked at (a symlink there may point anywhere).
/// `None` when the list cannot be trusted alone: a changed regular file with
/// other hard links, whose other names the list may leave out.
pub fn diff_paths(base: &Path, current: &Path, paths: &BTreeSet<String>) -> Result<Option<Diff>> {
    let mut out = Diff::default();
    let root = meta(current)?;
    let dev = root.dev();
    if !same(&meta(base)?, &root) {
        out.changed.push(".".into());
    }
    // Names whose subtree is settled: walked whole, gone, or no directory here.
    let mut settled: Vec<String> = Vec::new();
    // Sorted: a parent comes before its children.
    for p in paths.iter().filter(|p| !p.is_empty()) {
        if settled
            .iter()
            .any(|d| p.starts_with(d.as_str()) && p[d.len()..].starts_with('/'))
        {
            continue;
        }
        let (cur, was) = (current.join(p), base.join(p));
        let Ok(m) = std::fs::symlink_metadata(&cur) else {
            if std::fs::symlink_metadata(&was).is_ok() {
                out.deleted.push(p.clone());
            }
            settled.push(p.clone());
            continue;
        };
        if m.is_file() && m.nlink() > 1 {
            return Ok(None);
        }
        let old = compare(p, &cur, &m, Some(&was), &mut out);
        if !m.is_dir() || m.dev() != dev {
            settled.push(p.clone());
        } else if !old.is_some_and(|o| o.is_dir()) {
            // New, or replaced another kind of entry: nothing below is the image's.
            walk(None, &cur, p, dev, &mut out)?;
            settled.push(p.clone());
        }
    }
    Ok(Some(out))
}

fn meta(p: &Path) -> Result<std::fs::Metadata> {
    std::fs::symlink_metadata(p).map_err(Error::io(format!("stat {}", p.display())))
}

fn names(dir: &Path) -> Result<BTreeSet<OsString>> {
    let entries = std::fs::read_dir(dir).map_err(Error::io(format!("read {}", dir.display())))?;
    let mut out = BTreeSet::new();
    for e in entries {
        out.insert(
            e.map_err(Error::io(format!("read {}", dir.display())))?
                .file_name(),
        );
    }
    Ok(out)
}

fn join(rel: &str, name: &OsString) -> String {
    let name = name.to_string_lossy();
    if rel.is_empty() {
        name.into_owned()
    } else {
        format!("{rel}/{name}")
    }
}

fn walk(base: Option<&Path>, cur: &Path, rel: &str, dev: u64, out: &mut Diff) -> Result<()> {
    let here = names(cur)?;
    if let Some(b) = base {
        for gone in names(b)?.difference(&here) {
            out.deleted.push(join(rel, gone));
        }
    }
    for name in &here {
        let path = cur.join(name);
        let m = meta(&path)?;
        let sub = join(rel, name);
        let was = base.map(|b| b.join(name));
        let old = compare(&sub, &path, &m, was.as_deref(), out);
        if m.is_dir() && m.dev() == dev {
            let base_dir = match &old {
                Some(o) if o.is_dir() => was.as_deref(),
                _ => None,
            };
            walk(base_dir, &path, &sub, dev, out)?;
        }
    }
    Ok(())
}

/// Records entry `rel` (at `cur` in the container, with metadata `m`; at `was` in
/// the image, when the image can hold it there): deleted first when its kind
/// changed, changed when it differs or is new. Returns its metadata in the image.
fn compare(
    rel: &str,
    cur: &Path,
    m: &std::fs::Metadata,
    was: Option<&Path>,
    out: &mut Diff,
) -> Option<std::fs::Metadata> {
    let old = was.and_then(|w| std::fs::symlink_metadata(w).ok());
    if old.as_ref().is_some_and(|o| o.file_type() != m.file_type()) {
        out.deleted.push(rel.to_string());
    }
    let differs = match (&old, was) {
        (Some(o), Some(w)) => !same(o, m) || (m.file_type().is_symlink() && link(cur) != link(w)),
        _ => true,
    };
    if differs {
        out.changed.push(rel.to_string());
    }
    old
}

fn link(p: &Path) -> Option<std::path::PathBuf> {
    std::fs::read_link(p).ok()
}

/// Same entry, as far as metadata tells. Sub-second times are compared only when both
/// sides keep them (zfs-fuse keeps whole seconds).
fn same(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    let t = a.file_type();
    if t != b.file_type() || a.mode() != b.mode() || a.uid() != b.uid() || a.gid() != b.gid() {
        return false;
    }
    if t.is_block_device() || t.is_char_device() {
        return a.rdev() == b.rdev();
    }
    if t.is_dir() {
        // A directory's size and mtime change with its entries, which are compared
        // one by one; tar restores its mode and owner.
        return true;
    }
    let nanos_kept = a.mtime_nsec() != 0 && b.mtime_nsec() != 0;
    a.len() == b.len()
        && a.mtime() == b.mtime()
        && (!nanos_kept || a.mtime_nsec() == b.mtime_nsec())
}

/// Writes the changed entries of `current` into the tar `out`; returns its size.
pub fn write_tar(current: &Path, diff: &Diff, out: &Path) -> Result<u64> {
    let list = out.with_extension("list");
    {
        let mut f = std::fs::File::create(&list)
            .map_err(Error::io(format!("create {}", list.display())))?;
        for p in &diff.changed {
            let entry = if p == "." {
                ".".to_string()
            } else {
                format!("./{p}")
            };
            f.write_all(entry.as_bytes())
                .and_then(|()| f.write_all(b"\0"))
                .map_err(Error::io(format!("write {}", list.display())))?;
        }
    }
    let mut cmd = Command::new("tar");
    cmd.arg("-C")
        .arg(current)
        .args([
            "--create",
            "--no-recursion",
            "--null",
            "--sparse",
            "--numeric-owner",
            "--xattrs",
            "--xattrs-include=*",
            "--acls",
        ])
        .arg("--files-from")
        .arg(&list)
        .arg("--file")
        .arg(out);
    let result = run_tar(cmd, "write the file-system delta");
    let _ = std::fs::remove_file(&list);
    result?;
    Ok(std::fs::metadata(out)
        .map_err(Error::io(format!("stat {}", out.display())))?
        .len())
}

/// Makes `rootfs` (a fresh copy of the image) equal to the checkpointed tree: removes
/// `deleted`, then unpacks the tar.
pub fn apply(rootfs: &Path, deleted: &[String], tar: &Path) -> Result<()> {
    for rel in deleted {
        let p = Path::new(rel);
        if p.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(Error::BadCheckpoint {
                path: tar.to_path_buf(),
                message: format!("deleted path {rel:?} is not a plain relative path"),
            });
        }
        let target = rootfs.join(p);
        let removed = match std::fs::symlink_metadata(&target) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&target),
            Ok(_) => std::fs::remove_file(&target),
            Err(_) => Ok(()),
        };
        removed.map_err(Error::io(format!("remove {}", target.display())))?;
    }
    let mut cmd = Command::new("tar");
    cmd.arg("-C")
        .arg(rootfs)
        .args([
            "--extract",
            "--preserve-permissions",
            "--same-owner",
            "--numeric-owner",
            "--xattrs",
            "--xattrs-include=*",
            "--acls",
        ])
        .arg("--file")
        .arg(tar);
    run_tar(cmd, "apply the file-system delta")
}

fn run_tar(mut cmd: Command, what: &str) -> Result<()> {
    let out = cmd
        .output()
        .map_err(Error::io(format!("{what}: run tar")))?;
    if out.status.success() {
        return Ok(());
    }
    let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if message.contains("No space left") {
        return Err(Error::PoolFull {
            command: format!("tar ({what})"),
            message,
        });
    }
    Err(Error::Command {
        command: format!("tar ({what})"),
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn write(p: &Path, s: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, s).unwrap();
    }

    #[test]
    fn delta_applied_to_the_image_gives_the_changed_tree() {
        let t = tempfile::tempdir().unwrap();
        let (base, cur, out) = (
            t.path().join("base"),
            t.path().join("cur"),
            t.path().join("out"),
        );
        for d in [&base, &out] {
            write(&d.join("keep"), "same");
            write(&d.join("edit"), "old");
            write(&d.join("gone/deep/file"), "x");
            write(&d.join("becomes_dir"), "file");
            write(&d.join("mode"), "m");
        }
        // The container's tree: a snapshot of the image (times kept), then changed.
        assert!(Command::new("cp")
            .arg("-a")
            .arg(&base)
            .arg(&cur)
            .status()
            .unwrap()
            .success());
        write(&cur.join("edit"), "new content");
        std::fs::remove_dir_all(cur.join("gone")).unwrap();
        std::fs::remove_file(cur.join("becomes_dir")).unwrap();
        write(&cur.join("becomes_dir/inner"), "in");
        write(&cur.join("new/dir/file"), "fresh");
        std::fs::set_permissions(cur.join("mode"), std::fs::Permissions::from_mode(0o600)).unwrap();
        symlink("edit", cur.join("link")).unwrap();
        std::fs::hard_link(cur.join("new/dir/file"), cur.join("hard")).unwrap();

        let d = diff(Some(&base), &cur).unwrap();
        assert!(!d.changed.contains(&"keep".to_string()), "{d:?}");
        assert!(d.deleted.contains(&"gone".to_string()), "{d:?}");
        assert!(!d.deleted.iter().any(|p| p.starts_with("gone/")), "{d:?}");
        let tar = t.path().join("d.tar");
        write_tar(&cur, &d, &tar).unwrap();
        apply(&out, &d.deleted, &tar).unwrap();

        assert_eq!(
            std::fs::read_to_string(out.join("edit")).unwrap(),
            "new content"
        );
        assert_eq!(std::fs::read_to_string(out.join("keep")).unwrap(), "same");
        assert!(!out.join("gone").exists());
        assert_eq!(
            std::fs::read_to_string(out.join("becomes_dir/inner")).unwrap(),
            "in"
        );
        assert_eq!(
            std::fs::read_to_string(out.join("new/dir/file")).unwrap(),
            "fresh"
        );
        assert_eq!(
            std::fs::read_link(out.join("link")).unwrap(),
            Path::new("edit")
        );
        let m = std::fs::metadata(out.join("mode")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        let (a, b) = (
            std::fs::metadata(out.join("hard")).unwrap(),
            std::fs::metadata(out.join("new/dir/file")).unwrap(),
        );
        assert_eq!(a.ino(), b.ino(), "hard link kept");
        assert!(diff(Some(&out), &cur).unwrap().deleted.is_empty());
    }

    #[test]
    fn a_deleted_path_that_climbs_out_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let tar = t.path().join("x.tar");
        let e = apply(t.path(), &["../etc".to_string()], &tar).unwrap_err();
        assert!(e.to_string().contains("plain relative path"), "{e}");
    }
}
