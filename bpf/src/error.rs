//! Errors of the inspector.

use std::path::PathBuf;

/// What can go wrong loading or reading the inspector.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A libbpf call failed (load, attach, pin, map access).
    #[error("{what}: {source}")]
    Bpf {
        /// What was being done.
        what: String,
        /// libbpf's error.
        source: libbpf_rs::Error,
    },
    /// The opened object has no read-only data section to set its flags in.
    #[error("the eBPF object has no read-only data (its have_rdonly_cast flag)")]
    NoReadOnlyData,
    /// The programs did not see the calibration opens as expected.
    #[error(
        "cannot tell which f_mode bit means created on this kernel \
         (opens seen {seen}, f_mode of a created file {created:#x}, of an existing one {existing:#x})"
    )]
    Calibration {
        /// Calibration opens the programs saw (2 expected).
        seen: u64,
        /// f_mode of the open that created the file.
        created: u64,
        /// f_mode of the open of the existing file.
        existing: u64,
    },
    /// The host's table of watched containers is full: this one is not watched,
    /// so each of its turns is a full checkpoint.
    #[error(
        "the eBPF inspector already watches {max} containers, its most: cgroup {cgid} is \
         not watched, and each of its turns is a full checkpoint until one of the others \
         is deleted"
    )]
    TableFull {
        /// The container's cgroup id.
        cgid: u64,
        /// The table's size.
        max: u64,
    },
    /// A file system call failed (bpffs, lock file).
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Result of the inspector's calls.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn bpf(what: impl Into<String>) -> impl FnOnce(libbpf_rs::Error) -> Error {
        let what = what.into();
        move |source| Error::Bpf { what, source }
    }

    pub(crate) fn io(
        what: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { what, path, source }
    }
}
