//! Unix socket paths longer than a socket address holds (`sun_path`: 108 bytes
//! with its NUL). A container's sockets are named after its namespace and id
//! (`<state_dir>/<namespace>/<id>.ctl`), and Docker under `userns-remap` puts its
//! containers in the namespace `moby-<uid>.<gid>` with 64-hex ids: below a state
//! directory longer than `/run/crab` that passes the limit, and binding or
//! connecting by the path fails. Such a path is given to the kernel through its
//! directory instead, `/proc/self/fd/<dir>/<name>`, with the directory held open
//! meanwhile: it resolves as any path does, so both ends meet at the same file,
//! whichever form each used.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The longest path a socket address holds (`sun_path` less its NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// A socket's path in a form `bind` and `connect` accept, whatever its length.
#[derive(Debug)]
pub struct SocketPath {
    path: PathBuf,
    /// The directory, while `path` names it through `/proc/self/fd`.
    _dir: Option<OwnedFd>,
}

impl SocketPath {
    /// `path` itself when it fits, else the same file through its directory
    /// (which must exist).
    pub fn new(path: &Path) -> Result<SocketPath> {
        if path.as_os_str().len() <= MAX_SOCKET_PATH {
            return Ok(SocketPath {
                path: path.to_path_buf(),
                _dir: None,
            });
        }
        let too_long = |why: &str| Error::Io {
            context: format!("socket path {}", path.display()),
            source: std::io::Error::other(format!("longer than {MAX_SOCKET_PATH} bytes and {why}")),
        };
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(too_long("not a file in a directory"));
        };
        let dir = std::fs::File::options()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dir)
            .map_err(Error::io(format!("open {}", dir.display())))?;
        let dir = OwnedFd::from(dir);
        let short = Path::new(&format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
        if short.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(too_long("its name alone does not fit"));
        }
        Ok(SocketPath {
            path: short,
            _dir: Some(dir),
        })
    }

    /// The path to bind or connect to (valid while this lives).
    pub fn as_path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_deeper_than_an_address_holds_is_bound_and_reached_by_its_full_path() {
        let base = std::env::temp_dir().join(format!("crab-socket-path-{}", std::process::id()));
        let dir = base.join("moby-100000.100000").join("x".repeat(40));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}.ctl", "a".repeat(64)));
        assert!(path.as_os_str().len() > MAX_SOCKET_PATH);
        assert!(
            std::os::unix::net::UnixListener::bind(&path).is_err(),
            "the limit holds"
        );

        let bound = SocketPath::new(&path).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(bound.as_path()).unwrap();
        drop(bound);
        assert!(path.exists(), "the socket is at the full path");
        let reached = SocketPath::new(&path).unwrap();
        let mut client = std::os::unix::net::UnixStream::connect(reached.as_path()).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        std::io::Write::write_all(&mut client, b"hi").unwrap();
        let mut got = [0u8; 2];
        std::io::Read::read_exact(&mut server, &mut got).unwrap();
        assert_eq!(&got, b"hi");

        let short = base.join("s.ctl");
        assert_eq!(SocketPath::new(&short).unwrap().as_path(), short);
        let no_room = dir.join("n".repeat(100));
        assert!(SocketPath::new(&no_room).is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
