//! The proxy's log file, capped: when a line would take it past its size, it
//! is renamed to `<log>.1` (replacing the previous one) and a new one is
//! started, so the log takes at most twice the cap on the host's `/run`. The
//! process's stderr follows it (panics and early errors land there too).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// A log file rotated at a size.
pub struct CappedLog {
    path: PathBuf,
    max: u64,
    file: File,
    stderr: bool,
}

fn open(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

impl CappedLog {
    /// Opens (appends to) `path`, rotated past `max` bytes. With `stderr`,
    /// this process's stderr is pointed at it, now and after each rotation.
    pub fn open(path: &Path, max: u64, stderr: bool) -> Result<CappedLog> {
        let file = open(path).map_err(|source| Error::Io {
            what: format!("open the log {}", path.display()),
            source,
        })?;
        let log = CappedLog {
            path: path.to_path_buf(),
            max,
            file,
            stderr,
        };
        log.redirect_stderr().map_err(|source| Error::Io {
            what: "point stderr at the log".into(),
            source,
        })?;
        Ok(log)
    }

    /// Where the previous log goes.
    pub fn rotated_path(path: &Path) -> PathBuf {
        let mut p = path.as_os_str().to_owned();
        p.push(".1");
        PathBuf::from(p)
    }

    fn redirect_stderr(&self) -> std::io::Result<()> {
        if !self.stderr {
            return Ok(());
        }
        // SAFETY: dup2 on two descriptors this process owns: the log file,
        // open for the call, and stderr, which it replaces atomically.
        if unsafe { libc::dup2(self.file.as_raw_fd(), libc::STDERR_FILENO) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        std::fs::rename(&self.path, Self::rotated_path(&self.path))?;
        self.file = open(&self.path)?;
        self.redirect_stderr()
    }
}

impl Write for CappedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The size is the file's own: raw writes to stderr count too.
        let size = self.file.metadata()?.len();
        if size > 0 && size + buf.len() as u64 > self.max {
            if let Err(e) = self.rotate() {
                // A log that cannot rotate is emptied rather than grown.
                let _ = self.file.set_len(0);
                let _ = writeln!(
                    self.file,
                    "crab proxy: log rotation failed: {e}; log truncated"
                );
            }
        }
        self.file.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_rotates_at_its_cap_and_keeps_one_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.proxy.log");
        let mut log = CappedLog::open(&path, 1000, false).unwrap();
        for i in 0..10_000 {
            writeln!(log, "line {i:05} of a flood").unwrap();
        }
        let now = std::fs::metadata(&path).unwrap().len();
        let old = std::fs::metadata(CappedLog::rotated_path(&path))
            .unwrap()
            .len();
        assert!(now <= 1000 && old <= 1000, "{now} {old}");
        let last = std::fs::read_to_string(&path).unwrap();
        assert!(last.ends_with("line 09999 of a flood\n"), "{last}");
    }
}
