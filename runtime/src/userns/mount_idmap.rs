//! The kernel's side of a staged bind ([`super::staged_binds`]): a detached copy
//! of a mount, idmapped with `MOUNT_ATTR_IDMAP` from a user namespace that
//! carries the mapping when the spec asks, attached where the holder of its fd
//! chooses.
//!
//! The namespace is only a carrier (the kernel reads its maps, nothing runs in
//! it): a child unshares it and waits, the caller writes its maps as the host's
//! root, opens `/proc/<child>/ns/user` and lets the child go. The open fd keeps
//! the namespace alive for as long as `mount_setattr` needs it; the mount keeps
//! its own reference after that.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::Extent;
use crate::{Error, Result};

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct MountAttr {
    /// `MOUNT_ATTR_*` flags to set.
    pub attr_set: u64,
    /// Flags to clear.
    pub attr_clr: u64,
    /// `MS_SHARED` and the like.
    pub propagation: u64,
    /// The user namespace of `MOUNT_ATTR_IDMAP`.
    pub userns_fd: u64,
}
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// A user namespace whose maps are `uids` and `gids`, held by an fd.
pub fn carrier_namespace(uids: &[Extent], gids: &[Extent]) -> Result<OwnedFd> {
    with_child_in(None, |pid| {
        let lines = |v: &[Extent]| {
            v.iter()
                .map(|e| format!("{} {} {}\n", e.inside, e.host, e.count))
                .collect::<String>()
        };
        for (file, text) in [("uid_map", lines(uids)), ("gid_map", lines(gids))] {
            let path = format!("/proc/{pid}/{file}");
            std::fs::write(&path, text).map_err(Error::io(format!("write {path}")))?;
        }
        let path = format!("/proc/{pid}/ns/user");
        let ns = File::open(&path).map_err(Error::io(format!("open {path}")))?;
        Ok(ns.into())
    })
}

/// Runs `f` with the pid of a child that waits in a user namespace: a new one
/// it unshares (`join` `None`), or the one `join` is open on. The child ends
/// when `f` returns; it runs only async-signal-safe calls, so any caller may
/// fork it.
pub fn with_child_in<T>(
    join: Option<&OwnedFd>,
    f: impl FnOnce(libc::pid_t) -> Result<T>,
) -> Result<T> {
    let (ready_r, ready_w) = pipe()?;
    let (hold_r, hold_w) = pipe()?;
    let join_fd = join.map(|j| j.as_raw_fd());
    // SAFETY: the child runs only async-signal-safe calls (close, unshare or
    // setns, write, read, _exit) on fds it inherited, so forking a
    // multi-threaded caller is sound; the parent reaps it below on every path.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Error::io("fork a child in a user namespace")(
            std::io::Error::last_os_error(),
        ));
    }
    if pid == 0 {
        // SAFETY: see above; the fds are this child's copies.
        unsafe {
            libc::close(ready_r.as_raw_fd());
            libc::close(hold_w.as_raw_fd());
            let r = match join_fd {
                Some(fd) => libc::setns(fd, libc::CLONE_NEWUSER),
                None => libc::unshare(libc::CLONE_NEWUSER),
            };
            let ok: u8 = u8::from(r == 0);
            libc::write(ready_w.as_raw_fd(), (&ok as *const u8).cast(), 1);
            let mut byte = 0u8;
            libc::read(hold_r.as_raw_fd(), (&mut byte as *mut u8).cast(), 1);
            libc::_exit(0);
        }
    }
    drop(ready_w);
    drop(hold_r);
    let mut ok = 0u8;
    // SAFETY: reads one byte into a local from an fd this process owns.
    let n = unsafe { libc::read(ready_r.as_raw_fd(), (&mut ok as *mut u8).cast(), 1) };
    let result = if n == 1 && ok == 1 {
        f(pid)
    } else {
        Err(Error::io("enter a user namespace in a child")(
            std::io::Error::other(if join.is_some() {
                "the child could not join it"
            } else {
                "the child could not unshare one"
            }),
        ))
    };
    drop(hold_w);
    let mut status = 0;
    // SAFETY: reaps the child forked above (it exits once `hold_w` is closed).
    unsafe { libc::waitpid(pid, &mut status, 0) };
    result
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array; they are owned from here on.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Error::io("pipe")(std::io::Error::last_os_error()));
    }
    // SAFETY: both fds were just made by pipe2 and nothing else owns them.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn c_path(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        Error::io(format!("path {}", p.display()))(std::io::Error::from(
            std::io::ErrorKind::InvalidInput,
        ))
    })
}

/// How the copy is made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recursion {
    /// Copy the source's submounts too (`rbind`).
    pub tree: bool,
    /// Idmap the submounts too (`ridmap`).
    pub idmap: bool,
}

/// mount_setattr(2) of the mount `fd` is open on (its whole tree for
/// `recursive`).
pub(crate) fn mount_setattr(
    fd: std::os::fd::BorrowedFd,
    attr: &MountAttr,
    recursive: bool,
) -> std::io::Result<()> {
    let empty = c"";
    let flags = libc::AT_EMPTY_PATH | if recursive { libc::AT_RECURSIVE } else { 0 };
    // SAFETY: mount_setattr reads `attr` (of the size passed) and the empty path
    // for the call; `fd` is borrowed for it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            empty.as_ptr(),
            flags,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A detached copy of the mount at `source` (with its submounts for
/// `how.tree`), its ids mapped through the namespace `userns` when one is
/// given. It is attached nowhere: only the holder of the fd can put it
/// somewhere ([`attach`]).
pub fn copy_of(source: &Path, how: Recursion, userns: Option<&OwnedFd>) -> Result<OwnedFd> {
    let src = c_path(source)?;
    let tree_flags = OPEN_TREE_CLONE
        | libc::O_CLOEXEC as libc::c_uint
        | if how.tree {
            libc::AT_RECURSIVE as libc::c_uint
        } else {
            0
        };
    // SAFETY: open_tree reads the NUL-terminated path for the call and answers a
    // new fd (or -1), owned below.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            tree_flags,
        )
    };
    if fd < 0 {
        return Err(Error::io(format!(
            "clone the mount of {}",
            source.display()
        ))(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by open_tree and nothing else owns it.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    if let Some(userns) = userns {
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_IDMAP,
            userns_fd: userns.as_raw_fd() as u64,
            ..MountAttr::default()
        };
        if let Err(e) = mount_setattr(std::os::fd::AsFd::as_fd(&tree), &attr, how.idmap) {
            let why = match e.raw_os_error() {
                Some(libc::EINVAL) => " (its file system does not support idmapped mounts)",
                _ => "",
            };
            return Err(Error::io(format!(
                "idmap the mount of {}{why}",
                source.display()
            ))(e));
        }
    }
    Ok(tree)
}

/// Attaches the detached `tree` at `target` (an existing file or directory).
pub fn attach(tree: &OwnedFd, target: &Path) -> Result<()> {
    let empty = c"";
    let dst = c_path(target)?;
    // SAFETY: move_mount reads the two NUL-terminated paths for the call; `tree`
    // is a detached mount the caller owns.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r != 0 {
        return Err(Error::io(format!(
            "attach a copy of a mount at {}",
            target.display()
        ))(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Detaches whatever is mounted at `target` (nothing mounted is no error).
pub fn detach(target: &Path) -> Result<()> {
    match nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(Error::sys(format!("unmount {}", target.display()))(e)),
    }
}
