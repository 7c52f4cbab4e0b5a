//! Checkpoint directories.
//!
//! A checkpoint is one directory, self-contained: containerd tars the directory the
//! shim fills for `Checkpoint` into its content store, and hands it back, unpacked, to
//! `Create` on restore. Crab writes there:
//! - CRIU's images of the process tree, at the top of the directory as runc's are
//!   (containerd 2.x's CRI `CheckpointContainer` unpacks them into one flat
//!   directory); checkpoints of earlier versions hold them in `criu/`, which
//!   [`images_in`] still reads;
//! - `rootfs-diff.tar`: the files the container changed against its image (so a restore
//!   gets them even without `ctr ... --rw`), with the deleted paths in the manifest;
//! - [`MANIFEST`], written last: a checkpoint without it is incomplete.

pub mod archive;
#[cfg(test)]
mod archive_fixture;
pub mod archive_sign;
pub mod archive_work;
pub(crate) mod beneath;
pub(crate) mod byte_quota;
pub(crate) mod calls;
pub mod durability;
pub mod engine;
pub mod fs_diff;
pub mod history;
pub mod history_store;
pub mod hooks;
pub mod import_spec;
pub mod journal;
pub(crate) mod net_images;
pub mod ops;
pub(crate) mod pin;
pub(crate) mod restore_helper;
pub mod reuse;
pub mod sched;
pub mod source;
pub mod stats;
pub(crate) mod tty;

pub use restore_helper::own_cgroup_path;

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The manifest's file name.
pub const MANIFEST: &str = "crab-checkpoint.json";
/// The CRIU images' directory (in a history's entries, an archive, and containerd
/// checkpoints of earlier versions; see [`images_in`]).
pub const CRIU_DIR: &str = "criu";
/// The file-system delta.
pub const FS_DIFF: &str = "rootfs-diff.tar";
/// The manifest format this version writes and reads.
pub const VERSION: u32 = 1;
/// How containerd 1.7 names the directory it unpacks a checkpoint into for a
/// restore (in its temporary directory). It never removes one.
pub const CONTAINERD_UNPACKED_PREFIX: &str = "ctrd-checkpoint";

/// What a checkpoint holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Processes and files.
    Full,
    /// Files only.
    FsOnly,
    /// Processes only.
    ProcessOnly,
    /// Nothing changed since the previous checkpoint: this entry names the
    /// previous one's snapshot and image, and costs no dump and no snapshot.
    Skip,
}

impl Kind {
    /// The name the manifest and the CLI use (`full`, `fs-only`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Full => "full",
            Kind::FsOnly => "fs-only",
            Kind::ProcessOnly => "process-only",
            Kind::Skip => "skip",
        }
    }

    /// Whether a checkpoint of this kind dumps the processes (with CRIU).
    pub fn dumps_processes(self) -> bool {
        matches!(self, Kind::Full | Kind::ProcessOnly)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The keys CRIU gave the init's stdio (`pipe:[1234]`), to be replaced on restore.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stdio {
    /// fd 0.
    pub stdin: Option<String>,
    /// fd 1.
    pub stdout: Option<String>,
    /// fd 2.
    pub stderr: Option<String>,
    /// CRIU's key (`tty[rdev:dev]`) of the terminal the init's stdio is on (a pty
    /// slave whose master is the shim's), replaced by a new slave on restore.
    #[serde(default)]
    pub tty: Option<String>,
}

/// The file-system part.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsPart {
    /// Paths (relative to the root) the container deleted or replaced by another type
    /// (bytes: a name need not be UTF-8).
    pub deleted: Vec<fs_diff::RelPath>,
    /// How many entries the diff tar holds.
    pub changed: usize,
    /// The tar's size.
    pub bytes: u64,
}

/// What a checkpoint directory holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version ([`VERSION`]).
    pub version: u32,
    /// What it holds.
    pub kind: Kind,
    /// containerd namespace of the checkpointed container.
    pub namespace: String,
    /// Its id.
    pub id: String,
    /// When it was taken (milliseconds since the epoch).
    pub created_ms: u64,
    /// The init's stdio keys.
    pub stdio: Stdio,
    /// The file-system delta, when the checkpoint has one.
    pub fs: Option<FsPart>,
    /// Bytes of CRIU images.
    pub process_bytes: u64,
    /// Whether the container had a terminal.
    pub terminal: bool,
    /// Where the time went.
    #[serde(default)]
    pub timings: Timings,
    /// The size of every CRIU image file (checked before a restore).
    #[serde(default)]
    pub criu_files: std::collections::BTreeMap<String, u64>,
    /// The network namespace was dumped empty: the spec's hooks make it again at
    /// the restore ([`hooks`]).
    #[serde(default)]
    pub network_by_hooks: bool,
    /// An exported agent's fast-forward: the plan its importer leaves the proxy
    /// (the seqs are the exporting host's), with the journal's exchanges in the
    /// archive's `journal/` (name -> size). Absent: the agent asks its LLM again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<journal::Plan>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub journal_files: std::collections::BTreeMap<String, u64>,
}

/// Milliseconds spent in each step of a checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timings {
    /// Freezing the container.
    pub freeze_ms: u64,
    /// Writing the file-system delta.
    pub fs_ms: u64,
    /// CRIU's dump.
    pub dump_ms: u64,
    /// The container running again after the dump, until its process image is
    /// on disk (the container's thaw, the byte quota, every image file synced).
    #[serde(default)]
    pub sync_ms: u64,
    /// From start to the manifest.
    pub total_ms: u64,
}

impl Manifest {
    /// Now, in milliseconds since the epoch.
    pub fn now_ms() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    /// Writes the manifest into `dir`, last. With `durable`, everything in `dir` is
    /// fsync-ed first and the manifest after it (containerd copies a checkpoint into
    /// its content store, which syncs it there: that copy needs no sync of its own).
    pub fn write(&self, dir: &Path, durable: bool) -> Result<()> {
        if durable {
            sync_tree(dir)?;
        }
        let json = serde_json::to_vec_pretty(self).expect("manifest serializes");
        let tmp = dir.join(format!(".{MANIFEST}.tmp"));
        std::fs::write(&tmp, json).map_err(Error::io(format!("write {}", tmp.display())))?;
        if durable {
            sync_path(&tmp)?;
        }
        let dst = dir.join(MANIFEST);
        std::fs::rename(&tmp, &dst).map_err(Error::io(format!("rename {}", dst.display())))?;
        if durable {
            sync_path(dir)?;
        }
        Ok(())
    }

    /// Reads and checks the manifest of the checkpoint in `dir`.
    pub fn read(dir: &Path) -> Result<Manifest> {
        let bad = |message: String| Error::BadCheckpoint {
            path: dir.to_path_buf(),
            message,
        };
        let file = dir.join(MANIFEST);
        // Never through a symlink (a checkpoint may come from a registry or another
        // host): `crab-checkpoint.json -> /etc/shadow` is refused, not read.
        let text = read_no_follow(&file, 16 << 20).map_err(|e| {
            bad(format!(
                "no {MANIFEST} ({e}): not a Crab checkpoint, or an incomplete one"
            ))
        })?;
        let m: Manifest =
            serde_json::from_slice(&text).map_err(|e| bad(format!("{MANIFEST}: {e}")))?;
        if m.version != VERSION {
            return Err(bad(format!(
                "format version {} (this Crab reads {VERSION})",
                m.version
            )));
        }
        let is = |p: &Path, dir: bool| {
            std::fs::symlink_metadata(p).is_ok_and(|m| if dir { m.is_dir() } else { m.is_file() })
        };
        if m.kind != Kind::FsOnly && !is(&images_in(dir).join("inventory.img"), false) {
            return Err(bad(
                "inventory.img is missing (or not a regular file), in the directory and in \
                 its criu/"
                    .into(),
            ));
        }
        if m.fs.is_some() && !is(&dir.join(FS_DIFF), false) {
            return Err(bad(format!("{FS_DIFF} is missing (or not a regular file)")));
        }
        Ok(m)
    }
}

/// Reads the regular file `p` (at most `max` bytes), never through a symlink as its
/// last name.
pub(crate) fn read_no_follow(p: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(p)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut out = Vec::new();
    f.take(max).read_to_end(&mut out)?;
    Ok(out)
}

/// Runs `f` holding one of the host's checkpoint slots (`checkpoint.max_parallel`),
/// queued at high priority: what a person or containerd asked for.
pub fn bounded<T>(config: &crate::config::Config, f: impl FnOnce() -> Result<T>) -> Result<T> {
    bounded_at(config, &sched::Priority::high(), f).map(|(v, _)| v)
}

/// Runs `f` holding one of the host's checkpoint slots, queued at `priority`
/// (which may be promoted while it waits); also says how long it waited.
/// Dumps and restores of different containers run in parallel, within the bound.
pub fn bounded_at<T>(
    config: &crate::config::Config,
    priority: &sched::Priority,
    f: impl FnOnce() -> Result<T>,
) -> Result<(T, std::time::Duration)> {
    let slot = sched::acquire(
        &config.state_dir.join("slots"),
        config.checkpoint.max_parallel,
        priority,
    )?;
    let waited = slot.as_ref().map(|s| s.waited).unwrap_or_default();
    let v = f()?;
    drop(slot);
    Ok((v, waited))
}

/// Where the CRIU images of checkpoint directory `dir` are: its `criu/` when it has
/// one (Crab before containerd 2.x's CRI), else the directory itself.
pub fn images_in(dir: &Path) -> PathBuf {
    let nested = dir.join(CRIU_DIR);
    if std::fs::symlink_metadata(&nested).is_ok_and(|m| m.is_dir()) {
        nested
    } else {
        dir.to_path_buf()
    }
}

/// Total size of the regular files under `dir`.
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

pub(crate) fn sync_path(p: &Path) -> Result<()> {
    std::fs::File::open(p)
        .and_then(|f| f.sync_all())
        .map_err(Error::io(format!("fsync {}", p.display())))
}

/// fsyncs every file and directory under `dir` (CRIU does not).
pub(crate) fn sync_tree(dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(Error::io(format!("read {}", dir.display())))?;
    for e in entries.flatten() {
        let p: PathBuf = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => sync_tree(&p)?,
            Ok(t) if t.is_file() => sync_path(&p)?,
            _ => {}
        }
    }
    sync_path(dir)
}
