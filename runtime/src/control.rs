//! Crab's control API: one unix socket per container, served by its shim, for the
//! operations containerd has no call for (checkpoint history, rollback in place).
//!
//! The socket is `<state_dir>/<namespace>/<id>.ctl`, mode 0600 in a root-only
//! directory: only root on the host reaches it. A connection carries one request (a
//! JSON line) and gets one response (a JSON line). Requests name the container's
//! namespace and id, and the shim refuses any other.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::checkpoint::history::Entry;
use crate::checkpoint::ops::CheckpointRequest;
use crate::checkpoint::stats::TurnStats;
use crate::config::Config;
use crate::error::ErrorKind;
use crate::inspect::Classification;
use crate::{Error, Result};

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    /// Take a checkpoint.
    Checkpoint {
        /// containerd namespace.
        namespace: String,
        /// Container id.
        id: String,
        /// What to take.
        #[serde(flatten)]
        request: CheckpointRequest,
        /// The connection the agent API's request came on, as the caller's
        /// socket sees it: when the caller runs in an exec the checkpoint would
        /// wait for, the checkpoint fails at once (that exec waits for this
        /// answer, and would outlive any wait).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        caller: Option<AgentConn>,
    },
    /// List the checkpoints.
    List {
        /// containerd namespace.
        namespace: String,
        /// Container id.
        id: String,
    },
    /// Delete a checkpoint.
    Remove {
        /// containerd namespace.
        namespace: String,
        /// Container id.
        id: String,
        /// Its name or seq.
        checkpoint: String,
    },
    /// Close the turn: classify what changed since the last checkpoint and take
    /// the checkpoint it needs (a skip entry when nothing changed).
    Turn {
        /// containerd namespace.
        namespace: String,
        /// Container id.
        id: String,
        /// Classify only; take nothing.
        #[serde(default)]
        dry_run: bool,
        /// Hidden in the LLM's think time: queue the checkpoint at low priority
        /// until a `Promote` (else high: someone waits for it now).
        #[serde(default)]
        background: bool,
        /// The connection the turn's LLM request came on, as the agent's socket
        /// sees it (the proxy saw it from the other end): the processes holding
        /// it are the agent. Given by the proxy of a container whose agent is
        /// fast-forwarded (`[agent] fast_forward`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<AgentConn>,
        /// The proxy's number for this turn, which its `Promote` names: the
        /// two come on separate connections, and a promotion that reaches the
        /// shim before the turn does is kept for it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<u64>,
    },
    /// The LLM answered before the turn's checkpoint is durable: raise that
    /// checkpoint to high priority in the host's queue.
    Promote {
        /// containerd namespace.
        namespace: String,
        /// Container id.
        id: String,
        /// The turn's token (see `Turn`); none: whichever turn is pending.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<u64>,
    },
    /// An agent's answer was held this long for its turn's checkpoint (reported
    /// by the proxy, for the container's metrics).
    Gated {
        /// containerd namespace.
        namespace: String,
        /// Container id.
        id: String,
        /// Microseconds held.
        us: u64,
    },
    /// The container's turn metrics.
    Stats {
        /// containerd namespace.
        namespace: String,
        /// Container id.
        id: String,
    },
    /// Take a snapshot of the container's root file system (frozen around it).
    FsSnapshot {
        /// containerd namespace.
        namespace: String,
        /// Container id.
        id: String,
        /// The snapshot's name.
        name: String,
    },
    /// Make the container's root file system that of a snapshot, in place (its
    /// processes frozen around it); the next turn then takes everything.
    FsRollback {
        /// containerd namespace.
        namespace: String,
        /// Container id.
        id: String,
        /// The snapshot's name.
        name: String,
    },
    /// Make the container's processes and files those of a checkpoint, in place.
    Rollback {
        /// containerd namespace.
        namespace: String,
        /// Container id.
        id: String,
        /// Its name or seq.
        checkpoint: String,
        /// The connection the agent API's request came on, as the caller's
        /// socket sees it: when a process of the container holds it, the
        /// caller lives in the sandbox, and only the files go back (its
        /// processes keep running, so that it gets the answer and remembers
        /// asking).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        caller: Option<AgentConn>,
    },
}

impl Request {
    /// The (namespace, id) the request names.
    pub fn target(&self) -> (&str, &str) {
        match self {
            Request::Checkpoint { namespace, id, .. }
            | Request::List { namespace, id }
            | Request::Remove { namespace, id, .. }
            | Request::Turn { namespace, id, .. }
            | Request::Promote { namespace, id, .. }
            | Request::Gated { namespace, id, .. }
            | Request::Stats { namespace, id }
            | Request::FsSnapshot { namespace, id, .. }
            | Request::FsRollback { namespace, id, .. }
            | Request::Rollback { namespace, id, .. } => (namespace, id),
        }
    }
}

/// A TCP connection from the agent to its proxy, from the agent's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentConn {
    /// The agent socket's own address (the proxy's peer).
    pub local: std::net::SocketAddr,
    /// The address it is connected to (the proxy's listener).
    pub remote: std::net::SocketAddr,
}

/// What a rollback did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollback {
    /// The checkpoint rolled back to.
    pub checkpoint: Entry,
    /// The init's pid afterwards (new when processes were restored).
    pub pid: i32,
    /// Whether the processes were restored (else only the files were rolled back).
    pub processes: bool,
    /// How long it took.
    pub ms: u64,
    /// Whether a standby replica was adopted (else the processes were restored
    /// from the images).
    #[serde(default)]
    pub standby: bool,
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum Response {
    /// A checkpoint taken or removed.
    Entry {
        /// It.
        entry: Entry,
    },
    /// The checkpoints, oldest first.
    Entries {
        /// They.
        entries: Vec<Entry>,
    },
    /// A turn's classification, and the checkpoint taken for it.
    Turn {
        /// What changed.
        classification: Classification,
        /// The entry recorded (none for a dry run).
        entry: Option<Entry>,
    },
    /// A file-system snapshot taken, or rolled back to.
    Fs {
        /// The snapshot.
        name: String,
        /// How long it took, the container frozen.
        ms: f64,
    },
    /// A rollback's report.
    RolledBack {
        /// It.
        report: Rollback,
    },
    /// Done; nothing to report.
    Done {
        /// Whether it changed anything (for a promotion: whether a checkpoint
        /// was waiting).
        changed: bool,
    },
    /// The container's turn metrics.
    Stats {
        /// They.
        stats: TurnStats,
    },
    /// The request failed.
    Error {
        /// What kind of failure (answers from older shims have none: internal).
        #[serde(default)]
        kind: ErrorKind,
        /// What went wrong.
        message: String,
    },
}

/// Where the control socket of a container is.
pub fn socket_path(config: &Config, namespace: &str, id: &str) -> PathBuf {
    config.namespace_dir(namespace).join(format!("{id}.ctl"))
}

/// Where the host-side door of a container's turn proxy is: a unix socket through
/// which orchestrators on the host reach the proxy without entering the
/// container's network namespace (root and `control_group` only, as the control
/// socket).
pub fn proxy_socket_path(config: &Config, namespace: &str, id: &str) -> PathBuf {
    config
        .namespace_dir(namespace)
        .join(format!("{id}.proxy.sock"))
}

/// Sends `request` to the container's shim and waits (up to `timeout`) for the answer.
pub fn call(config: &Config, request: &Request, timeout: Duration) -> Result<Response> {
    let (namespace, id) = request.target();
    let path = socket_path(config, namespace, id);
    let address = match crate::socket_path::SocketPath::new(&path) {
        Ok(a) => a,
        // No directory: no shim made it.
        Err(_) if !path.parent().is_some_and(Path::exists) => {
            return Err(Error::NotFound(format!(
                "{namespace}/{id} (no running task with a control socket at {})",
                path.display()
            )))
        }
        Err(e) => return Err(e),
    };
    let mut conn = UnixStream::connect(address.as_path()).map_err(|e| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
        ) {
            Error::NotFound(format!(
                "{namespace}/{id} (no running task with a control socket at {})",
                path.display()
            ))
        } else {
            Error::io(format!("connect to {}", path.display()))(e)
        }
    })?;
    conn.set_read_timeout(Some(timeout))
        .map_err(Error::io("set timeout"))?;
    let mut line = serde_json::to_vec(request).expect("request serializes");
    line.push(b'\n');
    conn.write_all(&line)
        .map_err(Error::io(format!("send to {}", path.display())))?;
    let mut answer = String::new();
    BufReader::new(conn)
        .read_line(&mut answer)
        .map_err(Error::io(format!("read from {}", path.display())))?;
    serde_json::from_str(&answer).map_err(|e| Error::Io {
        context: format!("answer from {}", path.display()),
        source: std::io::Error::other(format!("{e}: {answer:?}")),
    })
}
