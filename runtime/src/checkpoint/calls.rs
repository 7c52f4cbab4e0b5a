//! The checkpoint calls the shim makes to the helper process (CRIU and the storage
//! tools are its children there, out of reach of the shim's reaper), each with the
//! type of its reply: a checkpoint for containerd ([`Checkpoint`]), the file-system
//! delta of a restore ([`ApplyFsDelta`]), and the operations on a container's history
//! ([`OnHistory`] of one [`HistoryCall`]).

use std::path::PathBuf;

use libcontainer::container::ContainerStatus;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::engine::CheckpointOpts;
use super::history::{self, Entry};
use super::ops::CheckpointRequest;
use super::Manifest;
use crate::config::Config;
use crate::container::{Container, CrabState};
use crate::helper::{self, Call, ChildStdio, Request};
use crate::inspect;
use crate::storage::fault;
use crate::Result;

/// Checkpoint a container (CRIU dump and file-system delta); answers its manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Checkpoint {
    /// libcontainer's state root.
    pub root: PathBuf,
    /// Crab's state of the container.
    pub state: CrabState,
    /// What to write where.
    pub opts: CheckpointOpts,
}

impl Call for Checkpoint {
    type Reply = Manifest;
    const OPERATION: &'static str = "checkpoint container";

    fn serve(self) -> Result<Manifest> {
        let c = Container {
            root: self.root,
            state: self.state,
        };
        c.checkpoint_here(&self.opts)
    }
}

/// Apply a checkpoint's file-system delta to a rootfs; answers nothing.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApplyFsDelta {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// The rootfs (a fresh tree of the image).
    pub rootfs: PathBuf,
}

impl Call for ApplyFsDelta {
    type Reply = ();
    const OPERATION: &'static str = "apply a file-system delta";

    fn serve(self) -> Result<()> {
        super::engine::apply_fs_delta_here(&self.dir, &self.rootfs)
    }
}

/// An operation on a container's history, run in the helper, and what it answers.
pub trait HistoryCall: Into<HistoryOp> {
    /// What the operation answers.
    type Reply: Serialize + DeserializeOwned;
    /// The operation itself, in the helper, on container `c`.
    fn serve(self, c: &Container, config: &Config) -> Result<Self::Reply>;
}

/// The operations on a container's history, as the helper receives them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum HistoryOp {
    /// Take a checkpoint.
    Checkpoint(CheckpointRequest),
    /// Delete a checkpoint.
    Remove(RemoveCheckpoint),
    /// Roll the container's files back to a snapshot.
    RollbackFs(RollbackFs),
    /// Take a snapshot of the container's files.
    SnapshotFs(SnapshotFs),
}

/// Delete the checkpoint of this name (or seq); answers the removed [`Entry`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RemoveCheckpoint(pub String);

/// Roll the container's files back to this snapshot (the caller has frozen or
/// stopped its processes); answers nothing.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RollbackFs(pub String);

/// Take a snapshot of this name of the container's files (the caller has frozen its
/// processes); answers its name.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotFs(pub String);

/// Take a checkpoint; answers its [`Entry`].
impl HistoryCall for CheckpointRequest {
    type Reply = Entry;
    fn serve(self, c: &Container, config: &Config) -> Result<Entry> {
        c.checkpoint_into_history(config, &self)
    }
}

impl HistoryCall for RemoveCheckpoint {
    type Reply = Entry;
    fn serve(self, c: &Container, config: &Config) -> Result<Entry> {
        c.remove_checkpoint(config, &self.0)
    }
}

impl HistoryCall for RollbackFs {
    type Reply = ();
    fn serve(self, c: &Container, config: &Config) -> Result<()> {
        Container::open_store(config)?.rollback(&c.key()?, &self.0)
    }
}

impl HistoryCall for SnapshotFs {
    type Reply = String;
    fn serve(self, c: &Container, config: &Config) -> Result<String> {
        history::check_hand_snapshot_name(&self.0)?;
        let info = Container::open_store(config)?.snapshot(&c.key()?, &self.0)?;
        Ok(info.name)
    }
}

helper::travels_as!(Request: Checkpoint => Checkpoint, ApplyFsDelta => ApplyFsDelta);

helper::travels_as!(
    HistoryOp:
    CheckpointRequest => Checkpoint,
    RemoveCheckpoint => Remove,
    RollbackFs => RollbackFs,
    SnapshotFs => SnapshotFs
);

/// An operation `op` on the history of one container.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OnHistory<O> {
    /// The container's configuration (its store, the checkpoint store).
    pub config: Config,
    /// libcontainer's state root.
    pub root: PathBuf,
    /// Crab's state of the container.
    pub state: CrabState,
    /// What to do.
    pub op: O,
}

impl<O> OnHistory<O> {
    /// The container, and the operation apart.
    pub(crate) fn split(self) -> (OnHistory<()>, O) {
        let OnHistory {
            config,
            root,
            state,
            op,
        } = self;
        let at = OnHistory {
            config,
            root,
            state,
            op: (),
        };
        (at, op)
    }
}

impl OnHistory<()> {
    /// Operation `op` on this container.
    pub(crate) fn with<P>(self, op: P) -> OnHistory<P> {
        OnHistory {
            config: self.config,
            root: self.root,
            state: self.state,
            op,
        }
    }
}

impl<O: Into<HistoryOp>> From<OnHistory<O>> for Request {
    fn from(call: OnHistory<O>) -> Request {
        let (at, op) = call.split();
        Request::History(at.with(op.into()))
    }
}

impl<O: HistoryCall> Call for OnHistory<O> {
    type Reply = O::Reply;
    const OPERATION: &'static str = "change the checkpoint history";

    fn serve(self) -> Result<O::Reply> {
        fault::choose_from(self.config.fault_file.as_deref());
        let (at, op) = self.split();
        let c = Container {
            root: at.root,
            state: at.state,
        };
        op.serve(&c, &at.config)
    }
}

impl Container {
    /// Runs `op` in a helper process (CRIU and the storage tools are its children,
    /// out of reach of the shim's reaper); answers what the op answers.
    pub fn history<O: HistoryCall>(&self, config: &Config, op: O) -> Result<O::Reply> {
        let call = OnHistory {
            config: config.clone(),
            root: self.root.clone(),
            state: self.state.clone(),
            op,
        };
        self.thawed_if_it_fails(|| helper::run(|_| call, ChildStdio::default()))
    }

    /// Takes a checkpoint (through [`Container::history`]).
    pub fn take_checkpoint(&self, config: &Config, req: CheckpointRequest) -> Result<Entry> {
        let entry = self.history(config, req)?;
        // The helper that wrote the images has exited: their sync runs in this
        // process, which lives on (the shim).
        if config.checkpoint.durability == crate::config::Durability::Shim
            && entry.kind.dumps_processes()
        {
            let dir = super::history::dir(config, &self.key()?);
            super::durability::sync_in_background(dir, entry.seq);
        }
        Ok(entry)
    }

    /// Runs `op`, a helper that may freeze the container. A helper that dies (killed,
    /// out of memory) cannot thaw what it froze: if the container ran before and is
    /// frozen after a failure, it is thawed here, and the inspector tainted (the dead
    /// helper may have reset it for a checkpoint it never recorded).
    pub(crate) fn thawed_if_it_fails<T>(&self, op: impl FnOnce() -> Result<T>) -> Result<T> {
        let was_running = self.is_running();
        let result = op();
        if result.is_err() {
            // A dump cut while a stopped process had the freeze handed to the v2
            // freezer left it there, where neither the thaw below nor the
            // client's resume reaches.
            let v1 = self
                .cgroup_path()
                .map(|c| super::engine::freezer_cgroup(&c));
            match v1
                .and_then(|v1| crate::stopped::hand_back_if_cut(&v1, &self.state.tracking_cgroup))
            {
                Ok(true) => {
                    tracing::warn!(id = %self.state.id, "a failed helper left the freeze with the v2 freezer: handed back")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(id = %self.state.id, error = %e, "hand the freeze back after a failed helper")
                }
            }
        }
        if result.is_err() && was_running {
            if matches!(self.status(), Ok(ContainerStatus::Paused)) {
                tracing::warn!(id = %self.state.id, "a failed helper left the container frozen: thawing it");
                if let Err(e) = self.resume() {
                    tracing::error!(id = %self.state.id, error = %e, "thaw after a failed helper");
                }
            }
            inspect::taint(self);
        }
        result
    }
}
