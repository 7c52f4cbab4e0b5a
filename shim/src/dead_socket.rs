//! The ttrpc socket a killed shim leaves behind.
//!
//! A shim's socket is named after containerd's address, the namespace and the
//! container (or pod) id ([`containerd_shim::socket_address`]), so the next shim
//! of the same container binds the same path. A shim killed by SIGKILL cannot
//! remove it. The shim crate's server, finding the path taken, then tries to
//! connect to it for about a second (200 tries, 5 ms apart) before it removes it:
//! a restore right after a crash waited through that second. The dead shim's
//! cleanup (`delete`, which containerd runs as soon as it sees the shim gone)
//! removes the socket at once when nothing answers on it. After a host restart (or
//! a containerd that never saw the shim die) no cleanup runs: the next `start` of a
//! container's own shim removes its dead socket before binding. A socket that
//! answers belongs to a live shim (a pod's other containers share it) and is kept.

use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// What became of the socket at `address` (`unix://PATH` or a path).
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// There was none.
    Absent,
    /// A process listens on it: kept.
    Live,
    /// Nothing listened on it: removed.
    Removed,
    /// Left as it was: not a socket, or it could not be checked or removed.
    Kept(String),
}

/// Removes the socket at `address` if nothing listens on it.
pub fn remove_if_dead(address: &str) -> Outcome {
    let path = Path::new(address.strip_prefix("unix://").unwrap_or(address));
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Outcome::Absent,
        Err(e) => return Outcome::Kept(format!("stat {}: {e}", path.display())),
        Ok(md) if !md.file_type().is_socket() => {
            return Outcome::Kept(format!("{} is not a socket", path.display()))
        }
        Ok(_) => {}
    }
    match UnixStream::connect(path) {
        Ok(_) => Outcome::Live,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            match std::fs::remove_file(path) {
                Ok(()) => Outcome::Removed,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Outcome::Absent,
                Err(e) => Outcome::Kept(format!("remove {}: {e}", path.display())),
            }
        }
        Err(e) => Outcome::Kept(format!("connect to {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("crab-dead-socket-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    #[test]
    fn test_a_socket_nobody_listens_on_is_removed() {
        let path = scratch("dead");
        let _ = std::fs::remove_file(&path);
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists(), "a dropped listener leaves its file");
        let address = format!("unix://{}", path.display());
        assert_eq!(remove_if_dead(&address), Outcome::Removed);
        assert!(!path.exists());
        assert_eq!(remove_if_dead(&address), Outcome::Absent);
    }

    #[test]
    fn test_a_live_socket_is_kept() {
        let path = scratch("live");
        let _ = std::fs::remove_file(&path);
        let _listener = UnixListener::bind(&path).unwrap();
        assert_eq!(remove_if_dead(path.to_str().unwrap()), Outcome::Live);
        assert!(path.exists());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn test_a_file_that_is_not_a_socket_is_kept() {
        let path = scratch("plain");
        std::fs::write(&path, b"x").unwrap();
        assert!(matches!(
            remove_if_dead(path.to_str().unwrap()),
            Outcome::Kept(_)
        ));
        assert!(path.exists());
        std::fs::remove_file(&path).unwrap();
    }
}
