//! The turn policy: what a checkpoint of the turn must hold, decided from an
//! [`Observation`] of the container and the [`Baseline`] of the last dump.
//!
//! [`decide`] is a pure function: it reads no file, makes no system call and
//! reads no clock. Everything it needs from the eBPF maps, /proc and the mount
//! table is gathered beforehand into the plain data of an [`Observation`]
//! (`observe.rs` does that), so each rule can be tested with values built by
//! hand. docs/inspector.md gives the reason for every rule.

use crab_bpf::{opaque, Counters, FsChange, FsFlags};

use super::agent::AgentView;
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
    /// The agent inside, when it is fast-forwarded and was found: its threads,
    /// queued input and state paths alone make no checkpoint, and a turn that
    /// takes anything takes it too (full).
    pub agent: Option<AgentView>,
    /// With the agent's journal on: how long a restore of this turn's
    /// checkpoint would replay if it were a skip.
    pub replay: Option<ReplayRun>,
}

/// The turns since the newest process image, which a restore of a skip
/// replays from the journal, and the most it may replay
/// (`[agent] max_replay_turns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayRun {
    /// This turn's seq less the newest process image's.
    pub turns: u64,
    /// The bound: at this many, the turn is full.
    pub max: u64,
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
    // The agent's own threads are made again by fast-forward. A process that
    // holds the agent's connection but was born in this turn (a child the
    // socket was left to) is in no image the journal could replay from: it
    // counts like any other process.
    let of_agent = |t: &Task, c: Change| {
        obs.agent.as_ref().is_some_and(|a| a.pids.contains(&t.tgid))
            && !(c == Change::Born && t.tid == t.tgid)
    };
    let agent_ran = changed.iter().any(|&(t, c)| of_agent(t, c))
        || died.iter().any(|t| of_agent(t, Change::Ran));
    // A task that ran with a file mapped shared and writable may have changed
    // that file with plain stores, which no syscall shows: the agent's own
    // tasks too, since what such a store changes is a file, not its state.
    let maps_shared = changed
        .iter()
        .any(|(t, c)| *c == Change::Ran && obs.shared_writable.contains(&t.tid));
    let changed: Vec<_> = changed
        .into_iter()
        .filter(|&(t, c)| !of_agent(t, c))
        .collect();
    let died: Vec<_> = died
        .into_iter()
        .filter(|t| !of_agent(t, Change::Ran))
        .collect();
    if !changed.is_empty() || !died.is_empty() {
        proc = true;
        out.reasons.push(format!(
            "{} tasks born or ran, {} died",
            changed.len(),
            died.len()
        ));
    }
    let not_agents = |qs: &[Queue]| -> Vec<Queue> {
        qs.iter()
            .filter(|q| !obs.agent.as_ref().is_some_and(|a| a.pids.contains(&q.pid)))
            .cloned()
            .collect()
    };
    if not_agents(&obs.queues) != not_agents(base.map_or(&[][..], |b| &b.queues[..])) {
        proc = true;
        out.reasons
            .push("input queued on pipes or sockets changed".into());
    }
    if !fs && maps_shared {
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
    if let Some(a) = &obs.agent {
        // Skipped turns are replayed from the agent's checkpoint: one that takes
        // the files or other processes must take the agent with them, or the
        // agent and its state would come back from different turns.
        if (fs || proc) && !(fs && proc) {
            (fs, proc) = (true, true);
            out.reasons
                .push("the fast-forwarded agent goes with every checkpoint".into());
        }
        if !fs && agent_ran {
            out.reasons.push(format!(
                "only the agent ran (pids {:?}): fast-forward makes it again",
                a.pids
            ));
        }
    }
    // Every skip lengthens the replay of a restore and the journal kept for
    // it: past the bound, the turn takes a new image.
    if let Some(r) = obs.replay.filter(|r| r.turns >= r.max) {
        if !(fs && proc) {
            (fs, proc) = (true, true);
            out.reasons.push(format!(
                "{} turns since the last process image: a restore replays at most {} \
                 (agent.max_replay_turns)",
                r.turns, r.max
            ));
        }
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
    let (mut rootfs, mut internal, mut unlinked, mut agent_state) = (0, 0, 0, 0);
    for ch in &obs.fs_changes {
        if ch.flags.has(FsFlags::UNLINKED) {
            unlinked += 1;
            continue;
        }
        let (place, _) = obs.mounts.place(&ch.path, ch.dev);
        if place != Place::Ignored && obs.agent.as_ref().is_some_and(|a| a.owns_path(&ch.path)) {
            agent_state += 1;
            continue;
        }
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
    if agent_state > 0 {
        out.reasons.push(format!(
            "{agent_state} paths of the agent's own state changed (fast-forward writes them again)"
        ));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::mounts::Mount;
    use Kind::{FsOnly, Full, ProcessOnly, Skip};

    const W: u32 = FsFlags::WRITTEN;

    fn mounts(extra: &[(&str, u32, &str)]) -> MountMap {
        let base = [
            ("/", 1, "overlay"),
            ("/dev/shm", 3, "tmpfs"),
            ("/proc", 4, "proc"),
            ("/data", 5, "ext4"),
        ];
        let all = base.iter().chain(extra).map(|&(point, dev, fstype)| Mount {
            point: point.into(),
            dev,
            fstype: fstype.into(),
        });
        MountMap::new(all.collect(), &["/data".to_string()])
    }

    pub(super) fn task(tid: i32, start: u64, runtime_ns: u64, comm: &str) -> Task {
        Task {
            tid,
            start,
            runtime_ns,
            comm: comm.into(),
            tgid: tid,
        }
    }

    /// A container whose shell and daemon did nothing since a checkpoint,
    /// with a history that holds both halves, and its baseline.
    pub(super) fn quiet() -> (Observation, Option<Baseline>) {
        let tasks = vec![task(1, 100, 5_000, "sh"), task(7, 200, 9_000, "daemon")];
        let base = Baseline {
            tasks: tasks.clone(),
            queues: Vec::new(),
            mounts: mounts(&[]).signature(),
        };
        let obs = Observation {
            taken: Some(Taken {
                fs_snapshot: true,
                process_image: true,
            }),
            counters: Counters::default(),
            fs_changes: Vec::new(),
            mounts: mounts(&[]),
            holds_deleted_files: false,
            tasks,
            queues: Vec::new(),
            shared_writable: Vec::new(),
            dirty_pages: Vec::new(),
            agent: None,
            replay: None,
        };
        (obs, Some(base))
    }

    /// Records a changed name, as the inspector would.
    pub(super) fn change(o: &mut Observation, path: &str, flags: u32, dev: u32) {
        o.counters.fs_entries += 1;
        o.fs_changes.push(FsChange {
            path: path.into(),
            flags: FsFlags(flags),
            dev,
            pid: 7,
        });
    }

    fn queue(pid: i32, fd: i32, bytes: u64) -> Queue {
        Queue { pid, fd, bytes }
    }

    type Turn = fn(&mut Observation, &mut Option<Baseline>);

    /// What a turn did, the kind it needs, and a part of its reasons (None:
    /// no reason at all).
    const ROWS: &[(&str, Turn, Kind, Option<&str>)] = &[
        ("nothing changed", |_, _| {}, Skip, None),
        (
            "a file written on the rootfs",
            |o, _| change(o, "/app/x", W, 0),
            FsOnly,
            Some("1 paths changed on the rootfs"),
        ),
        (
            "a file that existed removed",
            |o, _| change(o, "/app/old", FsFlags::REMOVED, 0),
            FsOnly,
            Some("1 paths changed on the rootfs"),
        ),
        (
            // The inspector drops the entry of a name proven new, then gone.
            "a file created then deleted within the turn",
            |o, _| o.counters.events = 4,
            Skip,
            None,
        ),
        (
            "records lost to a full map",
            |o, _| o.counters.overflow = 3,
            Full,
            Some("3 records did not fit the inspector's maps"),
        ),
        (
            "asynchronous I/O",
            |o, _| o.counters.opaque = opaque::ASYNC_IO,
            Full,
            Some("asynchronous I/O (io_uring, AIO) in use"),
        ),
        (
            "changes before recording began",
            |o, _| o.counters.opaque = opaque::UNTRACKED,
            Full,
            Some("not every change since the container started or was rolled back"),
        ),
        (
            // Exec'd processes mount in namespaces of their own.
            "the eBPF mount bit alone",
            |o, _| o.counters.opaque = opaque::MOUNT,
            Skip,
            None,
        ),
        (
            "a mount added in the container",
            |o, _| o.mounts = mounts(&[("/mnt", 8, "tmpfs")]),
            Full,
            Some("the mount table differs from the last dump"),
        ),
        (
            "a mount table other than a baseline's without one",
            |o, b| {
                o.mounts = mounts(&[("/mnt", 8, "tmpfs")]);
                b.as_mut().unwrap().mounts.clear();
            },
            Skip,
            None,
        ),
        (
            "a file written on a tmpfs",
            |o, _| change(o, "/dev/shm/x", W, 0),
            ProcessOnly,
            Some("1 paths changed on internal mounts (tmpfs)"),
        ),
        (
            // The path is the kernel's, the device says which mount.
            "an open file written on a tmpfs's device",
            |o, _| change(o, "/x", W | FsFlags::RESOLVED, 3),
            ProcessOnly,
            Some("1 paths changed on internal mounts (tmpfs)"),
        ),
        (
            "a file written on a host volume",
            |o, _| change(o, "/data/f", W, 0),
            Skip,
            None,
        ),
        (
            "a file written on proc",
            |o, _| change(o, "/proc/self/attr/current", W, 0),
            Skip,
            None,
        ),
        (
            "a memfd written",
            |o, _| change(o, "/memfd:x (deleted)", W | FsFlags::RESOLVED, 9),
            Skip,
            None,
        ),
        (
            "a file without a name written, a deleted file held open",
            |o, _| {
                change(o, "/tmp/#123", W | FsFlags::UNLINKED, 1);
                o.holds_deleted_files = true;
            },
            ProcessOnly,
            Some("1 files without a name were written, and a process holds deleted files"),
        ),
        (
            "a file without a name written, no deleted file held",
            |o, _| change(o, "/tmp/#123", W | FsFlags::UNLINKED, 1),
            Skip,
            None,
        ),
        (
            "a process born and alive",
            |o, _| {
                o.counters.births = 1;
                o.tasks.push(task(9, 300, 100, "python"));
            },
            ProcessOnly,
            Some("1 tasks born or ran, 0 died"),
        ),
        (
            "a birth the inspector saw that /proc does not show",
            |o, _| o.counters.births = 1,
            ProcessOnly,
            Some("1 tasks born and alive (eBPF) that /proc did not show"),
        ),
        (
            "a process born and dead within the turn",
            |o, _| o.counters.transient = 2,
            Skip,
            None,
        ),
        (
            "a daemon killed",
            |o, _| {
                o.counters.deaths = 1;
                o.tasks.retain(|t| t.tid != 7);
            },
            ProcessOnly,
            Some("0 tasks born or ran, 1 died"),
        ),
        (
            // Another start time: the daemon died and its tid was reused.
            "a tid reused by another task",
            |o, _| o.tasks[1].start = 250,
            ProcessOnly,
            Some("1 tasks born or ran, 1 died"),
        ),
        (
            "a task that ran",
            |o, _| o.tasks[1].runtime_ns += 1_000,
            ProcessOnly,
            Some("1 tasks born or ran, 0 died"),
        ),
        (
            "input queued for a task",
            |o, _| o.queues.push(queue(7, 3, 5)),
            ProcessOnly,
            Some("input queued on pipes or sockets changed"),
        ),
        (
            "queued input read",
            |_, b| b.as_mut().unwrap().queues.push(queue(7, 3, 5)),
            ProcessOnly,
            Some("input queued on pipes or sockets changed"),
        ),
        (
            "a task that ran maps a file shared and writable",
            |o, _| {
                o.tasks[1].runtime_ns += 1_000;
                o.shared_writable.push(7);
            },
            Full,
            Some("a task that ran maps a file shared and writable"),
        ),
        (
            "a task that did not run maps a file shared and writable",
            |o, _| o.shared_writable.push(7),
            Skip,
            None,
        ),
        (
            "no baseline (no dump yet)",
            |_, b| *b = None,
            ProcessOnly,
            Some("2 tasks born or ran, 0 died"),
        ),
        (
            "no snapshot of the files in the history",
            |o, _| o.taken.as_mut().unwrap().fs_snapshot = false,
            FsOnly,
            Some("no snapshot of the files yet"),
        ),
        (
            "no process image in the history",
            |o, _| o.taken.as_mut().unwrap().process_image = false,
            ProcessOnly,
            Some("no process image yet"),
        ),
        (
            "an empty history",
            |o, _| {
                o.taken = Some(Taken {
                    fs_snapshot: false,
                    process_image: false,
                })
            },
            Full,
            Some("no process image yet"),
        ),
        (
            "files and processes at once",
            |o, _| {
                change(o, "/app/x", W, 0);
                o.tasks[1].runtime_ns += 1_000;
            },
            Full,
            Some("1 paths changed on the rootfs"),
        ),
    ];

    #[test]
    fn test_each_rule_gives_its_kind_and_reason() {
        let mut wrong = Vec::new();
        for (behaviour, turn, kind, reason) in ROWS {
            let (mut obs, mut base) = quiet();
            turn(&mut obs, &mut base);
            let got = decide(&obs, base.as_ref());
            let reason_ok = match reason {
                None => got.reasons.is_empty(),
                Some(r) => got.reasons.iter().any(|g| g.contains(r)),
            };
            if got.kind != *kind || !reason_ok {
                wrong.push(format!(
                    "{behaviour}: want {kind} {reason:?}, got {} {:?}",
                    got.kind, got.reasons
                ));
            }
        }
        assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
    }

    #[test]
    fn test_changed_paths_are_reported_by_place() {
        let (mut obs, base) = quiet();
        change(&mut obs, "/app/x", FsFlags::CREATED | W, 0);
        change(&mut obs, "/dev/shm/y", FsFlags::META, 0);
        change(&mut obs, "/data/z", W, 0);
        change(&mut obs, "/proc/self/attr/current", W, 0);
        let got = decide(&obs, base.as_ref());
        let paths: Vec<_> = got
            .paths
            .iter()
            .map(|p| (p.path.as_str(), p.what.as_str(), p.place))
            .collect();
        assert_eq!(
            paths,
            [
                ("/app/x", "created+written", Place::Rootfs),
                ("/dev/shm/y", "metadata", Place::Internal),
            ]
        );
        assert_eq!(got.external, ["/data/z"]);
        assert_eq!(got.kind, Full);
    }

    #[test]
    fn test_details_stop_at_the_limit_and_counts_do_not() {
        let (mut obs, mut base) = quiet();
        for i in 0..40 {
            change(&mut obs, &format!("/app/{i}"), W, 0);
            change(&mut obs, &format!("/data/{i}"), W, 0);
            obs.tasks.push(task(1000 + i, 300, 1, "worker"));
        }
        base.as_mut().unwrap().tasks.push(task(50, 90, 1, "gone"));
        let got = decide(&obs, base.as_ref());
        assert_eq!(got.paths.len(), DETAIL_LIMIT);
        assert_eq!(got.paths[0].path, "/app/0");
        assert_eq!(got.external.len(), DETAIL_LIMIT);
        assert!(got
            .reasons
            .iter()
            .any(|r| r == "40 paths changed on the rootfs"));
        assert!(got
            .reasons
            .iter()
            .any(|r| r == "40 tasks born or ran, 1 died"));
        // Born and ran first (in /proc's order), the dead after them.
        assert_eq!(got.tasks.len(), DETAIL_LIMIT);
        assert!(
            got.tasks.iter().all(|t| t.what == "born"),
            "{:?}",
            got.tasks
        );
        assert_eq!(got.tasks[0].tid, 1000);

        let (mut obs, base) = quiet();
        obs.tasks.retain(|t| t.tid != 7);
        obs.tasks.push(task(9, 300, 1, "python"));
        let got = decide(&obs, base.as_ref());
        let tasks: Vec<_> = got.tasks.iter().map(|t| (t.tid, t.what.as_str())).collect();
        assert_eq!(tasks, [(9, "born"), (7, "died")]);
    }

    #[test]
    fn test_a_task_that_ran_shows_the_pages_it_wrote() {
        let (mut obs, base) = quiet();
        obs.tasks[1].runtime_ns += 1_000;
        obs.tasks.push(task(9, 300, 1, "python"));
        obs.dirty_pages = vec![(7, 37), (9, 2)];
        let got = decide(&obs, base.as_ref());
        let tasks: Vec<_> = got.tasks.iter().map(|t| (t.tid, t.what.as_str())).collect();
        assert_eq!(tasks, [(7, "ran, 37 pages written"), (9, "born")]);
        assert_eq!(got.kind, ProcessOnly);
    }

    #[test]
    fn test_tasks_born_and_gone_within_the_turn_are_counted_only() {
        let (mut obs, base) = quiet();
        obs.counters.transient = 2;
        let got = decide(&obs, base.as_ref());
        assert_eq!((got.kind, got.transient_tasks), (Skip, 2));
        assert!(got.tasks.is_empty());
    }
}

#[cfg(test)]
#[path = "policy_agent_tests.rs"]
mod agent_tests;
