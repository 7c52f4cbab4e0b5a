//! Receiving a terminal's pty master from the container; new ptys for restored ones.
//!
//! libcontainer creates the pty inside the container and sends the master over a unix
//! socket (the OCI "console socket"). The shim listens on a short path under its state
//! directory, because unix socket paths are limited to 108 bytes.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use tokio::net::UnixListener;

use crate::error::{ShimError, ShimResult};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A listening console socket.
#[derive(Debug)]
pub struct ConsoleSocket {
    path: PathBuf,
    listener: UnixListener,
}

impl ConsoleSocket {
    /// Listens on a fresh path in `dir`.
    pub fn bind(dir: &Path) -> ShimResult<ConsoleSocket> {
        std::fs::create_dir_all(dir)
            .map_err(|e| ShimError::Other(format!("create {}: {e}", dir.display())))?;
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("pty-{}-{n}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|e| {
            ShimError::Other(format!("bind console socket {}: {e}", path.display()))
        })?;
        Ok(ConsoleSocket { path, listener })
    }

    /// Its path, for the OCI runtime.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for the container to connect and send the pty master.
    pub async fn receive(self, timeout: Duration) -> ShimResult<OwnedFd> {
        let result = tokio::time::timeout(timeout, self.receive_inner()).await;
        let _ = std::fs::remove_file(&self.path);
        match result {
            Ok(r) => r,
            Err(_) => Err(ShimError::Other(
                "timed out waiting for the container's terminal".into(),
            )),
        }
    }

    async fn receive_inner(&self) -> ShimResult<OwnedFd> {
        let (stream, _) = self
            .listener
            .accept()
            .await
            .map_err(|e| ShimError::Other(format!("accept console socket: {e}")))?;
        loop {
            stream
                .readable()
                .await
                .map_err(|e| ShimError::Other(format!("console socket: {e}")))?;
            match recv_fd(stream.as_raw_fd()) {
                Ok(Some(fd)) => return Ok(fd),
                Ok(None) => {
                    return Err(ShimError::Other(
                        "console socket closed without a pty master".into(),
                    ))
                }
                Err(nix::errno::Errno::EAGAIN) => continue,
                Err(e) => return Err(ShimError::Other(format!("receive pty master: {e}"))),
            }
        }
    }
}

fn recv_fd(sock: RawFd) -> nix::Result<Option<OwnedFd>> {
    let mut buf = [0u8; 256];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(
        sock,
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            if let Some(&fd) = fds.first() {
                // SAFETY: SCM_RIGHTS just installed this fd in our table; we own it.
                return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
    }
    Ok(None)
}

/// A new pty pair (master, slave), both close-on-exec (CRIU puts the dumped termios and
/// window size on the slave).
pub fn open_pty() -> ShimResult<(OwnedFd, OwnedFd)> {
    let pty =
        nix::pty::openpty(None, None).map_err(|e| ShimError::Other(format!("open a pty: {e}")))?;
    for fd in [&pty.master, &pty.slave] {
        nix::fcntl::fcntl(
            fd.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(|e| ShimError::Other(format!("pty: set close-on-exec: {e}")))?;
    }
    Ok((pty.master, pty.slave))
}

/// Sets a terminal's window size.
pub fn resize(master: &OwnedFd, width: u32, height: u32) -> ShimResult<()> {
    let ws = libc::winsize {
        ws_row: height as u16,
        ws_col: width as u16,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a `winsize` from the pointer, which is valid for the call.
    let rc = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    if rc < 0 {
        return Err(ShimError::Other(format!(
            "resize pty: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}
