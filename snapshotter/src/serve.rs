//! The socket containerd's proxy plugin dials: a Unix socket in a root-only
//! directory, itself 0600, and every connection's peer checked (`SO_PEERCRED`):
//! only root (containerd) is served. Anyone who could call a snapshotter could
//! mount any layer's files and remove any container's writable layer.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::StreamExt;

use crate::error::{Error, Result};
use crate::proto::snapshots_server::SnapshotsServer;
use crate::service::Service;

/// Whether a peer with this uid may use the snapshotter.
pub fn allowed(uid: u32) -> bool {
    uid == 0
}

/// Binds `socket` (its directory made root-only, a stale socket replaced).
pub fn bind(socket: &Path) -> Result<UnixListener> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(Error::io(format!("mkdir {}", dir.display())))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(Error::io(format!("chmod {}", dir.display())))?;
    }
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("remove {}", socket.display()))(e)),
    }
    let listener =
        UnixListener::bind(socket).map_err(Error::io(format!("bind {}", socket.display())))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .map_err(Error::io(format!("chmod {}", socket.display())))?;
    Ok(listener)
}

/// Serves `service` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: UnixListener,
    service: Service,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::result::Result<(), tonic::transport::Error> {
    let incoming = UnixListenerStream::new(listener).filter(|conn| match conn {
        Ok(stream) => peer_allowed(stream),
        Err(_) => true,
    });
    tonic::transport::Server::builder()
        .add_service(SnapshotsServer::new(service))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

fn peer_allowed(stream: &UnixStream) -> bool {
    match stream.peer_cred() {
        Ok(cred) if allowed(cred.uid()) => true,
        Ok(cred) => {
            tracing::warn!(uid = cred.uid(), pid = ?cred.pid(), "refused a non-root peer");
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "refused a peer without credentials");
            false
        }
    }
}
