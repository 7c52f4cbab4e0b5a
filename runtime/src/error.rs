//! Errors of the runtime crate: one variant per failure site, each of one
//! [`ErrorKind`] (which every door, containerd's, the control socket's,
//! crabctl's and the agent API's, spells its own way).

use std::path::PathBuf;

pub use crab_errkind::{ErrorKind, Failure};

/// Convenience alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while running a container.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The runtime configuration could not be read or is invalid.
    #[error("config {path}: {message}")]
    Config {
        /// Where the configuration came from (a file, or the runtime options).
        path: String,
        /// What is wrong with it, naming the key.
        message: String,
    },
    /// The OCI bundle's spec is missing or invalid.
    #[error("invalid OCI spec in {bundle}: {message}")]
    InvalidSpec {
        /// The bundle directory.
        bundle: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The container's root file system is missing.
    #[error("rootfs {0} does not exist")]
    MissingRootfs(PathBuf),
    /// A container with this id already exists.
    #[error("container {0} already exists")]
    AlreadyExists(String),
    /// No container with this id.
    #[error("container {0} not found")]
    NotFound(String),
    /// A restore of processes from a checkpoint of files alone.
    #[error("checkpoint {checkpoint} of {container} holds no processes")]
    NoProcessImage {
        /// The container whose history holds it.
        container: String,
        /// The checkpoint's name.
        checkpoint: String,
    },
    /// The operation is not allowed in the container's current state.
    #[error("container {id} is {state}: cannot {operation}")]
    WrongState {
        /// The container id.
        id: String,
        /// Its state.
        state: String,
        /// What was attempted.
        operation: &'static str,
    },
    /// The container's processes cannot be checkpointed in a way that restores:
    /// refused before anything is frozen or dumped.
    #[error("cannot checkpoint the processes of container {id}: {reason}")]
    ProcessDumpRefused {
        /// The container id.
        id: String,
        /// Why, and what still works.
        reason: String,
    },
    /// A process of the container is stopped by a signal while the v1 freezer holds
    /// it, and the dump has no cgroup v2 directory to freeze it through instead
    /// (see `crate::stopped`).
    #[error(
        "process {pid} of the container is stopped (SIGSTOP or job control) in a container \
         frozen by the v1 freezer, and the dump has no cgroup v2 directory to freeze it \
         through: continue the process (kill -CONT) and checkpoint again"
    )]
    StoppedProcess {
        /// Its host pid.
        pid: i32,
    },
    /// The helper process that runs libcontainer's forking calls failed.
    #[error("helper process failed to {operation}: {message}")]
    Helper {
        /// What the helper was asked to do.
        operation: &'static str,
        /// The helper's own error text.
        message: String,
    },
    /// The helper process reported a failure of a known kind.
    #[error("helper process failed to {operation}: {}", failure.message)]
    InHelper {
        /// What the helper was asked to do.
        operation: &'static str,
        /// Its kind and text, as the helper gave them.
        failure: Failure,
    },
    /// A libcontainer call failed.
    #[error("libcontainer {operation} failed: {source}")]
    Libcontainer {
        /// What was attempted.
        operation: &'static str,
        /// The underlying error (boxed: it is large, and errors travel by value).
        #[source]
        source: Box<libcontainer::error::LibcontainerError>,
    },
    /// A cgroup operation failed.
    #[error("cgroup {operation}: {message}")]
    Cgroup {
        /// What was attempted.
        operation: &'static str,
        /// The underlying error text.
        message: String,
    },
    /// A name (snapshot, container key) is not allowed.
    #[error("invalid {what} {name:?}: use letters, digits, '_', '-' and '.', not first '.' or '-', at most 128")]
    BadName {
        /// What the name is for.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// A snapshot name that belongs to the checkpoints (`ckpt-<seq>`).
    #[error("snapshot name {name:?} is reserved: names starting with ckpt- are the checkpoints' own (use crabctl checkpoint and crabctl rm for those)")]
    ReservedName {
        /// The name.
        name: String,
    },
    /// No such snapshot.
    #[error("container {container} has no snapshot {name:?}")]
    SnapshotNotFound {
        /// The container.
        container: String,
        /// The snapshot name.
        name: String,
    },
    /// A snapshot of that name exists already.
    #[error("container {container} already has a snapshot {name:?}")]
    SnapshotExists {
        /// The container.
        container: String,
        /// The snapshot name.
        name: String,
    },
    /// The container has no tree in the store.
    #[error("container {0} has no root file system in the store")]
    NoTree(String),
    /// The storage pool has no space left.
    #[error("storage pool is full: {command}: {message}")]
    PoolFull {
        /// The command that failed.
        command: String,
        /// Its error output.
        message: String,
    },
    /// A byte quota of the host configuration's `[quota]` would be passed.
    #[error("quota: {what} would pass {quota}: {message}")]
    QuotaExceeded {
        /// What was refused, and for whom.
        what: String,
        /// The configuration key (`quota.sandbox_pool_bytes`, ...).
        quota: &'static str,
        /// The figures.
        message: String,
    },
    /// A storage tool failed.
    #[error("{command}: {message}")]
    Command {
        /// The command line.
        command: String,
        /// Its error output.
        message: String,
    },
    /// A stream or archive given to a store's import reaches beyond what it may
    /// change (a path out of the tree, another container's snapshot, a layer the
    /// store does not hold). Nothing of it is kept.
    #[error("import refused: {0}")]
    ImportRefused(String),
    /// A storage operation failed.
    #[error("storage {operation}: {message}")]
    Storage {
        /// What was attempted.
        operation: &'static str,
        /// Why it failed.
        message: String,
    },
    /// The CRIU binary is not there.
    #[error("CRIU not found at {0}: install CRIU 4.2 or later (hack/setup.sh builds it), or set checkpoint.criu")]
    CriuMissing(PathBuf),
    /// A CRIU dump or restore failed.
    #[error("CRIU {operation} failed: {message} (log: {})", log.display())]
    Criu {
        /// dump or restore.
        operation: &'static str,
        /// The last errors CRIU logged.
        message: String,
        /// Its log file.
        log: PathBuf,
    },
    /// A checkpoint directory is missing a part, or holds something this version
    /// cannot read.
    #[error("invalid checkpoint {}: {message}", path.display())]
    BadCheckpoint {
        /// The checkpoint directory.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// An archive's spec asks for more than an import gives (see
    /// [`crate::checkpoint::import_spec`]).
    #[error(transparent)]
    SpecRefused(#[from] crate::checkpoint::import_spec::Refused),
    /// A file-system or other I/O call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was attempted, and on what.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A rollback of the files failed part of the way: the tree may be neither the
    /// old one nor the snapshot's, so the processes were killed before any ran on it.
    #[error("rollback of {id} failed part of the way, so its processes were stopped (none runs on a partly rolled-back tree); roll back again or restore it: {source}")]
    HalfRolledBack {
        /// Container id.
        id: String,
        /// Why the rollback failed.
        #[source]
        source: Box<Error>,
    },
    /// The eBPF inspector could not be loaded or read.
    #[error("eBPF inspector: {0}")]
    Inspector(#[from] crab_bpf::Error),
    /// A system call failed.
    #[error("{context}: {source}")]
    Sys {
        /// What was attempted.
        context: String,
        /// The errno.
        #[source]
        source: nix::Error,
    },
}

impl Error {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Config { .. }
            | Error::InvalidSpec { .. }
            | Error::MissingRootfs(_)
            | Error::BadName { .. }
            | Error::ReservedName { .. }
            | Error::BadCheckpoint { .. }
            | Error::ImportRefused(_)
            | Error::SpecRefused(_) => ErrorKind::InvalidArgument,
            Error::AlreadyExists(_) | Error::SnapshotExists { .. } => ErrorKind::AlreadyExists,
            Error::NotFound(_) | Error::SnapshotNotFound { .. } => ErrorKind::NotFound,
            Error::WrongState { .. }
            | Error::NoProcessImage { .. }
            | Error::ProcessDumpRefused { .. }
            | Error::StoppedProcess { .. }
            | Error::CriuMissing(_)
            | Error::NoTree(_) => ErrorKind::FailedPrecondition,
            Error::PoolFull { .. } => ErrorKind::Unavailable,
            Error::QuotaExceeded { .. } => ErrorKind::ResourceExhausted,
            Error::InHelper { failure, .. } => failure.kind,
            Error::Helper { .. }
            | Error::Libcontainer { .. }
            | Error::Cgroup { .. }
            | Error::Command { .. }
            | Error::Storage { .. }
            | Error::Criu { .. }
            | Error::Io { .. }
            | Error::Inspector(_)
            | Error::HalfRolledBack { .. }
            | Error::Sys { .. } => ErrorKind::Internal,
        }
    }

    /// Wraps an I/O error with what was being done.
    /// A full file system becomes [`Error::PoolFull`], a passed quota [`Error::QuotaExceeded`].
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let context = context.into();
        move |source| {
            if source.raw_os_error() == Some(libc::ENOSPC) {
                Error::PoolFull {
                    command: context,
                    message: source.to_string(),
                }
            } else if source.raw_os_error() == Some(libc::EDQUOT) {
                // The only kernel quota Crab sets is the sandbox's pool quota.
                Error::QuotaExceeded {
                    what: context,
                    quota: "quota.sandbox_pool_bytes",
                    message: source.to_string(),
                }
            } else {
                Error::Io { context, source }
            }
        }
    }

    /// Wraps an errno with what was being done.
    pub fn sys(context: impl Into<String>) -> impl FnOnce(nix::Error) -> Error {
        let context = context.into();
        move |source| Error::Sys { context, source }
    }

    /// Wraps a libcontainer error with the operation's name.
    pub fn libcontainer(
        operation: &'static str,
    ) -> impl FnOnce(libcontainer::error::LibcontainerError) -> Error {
        move |source| Error::Libcontainer {
            operation,
            source: Box::new(source),
        }
    }
}
