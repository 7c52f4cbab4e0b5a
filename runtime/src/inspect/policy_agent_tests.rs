//! The rules for a fast-forwarded agent inside the sandbox ([`AgentView`]):
//! what it alone does makes no checkpoint, and it goes with every checkpoint.

use super::tests::{change, quiet, task};
use super::*;
use crab_bpf::FsFlags;
use Kind::{Full, Skip};

const AGENT: i32 = 40;

/// The quiet container of the policy's tests, with an agent (a process of two
/// threads) that was in the last dump's baseline.
fn with_agent() -> (Observation, Option<Baseline>) {
    let (mut obs, mut base) = quiet();
    for t in [
        task(AGENT, 300, 1_000, "claude"),
        task(41, 300, 500, "node"),
    ] {
        let t = Task { tgid: AGENT, ..t };
        obs.tasks.push(t.clone());
        base.as_mut().unwrap().tasks.push(t);
    }
    obs.agent = Some(AgentView {
        pids: vec![AGENT],
        state_paths: vec!["/root/.claude".into()],
    });
    (obs, base)
}

fn agent_ran(obs: &mut Observation) {
    for t in obs.tasks.iter_mut().filter(|t| t.tgid == AGENT) {
        t.runtime_ns += 50_000;
    }
}

#[test]
fn a_turn_where_only_the_agent_ran_and_wrote_its_transcript_is_skipped() {
    let (mut obs, base) = with_agent();
    agent_ran(&mut obs);
    // A thread of its own born, another gone, input queued on its socket.
    obs.tasks.retain(|t| t.tid != 41);
    obs.tasks.push(Task {
        tgid: AGENT,
        ..task(42, 400, 10, "node")
    });
    obs.queues.push(Queue {
        pid: AGENT,
        fd: 20,
        bytes: 300,
    });
    change(
        &mut obs,
        "/root/.claude/projects/-root/s.jsonl",
        FsFlags::WRITTEN,
        0,
    );
    let got = decide(&obs, base.as_ref());
    assert_eq!(got.kind, Skip, "{:?}", got.reasons);
    assert!(
        got.reasons.iter().any(|r| r.contains("only the agent ran")),
        "{:?}",
        got.reasons
    );
}

#[test]
fn a_file_a_tool_wrote_takes_the_agent_too() {
    let (mut obs, base) = with_agent();
    agent_ran(&mut obs);
    change(
        &mut obs,
        "/root/hello.txt",
        FsFlags::CREATED | FsFlags::WRITTEN,
        0,
    );
    let got = decide(&obs, base.as_ref());
    assert_eq!(got.kind, Full, "{:?}", got.reasons);
    assert!(got
        .reasons
        .iter()
        .any(|r| r.contains("goes with every checkpoint")));
}

#[test]
fn a_daemon_a_tool_started_takes_the_agent_too() {
    let (mut obs, base) = with_agent();
    agent_ran(&mut obs);
    obs.tasks.push(task(77, 500, 10, "python3"));
    assert_eq!(decide(&obs, base.as_ref()).kind, Full);
}

#[test]
fn a_path_beside_the_state_paths_counts() {
    let (mut obs, base) = with_agent();
    change(&mut obs, "/root/.claude.json", FsFlags::WRITTEN, 0);
    assert_eq!(decide(&obs, base.as_ref()).kind, Full);
}

#[test]
fn without_the_agent_view_its_threads_and_transcript_count_as_before() {
    let (mut obs, base) = with_agent();
    obs.agent = None;
    agent_ran(&mut obs);
    change(&mut obs, "/root/.claude/x", FsFlags::WRITTEN, 0);
    assert_eq!(decide(&obs, base.as_ref()).kind, Full);
}

#[test]
fn another_process_ran_beside_the_agent_is_still_seen() {
    let (mut obs, base) = with_agent();
    agent_ran(&mut obs);
    obs.tasks[1].runtime_ns += 1_000;
    let got = decide(&obs, base.as_ref());
    assert_eq!(got.kind, Full);
    assert!(
        got.tasks.iter().all(|t| t.tid == 7),
        "the agent is not reported: {:?}",
        got.tasks
    );
}

#[test]
fn a_new_process_holding_the_agents_connection_counts() {
    // A child the agent left its socket to is also a holder of the
    // connection, but no image has it: it is no agent the journal replays.
    let (mut obs, base) = with_agent();
    agent_ran(&mut obs);
    obs.tasks.push(task(90, 500, 10, "worker"));
    obs.agent.as_mut().unwrap().pids.push(90);
    let got = decide(&obs, base.as_ref());
    assert_eq!(got.kind, Full, "{:?}", got.reasons);
    assert!(got.tasks.iter().any(|t| t.tid == 90), "{:?}", got.tasks);
}

#[test]
fn an_agent_that_stores_into_a_shared_file_mapping_takes_the_files() {
    // A store through a shared writable mapping changes a file with no
    // syscall: the agent's own stores too.
    let (mut obs, base) = with_agent();
    agent_ran(&mut obs);
    obs.shared_writable.push(41);
    let got = decide(&obs, base.as_ref());
    assert_eq!(got.kind, Full, "{:?}", got.reasons);
    assert!(
        got.reasons
            .iter()
            .any(|r| r.contains("shared and writable")),
        "{:?}",
        got.reasons
    );
}

#[test]
fn a_long_run_of_skips_ends_in_a_full_turn() {
    let (mut obs, base) = with_agent();
    agent_ran(&mut obs);
    obs.replay = Some(ReplayRun { turns: 31, max: 32 });
    assert_eq!(decide(&obs, base.as_ref()).kind, Skip);
    obs.replay = Some(ReplayRun { turns: 32, max: 32 });
    let got = decide(&obs, base.as_ref());
    assert_eq!(got.kind, Full, "{:?}", got.reasons);
    assert!(
        got.reasons.iter().any(|r| r.contains("max_replay_turns")),
        "{:?}",
        got.reasons
    );
    // Without the agent found (its request came from a process not seen), a
    // turn that would keep the old image is full too.
    let (mut quiet, base) = quiet();
    assert_eq!(decide(&quiet, base.as_ref()).kind, Skip);
    quiet.replay = Some(ReplayRun { turns: 40, max: 32 });
    assert_eq!(decide(&quiet, base.as_ref()).kind, Full);
}
