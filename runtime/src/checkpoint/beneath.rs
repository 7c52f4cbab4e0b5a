//! Names resolved inside one directory, never through a symlink: how a checkpoint's
//! file delta and an archive from another host reach the files they name.
//!
//! Every directory on the way is opened with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` below one opened first (the
//! container's root, the import directory), and the last name is changed with the
//! `*at` calls relative to the parent found so, which never follow it. A symlink in
//! the tree (the Debian image's `var/run -> /run`) is an entry like any other: never
//! a way out.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The components of a member's name (`./` prefixes and `.` dropped); `None` for
/// an absolute name, a `..` component or a NUL byte.
pub fn components(name: &[u8]) -> Option<Vec<&[u8]>> {
    if name.first() == Some(&b'/') || name.contains(&0) {
        return None;
    }
    let mut out = Vec::new();
    for c in name.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

fn cstr(name: &[u8]) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Opens the directory `path` (trusted: the runtime's own path to the tree).
pub fn open_root(path: &Path) -> io::Result<OwnedFd> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)?;
    Ok(OwnedFd::from(f))
}

/// `openat2` of `name` below `dir`: never through a symlink (the last name
/// included), never out of `dir`.
pub fn open(dir: BorrowedFd, name: &[u8], flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    let path = cstr(name)?;
    // SAFETY: open_how is a plain C struct; all-zero is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64;
    if flags & libc::O_CREAT != 0 {
        how.mode = u64::from(mode);
    }
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    loop {
        // SAFETY: `path` is a NUL-terminated string and `how` a valid open_how, both
        // alive for the call; the size passed is the struct's.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                path.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: the kernel returned a new descriptor that nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) });
        }
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) {
            return Err(e);
        }
    }
}

/// The directory `comps` below `root` (`root` itself when empty), made (mode 0755)
/// where missing when `create`. A symlink on the way fails with `ELOOP`.
pub fn dir(root: BorrowedFd, comps: &[&[u8]], create: bool) -> io::Result<OwnedFd> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY;
    let mut cur = open(root, b".", flags, 0)?;
    for c in comps {
        let next = match open(fd(&cur), c, flags, 0) {
            Err(e) if create && e.raw_os_error() == Some(libc::ENOENT) => {
                mkdir(fd(&cur), c, 0o755)?;
                open(fd(&cur), c, flags, 0)?
            }
            r => r?,
        };
        cur = next;
    }
    Ok(cur)
}

/// Borrows an owned descriptor.
pub fn fd(f: &OwnedFd) -> BorrowedFd<'_> {
    use std::os::fd::AsFd;
    f.as_fd()
}

/// `lstat` of `name` in `dir`; `None` when there is none.
pub fn lstat(dir: BorrowedFd, name: &[u8]) -> io::Result<Option<libc::stat>> {
    let path = cstr(name)?;
    // SAFETY: stat is a plain C struct the call fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor, NUL-terminated name, and a stat buffer we own.
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            path.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    match check(r) {
        Ok(()) => Ok(Some(st)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// Removes `name` in `dir` whatever it is (a directory with everything below it,
/// symlinks removed, never followed); nothing when there is none.
pub fn remove(dir: BorrowedFd, name: &[u8]) -> io::Result<()> {
    let Some(st) = lstat(dir, name)? else {
        return Ok(());
    };
    if is_dir(&st) {
        let sub = open(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        // Listed through the descriptor just opened (no path is resolved again).
        let list = std::fs::read_dir(format!("/proc/self/fd/{}", sub.as_raw_fd()))?;
        for e in list {
            let e = e?;
            remove(
                fd(&sub),
                std::os::unix::ffi::OsStrExt::as_bytes(e.file_name().as_os_str()),
            )?;
        }
        unlink(dir, name, libc::AT_REMOVEDIR)
    } else {
        unlink(dir, name, 0)
    }
}

fn unlink(dir: BorrowedFd, name: &[u8], flags: libc::c_int) -> io::Result<()> {
    let path = cstr(name)?;
    // SAFETY: valid descriptor and NUL-terminated name.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), path.as_ptr(), flags) })
}

/// `mkdirat`.
pub fn mkdir(dir: BorrowedFd, name: &[u8], mode: u32) -> io::Result<()> {
    let path = cstr(name)?;
    // SAFETY: valid descriptor and NUL-terminated name.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), path.as_ptr(), mode) })
}

/// `symlinkat`: `name` in `dir` pointing at `target` (never resolved here).
pub fn symlink(target: &[u8], dir: BorrowedFd, name: &[u8]) -> io::Result<()> {
    let (t, path) = (cstr(target)?, cstr(name)?);
    // SAFETY: valid descriptor and NUL-terminated strings.
    check(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), path.as_ptr()) })
}

/// `linkat` without following: `name` in `dir` becomes another name of
/// `from_name` in `from_dir`.
pub fn link(
    from_dir: BorrowedFd,
    from_name: &[u8],
    dir: BorrowedFd,
    name: &[u8],
) -> io::Result<()> {
    let (from, path) = (cstr(from_name)?, cstr(name)?);
    // SAFETY: valid descriptors and NUL-terminated names.
    check(unsafe {
        libc::linkat(
            from_dir.as_raw_fd(),
            from.as_ptr(),
            dir.as_raw_fd(),
            path.as_ptr(),
            0,
        )
    })
}

/// `mknodat` (device nodes and fifos).
pub fn mknod(dir: BorrowedFd, name: &[u8], mode: u32, dev: u64) -> io::Result<()> {
    let path = cstr(name)?;
    // SAFETY: valid descriptor and NUL-terminated name.
    check(unsafe { libc::mknodat(dir.as_raw_fd(), path.as_ptr(), mode, dev) })
}

/// `fchownat` of `name` itself (a symlink is not followed).
pub fn lchown(dir: BorrowedFd, name: &[u8], uid: u32, gid: u32) -> io::Result<()> {
    let path = cstr(name)?;
    // SAFETY: valid descriptor and NUL-terminated name.
    check(unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            path.as_ptr(),
            uid,
            gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// Sets the mode of `name` in `dir`, which the caller made and is no symlink.
pub fn chmod(dir: BorrowedFd, name: &[u8], mode: u32) -> io::Result<()> {
    let path = cstr(name)?;
    // SAFETY: valid descriptor and NUL-terminated name.
    check(unsafe { libc::fchmodat(dir.as_raw_fd(), path.as_ptr(), mode, 0) })
}

fn times(mtime: (i64, i64)) -> [libc::timespec; 2] {
    [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ]
}

/// Sets the modification time (seconds, nanoseconds) of `name` in `dir` itself.
pub fn set_mtime_at(dir: BorrowedFd, name: &[u8], mtime: (i64, i64)) -> io::Result<()> {
    let path = cstr(name)?;
    let ts = times(mtime);
    // SAFETY: valid descriptor, NUL-terminated name, and two timespecs.
    check(unsafe {
        libc::utimensat(
            dir.as_raw_fd(),
            path.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// Sets the modification time of an open file.
pub fn set_mtime(f: &File, mtime: (i64, i64)) -> io::Result<()> {
    let ts = times(mtime);
    // SAFETY: valid descriptor and two timespecs.
    check(unsafe { libc::futimens(f.as_raw_fd(), ts.as_ptr()) })
}
