//! The one mapping from Crab's errors to ttrpc status codes.

use containerd_shim::protos::ttrpc::{self, Code};
use crab_runtime::error::ErrorKind;
use crab_runtime::Error as RuntimeError;

/// Errors of the task service.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// From the runtime crate.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// No such container or exec process.
    #[error("{0}")]
    NotFound(String),
    /// Exists already.
    #[error("{0}")]
    AlreadyExists(String),
    /// The request is malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// Not allowed in the current state.
    #[error("{0}")]
    FailedPrecondition(String),
    /// Another operation on the container runs (a checkpoint, a rollback).
    #[error("{0}")]
    Busy(String),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// Result of a task-service operation.
pub type ShimResult<T> = Result<T, ShimError>;

impl ShimError {
    /// What kind of failure this is (for the control socket's answers too).
    pub fn kind(&self) -> ErrorKind {
        match self {
            ShimError::NotFound(_) => ErrorKind::NotFound,
            ShimError::AlreadyExists(_) => ErrorKind::AlreadyExists,
            ShimError::InvalidArgument(_) => ErrorKind::InvalidArgument,
            ShimError::FailedPrecondition(_) => ErrorKind::FailedPrecondition,
            ShimError::Busy(_) => ErrorKind::Busy,
            ShimError::Other(_) => ErrorKind::Internal,
            ShimError::Runtime(e) => e.kind(),
        }
    }

    /// The ttrpc code containerd turns into its errdefs.
    pub fn code(&self) -> Code {
        match self.kind() {
            ErrorKind::NotFound => Code::NOT_FOUND,
            ErrorKind::AlreadyExists => Code::ALREADY_EXISTS,
            ErrorKind::InvalidArgument => Code::INVALID_ARGUMENT,
            ErrorKind::FailedPrecondition => Code::FAILED_PRECONDITION,
            ErrorKind::Busy | ErrorKind::Unavailable => Code::UNAVAILABLE,
            ErrorKind::ResourceExhausted => Code::RESOURCE_EXHAUSTED,
            ErrorKind::Internal => Code::UNKNOWN,
        }
    }
}

impl From<ShimError> for ttrpc::Error {
    fn from(e: ShimError) -> Self {
        let message = crab_runtime::helper::error_chain(&e);
        tracing::warn!(code = ?e.code(), "{message}");
        ttrpc::Error::RpcStatus(ttrpc::get_status(e.code(), message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn test_runtime_errors_map_to_containerd_codes() {
        let cases = [
            (RuntimeError::NotFound("x".into()), Code::NOT_FOUND),
            (
                RuntimeError::AlreadyExists("x".into()),
                Code::ALREADY_EXISTS,
            ),
            (
                RuntimeError::MissingRootfs(PathBuf::from("/r")),
                Code::INVALID_ARGUMENT,
            ),
            (
                RuntimeError::InvalidSpec {
                    bundle: PathBuf::from("/b"),
                    message: "m".into(),
                },
                Code::INVALID_ARGUMENT,
            ),
        ];
        for (err, code) in cases {
            assert_eq!(ShimError::from(err).code(), code);
        }
    }

    #[test]
    fn test_a_helper_failure_keeps_its_kind_across_the_shim() {
        let failure = crab_runtime::error::Failure::new(ErrorKind::NotFound, "no checkpoint x");
        let e = ShimError::from(RuntimeError::InHelper {
            operation: "roll back",
            failure,
        });
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert_eq!(e.code(), Code::NOT_FOUND);
        assert_eq!(
            ShimError::Busy("container a is busy: checkpointing".into()).code(),
            Code::UNAVAILABLE
        );
    }

    #[test]
    fn test_status_message_keeps_the_cause() {
        let e: ttrpc::Error =
            ShimError::from(RuntimeError::MissingRootfs(PathBuf::from("/nowhere"))).into();
        match e {
            ttrpc::Error::RpcStatus(s) => {
                assert_eq!(s.code(), Code::INVALID_ARGUMENT);
                assert!(s.message.contains("/nowhere"), "{}", s.message);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
