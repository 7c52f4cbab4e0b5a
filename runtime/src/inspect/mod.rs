//! A turn's classification: skip, fs-only, process-only or full.
//!
//! The eBPF inspector (crate `crab-bpf`) records, per container, the names
//! whose net state changed and the tasks born or gone since the last checkpoint.
//! This module puts that next to what only userspace knows (which mount a path
//! is on, which tasks used CPU, what input waits in their queues) and decides
//! what a checkpoint of the turn must hold. docs/inspector.md argues why the
//! decision is sound and lists what it does not cover.
//!
//! Classifying is two steps: `observe.rs` reads the eBPF maps, /proc and the
//! mount table into a [`policy::Observation`] (all the I/O); then
//! [`policy::decide`], a pure function, turns it and the last dump's
//! [`Baseline`] into a [`Classification`].
//!
//! After a checkpoint, [`captured`] forgets what it holds (while the container
//! is still frozen) and writes the new process [`Baseline`].

pub(crate) mod agent;
mod freeze;
pub(crate) mod mounts;
mod observe;
pub(crate) mod policy;
pub(crate) mod procs;
pub(crate) mod softdirty;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::checkpoint::history::History;
use crate::checkpoint::history_store::HistoryStore;
use crate::checkpoint::Kind;
use crate::config::{Config, PolicyMode};
use crate::container::{load_spec, Container};
use crate::control::AgentConn;
use crate::tracking::TrackingCgroup;
use crate::{Error, Result};
use crab_bpf::Inspector;
use mounts::{MountMap, Place};
use procs::{Queue, Task};

pub use freeze::Freeze;

/// How many paths and pids a classification reports at most.
pub const DETAIL_LIMIT: usize = 32;

/// The process state at the last process dump.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Baseline {
    /// The container's tasks.
    pub tasks: Vec<Task>,
    /// Input queued on their pipes and sockets.
    pub queues: Vec<Queue>,
    /// The mount table (`point fstype dev`, sorted).
    pub mounts: Vec<String>,
}

/// One changed path in a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathChange {
    /// The path in the container.
    pub path: String,
    /// What happened (`created+written`, `removed`, ...).
    pub what: String,
    /// Where it lives.
    pub place: Place,
}

/// One changed task in a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskChange {
    /// Thread id.
    pub tid: i32,
    /// Its command name.
    pub comm: String,
    /// `born`, `died`, `ran` or `input queued`.
    pub what: String,
}

/// What a turn changed, and the checkpoint it needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Classification {
    /// The checkpoint the turn needs (`Skip` when nothing changed).
    pub kind: Kind,
    /// Why, in a few words each.
    pub reasons: Vec<String>,
    /// Changed paths (at most [`DETAIL_LIMIT`]).
    pub paths: Vec<PathChange>,
    /// Changed tasks (at most [`DETAIL_LIMIT`]).
    pub tasks: Vec<TaskChange>,
    /// Paths written on external mounts: not part of any checkpoint.
    pub external: Vec<String>,
    /// Tasks born and gone within the turn (no net change).
    pub transient_tasks: u64,
    /// How long classifying took (µs).
    pub elapsed_us: u64,
}

impl Classification {
    /// A full checkpoint, for `reason` (no inspection).
    pub fn full(reason: &str) -> Classification {
        Classification {
            kind: Kind::Full,
            reasons: vec![reason.to_string()],
            paths: Vec::new(),
            tasks: Vec::new(),
            external: Vec::new(),
            transient_tasks: 0,
            elapsed_us: 0,
        }
    }
}

fn baseline_path(c: &Container) -> PathBuf {
    c.dir().join("crab-baseline.json")
}

/// The baseline of the last process dump (None before the first).
fn load_baseline(c: &Container) -> Option<Baseline> {
    let bytes = std::fs::read(baseline_path(c)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Writes the baseline whole (temporary file, then rename).
fn save_baseline(c: &Container, base: &Baseline) -> Result<()> {
    let path = baseline_path(c);
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec(base).expect("baseline serializes"))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(Error::io(format!("write {}", path.display())))
}

/// Starts the inspector's records of a new container (policy `adaptive`).
/// A host without a working inspector still runs containers: the error is
/// logged, and classifying this container's turns will fail, saying why.
pub fn watch(config: &Config, cgroup_id: u64, id: &str) {
    if config.policy.mode != PolicyMode::Adaptive {
        return;
    }
    if let Err(e) = inspector(config).and_then(|i| Ok(i.watch(cgroup_id)?)) {
        tracing::error!(%id, error = %e, "the eBPF inspector cannot watch this container");
    }
}

/// Moves the inspector's watch of container `id` from the tracking cgroup `old`
/// (whose id is `old_id`) to the one whose id is `new` (an adopted replica's
/// tracking cgroup, [`Container::with_tracking`]): `new` watched and tainted, so
/// that the next turn takes everything; nothing more is recorded for `old`.
/// Answers whether `old` may hold records, which the caller drops later, off the
/// rollback's critical path ([`unwatch`] walks the host's tables: about 1 ms,
/// more on a busy host). It holds none when it was empty before the watch
/// stopped (no task of it can be recording) and its counters were zero: a
/// fork's own tracking cgroup, which no task ever joined. A failure is logged:
/// the next classification finds `new` unwatched, takes everything and watches
/// it.
pub(crate) fn rewatch(
    config: &Config,
    id: &str,
    (old, old_id): (&TrackingCgroup, u64),
    new: u64,
) -> bool {
    if config.policy.mode != PolicyMode::Adaptive {
        return false;
    }
    let was_empty = !old.populated();
    let mut recorded = true;
    let moved = inspector(config).and_then(|i| {
        recorded = i.stop_recording(old_id) || !was_empty;
        i.watch(new)?;
        // Untainted, `new` would read as unchanged since the adoption: better
        // unwatched, which takes everything.
        if let Err(e) = i.taint(new) {
            let _ = i.unwatch(new);
            return Err(e.into());
        }
        Ok(())
    });
    if let Err(e) = moved {
        tracing::error!(%id, error = %e, "the eBPF inspector cannot follow this container's new cgroup");
    }
    recorded
}

/// Drops the inspector's records of a container being deleted.
pub fn unwatch(pin_root: &Path, cgroup_id: u64) {
    if let Some(i) = Inspector::open_existing(pin_root) {
        let _ = i.unwatch(cgroup_id);
    }
}

/// Opens the host's inspector (loading it on first use).
pub fn inspector(config: &Config) -> Result<Inspector> {
    Ok(Inspector::open(&config.policy.bpf_pin_root)?)
}

/// The destinations of the spec's bind mounts (from the host).
fn bind_destinations(bundle: &Path) -> Vec<String> {
    let Ok(spec) = load_spec(bundle) else {
        return Vec::new();
    };
    spec.mounts()
        .as_ref()
        .map(|ms| {
            ms.iter()
                .filter(|m| {
                    m.typ().as_deref() == Some("bind")
                        || m.options()
                            .as_ref()
                            .is_some_and(|o| o.iter().any(|o| o == "bind" || o == "rbind"))
                })
                .map(|m| m.destination().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn mount_map(c: &Container, pid: i32) -> Result<MountMap> {
    Ok(MountMap::new(
        mounts::mounts_of(pid)?,
        &bind_destinations(&c.state.bundle),
    ))
}

/// Classifies the turn of container `c` (since its last checkpoint). `agent`:
/// the connection the turn's LLM request came on, when the proxy knows it; the
/// agent holding it is left out when the container's agent is fast-forwarded.
pub fn classify(
    c: &Container,
    config: &Config,
    insp: &Inspector,
    agent: Option<AgentConn>,
) -> Result<Classification> {
    // Read, then let go: the turn's checkpoint (in the helper) takes the lock next.
    let hist = HistoryStore::open(config, &c.key()?)?.history().clone();
    let agent = agent
        .filter(|_| config.agent.fast_forward)
        .map(|conn| (conn, &config.agent));
    classify_against(c, insp, Some(&hist), agent)
}

/// What changed since the inspector last forgot (the last checkpoint of any
/// kind, Crab's or containerd's), whatever the history holds.
pub fn since_last_checkpoint(c: &Container, insp: &Inspector) -> Result<Classification> {
    classify_against(c, insp, None, None)
}

fn classify_against(
    c: &Container,
    insp: &Inspector,
    hist: Option<&History>,
    agent: Option<(AgentConn, &crate::config::Agent)>,
) -> Result<Classification> {
    let started = Instant::now();
    if !insp.is_watched(c.state.cgroup_id)? {
        // Not watched (the host's table was full when it started): everything,
        // and a new try, so that a later turn can be classified again.
        let again = match insp.watch(c.state.cgroup_id) {
            Ok(()) => "watched from now on".to_string(),
            Err(e) => e.to_string(),
        };
        let mut out = Classification::full(&format!("not watched by the eBPF inspector ({again})"));
        out.elapsed_us = started.elapsed().as_micros() as u64;
        return Ok(out);
    }
    let base = load_baseline(c);
    let obs = observe::observe(c, insp, hist, base.as_ref(), agent)?;
    let mut out = policy::decide(&obs, base.as_ref());
    out.elapsed_us = started.elapsed().as_micros() as u64;
    Ok(out)
}

/// After a checkpoint of `kind` (the container still frozen): forgets what it
/// captured and, when it dumped the processes, records the new baseline.
///
/// A container the inspector does not watch has nothing to forget.
pub fn captured(c: &Container, kind: Kind, pid: i32) -> Result<()> {
    let Some(pins) = &c.state.bpf_pin_root else {
        return Ok(());
    };
    let (with_fs, with_proc) = match kind {
        Kind::Skip => return Ok(()),
        Kind::FsOnly => (true, false),
        Kind::ProcessOnly => (false, true),
        Kind::Full => (true, true),
    };
    let map = mount_map(c, pid)?;
    if with_proc {
        let tracking = c.tracking();
        let base = Baseline {
            tasks: procs::tasks(tracking.path()),
            queues: procs::queues(&procs::processes(tracking.path())),
            mounts: map.signature(),
        };
        save_baseline(c, &base)?;
        if softdirty::available() {
            for p in procs::processes(tracking.path()) {
                if let Err(e) = softdirty::clear(p) {
                    tracing::debug!(pid = p, error = %e, "clear soft-dirty bits");
                }
            }
        }
    }
    let insp = Inspector::open(pins)?;
    insp.forget(
        c.state.cgroup_id,
        |ch| match map.place(&ch.path, ch.dev).0 {
            Place::Rootfs => with_fs,
            Place::Internal => with_proc,
            Place::External | Place::Ignored => true,
        },
        with_proc,
        kind == Kind::Full,
    )?;
    Ok(())
}

/// After a failed checkpoint that [`captured`] had already run for: the next
/// classification must take everything.
pub fn taint(c: &Container) {
    let Some(pins) = &c.state.bpf_pin_root else {
        return;
    };
    let r = Inspector::open(pins).and_then(|i| i.taint(c.state.cgroup_id));
    if let Err(e) = r {
        tracing::warn!(id = %c.state.id, error = %e, "mark inspector records incomplete");
    }
}
