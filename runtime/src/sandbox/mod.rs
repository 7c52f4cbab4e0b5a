//! One live container as Crab's own operations see it: the facade the shim calls.
//!
//! Each operation keeps the invariants every caller used to have to remember:
//! - a dump or a restore takes one of the host's checkpoint slots ([`bounded_at`]),
//!   queued at the caller's priority; a skipped turn takes none;
//! - a change Crab makes to the tree behind the inspector's back (a file-system
//!   rollback) taints the inspector, so that the next turn takes everything;
//! - the history is read and written under its lock ([`HistoryStore`]);
//! - tools run in the helper process, never in the (multithreaded) caller.
//!
//! What only the shim knows (which exec processes run, whether another operation
//! holds the container) stays in the shim.

mod export;
mod lifecycle;

pub use crate::checkpoint::pin::PinnedImage;
pub use lifecycle::RestoreImages;

use std::path::PathBuf;
use std::time::Duration;

use crate::checkpoint::calls::{RemoveCheckpoint, RollbackFs, SnapshotFs};
use crate::checkpoint::engine::{CheckpointOpts, Dumped};
use crate::checkpoint::history::Entry;
use crate::checkpoint::history_store::HistoryStore;
use crate::checkpoint::ops::{self, CheckpointRequest};
use crate::checkpoint::sched::Priority;
use crate::checkpoint::{bounded, bounded_at, Kind, Manifest};
use crate::config::{Config, PolicyMode};
use crate::container::Container;
use crate::control::AgentConn;
use crate::helper::ChildStdio;
use crate::inspect::{self, Classification};
use crate::standby::{Leftovers, Standby};
use crate::{criu, Result};

/// A container and the configuration it was created with.
#[derive(Debug, Clone)]
pub struct Sandbox {
    container: Container,
    config: Config,
}

/// A replica made a container's processes ([`Sandbox::adopt_standby`],
/// [`Sandbox::adopt_fork_replica`]).
#[derive(Debug)]
pub struct Adoption {
    /// The adopted init's host pid.
    pub pid: i32,
    /// The sandbox as it is after the adoption, in place of the one adopting.
    pub sandbox: Sandbox,
    /// What the adoption left, for [`Sandbox::clean_after_adoption`].
    pub leftovers: Leftovers,
}

/// A checkpoint taken, and how long it waited for a slot.
pub type Taken = (Entry, Duration);

impl Sandbox {
    /// The facade over `container`, created with `config`.
    pub(crate) fn new(container: Container, config: Config) -> Sandbox {
        Sandbox { container, config }
    }

    /// The container.
    pub fn container(&self) -> &Container {
        &self.container
    }

    /// The configuration it was created with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Takes a checkpoint of `req.kind`, in the host's queue at `priority` (a skip
    /// records an entry and takes no slot).
    pub fn checkpoint(&self, req: CheckpointRequest, priority: &Priority) -> Result<Taken> {
        let (c, config) = (&self.container, &self.config);
        if req.kind == Kind::Skip {
            return Ok((c.take_checkpoint(config, req)?, Duration::ZERO));
        }
        bounded_at(config, priority, || c.take_checkpoint(config, req))
    }

    /// A self-contained checkpoint into `opts.dir` (containerd's `Checkpoint`: CRIU
    /// images and the file delta), in one of the host's slots.
    pub fn checkpoint_to(&self, opts: &CheckpointOpts) -> Result<Manifest> {
        bounded(&self.config, || self.container.checkpoint(opts))
    }

    /// What the turn changed since the last checkpoint (every turn is full under
    /// the `full` policy) and, unless `dry_run`, the checkpoint it needs.
    pub fn turn(
        &self,
        dry_run: bool,
        priority: &Priority,
        agent: Option<AgentConn>,
    ) -> Result<(Classification, Option<Taken>)> {
        let class = self.classify(agent)?;
        if dry_run {
            return Ok((class, None));
        }
        let taken = self.take_turn(&class, priority)?;
        Ok((class, Some(taken)))
    }

    /// What the turn changed since the last checkpoint (every turn is full under
    /// the `full` policy); reads only, so it may be asked again. `agent`: the
    /// connection of the turn's LLM request ([`inspect::classify`]).
    pub fn classify(&self, agent: Option<AgentConn>) -> Result<Classification> {
        Ok(match self.config.policy.mode {
            PolicyMode::Adaptive => {
                let insp = inspect::inspector(&self.config)?;
                inspect::classify(&self.container, &self.config, &insp, agent)?
            }
            PolicyMode::Full => Classification::full("policy mode is full"),
        })
    }

    /// The checkpoint a turn classified as `class` needs.
    pub fn take_turn(&self, class: &Classification, priority: &Priority) -> Result<Taken> {
        let req = CheckpointRequest {
            kind: class.kind,
            name: None,
            mark: false,
        };
        self.checkpoint(req, priority)
    }

    /// Whether a process of the container holds the TCP connection `conn` (as
    /// its side sees it): the caller of the agent API lives in the sandbox.
    pub fn holds_connection(&self, conn: AgentConn) -> bool {
        let processes = inspect::procs::processes(self.container.tracking().path());
        !inspect::agent::holders(&processes, conn).is_empty()
    }

    /// Of `roots` (processes of the container, such as its execs'), the one the
    /// process of the container holding the TCP connection `conn` (as its side
    /// sees it) runs under: that process or its nearest ancestor.
    pub fn caller_under(&self, conn: AgentConn, roots: &[i32]) -> Option<i32> {
        let processes = inspect::procs::processes(self.container.tracking().path());
        inspect::agent::holder_under(&processes, conn, roots)
    }

    /// The checkpoints, oldest first.
    pub fn checkpoints(&self) -> Result<Vec<Entry>> {
        Ok(HistoryStore::open(&self.config, &self.container.key()?)?
            .history()
            .entries
            .clone())
    }

    /// The checkpoint `name` (a name or a seq), and the process image a rollback
    /// to it restores (none for a checkpoint of the files alone).
    pub fn find(&self, name: &str) -> Result<(Entry, Option<(PathBuf, Dumped)>)> {
        let key = self.container.key()?;
        let entry = HistoryStore::open(&self.config, &key)?.find(name)?.clone();
        let image = ops::process_image(&self.config, &key, &entry)?;
        Ok((entry, image))
    }

    /// Removes the checkpoint `name`; answers its entry.
    pub fn remove_checkpoint(&self, name: &str) -> Result<Entry> {
        self.container
            .history(&self.config, RemoveCheckpoint(name.to_string()))
    }

    /// Takes a snapshot `name` of the files (the caller has frozen the processes).
    pub fn snapshot_files(&self, name: &str) -> Result<()> {
        self.container
            .history(&self.config, SnapshotFs(name.to_string()))
            .map(|_| ())
    }

    /// Makes the files those of snapshot `snapshot` (the caller has frozen or
    /// stopped the processes). The tree is then no longer the one the inspector
    /// watched: until the next checkpoint, every turn takes everything.
    pub fn rollback_files(&self, snapshot: &str) -> Result<()> {
        inspect::taint(&self.container);
        self.container
            .history(&self.config, RollbackFs(snapshot.to_string()))
    }

    /// Makes a standby replica of checkpoint `name` ([`crate::standby`]), in one of
    /// the host's slots at low priority: a checkpoint or restore that somebody
    /// waits for goes first. The init's stdio are `stdio`.
    pub fn make_standby(
        &self,
        name: &str,
        stdio: ChildStdio,
        usage: crate::standby::Use,
    ) -> Result<Standby> {
        let (entry, image) = self.find(name)?;
        let no_image = || crate::Error::NoProcessImage {
            container: self.container.id().to_string(),
            checkpoint: entry.name.clone(),
        };
        let (images, dumped) = image.ok_or_else(no_image)?;
        let snapshot = entry.fs_snapshot.clone().ok_or_else(no_image)?;
        let of = crate::standby::Of {
            seq: entry.seq,
            images: &images,
            dumped: &dumped,
            snapshot: &snapshot,
            image_bytes: entry.process_bytes,
        };
        bounded_at(&self.config, &Priority::low(), || {
            self.container.make_standby(&self.config, &of, stdio, usage)
        })
        .map(|(s, _)| s)
    }

    /// Makes `standby` the container, whose processes `killed` were sent SIGKILL
    /// ([`Container::adopt_standby`]); answers the new init's pid, the sandbox
    /// as it is now (an adoption may give the container another tracking
    /// cgroup: the caller keeps this one) and what is left to clean
    /// ([`Sandbox::clean_after_adoption`]). The state is then a checkpoint's,
    /// which need not be the latest: the inspector is tainted, as after any
    /// rollback.
    pub fn adopt_standby(
        &self,
        standby: Standby,
        rootfs: &std::path::Path,
        killed: Vec<i32>,
    ) -> Result<Adoption> {
        inspect::taint(&self.container);
        let adopted = self
            .container
            .adopt_standby(&self.config, standby, rootfs, killed)?;
        Ok(self.adoption(adopted))
    }

    /// Makes `standby`, a replica for forks of checkpoint of `dumped_id` this
    /// new container is forked from, its processes
    /// ([`Container::adopt_fork_replica`]); answers the init's pid, the sandbox
    /// and what is left to clean.
    pub fn adopt_fork_replica(
        &self,
        standby: Standby,
        rootfs: &std::path::Path,
        dumped_id: &str,
    ) -> Result<Adoption> {
        let adopted =
            self.container
                .adopt_fork_replica(&self.config, standby, rootfs, dumped_id)?;
        Ok(self.adoption(adopted))
    }

    /// The container's adoption as the sandbox's: the same configuration.
    fn adoption(&self, adopted: crate::standby::Adopted) -> Adoption {
        Adoption {
            pid: adopted.pid,
            sandbox: Sandbox::new(adopted.container, self.config.clone()),
            leftovers: adopted.leftovers,
        }
    }

    /// Removes what an adoption left, once the processes it replaced are gone.
    pub fn clean_after_adoption(&self, leftovers: Leftovers) -> Result<()> {
        leftovers.clean(&self.config)
    }

    /// Restores the processes of a process image into the container (its old
    /// processes are gone), in one of the host's slots; answers the init's pid.
    /// `in_place`: a rollback, which keeps the container's cgroups as they are.
    pub fn restore_processes(
        &self,
        images: &std::path::Path,
        dumped: &Dumped,
        stdio: ChildStdio,
        in_place: bool,
    ) -> Result<i32> {
        let tool = criu::Tool::from_config(&self.config);
        bounded(&self.config, || {
            self.container
                .restore(images, dumped, &tool, stdio, in_place)
        })
    }
}
