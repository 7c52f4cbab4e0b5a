//! The turn policy: what a checkpoint of the turn must hold, decided from an
//! [`Observation`] of the container and the [`Baseline`] of the last dump.
//!
//! [`decide`] is a pure function: it reads no file, makes no system call and
//! reads no clock. Everything it needs from the eBPF maps, /proc and the mount
//! table is gathered beforehand into the plain data of an [`Observation`]
//! (`observe.rs` does that), so each rule can be tested with values built by
//! hand. docs/inspector.md gives the reason for every rule.

use crab_bpf::{opaque, Counters, FsChange, FsFlags};

use super::mounts::{MountMap, Place};
use super::procs::{Queue, Task};
use super::{Baseline, Classification, PathChange, TaskChange, DETAIL_LIMIT};
use crate::checkpoint::Kind;

/// What the checkpoint history already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// Some entry has a snapshot of the files.
    pub fs_snapshot: bool,
    /// Some entry has a process image.
    pub process_image: bool,
}

/// What the decision needs to know of a container at the end of a turn.
#[derive(Debug, Clone)]
pub struct Observation {
    /// What the history holds; None to classify against the last checkpoint of
    /// any kind, whatever the history holds.
    pub taken: Option<Taken>,
    /// The inspector's counters of the container.
    pub counters: Counters,
    /// The names with a net change (empty when `counters.fs_entries` is 0).
    pub fs_changes: Vec<FsChange>,
    /// The container's mounts, seen from its init, with the spec's bind mounts.
    pub mounts: MountMap,
    /// Whether a process of the container holds a deleted file open. Only
    /// looked at when a file without a name was written (false otherwise).
    pub holds_deleted_files: bool,
    /// The container's tasks now.
    pub tasks: Vec<Task>,
    /// Input queued now on their pipes and sockets.
    pub queues: Vec<Queue>,
    /// Tasks that ran since the baseline and map a file shared and writable.
    /// The tasks that ran are looked at up to the first such one.
    pub shared_writable: Vec<i32>,
    /// Pages written since the last dump, by tid, where the kernel tracks them:
    /// for the tasks that ran among the first [`DETAIL_LIMIT`] changed ones.
    pub dirty_pages: Vec<(i32, u64)>,
}

/// How a task alive now differs from the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Not in the baseline (a tid with another start time is another task).
    Born,
    /// In the baseline, with another CPU time.
    Ran,
}

impl Change {
    fn label(self) -> &'static str {
        match self {
            Change::Born => "born",
            Change::Ran => "ran",
        }
    }
}

/// The tasks of `now` born or ran since `base` (in the order of `now`), and
/// the tasks of `base` gone. No baseline: every task is born.
pub fn compare<'a>(
    now: &'a [Task],
    base: Option<&'a Baseline>,
) -> (Vec<(&'a Task, Change)>, Vec<&'a Task>) {
    let base = base.map_or(&[][..], |b| &b.tasks[..]);
    let same = |a: &Task, b: &Task| a.tid == b.tid && a.start == b.start;
    let changed = now
        .iter()
        .filter_map(|t| match base.iter().find(|b| same(b, t)) {
            None => Some((t, Change::Born)),
            Some(b) if b.runtime_ns != t.runtime_ns => Some((t, Change::Ran)),
            Some(_) => None,
        })
        .collect();
    let died = base
        .iter()
        .filter(|b| !now.iter().any(|t| same(t, b)))
        .collect();
    (changed, died)
}

/// The checkpoint the turn observed in `obs` needs, with its reasons and
/// details, against `base`, the baseline of the last dump (None before the
/// first). `elapsed_us` is left at 0 for the caller.
pub fn decide(obs: &Observation, base: Option<&Baseline>) -> Classification {
    let mut out = Classification {
        kind: Kind::Skip,
        reasons: Vec::new(),
        paths: Vec::new(),
        tasks: Vec::new(),
        external: Vec::new(),
        transient_tasks: obs.counters.transient,
        elapsed_us: 0,
    };
    let (mut fs, mut proc) = (false, false);
    let counters = &obs.counters;

    if let Some(taken) = obs.taken {
        if !taken.fs_snapshot {
            fs = true;
            out.reasons.push("no snapshot of the files yet".into());
        }
        if !taken.process_image {
            proc = true;
            out.reasons.push("no process image yet".into());
        }
    }
    // What the inspector could not follow fails closed: everything is taken.
    let mut blind = |reason: String| {
        out.reasons.push(reason);
        (true, true)
    };
    if counters.overflow > 0 {
        (fs, proc) = blind(format!(
            "{} records did not fit the inspector's maps",
            counters.overflow
        ));
    }
    if counters.opaque & opaque::ASYNC_IO != 0 {
        (fs, proc) = blind("asynchronous I/O (io_uring, AIO) in use".into());
    }
    if counters.opaque & opaque::UNTRACKED != 0 {
        (fs, proc) = blind(
            "not every change since the container started or was rolled back is known".into(),
        );
    }
    // The MOUNT bit is not used: exec'd processes mount in namespaces of their
    // own while they join the container. The container's own mount table is
    // compared with the last dump's below.

    let (rootfs, internal) = paths(obs, &mut out);
    fs |= rootfs;
    proc |= internal;

    if let Some(base) = base {
        if !base.mounts.is_empty() && base.mounts != obs.mounts.signature() {
            (fs, proc) = (true, true);
            out.reasons
                .push("the mount table differs from the last dump".into());
        }
    }
    let (changed, died) = compare(&obs.tasks, base);
    if counters.births > 0 && changed.iter().all(|(_, c)| *c != Change::Born) {
        out.reasons.push(format!(
            "{} tasks born and alive (eBPF) that /proc did not show",
            counters.births
        ));
        proc = true;
    }
    if !changed.is_empty() || !died.is_empty() {
        proc = true;
        out.reasons.push(format!(
            "{} tasks born or ran, {} died",
            changed.len(),
            died.len()
        ));
    }
    if obs.queues != base.map_or(&[][..], |b| &b.queues[..]) {
        proc = true;
        out.reasons
            .push("input queued on pipes or sockets changed".into());
    }
    // A task that ran with a file mapped shared and writable may have changed
    // that file with plain stores, which no syscall shows.
    if !fs
        && changed
            .iter()
            .any(|(t, c)| *c == Change::Ran && obs.shared_writable.contains(&t.tid))
    {
        fs = true;
        out.reasons
            .push("a task that ran maps a file shared and writable".into());
    }

    for (t, change) in changed.iter().take(DETAIL_LIMIT) {
        let pages = obs.dirty_pages.iter().find(|(tid, _)| *tid == t.tid);
        let what = match (change, pages) {
            (Change::Ran, Some((_, n))) => format!("ran, {n} pages written"),
            _ => change.label().to_string(),
        };
        out.tasks.push(TaskChange {
            tid: t.tid,
            comm: t.comm.clone(),
            what,
        });
    }
    for b in died
        .iter()
        .take(DETAIL_LIMIT.saturating_sub(out.tasks.len()))
    {
        out.tasks.push(TaskChange {
            tid: b.tid,
            comm: b.comm.clone(),
            what: "died".into(),
        });
    }
    out.kind = match (fs, proc) {
        (false, false) => Kind::Skip,
        (true, false) => Kind::FsOnly,
        (false, true) => Kind::ProcessOnly,
        (true, true) => Kind::Full,
    };
    out
}

/// Files the changed names of `obs` by mount, into the reasons and details of
/// `out`. Returns whether the files (rootfs) and the processes (tmpfs, ghost
/// files) changed.
fn paths(obs: &Observation, out: &mut Classification) -> (bool, bool) {
    let (mut rootfs, mut internal, mut unlinked) = (0, 0, 0);
    for ch in &obs.fs_changes {
        if ch.flags.has(FsFlags::UNLINKED) {
            unlinked += 1;
            continue;
        }
        let (place, _) = obs.mounts.place(&ch.path, ch.dev);
        match place {
            Place::Rootfs => rootfs += 1,
            Place::Internal => internal += 1,
            Place::External => {
                if out.external.len() < DETAIL_LIMIT {
                    out.external.push(ch.path.clone());
                }
                continue;
            }
            Place::Ignored => continue,
        }
        if out.paths.len() < DETAIL_LIMIT {
            out.paths.push(PathChange {
                path: ch.path.clone(),
                what: ch.flags.label(),
                place,
            });
        }
    }
    if rootfs > 0 {
        out.reasons
            .push(format!("{rootfs} paths changed on the rootfs"));
    }
    if internal > 0 {
        out.reasons.push(format!(
            "{internal} paths changed on internal mounts (tmpfs)"
        ));
    }
    // A file written while it had no name is state only while a process
    // still holds it open (CRIU's ghost files); otherwise it is gone.
    let ghosts = unlinked > 0 && obs.holds_deleted_files;
    if ghosts {
        out.reasons.push(format!(
            "{unlinked} files without a name were written, and a process holds deleted files open"
        ));
    }
    (rootfs > 0, internal > 0 || ghosts)
}
