//! The host-side door of a managed proxy: a unix socket per sandbox
//! ([`control::proxy_socket_path`]) for orchestrators on the host, such as an agent
//! that acts on the sandbox from outside. Same proxy, same turns; the caller must be
//! root or in `control_group`, as for the control socket (the file's mode first,
//! then the peer's credentials).

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use anyhow::{Context, Result};
use crab_runtime::config::Config;
use crab_runtime::control;

/// The door's socket, bound; removed when dropped.
pub struct HostDoor {
    path: PathBuf,
    listener: Option<tokio::net::UnixListener>,
}

impl HostDoor {
    /// Binds the door of container `id` (a stale socket a dead proxy left is
    /// replaced). Needs a tokio runtime.
    pub fn bind(config: &Config, namespace: &str, id: &str) -> Result<HostDoor> {
        let path = control::proxy_socket_path(config, namespace, id);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("remove {}", path.display())),
        }
        let address = crab_runtime::socket_path::SocketPath::new(&path)?;
        let listener = tokio::net::UnixListener::bind(address.as_path())
            .with_context(|| format!("bind {}", path.display()))?;
        let group = config.control_gid()?;
        let mode = if group.is_some() { 0o660 } else { 0o600 };
        if let Some(gid) = group {
            std::os::unix::fs::chown(&path, None, Some(gid))
                .with_context(|| format!("chown {}", path.display()))?;
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("chmod {}", path.display()))?;
        Ok(HostDoor {
            path,
            listener: Some(listener),
        })
    }

    /// Where it is.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The listener, to serve (once).
    pub fn take_listener(&mut self) -> Option<tokio::net::UnixListener> {
        self.listener.take()
    }
}

impl Drop for HostDoor {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether the peer of `conn` may use the door ([`crab_runtime::peer::allowed`]).
pub fn admit(conn: &tokio::net::UnixStream, group: Option<u32>) -> Result<(), String> {
    crab_runtime::peer::socket_allowed(std::os::fd::AsFd::as_fd(conn), group)
}
