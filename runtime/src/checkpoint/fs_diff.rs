//! The container's file-system delta against its image, as a tar.
//!
//! The diff walks the container's tree beside the image's (both read-only at that
//! moment: the container is frozen) and compares what `rsync` compares: type, mode,
//! owner, size, modification time (to the precision both sides keep), a symlink's
//! target, a device's number. An entry the image lacks, or that differs, goes into the
//! tar (GNU tar: hard links, sparse files, xattrs and owners kept); an image entry the
//! container lacks, or replaced by another type, is listed as deleted. A restore deletes
//! those, then unpacks the tar over a fresh copy of the image.
//!
//! Names are bytes throughout (a name need not be UTF-8). The restore trusts neither
//! the list nor the tar (a checkpoint may come from a registry or another host): every
//! name is resolved inside the tree, never through a symlink of the tree
//! ([`super::beneath`]), and the tar is unpacked here, not by GNU tar (which follows
//! symlinks in a member's directories).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

use super::beneath;
use crate::{Error, Result};

/// A path relative to the container's root, as bytes. Stored as a JSON string when it
/// is UTF-8, else as `{"hex": "..."}`.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelPath(pub Vec<u8>);

impl RelPath {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// As a path.
    pub fn as_path(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.0))
    }
}

impl From<&str> for RelPath {
    fn from(s: &str) -> RelPath {
        RelPath(s.as_bytes().to_vec())
    }
}

impl std::fmt::Debug for RelPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "\"{}\"", self.0.escape_ascii())
    }
}

impl std::fmt::Display for RelPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.escape_ascii())
    }
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum RelPathRepr {
    Text(String),
    Bytes { hex: String },
}

impl Serialize for RelPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match std::str::from_utf8(&self.0) {
            Ok(t) => RelPathRepr::Text(t.to_string()),
            Err(_) => RelPathRepr::Bytes {
                hex: self.0.iter().map(|b| format!("{b:02x}")).collect(),
            },
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for RelPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match RelPathRepr::deserialize(d)? {
            RelPathRepr::Text(t) => Ok(RelPath(t.into_bytes())),
            RelPathRepr::Bytes { hex } => {
                let bad = || serde::de::Error::custom(format!("bad hex path {hex:?}"));
                if hex.len() % 2 != 0 {
                    return Err(bad());
                }
                (0..hex.len())
                    .step_by(2)
                    .map(|i| {
                        hex.get(i..i + 2)
                            .and_then(|h| u8::from_str_radix(h, 16).ok())
                            .ok_or_else(bad)
                    })
                    .collect::<std::result::Result<Vec<u8>, _>>()
                    .map(RelPath)
            }
        }
    }
}

/// What differs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    /// Entries to write (relative, `.` for the root itself), parents before children.
    pub changed: Vec<RelPath>,
    /// Image entries to remove first (top-most only).
    pub deleted: Vec<RelPath>,
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
    walk(base, current, b"", root.dev(), &mut out)?;
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
    let mut settled: Vec<&[u8]> = Vec::new();
    // Sorted: a parent comes before its children.
    for p in paths.iter().filter(|p| !p.is_empty()) {
        let p = p.as_bytes();
        if settled
            .iter()
            .any(|d| p.starts_with(d) && p[d.len()..].starts_with(b"/"))
        {
            continue;
        }
        let rel = RelPath(p.to_vec());
        let (cur, was) = (current.join(rel.as_path()), base.join(rel.as_path()));
        let Ok(m) = std::fs::symlink_metadata(&cur) else {
            if std::fs::symlink_metadata(&was).is_ok() {
                out.deleted.push(rel);
            }
            settled.push(p);
            continue;
        };
        if m.is_file() && m.nlink() > 1 {
            return Ok(None);
        }
        let old = compare(&rel, &cur, &m, Some(&was), &mut out);
        if !m.is_dir() || m.dev() != dev {
            settled.push(p);
        } else if !old.is_some_and(|o| o.is_dir()) {
            // New, or replaced another kind of entry: nothing below is the image's.
            walk(None, &cur, p, dev, &mut out)?;
            settled.push(p);
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

fn join(rel: &[u8], name: &OsString) -> RelPath {
    let mut out = rel.to_vec();
    if !out.is_empty() {
        out.push(b'/');
    }
    out.extend_from_slice(name.as_bytes());
    RelPath(out)
}

fn walk(base: Option<&Path>, cur: &Path, rel: &[u8], dev: u64, out: &mut Diff) -> Result<()> {
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
            walk(base_dir, &path, sub.as_bytes(), dev, out)?;
        }
    }
    Ok(())
}

/// Records entry `rel` (at `cur` in the container, with metadata `m`; at `was` in
/// the image, when the image can hold it there): deleted first when its kind
/// changed, changed when it differs or is new. Returns its metadata in the image.
fn compare(
    rel: &RelPath,
    cur: &Path,
    m: &std::fs::Metadata,
    was: Option<&Path>,
    out: &mut Diff,
) -> Option<std::fs::Metadata> {
    let old = was.and_then(|w| std::fs::symlink_metadata(w).ok());
    if old.as_ref().is_some_and(|o| o.file_type() != m.file_type()) {
        out.deleted.push(rel.clone());
    }
    let differs = match (&old, was) {
        (Some(o), Some(w)) => !same(o, m) || (m.file_type().is_symlink() && link(cur) != link(w)),
        _ => true,
    };
    if differs {
        out.changed.push(rel.clone());
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
            let entry = if p.as_bytes() == b"." {
                b".".to_vec()
            } else {
                [b"./", p.as_bytes()].concat()
            };
            f.write_all(&entry)
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
/// `deleted`, then unpacks the tar. Every name is resolved inside `rootfs`, never
/// through a symlink there; a name that would be (or climbs out, or is absolute)
/// fails the whole restore, naming it.
pub fn apply(rootfs: &Path, deleted: &[RelPath], tar: &Path) -> Result<()> {
    let root =
        beneath::open_root(rootfs).map_err(Error::io(format!("open {}", rootfs.display())))?;
    let root = beneath::fd(&root);
    for rel in deleted {
        remove_deleted(root, rel)
            .map_err(|e| member_error(tar, "deleted path", rel.as_bytes(), e))?;
    }
    extract(root, tar)
}

fn bad_member(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_string())
}

/// A member's failure: refused names and symlinks on the way are the checkpoint's
/// fault (invalid argument); anything else is the host's.
fn member_error(tar: &Path, what: &str, name: &[u8], e: std::io::Error) -> Error {
    let name = format!("\"{}\"", name.escape_ascii());
    match e.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::EXDEV) | Some(libc::ENOTDIR) => Error::BadCheckpoint {
            path: tar.to_path_buf(),
            message: format!(
                "{what} {name} resolves through a symlink, a non-directory or out of the container's tree"
            ),
        },
        None if e.kind() == std::io::ErrorKind::InvalidInput
            || e.kind() == std::io::ErrorKind::InvalidData =>
        {
            Error::BadCheckpoint {
                path: tar.to_path_buf(),
                message: format!("{what} {name}: {e}"),
            }
        }
        _ => Error::io(format!("{what} {name} of {}", tar.display()))(e),
    }
}

fn remove_deleted(root: BorrowedFd, rel: &RelPath) -> std::io::Result<()> {
    let comps = beneath::components(rel.as_bytes())
        .ok_or_else(|| bad_member("is not a plain relative path"))?;
    let Some((last, parents)) = comps.split_last() else {
        return Err(bad_member("is not a plain relative path"));
    };
    let parent = match beneath::dir(root, parents, false) {
        Ok(p) => p,
        // Nothing there: nothing to remove.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
        Err(e) => return Err(e),
    };
    beneath::remove(beneath::fd(&parent), last)
}

/// What the pax headers of one member say.
#[derive(Default)]
struct Pax(BTreeMap<Vec<u8>, Vec<u8>>);

impl Pax {
    fn of<R: Read>(entry: &mut tar::Entry<R>) -> std::io::Result<Pax> {
        let mut out = BTreeMap::new();
        if let Some(exts) = entry.pax_extensions()? {
            for e in exts {
                let e = e?;
                out.insert(e.key_bytes().to_vec(), e.value_bytes().to_vec());
            }
        }
        Ok(Pax(out))
    }

    fn get(&self, key: &str) -> Option<&[u8]> {
        self.0.get(key.as_bytes()).map(Vec::as_slice)
    }

    fn number(&self, key: &str) -> Option<u64> {
        std::str::from_utf8(self.get(key)?).ok()?.parse().ok()
    }

    /// `mtime` with its fraction, as (seconds, nanoseconds).
    fn mtime(&self) -> Option<(i64, i64)> {
        let text = std::str::from_utf8(self.get("mtime")?).ok()?;
        let (secs, frac) = text.split_once('.').unwrap_or((text, ""));
        let secs: i64 = secs.parse().ok()?;
        let digits: String = frac.chars().take(9).collect();
        let nanos = if digits.is_empty() {
            0
        } else {
            digits.parse::<i64>().ok()? * 10i64.pow(9 - digits.len() as u32)
        };
        (secs >= 0).then_some((secs, nanos))
    }

    fn xattrs(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.0.iter().filter_map(|(k, v)| {
            k.strip_prefix(b"SCHILY.xattr.")
                .map(|name| (name, v.as_slice()))
        })
    }
}

/// Unpacks the delta `tar` below `root`: regular files (sparse ones kept sparse),
/// directories, symlinks, hard links to names of the tree, device nodes and fifos,
/// with owners, modes, xattrs and modification times.
fn extract(root: BorrowedFd, tar: &Path) -> Result<()> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(tar)
        .map_err(Error::io(format!("open {}", tar.display())))?;
    let mut archive = tar::Archive::new(BufReader::new(file));
    let bad = |e: std::io::Error| Error::BadCheckpoint {
        path: tar.to_path_buf(),
        message: format!("unreadable: {e}"),
    };
    // Directories' times, set once everything below them is in place.
    let mut dirs: Vec<(Vec<u8>, (i64, i64))> = Vec::new();
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let pax = Pax::of(&mut entry).map_err(bad)?;
        let name = match pax.get("GNU.sparse.name") {
            Some(n) => n.to_vec(),
            None => entry.path_bytes().into_owned(),
        };
        place(root, &name, &mut entry, &pax, &mut dirs)
            .map_err(|e| member_error(tar, "member", &name, e))?;
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.0.len()));
    for (name, mtime) in dirs {
        let set = || -> std::io::Result<()> {
            let comps = beneath::components(&name).unwrap_or_default();
            match comps.split_last() {
                None => {
                    let d = beneath::dir(root, &[], false)?;
                    beneath::set_mtime(&File::from(d), mtime)
                }
                Some((last, parents)) => {
                    let parent = beneath::dir(root, parents, false)?;
                    beneath::set_mtime_at(beneath::fd(&parent), last, mtime)
                }
            }
        };
        set().map_err(|e| member_error(tar, "member", &name, e))?;
    }
    Ok(())
}

fn place<R: Read>(
    root: BorrowedFd,
    name: &[u8],
    entry: &mut tar::Entry<R>,
    pax: &Pax,
    dirs: &mut Vec<(Vec<u8>, (i64, i64))>,
) -> std::io::Result<()> {
    use tar::EntryType as T;
    let kind = entry.header().entry_type();
    if matches!(kind, T::XGlobalHeader) {
        return Ok(());
    }
    let comps = beneath::components(name)
        .ok_or_else(|| bad_member("is absolute or climbs out with '..'"))?;
    let h = entry.header();
    let mode = h.mode()? & 0o7777;
    let uid = pax.number("uid").unwrap_or(h.uid()?) as u32;
    let gid = pax.number("gid").unwrap_or(h.gid()?) as u32;
    let mtime = pax.mtime().unwrap_or((h.mtime()? as i64, 0));
    let Some((last, parents)) = comps.split_last() else {
        // The root itself.
        if !kind.is_dir() {
            return Err(bad_member("names the root but is not a directory"));
        }
        let d = File::from(beneath::dir(root, &[], false)?);
        set_meta(&d, uid, gid, mode, pax)?;
        dirs.push((name.to_vec(), mtime));
        return Ok(());
    };
    let parent = beneath::dir(root, parents, true)?;
    let at = beneath::fd(&parent);
    match kind {
        T::Regular | T::Continuous | T::GNUSparse => {
            beneath::remove(at, last)?;
            let f = beneath::open(
                at,
                last,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                0o600,
            )?;
            let mut f = File::from(f);
            if pax.get("GNU.sparse.major") == Some(b"1") {
                let size = pax
                    .number("GNU.sparse.realsize")
                    .or_else(|| pax.number("GNU.sparse.size"))
                    .ok_or_else(|| bad_member("sparse without a size"))?;
                write_sparse(entry, &mut f, size)?;
            } else if pax.get("GNU.sparse.major").is_some() || pax.get("GNU.sparse.map").is_some() {
                return Err(bad_member("sparse format other than 1.0"));
            } else {
                std::io::copy(entry, &mut f)?;
            }
            set_meta(&f, uid, gid, mode, pax)?;
            beneath::set_mtime(&f, mtime)?;
        }
        T::Directory => {
            match beneath::lstat(at, last)? {
                Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {}
                Some(_) => {
                    beneath::remove(at, last)?;
                    beneath::mkdir(at, last, 0o700)?;
                }
                None => beneath::mkdir(at, last, 0o700)?,
            }
            let d = beneath::open(at, last, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
            set_meta(&File::from(d), uid, gid, mode, pax)?;
            dirs.push((name.to_vec(), mtime));
        }
        T::Symlink => {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| bad_member("symlink without a target"))?
                .into_owned();
            beneath::remove(at, last)?;
            beneath::symlink(&target, at, last)?;
            beneath::lchown(at, last, uid, gid)?;
            beneath::set_mtime_at(at, last, mtime)?;
        }
        T::Link => {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| bad_member("hard link without a target"))?
                .into_owned();
            let tcomps = beneath::components(&target)
                .ok_or_else(|| bad_member("hard link to a name out of the tree"))?;
            let Some((tlast, tparents)) = tcomps.split_last() else {
                return Err(bad_member("hard link to the root"));
            };
            let tdir = beneath::dir(root, tparents, false)?;
            // The target itself must be in the tree, not behind a symlink.
            if beneath::lstat(beneath::fd(&tdir), tlast)?
                .is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
            {
                return Err(bad_member("hard link to a directory"));
            }
            beneath::remove(at, last)?;
            beneath::link(beneath::fd(&tdir), tlast, at, last)?;
        }
        T::Char | T::Block | T::Fifo => {
            let fmt = match kind {
                T::Char => libc::S_IFCHR,
                T::Block => libc::S_IFBLK,
                _ => libc::S_IFIFO,
            };
            let dev = match kind {
                T::Fifo => 0,
                _ => libc::makedev(
                    h.device_major()?.unwrap_or(0),
                    h.device_minor()?.unwrap_or(0),
                ),
            };
            beneath::remove(at, last)?;
            beneath::mknod(at, last, fmt | (mode & 0o777), dev)?;
            beneath::lchown(at, last, uid, gid)?;
            beneath::chmod(at, last, mode)?;
            beneath::set_mtime_at(at, last, mtime)?;
        }
        other => {
            return Err(bad_member(&format!(
                "entry of kind {other:?} is not allowed"
            )))
        }
    }
    Ok(())
}

/// Owner first (a chown clears set-id bits and file capabilities), then mode, then
/// xattrs.
fn set_meta(f: &File, uid: u32, gid: u32, mode: u32, pax: &Pax) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::os::unix::fs::fchown(f, Some(uid), Some(gid))?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    for (name, value) in pax.xattrs() {
        xattr::FileExt::set_xattr(f, OsStr::from_bytes(name), value)?;
    }
    Ok(())
}

/// Most chunks a sparse member may list.
const SPARSE_MAX_CHUNKS: u64 = 1 << 20;

/// A member in GNU tar's sparse format 1.0: a map (decimal lines: the count, then an
/// offset and a size per chunk, padded to 512 bytes), then the chunks' data.
fn write_sparse<R: Read>(data: &mut R, f: &mut File, size: u64) -> std::io::Result<()> {
    let mut reader = BufReader::new(data);
    let mut consumed = 0u64;
    let mut number = |r: &mut BufReader<&mut R>| -> std::io::Result<u64> {
        let mut line = Vec::new();
        (&mut *r).take(32).read_until(b'\n', &mut line)?;
        consumed += line.len() as u64;
        std::str::from_utf8(line.strip_suffix(b"\n").unwrap_or(&line))
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| bad_member("bad sparse map"))
    };
    let count = number(&mut reader)?;
    if count > SPARSE_MAX_CHUNKS {
        return Err(bad_member("sparse map too long"));
    }
    let mut chunks = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let (offset, len) = (number(&mut reader)?, number(&mut reader)?);
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(bad_member("sparse chunk beyond the file's size"));
        }
        chunks.push((offset, len));
    }
    let pad = (512 - consumed % 512) % 512;
    std::io::copy(&mut (&mut reader).take(pad), &mut std::io::sink())?;
    for (offset, len) in chunks {
        f.seek(SeekFrom::Start(offset))?;
        let copied = std::io::copy(&mut (&mut reader).take(len), f)?;
        if copied != len {
            return Err(bad_member("sparse data shorter than its map"));
        }
    }
    f.set_len(size)
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
        assert!(!d.changed.contains(&"keep".into()), "{d:?}");
        assert!(d.deleted.contains(&"gone".into()), "{d:?}");
        assert!(
            !d.deleted.iter().any(|p| p.as_bytes().starts_with(b"gone/")),
            "{d:?}"
        );
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
        let e = apply(t.path(), &["../etc".into()], &tar).unwrap_err();
        assert!(e.to_string().contains("plain relative path"), "{e}");
        assert_eq!(e.kind(), crate::error::ErrorKind::InvalidArgument);
    }

    /// A directory standing for the host, with a file of a unique name in it.
    fn host_victim(t: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
        let host = t.join("host-run");
        let name = format!("victim-{}", std::process::id());
        write(&host.join(&name), "host data");
        (host.clone(), host.join(name))
    }

    /// An image whose `var/run` is a symlink to the host's directory (as Debian's
    /// `var/run -> /run`, seen from the host).
    fn image_with_var_run(t: &Path, host: &Path) -> std::path::PathBuf {
        let rootfs = t.join("rootfs");
        std::fs::create_dir_all(rootfs.join("var")).unwrap();
        symlink(host, rootfs.join("var/run")).unwrap();
        rootfs
    }

    fn tar_of(t: &Path, build: impl FnOnce(&mut tar::Builder<File>)) -> std::path::PathBuf {
        let p = t.join("delta.tar");
        let mut b = tar::Builder::new(File::create(&p).unwrap());
        build(&mut b);
        b.finish().unwrap();
        p
    }

    /// A member with its name written as is (the builder refuses `..` and the like),
    /// mode 0644.
    fn raw(
        b: &mut tar::Builder<File>,
        name: &[u8],
        kind: tar::EntryType,
        link: &[u8],
        data: &[u8],
    ) {
        crate::checkpoint::archive_fixture::raw(b, name, kind, link, 0o644, data);
    }

    #[test]
    fn a_deleted_path_through_an_image_symlink_leaves_the_host_alone() {
        let t = tempfile::tempdir().unwrap();
        let (host, victim) = host_victim(t.path());
        let rootfs = image_with_var_run(t.path(), &host);
        let tar = tar_of(t.path(), |_| {});
        let rel = format!("var/run/{}", victim.file_name().unwrap().to_str().unwrap());
        let e = apply(&rootfs, &[rel.as_str().into()], &tar).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains("symlink"), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "host data");
        // The symlink itself may be deleted: it is the container's.
        apply(&rootfs, &["var/run".into()], &tar).unwrap();
        assert!(std::fs::symlink_metadata(rootfs.join("var/run")).is_err());
        assert!(victim.exists());
    }

    #[test]
    fn a_member_through_an_image_symlink_does_not_land_on_the_host() {
        let t = tempfile::tempdir().unwrap();
        let (host, _) = host_victim(t.path());
        let rootfs = image_with_var_run(t.path(), &host);
        let tar = tar_of(t.path(), |b| {
            raw(
                b,
                b"./var/run/pwned",
                tar::EntryType::Regular,
                b"",
                b"owned",
            )
        });
        let e = apply(&rootfs, &[], &tar).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::InvalidArgument, "{e}");
        assert!(e.to_string().contains("var/run/pwned"), "{e}");
        assert!(!host.join("pwned").exists());
    }

    #[test]
    fn a_symlink_member_then_a_member_through_it_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let (host, _) = host_victim(t.path());
        let rootfs = t.path().join("rootfs");
        std::fs::create_dir_all(&rootfs).unwrap();
        let tar = tar_of(t.path(), |b| {
            let target = host.as_os_str().as_bytes();
            raw(b, b"./esc", tar::EntryType::Symlink, target, b"");
            raw(b, b"./esc/pwned", tar::EntryType::Regular, b"", b"owned");
        });
        let e = apply(&rootfs, &[], &tar).unwrap_err();
        assert!(e.to_string().contains("esc/pwned"), "{e}");
        assert!(!host.join("pwned").exists());
        // The symlink was placed, as the container had it, and points where it did.
        assert_eq!(std::fs::read_link(rootfs.join("esc")).unwrap(), host);
    }

    #[test]
    fn names_out_of_the_tree_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let (host, victim) = host_victim(t.path());
        let rootfs = image_with_var_run(t.path(), &host);
        let abs = host.join("abs");
        let cases: Vec<(Vec<u8>, tar::EntryType, Vec<u8>)> = vec![
            (
                abs.as_os_str().as_bytes().to_vec(),
                tar::EntryType::Regular,
                vec![],
            ),
            (b"../../escape".to_vec(), tar::EntryType::Regular, vec![]),
            (
                b"./hard".to_vec(),
                tar::EntryType::Link,
                victim.as_os_str().as_bytes().to_vec(),
            ),
            (
                b"./hard".to_vec(),
                tar::EntryType::Link,
                b"../host-run/x".to_vec(),
            ),
            (
                b"./hard".to_vec(),
                tar::EntryType::Link,
                [
                    b"var/run/".as_slice(),
                    victim.file_name().unwrap().as_bytes(),
                ]
                .concat(),
            ),
        ];
        for (name, kind, link) in cases {
            let tar = tar_of(t.path(), |b| raw(b, &name, kind, &link, b"x"));
            let e = apply(&rootfs, &[], &tar).unwrap_err();
            assert_eq!(e.kind(), crate::error::ErrorKind::InvalidArgument, "{e}");
            assert!(!rootfs.join("hard").exists());
        }
        assert!(!abs.exists());
        assert!(!t.path().join("escape").exists());
        assert_eq!(std::fs::metadata(&victim).unwrap().nlink(), 1);
    }

    #[test]
    fn names_that_are_not_utf8_are_created_changed_and_deleted() {
        use std::os::unix::ffi::OsStrExt;
        let t = tempfile::tempdir().unwrap();
        let (base, out) = (t.path().join("base"), t.path().join("out"));
        let n = |b: &[u8]| OsStr::from_bytes(b).to_os_string();
        for d in [&base, &out] {
            write(&d.join(n(b"changed\xff")), "old");
            write(&d.join(n(b"gone\xfe")), "x");
            write(&d.join(n(b"dir\xfd/gone\xff")), "x");
        }
        let cur = t.path().join("cur");
        assert!(Command::new("cp")
            .arg("-a")
            .arg(&base)
            .arg(&cur)
            .status()
            .unwrap()
            .success());
        write(&cur.join(n(b"changed\xff")), "new content");
        std::fs::remove_file(cur.join(n(b"gone\xfe"))).unwrap();
        std::fs::remove_file(cur.join(n(b"dir\xfd/gone\xff"))).unwrap();
        write(&cur.join(n(b"new\xff/\xff")), "fresh");

        let d = diff(Some(&base), &cur).unwrap();
        assert!(d.deleted.contains(&RelPath(b"gone\xfe".to_vec())), "{d:?}");
        assert!(
            d.deleted.contains(&RelPath(b"dir\xfd/gone\xff".to_vec())),
            "{d:?}"
        );
        // The manifest keeps them exactly.
        let part = crate::checkpoint::FsPart {
            deleted: d.deleted.clone(),
            ..Default::default()
        };
        let json = serde_json::to_string(&part).unwrap();
        let back: crate::checkpoint::FsPart = serde_json::from_str(&json).unwrap();
        assert_eq!(back, part, "{json}");
        let tar = t.path().join("d.tar");
        write_tar(&cur, &d, &tar).unwrap();
        apply(&out, &back.deleted, &tar).unwrap();

        assert_eq!(
            std::fs::read_to_string(out.join(n(b"changed\xff"))).unwrap(),
            "new content"
        );
        assert!(!out.join(n(b"gone\xfe")).exists());
        assert!(!out.join(n(b"dir\xfd/gone\xff")).exists());
        assert_eq!(
            std::fs::read_to_string(out.join(n(b"new\xff/\xff"))).unwrap(),
            "fresh"
        );
        let again = diff(Some(&out), &cur).unwrap();
        assert!(again.deleted.is_empty(), "{again:?}");
    }

    #[test]
    fn sparse_files_owners_and_xattrs_survive_the_delta() {
        let t = tempfile::tempdir().unwrap();
        let (cur, out) = (t.path().join("cur"), t.path().join("out"));
        std::fs::create_dir_all(&cur).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        let sparse = cur.join("sparse");
        let f = File::create(&sparse).unwrap();
        f.set_len(64 << 20).unwrap();
        let mut f = f;
        f.seek(SeekFrom::Start(5 << 20)).unwrap();
        f.write_all(b"middle").unwrap();
        drop(f);
        write(&cur.join("owned"), "o");
        std::os::unix::fs::chown(cur.join("owned"), Some(1234), Some(4321)).unwrap();
        std::fs::set_permissions(cur.join("owned"), std::fs::Permissions::from_mode(0o4750))
            .unwrap();
        let xattrs = xattr::set(cur.join("owned"), "user.crab", b"value").is_ok();

        let d = diff(None, &cur).unwrap();
        let tar = t.path().join("d.tar");
        write_tar(&cur, &d, &tar).unwrap();
        apply(&out, &d.deleted, &tar).unwrap();

        let m = std::fs::metadata(out.join("sparse")).unwrap();
        assert_eq!(m.len(), 64 << 20);
        assert!(m.blocks() * 512 < 1 << 20, "sparse: {} blocks", m.blocks());
        let mut content = vec![0u8; 6];
        let mut f = File::open(out.join("sparse")).unwrap();
        f.seek(SeekFrom::Start(5 << 20)).unwrap();
        f.read_exact(&mut content).unwrap();
        assert_eq!(&content, b"middle");
        let m = std::fs::metadata(out.join("owned")).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (1234, 4321, 0o4750));
        if xattrs {
            assert_eq!(
                xattr::get(out.join("owned"), "user.crab")
                    .unwrap()
                    .as_deref(),
                Some(b"value".as_slice())
            );
        }
        let a = std::fs::metadata(cur.join("owned")).unwrap();
        assert_eq!((a.mtime(), a.mtime_nsec()), (m.mtime(), m.mtime_nsec()));
    }
}
