//! The helper's wire: the request it is given (one JSON argument) and the line it
//! answers on stdout.
//!
//! A request is one of the [`Call`]s, wrapped in [`Request`] so that the helper knows
//! which to serve. The answer is one line, either `{"reply": <the call's Reply>}` or
//! `{"failure": {"kind": ..., "message": ...}}`. Both ends name the reply's type
//! through the same [`Call`], so a reply is decoded into the type it was served as.

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};

use super::spawn::{Create, Exec};
use super::Call;
use crate::checkpoint::calls::{ApplyFsDelta, Checkpoint, HistoryOp, OnHistory};
use crate::checkpoint::restore_helper::Restore;
use crate::error::Failure;
use crate::storage::in_helper::{OnStore, StoreOp};
use crate::{Error, Result};

/// What the helper is asked to do: one [`Call`] each.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// Create (not start) a container from an OCI bundle.
    Create(Create),
    /// Start an additional process in a running container.
    Exec(Exec),
    /// Checkpoint a container (CRIU dump and file-system delta).
    Checkpoint(Checkpoint),
    /// An operation on the container's checkpoint history.
    History(OnHistory<HistoryOp>),
    /// A store operation (the stores exec tools).
    Store(OnStore<StoreOp>),
    /// Apply a checkpoint's file-system delta to a rootfs.
    ApplyFsDelta(ApplyFsDelta),
    /// Restore a container's processes from CRIU images (see [`crate::checkpoint`]).
    Restore(Restore),
}

/// The helper's answer line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Answer<R> {
    /// What the call answered.
    Reply(R),
    /// The call failed: the error's kind and text, so that the caller answers its
    /// own client with the same kind.
    Failure(Failure),
}

/// Serves `request` in the helper; answers its line and the helper's exit code.
pub(super) fn serve(request: Request) -> (String, i32) {
    match request {
        Request::Create(call) => respond(call),
        Request::Exec(call) => respond(call),
        Request::Checkpoint(call) => respond(call),
        Request::ApplyFsDelta(call) => respond(call),
        Request::Restore(call) => respond(call),
        Request::History(call) => {
            let (at, op) = call.split();
            match op {
                HistoryOp::Checkpoint(op) => respond(at.with(op)),
                HistoryOp::Remove(op) => respond(at.with(op)),
                HistoryOp::RollbackFs(op) => respond(at.with(op)),
                HistoryOp::SnapshotFs(op) => respond(at.with(op)),
            }
        }
        Request::Store(call) => {
            let (at, op) = call.split();
            match op {
                StoreOp::Prepare(op) => respond(at.with(op)),
                StoreOp::Clone(op) => respond(at.with(op)),
                StoreOp::Release(op) => respond(at.with(op)),
                StoreOp::Collect(op) => respond(at.with(op)),
                StoreOp::ChangedSinceImage(op) => respond(at.with(op)),
                StoreOp::Reconcile(op) => respond(at.with(op)),
                StoreOp::WriteBack(op) => respond(at.with(op)),
            }
        }
    }
}

/// Serves one call; its answer line and exit code (the error's text also goes to
/// stderr, for the helper's log).
fn respond<C: Call>(call: C) -> (String, i32) {
    match call.serve() {
        Ok(reply) => (encode(&Answer::Reply(reply)), 0),
        Err(e) => {
            let message = super::error_chain(&e);
            eprintln!("{message}");
            let failure = Answer::<()>::Failure(Failure::new(e.kind(), message));
            (encode(&failure), 1)
        }
    }
}

fn encode<R: Serialize>(answer: &Answer<R>) -> String {
    serde_json::to_string(answer).expect("answer serializes")
}

/// Reads the answer of an `operation` in one line of the helper's stdout: `None`
/// for a line that is no answer (a tool's output). An answer of the wrong shape for
/// the call is an error, naming the operation.
pub(crate) fn decode<R: DeserializeOwned>(
    operation: &'static str,
    line: &str,
) -> Option<Result<R>> {
    serde_json::from_str::<Answer<IgnoredAny>>(line).ok()?;
    Some(match serde_json::from_str::<Answer<R>>(line) {
        Ok(Answer::Reply(reply)) => Ok(reply),
        Ok(Answer::Failure(failure)) => Err(Error::InHelper { operation, failure }),
        Err(e) => Err(Error::Helper {
            operation,
            message: format!("unexpected answer: {e}"),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::restore_helper::{RestorePhases, Restored};
    use crate::error::ErrorKind;

    #[test]
    fn test_a_typed_reply_decodes_as_it_was_served() -> Result<()> {
        let restored = Restored {
            pid: 42,
            phases: RestorePhases {
                prepare_ms: 1,
                criu_ms: 2,
                finish_ms: 3,
            },
        };
        let line = encode(&Answer::Reply(restored));
        let back: Restored = decode("restore container", &line).expect("an answer")?;
        assert_eq!(back.pid, 42);
        assert_eq!(back.phases.criu_ms, 2);

        let keys: Option<Vec<String>> =
            decode("operate the store", r#"{"reply":null}"#).expect("an answer")?;
        assert_eq!(keys, None);
        let () = decode("operate the store", &encode(&Answer::Reply(()))).expect("an answer")?;
        Ok(())
    }

    #[test]
    fn test_a_failure_keeps_its_kind_and_operation() {
        let line = encode(&Answer::<()>::Failure(Failure::new(
            ErrorKind::NotFound,
            "no checkpoint x",
        )));
        match decode::<i32>("change the checkpoint history", &line) {
            Some(Err(Error::InHelper { operation, failure })) => {
                assert_eq!(operation, "change the checkpoint history");
                assert_eq!(failure.kind, ErrorKind::NotFound);
                assert_eq!(failure.message, "no checkpoint x");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn test_a_reply_of_the_wrong_shape_is_an_error_naming_the_operation() {
        let line = r#"{"reply":{"seq":"not a pid"}}"#;
        match decode::<i32>("exec process", line) {
            Some(Err(e @ Error::Helper { .. })) => {
                let text = e.to_string();
                assert!(text.contains("exec process"), "{text}");
                assert!(text.contains("unexpected answer"), "{text}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn test_a_line_that_is_no_answer_is_skipped() {
        for line in ["", "criu: some output", "{}", r#"{"pid": 3}"#, "[1,2]"] {
            assert!(decode::<i32>("exec process", line).is_none(), "{line}");
        }
    }

    #[test]
    fn test_a_request_round_trips() -> Result<()> {
        let request: Request = Exec {
            id: "c".into(),
            root: "/run/crab".into(),
            process: "/tmp/p.json".into(),
            stdio: Default::default(),
            console_socket: None,
            tracking: "/sys/fs/cgroup/crab/c".into(),
        }
        .into();
        let json = serde_json::to_string(&request).expect("serializes");
        match serde_json::from_str::<Request>(&json).expect("deserializes") {
            Request::Exec(exec) => assert_eq!(exec.id, "c"),
            other => panic!("{other:?}"),
        }
        Ok(())
    }

    #[test]
    fn test_a_store_operation_travels_as_its_variant() -> Result<()> {
        use crate::storage::in_helper::Release;
        use crate::storage::ContainerKey;

        let key = ContainerKey::new("default", "c")?;
        let call = OnStore {
            config: crate::config::Config::default(),
            op: Release { key: key.clone() },
        };
        let request: Request = call.into();
        let json = serde_json::to_string(&request).expect("serializes");
        match serde_json::from_str::<Request>(&json).expect("deserializes") {
            Request::Store(OnStore {
                op: StoreOp::Release(release),
                ..
            }) => assert_eq!(release.key, key),
            other => panic!("{other:?}"),
        }
        Ok(())
    }
}
