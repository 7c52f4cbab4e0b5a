//! Where a new task's processes come from when it is not started afresh: the
//! [`RestoreRequest`] that `crabctl restore`, `fork` and `import` leave for the new
//! task's shim, named in containerd's `CreateTask`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Where the checkpoint is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "kebab-case")]
pub enum Source {
    /// A checkpoint in a container's history on this host: the same container (after
    /// a crash) or another one (a fork, which gets a clone of its file system).
    History {
        /// The checkpointed container's namespace.
        namespace: String,
        /// Its id.
        id: String,
        /// The checkpoint's name or seq.
        checkpoint: String,
    },
    /// An unpacked checkpoint directory (an export from another host), laid out like
    /// the ones containerd hands over ([`crate::checkpoint`]).
    Dir {
        /// The directory.
        path: PathBuf,
    },
}

/// What a new task is restored from, with the configuration it is created with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreOptions {
    /// Where from.
    pub source: Source,
    /// The container's runtime options, carried over (task options replace them).
    #[serde(default)]
    pub config_path: Option<String>,
    /// See `config_path`.
    #[serde(default)]
    pub config_body: Option<String>,
}

/// Where restore requests live: a fixed, root-only directory, so that a request can
/// be told from a directory of CRIU images (an unpacked archive is hostile and may
/// hold a file that looks like a request).
pub const REQUEST_DIR: &str = "/run/crab/restore-requests";

/// The largest request read (a request is a few hundred bytes).
const MAX_REQUEST_BYTES: u64 = 64 * 1024;

/// A request older than this was left by a `crabctl` that died before it could
/// remove it (a `CreateTask` takes seconds): the next write removes it.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);

/// A restore request: [`RestoreOptions`] for one container's new task.
///
/// containerd 2.x accepts only runc's `containerd.runc.v1.Options` as task options
/// and refuses other types, so `crabctl restore`, `fork` and `import` cannot send
/// Crab's own option. They write the request to a file in [`REQUEST_DIR`] and send
/// its path as runc's `criu_image_path`, which both containerd 1.7 and 2.x hand to
/// the shim as they are (2.x also names it as the task's checkpoint).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreRequest {
    /// The namespace of the container the request is for.
    pub namespace: String,
    /// That container's id: a request for another container is refused.
    pub id: String,
    /// What to restore.
    pub options: RestoreOptions,
}

/// A written request; removed when dropped (the task holds what it needs by then).
#[derive(Debug)]
pub struct WrittenRequest {
    path: PathBuf,
}

impl WrittenRequest {
    /// The file's path, for runc's `criu_image_path`.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for WrittenRequest {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl RestoreRequest {
    /// Writes the request to a new file in [`REQUEST_DIR`].
    pub fn write(&self) -> Result<WrittenRequest> {
        self.write_in(Path::new(REQUEST_DIR))
    }

    fn write_in(&self, dir: &Path) -> Result<WrittenRequest> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        // Made, or closed again if made by hand, 0700.
        crate::checkpoint::history::create_private_dir(dir)?;
        remove_stale(dir, STALE_AFTER);
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let name = format!(
            "{}-{nanos}-{}.json",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(name);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(Error::io(format!("create {}", path.display())))?;
        let written = WrittenRequest { path };
        let body = serde_json::to_vec(self).expect("a request serializes");
        file.write_all(&body)
            .map_err(Error::io(format!("write {}", written.path.display())))?;
        Ok(written)
    }

    /// Whether `path` names a request rather than a directory of CRIU images.
    pub fn is_request_path(path: &Path) -> bool {
        path.starts_with(REQUEST_DIR)
    }

    /// Reads the request at `path` for container `namespace`/`id`.
    pub fn read(path: &Path, namespace: &str, id: &str) -> Result<RestoreOptions> {
        Self::read_in(Path::new(REQUEST_DIR), path, namespace, id)
    }

    /// Reads a request: a regular file directly in `dir`, both owned by this
    /// process's user and closed to others, for this very container.
    fn read_in(dir: &Path, path: &Path, namespace: &str, id: &str) -> Result<RestoreOptions> {
        use std::io::Read;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let bad = |message: String| Error::BadCheckpoint {
            path: path.to_path_buf(),
            message,
        };
        let name = match (path.parent(), path.file_name()) {
            (Some(parent), Some(name)) if parent == dir && !name.is_empty() => name,
            _ => {
                return Err(bad(format!(
                    "a restore request must lie in {}",
                    dir.display()
                )))
            }
        };
        let euid = nix::unistd::geteuid().as_raw();
        let closed = |m: &std::fs::Metadata| m.uid() == euid && m.mode() & 0o077 == 0;
        let dir_meta =
            std::fs::symlink_metadata(dir).map_err(Error::io(format!("stat {}", dir.display())))?;
        if !dir_meta.is_dir() || !closed(&dir_meta) {
            return Err(bad(format!(
                "{} is not a directory only its owner can use",
                dir.display()
            )));
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(dir.join(name))
            .map_err(Error::io(format!("open {}", path.display())))?;
        let meta = file
            .metadata()
            .map_err(Error::io(format!("stat {}", path.display())))?;
        if !meta.is_file() || !closed(&meta) || meta.len() > MAX_REQUEST_BYTES {
            return Err(bad(
                "not a restore request: a small regular file only its owner can use".into(),
            ));
        }
        let mut body = Vec::new();
        (&mut file)
            .take(MAX_REQUEST_BYTES)
            .read_to_end(&mut body)
            .map_err(Error::io(format!("read {}", path.display())))?;
        let request: RestoreRequest =
            serde_json::from_slice(&body).map_err(|e| bad(format!("bad restore request: {e}")))?;
        if request.namespace != namespace || request.id != id {
            return Err(bad(format!(
                "the restore request is for {}/{}, not {namespace}/{id}",
                request.namespace, request.id
            )));
        }
        Ok(request.options)
    }
}

/// Removes the requests in `dir` last modified more than `age` ago.
fn remove_stale(dir: &Path, age: std::time::Duration) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|elapsed| elapsed > age);
        if old {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn request(id: &str) -> RestoreRequest {
        RestoreRequest {
            namespace: "ns".into(),
            id: id.into(),
            options: RestoreOptions {
                source: Source::History {
                    namespace: "ns".into(),
                    id: "src".into(),
                    checkpoint: "3".into(),
                },
                config_path: Some("/etc/crab/x.toml".into()),
                config_body: None,
            },
        }
    }

    fn requests_dir() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("requests");
        (tmp, dir)
    }

    #[test]
    fn a_written_request_is_read_back_for_its_container_and_removed_when_dropped() {
        let (_tmp, dir) = requests_dir();
        let written = request("c1").write_in(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let back = RestoreRequest::read_in(&dir, written.path(), "ns", "c1").unwrap();
        assert_eq!(back, request("c1").options);
        let path = written.path().to_path_buf();
        drop(written);
        assert!(!path.exists());
    }

    #[test]
    fn a_request_for_another_container_is_refused() {
        let (_tmp, dir) = requests_dir();
        let written = request("victim").write_in(&dir).unwrap();
        let err = RestoreRequest::read_in(&dir, written.path(), "ns", "attacker").unwrap_err();
        assert!(err.to_string().contains("is for ns/victim"), "{err}");
        let err = RestoreRequest::read_in(&dir, written.path(), "other", "victim").unwrap_err();
        assert!(err.to_string().contains("not other/victim"), "{err}");
    }

    #[test]
    fn a_request_outside_the_requests_directory_is_refused() {
        let (tmp, dir) = requests_dir();
        let _written = request("c1").write_in(&dir).unwrap();
        // A file that looks like a request in an unpacked archive.
        let forged = tmp.path().join("checkpoint.json");
        std::fs::write(&forged, serde_json::to_vec(&request("c1")).unwrap()).unwrap();
        let err = RestoreRequest::read_in(&dir, &forged, "ns", "c1").unwrap_err();
        assert!(err.to_string().contains("must lie in"), "{err}");
        // Nor through `..`.
        let dotted = dir.join("..").join("checkpoint.json");
        assert!(RestoreRequest::read_in(&dir, &dotted, "ns", "c1").is_err());
    }

    #[test]
    fn a_symlink_or_a_file_open_to_others_is_not_a_request() {
        let (tmp, dir) = requests_dir();
        let written = request("c1").write_in(&dir).unwrap();
        let forged = tmp.path().join("forged.json");
        std::fs::write(&forged, serde_json::to_vec(&request("c1")).unwrap()).unwrap();
        let link = dir.join("link.json");
        std::os::unix::fs::symlink(&forged, &link).unwrap();
        assert!(RestoreRequest::read_in(&dir, &link, "ns", "c1").is_err());
        std::fs::set_permissions(written.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = RestoreRequest::read_in(&dir, written.path(), "ns", "c1").unwrap_err();
        assert!(err.to_string().contains("not a restore request"), "{err}");
        std::fs::set_permissions(written.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = RestoreRequest::read_in(&dir, written.path(), "ns", "c1").unwrap_err();
        assert!(err.to_string().contains("only its owner"), "{err}");
    }

    #[test]
    fn a_request_left_behind_goes_with_a_later_write() {
        let (_tmp, dir) = requests_dir();
        let left = request("c1").write_in(&dir).unwrap();
        let path = left.path().to_path_buf();
        std::mem::forget(left); // its crabctl died
        remove_stale(&dir, std::time::Duration::from_secs(3600));
        assert!(path.exists(), "a fresh request stays");
        std::thread::sleep(std::time::Duration::from_millis(20));
        remove_stale(&dir, std::time::Duration::from_millis(10));
        assert!(!path.exists(), "an old one goes");
    }

    #[test]
    fn garbage_in_a_request_is_a_clear_error() {
        let (_tmp, dir) = requests_dir();
        let written = request("c1").write_in(&dir).unwrap();
        std::fs::write(written.path(), b"{\"namespace\": 3").unwrap();
        let err = RestoreRequest::read_in(&dir, written.path(), "ns", "c1").unwrap_err();
        assert!(err.to_string().contains("bad restore request"), "{err}");
    }

    #[test]
    fn only_paths_in_the_requests_directory_are_requests() {
        assert!(RestoreRequest::is_request_path(
            &Path::new(REQUEST_DIR).join("1-2-3.json")
        ));
        assert!(!RestoreRequest::is_request_path(Path::new(
            "/var/lib/containerd/ctrd-checkpoint123"
        )));
        assert!(!RestoreRequest::is_request_path(Path::new(
            "/run/crab/restore-requests-x/a.json"
        )));
    }
}
