//! The snapshotter: an overlay snapshotter with containerd's semantics (committed
//! layers as lower directories, one upper directory per active snapshot), whose
//! `Usage` of an active snapshot is, when Crab's store made a container's tree for
//! it, what that tree wrote.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::meta::Meta;

/// The longest key accepted (containerd's keys are `<namespace>/<n>/<name>`).
pub const MAX_KEY: usize = 4096;

/// Where the bytes of a crab container's writable layer are: the tree Crab's store
/// made for it. `written_for` gets the layer's upper directory and answers `None`
/// when no tree was made for it (a runc container's layer holds its own data).
pub trait Trees: Send + Sync {
    /// Bytes the tree made for the writable layer `layer` wrote.
    fn written_for(&self, layer: &Path) -> std::result::Result<Option<u64>, String>;
}

impl Trees for crab_runtime::storage::usage::Trees {
    fn written_for(&self, layer: &Path) -> std::result::Result<Option<u64>, String> {
        crab_runtime::storage::usage::Trees::written_for(self, layer)
            .map(|t| t.map(|t| t.bytes))
            .map_err(|e| e.to_string())
    }
}

/// A snapshotter rooted at one directory.
pub struct Snapshotter {
    pub(crate) root: PathBuf,
    meta: Mutex<Meta>,
    pub(crate) trees: Box<dyn Trees>,
}

impl Snapshotter {
    /// Opens (making it if needed, root-only) the snapshotter at `root`.
    pub fn open(root: &Path, trees: Box<dyn Trees>) -> Result<Snapshotter> {
        private_dir(root)?;
        // Upper directories are matched against the owners Crab's store recorded,
        // which name them as containerd's mounts do: without symbolic links.
        let root = root
            .canonicalize()
            .map_err(Error::io(format!("resolve {}", root.display())))?;
        private_dir(&root.join("snapshots"))?;
        let meta = Meta::load(&root)?;
        Ok(Snapshotter {
            root,
            meta: Mutex::new(meta),
            trees,
        })
    }

    /// Its root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/snapshots/<id>`.
    pub(crate) fn dir(&self, id: u64) -> PathBuf {
        self.root.join("snapshots").join(id.to_string())
    }

    /// `<root>/snapshots/<id>/fs`: the layer's files (an active one's upper dir).
    pub(crate) fn fs(&self, id: u64) -> PathBuf {
        self.dir(id).join("fs")
    }

    /// `<root>/snapshots/<id>/work`: overlay's work directory of an active one.
    pub(crate) fn work(&self, id: u64) -> PathBuf {
        self.dir(id).join("work")
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Meta> {
        // A panic while holding the lock leaves records that were saved before it.
        self.meta.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn save(&self, meta: &Meta) -> Result<()> {
        meta.save(&self.root)
    }
}

/// Refuses keys containerd never sends: empty, longer than [`MAX_KEY`], or with a
/// NUL. A key is only ever a name in the records, never part of a path.
pub(crate) fn check_key(what: &str, key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY || key.contains('\0') {
        return Err(Error::InvalidArgument(format!(
            "{what} must be 1 to {MAX_KEY} bytes without NUL"
        )));
    }
    Ok(())
}

/// Makes `dir` (and its parents) if missing, and root-only: it holds every
/// container's and image's files.
fn private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).map_err(Error::io(format!("mkdir {}", dir.display())))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(Error::io(format!("chmod {}", dir.display())))
}
