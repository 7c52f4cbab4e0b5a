//! Gathers a turn's [`Observation`]: the inspector's maps, /proc and the
//! container's mounts. All the reading is here; the decision is in `policy.rs`.

use crab_bpf::{FsFlags, Inspector};

use super::agent::{self, AgentView};
use super::policy::{compare, Change, Observation, ReplayRun, Taken};
use super::{mount_map, procs, softdirty, Baseline, DETAIL_LIMIT};
use crate::checkpoint::history::History;
use crate::container::Container;
use crate::control::AgentConn;
use crate::{Error, Result};

/// Reads what [`super::policy::decide`] needs to classify the turn of `c`.
/// `hist`: the history to classify against (None: since the last checkpoint
/// of any kind); `base`: the last dump's baseline, which says which tasks ran
/// and so which to look at more closely. `agent`: the connection of a
/// fast-forwarded agent's LLM request and its state paths.
pub(super) fn observe(
    c: &Container,
    insp: &Inspector,
    hist: Option<&History>,
    base: Option<&Baseline>,
    agent: Option<(AgentConn, &crate::config::Agent)>,
) -> Result<Observation> {
    let cgid = c.state.cgroup_id;
    let counters = insp.counters(cgid)?.ok_or_else(|| Error::WrongState {
        id: c.state.id.clone(),
        state: "not watched by the eBPF inspector".into(),
        operation: "classify a turn",
    })?;
    let taken = hist.map(|h| Taken {
        fs_snapshot: h.entries.iter().any(|e| e.fs_snapshot.is_some()),
        process_image: h.entries.iter().any(|e| e.process_image.is_some()),
    });
    let mounts = mount_map(c, c.init_pid()?)?;
    let fs_changes = if counters.fs_entries > 0 {
        insp.fs_changes(cgid, usize::MAX)?
    } else {
        Vec::new()
    };
    let tracking = c.tracking();
    let processes = procs::processes(tracking.path());
    // Deleted files held open matter only to a file written without a name.
    let holds_deleted_files = fs_changes.iter().any(|ch| ch.flags.has(FsFlags::UNLINKED))
        && procs::holds_deleted_files(&processes);
    let tasks = procs::tasks(tracking.path());
    let queues = procs::queues(&processes);
    // An agent whose connection no process of the container holds is outside
    // (it came through the host's door): nothing of the sandbox is left out.
    let replay = agent.and_then(|(_, a)| replay_run(hist?, a));
    let agent = agent.and_then(|(conn, a)| {
        let pids = agent::holders(&processes, conn);
        (!pids.is_empty()).then(|| AgentView {
            pids,
            state_paths: a.state_paths.clone(),
        })
    });

    let (changed, _) = compare(&tasks, base);
    let ran = |(_, c): &&(&procs::Task, Change)| *c == Change::Ran;
    let shared_writable = changed
        .iter()
        .filter(ran)
        .map(|(t, _)| t.tid)
        .find(|&tid| procs::maps_file_shared_writable(tid))
        .into_iter()
        .collect();
    let dirty_pages = changed
        .iter()
        .take(DETAIL_LIMIT)
        .filter(ran)
        .filter_map(|(t, _)| softdirty::dirty_pages(t.tid).map(|n| (t.tid, n)))
        .collect();

    Ok(Observation {
        taken,
        counters,
        fs_changes,
        mounts,
        holds_deleted_files,
        tasks,
        queues,
        shared_writable,
        dirty_pages,
        agent,
        replay,
    })
}

/// How many turns a restore of the coming turn's checkpoint would replay if it
/// were a skip: from the newest process image to it (none before the first).
fn replay_run(hist: &History, agent: &crate::config::Agent) -> Option<ReplayRun> {
    let image = hist.entries.last()?.process_image?;
    Some(ReplayRun {
        turns: hist.next_seq.saturating_sub(image),
        max: u64::from(agent.max_replay_turns),
    })
}
