//! A listening socket inside another process's network namespace.
//!
//! A socket belongs to the namespace it was created in, whatever thread later
//! uses it. So a short-lived thread joins the container's network namespace,
//! binds, and ends; the proxy accepts on that socket from the host, where its
//! own upstream connections go out.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;

use crate::{Error, Result};

/// Binds `addr` inside the network namespace of process `pid`.
pub fn bind_in(pid: i32, addr: SocketAddr) -> Result<TcpListener> {
    let path = format!("/proc/{pid}/ns/net");
    let ns = std::fs::File::open(&path).map_err(|source| Error::Io {
        what: format!("open {path}"),
        source,
    })?;
    std::thread::spawn(move || -> Result<TcpListener> {
        // SAFETY: setns takes a namespace descriptor (valid for the call) and a
        // type; it changes only this thread, which ends right after binding.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(Error::Io {
                what: format!("join the network namespace of pid {pid}"),
                source: std::io::Error::last_os_error(),
            });
        }
        let l = TcpListener::bind(addr).map_err(|source| Error::Io {
            what: format!("bind {addr} in the network namespace of pid {pid}"),
            source,
        })?;
        l.set_nonblocking(true).map_err(|source| Error::Io {
            what: "make the listener non-blocking".into(),
            source,
        })?;
        Ok(l)
    })
    .join()
    .map_err(|_| Error::Io {
        what: "bind thread".into(),
        source: std::io::Error::other("panicked"),
    })?
}
