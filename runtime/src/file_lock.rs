//! Advisory locks on files (`flock`): held by an open file, dropped with it, and
//! by the kernel when the holder dies.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::{Error, Result};

/// How [`lock`] takes its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Shared with other shared holders; waits for an exclusive one.
    Shared,
    /// Exclusive; waits for every other holder.
    Exclusive,
    /// Exclusive, or nothing at once when another holds the file.
    TryExclusive,
}

/// Opens `path` (made if missing, 0600) and locks it. `None` only for
/// [`LockMode::TryExclusive`] when another holds it.
pub fn lock(path: &Path, mode: LockMode) -> Result<Option<File>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(Error::io(format!("open {}", path.display())))?;
    let how = match mode {
        LockMode::Shared => libc::LOCK_SH,
        LockMode::Exclusive => libc::LOCK_EX,
        LockMode::TryExclusive => libc::LOCK_EX | libc::LOCK_NB,
    };
    // SAFETY: flock on an fd this function owns; no memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), how) } == 0 {
        return Ok(Some(file));
    }
    let e = std::io::Error::last_os_error();
    if e.kind() == std::io::ErrorKind::WouldBlock {
        return Ok(None);
    }
    Err(Error::io(format!("lock {}", path.display()))(e))
}
