//! The state of one process (a container's init or an exec) as containerd sees it.

use std::time::SystemTime;

use containerd_shim::protos::api::Status;
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use tokio::sync::watch;

use crate::io::{ProcessIo, StdioPaths};

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// Exit code, or 128 + signal.
    pub code: u32,
    /// When the shim saw it.
    pub at: SystemTime,
}

impl Exit {
    /// Now, with this code.
    pub fn now(code: u32) -> Exit {
        Exit {
            code,
            at: SystemTime::now(),
        }
    }

    /// As a protobuf timestamp.
    pub fn timestamp(&self) -> Timestamp {
        timestamp(self.at)
    }
}

/// A protobuf timestamp of a system time.
pub fn timestamp(t: SystemTime) -> Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
        ..Default::default()
    }
}

/// A process of the task.
#[derive(Debug)]
pub struct Process {
    /// Exec id; empty for the init.
    pub exec_id: String,
    /// Pid on the host; 0 before it exists.
    pub pid: i32,
    /// Lifecycle state.
    pub status: Status,
    /// Its fifos.
    pub stdio: StdioPaths,
    /// The copy tasks, once started.
    pub io: Option<ProcessIo>,
    /// For exec processes: the OCI process JSON.
    pub spec: Option<Vec<u8>>,
    exit_tx: watch::Sender<Option<Exit>>,
}

impl Process {
    /// A process in the `Created` state.
    pub fn new(exec_id: &str, stdio: StdioPaths) -> Process {
        let (exit_tx, _) = watch::channel(None);
        Process {
            exec_id: exec_id.to_string(),
            pid: 0,
            status: Status::CREATED,
            stdio,
            io: None,
            spec: None,
            exit_tx,
        }
    }

    /// How it exited, if it has.
    pub fn exit(&self) -> Option<Exit> {
        *self.exit_tx.borrow()
    }

    /// Records the exit (once; later calls keep the first).
    pub fn set_exited(&mut self, exit: Exit) {
        self.status = Status::STOPPED;
        self.exit_tx.send_if_modified(|e| {
            if e.is_none() {
                *e = Some(exit);
                true
            } else {
                false
            }
        });
    }

    /// A receiver that sees the exit.
    pub fn subscribe(&self) -> watch::Receiver<Option<Exit>> {
        self.exit_tx.subscribe()
    }
}
