//! The snapshotter's errors, and the one mapping to gRPC codes containerd reads
//! (`NotFound`, `AlreadyExists` and `FailedPrecondition` change what it does).

use std::path::PathBuf;

/// What went wrong in a snapshotter call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No snapshot has this key.
    #[error("snapshot {0:?} does not exist")]
    NotFound(String),
    /// A snapshot with this key exists.
    #[error("snapshot {0:?} already exists")]
    AlreadyExists(String),
    /// The request is malformed (an empty or too long key, a bad parent).
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// The snapshot is not in the state the call needs (removing a parent,
    /// committing what is not active).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A file system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was attempted, on which path.
        context: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The metadata file cannot be read.
    #[error("metadata {path}: {message}")]
    Metadata {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A layer's usage could not be measured.
    #[error("measure {path}: {message}")]
    Measure {
        /// The layer's directory.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// Crab's store could not tell what a crab container's tree wrote.
    #[error("usage of the tree for {layer}: {message}")]
    TreeUsage {
        /// The writable layer the tree was made for.
        layer: PathBuf,
        /// Why.
        message: String,
    },
}

/// The snapshotter's results.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`Error::Io`] maker for `map_err`.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> tonic::Status {
        let msg = e.to_string();
        match e {
            Error::NotFound(_) => tonic::Status::not_found(msg),
            Error::AlreadyExists(_) => tonic::Status::already_exists(msg),
            Error::InvalidArgument(_) => tonic::Status::invalid_argument(msg),
            Error::FailedPrecondition(_) => tonic::Status::failed_precondition(msg),
            Error::Io { .. }
            | Error::Metadata { .. }
            | Error::Measure { .. }
            | Error::TreeUsage { .. } => tonic::Status::internal(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_codes_containerd_acts_on() {
        let code = |e: Error| tonic::Status::from(e).code();
        assert_eq!(code(Error::NotFound("a".into())), tonic::Code::NotFound);
        assert_eq!(
            code(Error::AlreadyExists("a".into())),
            tonic::Code::AlreadyExists
        );
        assert_eq!(
            code(Error::FailedPrecondition("busy".into())),
            tonic::Code::FailedPrecondition
        );
        assert_eq!(
            code(Error::InvalidArgument("key".into())),
            tonic::Code::InvalidArgument
        );
        let io = Error::io("mkdir /x")(std::io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(code(io), tonic::Code::Internal);
    }
}
