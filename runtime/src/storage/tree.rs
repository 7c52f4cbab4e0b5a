//! Copying and mirroring directory trees, with everything a root file system holds:
//! regular files (reflinked where the file system can, sparse-aware otherwise), hard
//! links, symlinks, devices, fifos, sockets, ownership, modes, times and xattrs.
//!
//! [`mirror`] makes a live tree equal to a snapshot in place, so that processes that
//! have the live tree open see the snapshot's content. It leaves alone every entry that
//! is provably unchanged: on btrfs and ZFS a snapshot keeps its source's inode numbers
//! and ctimes, and any change to a file changes its ctime, so the same (inode, ctime,
//! mtime, size, mode, owner) means the same file. Its cost is one walk of both trees
//! plus the changed data (reflinked, hence cheap, on btrfs).

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::{self, File, Metadata, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::sys::stat::{mknod, Mode, SFlag};
use nix::sys::time::TimeSpec;

use crate::{Error, Result};

/// What a copy or mirror did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Entries written.
    pub copied: u64,
    /// Entries removed from the destination.
    pub removed: u64,
    /// Entries left alone because they were unchanged.
    pub unchanged: u64,
    /// Bytes of the regular files written (their lengths).
    pub bytes: u64,
}

/// Copies the tree `src` into `dst`, which must be an empty directory.
pub fn copy(src: &Path, dst: &Path) -> Result<Stats> {
    mirror(src, dst)
}

/// Makes `dst` equal to `src` in place (both are directories).
pub fn mirror(src: &Path, dst: &Path) -> Result<Stats> {
    mirror_with_fault(src, dst, "")
}

/// [`mirror`], dying at fault point `fault` (see [`super::fault`]) half-way through.
pub fn mirror_with_fault(src: &Path, dst: &Path, fault: &str) -> Result<Stats> {
    let mut m = Mirror {
        links: HashMap::new(),
        stats: Stats::default(),
        fault: fault.to_string(),
    };
    let src_meta = lstat(src)?;
    m.dir(src, dst)?;
    apply_metadata(dst, &src_meta, true)?;
    sync_xattrs(src, dst)?;
    set_times(dst, &src_meta)?;
    Ok(m.stats)
}

/// Makes the entry `dst` equal to the entry `src`, whatever their kinds: copies a file,
/// link or device, mirrors a directory, or removes `dst` when `src` does not exist.
pub fn mirror_entry(src: &Path, dst: &Path) -> Result<Stats> {
    let mut m = Mirror::new();
    m.mirror_entry(src, dst)?;
    Ok(m.stats)
}

/// Copies the metadata (owner, mode, xattrs, times) of `src` onto `dst`.
pub fn copy_metadata(src: &Path, dst: &Path) -> Result<()> {
    let s = lstat(src)?;
    apply_metadata(dst, &s, !s.file_type().is_symlink())?;
    sync_xattrs(src, dst)?;
    set_times(dst, &s)
}

/// A series of mirror operations that share what they learn about hard links, so
/// that entries linked in the source end up linked in the destination even when they
/// are mirrored one call at a time.
#[derive(Debug, Default)]
pub struct Mirror {
    /// Source inode → destination path, for hard links made in this run.
    links: HashMap<(u64, u64), PathBuf>,
    stats: Stats,
    fault: String,
}

impl Mirror {
    /// A fresh series.
    pub fn new() -> Mirror {
        Mirror::default()
    }

    /// What the series did so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// [`mirror_entry`] as part of this series.
    pub fn mirror_entry(&mut self, src: &Path, dst: &Path) -> Result<()> {
        match fs::symlink_metadata(src) {
            Ok(_) => self.entry(src, dst),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Ok(d) = fs::symlink_metadata(dst) {
                    remove(dst, &d)?;
                    self.stats.removed += 1;
                }
                Ok(())
            }
            Err(e) => Err(Error::io(format!("lstat {}", src.display()))(e)),
        }
    }
}

fn lstat(p: &Path) -> Result<Metadata> {
    fs::symlink_metadata(p).map_err(Error::io(format!("lstat {}", p.display())))
}

fn names(dir: &Path) -> Result<HashSet<OsString>> {
    let mut out = HashSet::new();
    for e in fs::read_dir(dir).map_err(Error::io(format!("read dir {}", dir.display())))? {
        out.insert(
            e.map_err(Error::io(format!("read dir {}", dir.display())))?
                .file_name(),
        );
    }
    Ok(out)
}

fn unchanged(s: &Metadata, d: &Metadata) -> bool {
    s.file_type() == d.file_type()
        && s.ino() == d.ino()
        && s.ctime() == d.ctime()
        && s.ctime_nsec() == d.ctime_nsec()
        && s.mtime() == d.mtime()
        && s.mtime_nsec() == d.mtime_nsec()
        && s.size() == d.size()
        && s.mode() == d.mode()
        && s.uid() == d.uid()
        && s.gid() == d.gid()
        && s.rdev() == d.rdev()
}

fn remove(p: &Path, meta: &Metadata) -> Result<()> {
    if meta.is_dir() {
        fs::remove_dir_all(p)
    } else {
        fs::remove_file(p)
    }
    .map_err(Error::io(format!("remove {}", p.display())))
}

impl Mirror {
    fn dir(&mut self, src: &Path, dst: &Path) -> Result<()> {
        let src_names = names(src)?;
        for name in names(dst)? {
            if !src_names.contains(&name) {
                let p = dst.join(&name);
                remove(&p, &lstat(&p)?)?;
                self.stats.removed += 1;
            }
        }
        let mut sorted: Vec<OsString> = src_names.into_iter().collect();
        sorted.sort();
        for name in sorted {
            self.entry(&src.join(&name), &dst.join(&name))?;
        }
        Ok(())
    }

    fn entry(&mut self, src: &Path, dst: &Path) -> Result<()> {
        let s = lstat(src)?;
        let d = match fs::symlink_metadata(dst) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io(format!("lstat {}", dst.display()))(e)),
        };
        // Hard-linked files are always rewritten, so that every link of a group ends
        // up on one inode again.
        let linked = !s.is_dir() && s.nlink() > 1;
        if let Some(d) = &d {
            if !linked && !s.is_dir() && unchanged(&s, d) {
                self.stats.unchanged += 1;
                return Ok(());
            }
            if s.is_dir() && d.is_dir() {
                self.dir(src, dst)?;
                apply_metadata(dst, &s, true)?;
                sync_xattrs(src, dst)?;
                set_times(dst, &s)?;
                return Ok(());
            }
            remove(dst, d)?;
            self.stats.removed += 1;
        }
        if linked {
            if let Some(first) = self.links.get(&(s.dev(), s.ino())) {
                fs::hard_link(first, dst).map_err(Error::io(format!(
                    "link {} to {}",
                    dst.display(),
                    first.display()
                )))?;
                self.count_copy();
                return Ok(());
            }
            self.links.insert((s.dev(), s.ino()), dst.to_path_buf());
        }
        self.create(src, dst, &s)?;
        self.count_copy();
        Ok(())
    }

    /// Counts one entry copied (or linked). The third one is the fault point: every
    /// path that counts must pass here, or a fault could be stepped over.
    fn count_copy(&mut self) {
        self.stats.copied += 1;
        if self.stats.copied == 3 && !self.fault.is_empty() {
            super::fault::point(&self.fault);
        }
    }

    fn create(&mut self, src: &Path, dst: &Path, s: &Metadata) -> Result<()> {
        let ft = s.file_type();
        if ft.is_dir() {
            fs::create_dir(dst).map_err(Error::io(format!("mkdir {}", dst.display())))?;
            self.dir(src, dst)?;
        } else if ft.is_symlink() {
            let target =
                fs::read_link(src).map_err(Error::io(format!("readlink {}", src.display())))?;
            std::os::unix::fs::symlink(&target, dst)
                .map_err(Error::io(format!("symlink {}", dst.display())))?;
        } else if ft.is_file() {
            copy_file(src, dst, s.len())?;
            self.stats.bytes += s.len();
        } else {
            let kind = SFlag::from_bits_truncate(s.mode() & libc::S_IFMT);
            mknod(
                dst,
                kind,
                Mode::from_bits_truncate(s.mode() & 0o7777),
                s.rdev(),
            )
            .map_err(Error::sys(format!("mknod {}", dst.display())))?;
        }
        apply_metadata(dst, s, !ft.is_symlink())?;
        sync_xattrs(src, dst)?;
        set_times(dst, s)
    }
}

nix::ioctl_write_int!(ficlone, 0x94, 9);

fn copy_file(src: &Path, dst: &Path, len: u64) -> Result<()> {
    let from = File::open(src).map_err(Error::io(format!("open {}", src.display())))?;
    let to = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dst)
        .map_err(Error::io(format!("create {}", dst.display())))?;
    // SAFETY: FICLONE takes the source fd as its argument; both fds are open files
    // owned by this function for the duration of the call.
    if unsafe { ficlone(to.as_raw_fd(), from.as_raw_fd() as libc::c_ulong) }.is_ok() {
        return Ok(());
    }
    copy_sparse(&from, &to, len).map_err(Error::io(format!(
        "copy {} to {}",
        src.display(),
        dst.display()
    )))
}

/// Copies data extents only (SEEK_DATA/SEEK_HOLE), so holes stay holes.
fn copy_sparse(from: &File, to: &File, len: u64) -> io::Result<()> {
    let fi = from.as_raw_fd();
    let mut pos: i64 = 0;
    let end = len as i64;
    while pos < end {
        // SAFETY: lseek on an fd we own; no memory is passed.
        let data = unsafe { libc::lseek(fi, pos, libc::SEEK_DATA) };
        if data < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // only a hole remains
            }
            return Err(e);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fi, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        copy_range(from, to, data, hole)?;
        pos = hole;
    }
    to.set_len(len)
}

/// Copies bytes `[start, end)` at the same offsets: copy_file_range within a file
/// system, read/write across file systems (where the kernel refuses it with EXDEV).
fn copy_range(from: &File, to: &File, start: i64, end: i64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let (fi, fo) = (from.as_raw_fd(), to.as_raw_fd());
    let (mut off_in, mut off_out) = (start, start);
    while off_in < end {
        // SAFETY: the offsets point at live locals; the fds are owned files.
        let n = unsafe {
            libc::copy_file_range(
                fi,
                &mut off_in,
                fo,
                &mut off_out,
                (end - off_in) as usize,
                0,
            )
        };
        if n > 0 {
            continue;
        }
        if n == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EXDEV)
            | Some(libc::EOPNOTSUPP)
            | Some(libc::ENOSYS)
            | Some(libc::EINVAL) => break,
            _ => return Err(e),
        }
    }
    let mut buf = vec![0u8; 1 << 20];
    while off_in < end {
        let want = ((end - off_in) as usize).min(buf.len());
        let n = from.read_at(&mut buf[..want], off_in as u64)?;
        if n == 0 {
            break;
        }
        to.write_all_at(&buf[..n], off_in as u64)?;
        off_in += n as i64;
    }
    Ok(())
}

fn apply_metadata(p: &Path, s: &Metadata, chmod: bool) -> Result<()> {
    std::os::unix::fs::lchown(p, Some(s.uid()), Some(s.gid()))
        .map_err(Error::io(format!("chown {}", p.display())))?;
    if chmod {
        fs::set_permissions(p, fs::Permissions::from_mode(s.mode() & 0o7777))
            .map_err(Error::io(format!("chmod {}", p.display())))?;
    }
    Ok(())
}

fn set_times(p: &Path, s: &Metadata) -> Result<()> {
    let atime = TimeSpec::new(s.atime(), s.atime_nsec());
    let mtime = TimeSpec::new(s.mtime(), s.mtime_nsec());
    nix::sys::stat::utimensat(
        None,
        p,
        &atime,
        &mtime,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .map_err(Error::sys(format!("set times of {}", p.display())))
}

fn sync_xattrs(src: &Path, dst: &Path) -> Result<()> {
    let ctx = |what: &str, p: &Path| format!("{what} xattrs of {}", p.display());
    let wanted: Vec<OsString> = match xattr::list(src) {
        Ok(l) => l.collect(),
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(()),
        Err(e) => return Err(Error::io(ctx("list", src))(e)),
    };
    if let Ok(have) = xattr::list(dst) {
        for name in have {
            if !wanted.contains(&name) {
                let _ = xattr::remove(dst, &name);
            }
        }
    }
    for name in wanted {
        let Some(value) = xattr::get(src, &name).map_err(Error::io(ctx("read", src)))? else {
            continue;
        };
        if xattr::get(dst, &name).ok().flatten().as_deref() == Some(value.as_slice()) {
            continue;
        }
        xattr::set(dst, &name, &value).map_err(Error::io(ctx("write", dst)))?;
    }
    Ok(())
}
