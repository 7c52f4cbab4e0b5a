//! Where a process's output goes when containerd's client gives a URI instead of
//! fifos: the schemes of runc's shim. `ctr run --log-uri`, containerd's `cio.LogURI`
//! and `cio.BinaryIO`, and nerdctl (whose `run -d` logs through `binary://`) use them.
//!
//! - a plain path: containerd's fifo (the usual case);
//! - `file:///path`: both outputs appended to that file (made, with its directory,
//!   if missing);
//! - `binary:///path?k=v`: a logging program, started by the shim with the
//!   arguments `k v` (in the query's order), `CONTAINER_ID` and `CONTAINER_NAMESPACE`
//!   in its environment, the process's stdout on its fd 3, stderr on fd 4, and fd 5,
//!   which it closes once ready. The shim waits for that before the process starts,
//!   and at the process's end lets it read to EOF and exit, then stops it.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::error::{ShimError, ShimResult};

/// How long a logging program may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long it has to exit once its input ended, before SIGTERM, then SIGKILL.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// The output destination a stdout URI names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// None given: the output is read and dropped.
    None,
    /// A fifo of containerd's.
    Fifo(String),
    /// A file both outputs are appended to.
    File(PathBuf),
    /// A logging program and its arguments.
    Binary {
        /// Its absolute path.
        path: PathBuf,
        /// Its arguments.
        args: Vec<String>,
    },
}

fn invalid(uri: &str, why: &str) -> ShimError {
    ShimError::InvalidArgument(format!("stdio URI {uri:?}: {why}"))
}

impl Output {
    /// Parses containerd's stdout string.
    pub fn parse(uri: &str) -> ShimResult<Output> {
        if uri.is_empty() {
            return Ok(Output::None);
        }
        let Some((scheme, rest)) = uri.split_once("://") else {
            return Ok(Output::Fifo(uri.to_string()));
        };
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let path = decode(path).ok_or_else(|| invalid(uri, "bad escape"))?;
        if !path.starts_with('/') {
            return Err(invalid(uri, "the path must be absolute (scheme:///path)"));
        }
        match scheme {
            "fifo" => Ok(Output::Fifo(path)),
            "file" => Ok(Output::File(path.into())),
            "binary" => {
                let mut args = Vec::new();
                for pair in query.split('&').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    args.push(decode(k).ok_or_else(|| invalid(uri, "bad escape"))?);
                    if !v.is_empty() {
                        args.push(decode(v).ok_or_else(|| invalid(uri, "bad escape"))?);
                    }
                }
                Ok(Output::Binary {
                    path: path.into(),
                    args,
                })
            }
            other => Err(invalid(uri, &format!("unknown scheme {other:?}"))),
        }
    }
}

/// Percent-decoding as Go's query parsing does it (`+` is a space in a query; a
/// path has none in practice).
fn decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Opens (making it and its directory if missing) a file for both outputs.
pub fn open_file(path: &std::path::Path) -> ShimResult<std::fs::File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| ShimError::Other(format!("log directory {}: {e}", dir.display())))?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| ShimError::Other(format!("log file {}: {e}", path.display())))
}

/// A running logging program.
#[derive(Debug)]
pub struct Logger {
    pidfd: Option<OwnedFd>,
    pid: i32,
}

/// What [`Logger::start`] hands back: the program, and the write ends of its fd 3
/// (stdout) and fd 4 (stderr).
pub type Started = (Logger, OwnedFd, OwnedFd);

fn pipe() -> ShimResult<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| ShimError::Other(format!("pipe: {e}")))
}

/// A close-on-exec duplicate numbered above the three the child is given.
fn high(fd: &OwnedFd) -> ShimResult<OwnedFd> {
    let n = fcntl(fd.as_raw_fd(), FcntlArg::F_DUPFD_CLOEXEC(10))
        .map_err(|e| ShimError::Other(format!("dup: {e}")))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor this process owns.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

impl Logger {
    /// Starts `path` with `args` for container `id` of `namespace`, and waits until
    /// it closes fd 5 (or exits).
    pub fn start(
        path: &std::path::Path,
        args: &[String],
        namespace: &str,
        id: &str,
    ) -> ShimResult<Started> {
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let (ready_r, ready_w) = pipe()?;
        let given = [high(&out_r)?, high(&err_r)?, high(&ready_w)?];
        let raw: Vec<i32> = given.iter().map(|f| f.as_raw_fd()).collect();
        let mut cmd = std::process::Command::new(path);
        cmd.args(args)
            .env("CONTAINER_ID", id)
            .env("CONTAINER_NAMESPACE", namespace)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // SAFETY: the closure only calls dup2, which is async-signal-safe, on
        // descriptors that stay open in the parent until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                for (target, &fd) in (3..).zip(raw.iter()) {
                    if libc::dup2(fd, target) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| {
            ShimError::Other(format!("start logging binary {}: {e}", path.display()))
        })?;
        drop((given, out_r, err_r, ready_w));
        let pid = child.id() as i32;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        // SAFETY: a non-negative result is a descriptor this process now owns.
        let pidfd = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) });
        let logger = Logger { pidfd, pid };
        // Ready: fd 5 closed (EOF on our end), or the program ended.
        let mut fds = [PollFd::new(ready_r.as_fd(), PollFlags::POLLIN)];
        let timeout =
            PollTimeout::try_from(READY_TIMEOUT.as_millis() as i32).unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, timeout) {
            Ok(0) => {
                logger.kill();
                return Err(ShimError::Other(format!(
                    "logging binary {} not ready after {} s",
                    path.display(),
                    READY_TIMEOUT.as_secs()
                )));
            }
            Ok(_) => {}
            Err(e) => {
                return Err(ShimError::Other(format!(
                    "wait for the logging binary: {e}"
                )))
            }
        }
        Ok((logger, out_w, err_w))
    }

    fn exited_within(&self, wait: Duration) -> bool {
        let Some(pidfd) = &self.pidfd else {
            return true;
        };
        let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        let timeout = PollTimeout::try_from(wait.as_millis() as i32).unwrap_or(PollTimeout::MAX);
        !matches!(poll(&mut fds, timeout), Ok(0))
    }

    fn signal(&self, sig: libc::c_int) {
        if let Some(pidfd) = &self.pidfd {
            // SAFETY: pidfd_send_signal takes a pidfd, a signal, a null siginfo and
            // flags; the pidfd names this logger even after it was reaped.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd.as_raw_fd(),
                    sig,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
        }
    }

    fn kill(&self) {
        self.signal(libc::SIGKILL);
    }

    /// Once its input ended: lets it exit on its own, else SIGTERM, else SIGKILL.
    /// (Blocking: call it off the runtime's threads.)
    pub fn finish(self) {
        if self.exited_within(EXIT_GRACE) {
            return;
        }
        tracing::warn!(
            pid = self.pid,
            "logging binary still running after its input ended: SIGTERM"
        );
        self.signal(libc::SIGTERM);
        if !self.exited_within(EXIT_GRACE) {
            self.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerds_fifo_paths_and_runcs_schemes_parse() {
        assert_eq!(Output::parse("").unwrap(), Output::None);
        assert_eq!(
            Output::parse("/run/containerd/fifo/1/x-stdout").unwrap(),
            Output::Fifo("/run/containerd/fifo/1/x-stdout".into())
        );
        assert_eq!(
            Output::parse("file:///var/log/a%20b.log").unwrap(),
            Output::File("/var/log/a b.log".into())
        );
        assert_eq!(
            Output::parse("binary:///usr/local/bin/nerdctl?_NERDCTL_INTERNAL_LOGGING=%2Fvar%2Flib%2Fnerdctl%2F1a&debug")
                .unwrap(),
            Output::Binary {
                path: "/usr/local/bin/nerdctl".into(),
                args: vec![
                    "_NERDCTL_INTERNAL_LOGGING".into(),
                    "/var/lib/nerdctl/1a".into(),
                    "debug".into()
                ]
            }
        );
    }

    #[test]
    fn an_unknown_scheme_a_relative_path_or_a_bad_escape_is_refused() {
        for bad in [
            "http:///x",
            "file://relative/x",
            "binary:///x?a=%zz",
            "file:///%",
        ] {
            assert!(
                matches!(Output::parse(bad), Err(ShimError::InvalidArgument(_))),
                "{bad} passed"
            );
        }
    }
}
