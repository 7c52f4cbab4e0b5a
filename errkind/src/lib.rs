//! The kinds of failure every door of Crab answers with.
//!
//! One set of kinds, carried from where a failure happens (the runtime, the
//! helper process, a shim's operation) to every door a client comes through.
//! Each door spells a kind its own way:
//!
//! | kind | containerd (ttrpc) | control socket | `crabctl` exit code | agent API (HTTP) |
//! |---|---|---|---|---|
//! | not found | `NOT_FOUND` | `not-found` | 3 | 404 |
//! | already exists | `ALREADY_EXISTS` | `already-exists` | 4 | 409 |
//! | failed precondition | `FAILED_PRECONDITION` | `failed-precondition` | 5 | 412 |
//! | invalid argument | `INVALID_ARGUMENT` | `invalid-argument` | 6 | 400 |
//! | busy | `UNAVAILABLE` | `busy` | 7 | 409 |
//! | unavailable | `UNAVAILABLE` | `unavailable` | 8 | 503 |
//! | internal | `UNKNOWN` | `internal` | 1 | 500 |
//!
//! Busy (another operation runs on the container: retry once it ends) is a
//! conflict with the container's state for an HTTP client, and unavailable
//! (the host cannot serve now: a shim gone, a full queue) is a 503. The ttrpc
//! codes live in the shim, which is the crate that knows ttrpc.

use serde::{Deserialize, Serialize};

/// What kind of failure an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// No such container, checkpoint, snapshot or process.
    NotFound,
    /// A container, checkpoint or snapshot of that name exists already.
    AlreadyExists,
    /// Not in the state the operation needs (stopped, no process image, ...).
    FailedPrecondition,
    /// The request itself is wrong (a bad name, spec, option or value).
    InvalidArgument,
    /// Another operation runs on the container; retry once it ends.
    Busy,
    /// The service cannot answer now (no shim, a full queue, no space left).
    Unavailable,
    /// A quota of the host configuration is used up (forks alive, forks or
    /// checkpoints per minute); retry later or free some.
    ResourceExhausted,
    /// Anything else: a bug, or a tool that failed.
    #[default]
    Internal,
}

impl ErrorKind {
    /// Every kind.
    pub const ALL: [ErrorKind; 8] = [
        ErrorKind::NotFound,
        ErrorKind::AlreadyExists,
        ErrorKind::FailedPrecondition,
        ErrorKind::InvalidArgument,
        ErrorKind::Busy,
        ErrorKind::Unavailable,
        ErrorKind::ResourceExhausted,
        ErrorKind::Internal,
    ];

    /// The HTTP status the agent API answers with.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorKind::NotFound => 404,
            ErrorKind::AlreadyExists | ErrorKind::Busy => 409,
            ErrorKind::FailedPrecondition => 412,
            ErrorKind::InvalidArgument => 400,
            ErrorKind::Unavailable => 503,
            ErrorKind::ResourceExhausted => 429,
            ErrorKind::Internal => 500,
        }
    }

    /// `crabctl`'s exit code (2 is left to its argument parser).
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorKind::Internal => 1,
            ErrorKind::NotFound => 3,
            ErrorKind::AlreadyExists => 4,
            ErrorKind::FailedPrecondition => 5,
            ErrorKind::InvalidArgument => 6,
            ErrorKind::Busy => 7,
            ErrorKind::Unavailable => 8,
            ErrorKind::ResourceExhausted => 9,
        }
    }

    /// Its name on the wire (`not-found`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not-found",
            ErrorKind::AlreadyExists => "already-exists",
            ErrorKind::FailedPrecondition => "failed-precondition",
            ErrorKind::InvalidArgument => "invalid-argument",
            ErrorKind::Busy => "busy",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::ResourceExhausted => "resource-exhausted",
            ErrorKind::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A failure as it crosses a door: its kind and what happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// What kind of failure.
    #[serde(default)]
    pub kind: ErrorKind,
    /// What happened, with its causes.
    pub message: String,
}

impl Failure {
    /// A failure of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_each_kind_has_its_own_exit_code_outside_the_parsers() {
        let mut codes: Vec<i32> = ErrorKind::ALL.iter().map(|k| k.exit_code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), ErrorKind::ALL.len());
        assert!(!codes.contains(&0) && !codes.contains(&2));
    }

    #[test]
    fn test_http_statuses_follow_the_table() {
        let statuses: Vec<u16> = ErrorKind::ALL.iter().map(|k| k.http_status()).collect();
        assert_eq!(statuses, [404, 409, 412, 400, 409, 503, 429, 500]);
    }

    #[test]
    fn test_wire_names_round_trip_and_a_missing_kind_reads_as_internal() {
        for kind in ErrorKind::ALL {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.name()));
            assert_eq!(serde_json::from_str::<ErrorKind>(&json).unwrap(), kind);
        }
        let old: Failure = serde_json::from_str(r#"{"message":"m"}"#).unwrap();
        assert_eq!(old.kind, ErrorKind::Internal);
    }
}
