//! The evaluation's quick mode with real agents (`hack/eval.sh agents
//! --quick`), in the test suite so that a regression in correctness fails it:
//! one hand-written trajectory, done by Claude Code inside a crab sandbox
//! (`ctr`) and by mini-swe-agent on the host acting on one through Docker,
//! each fault-free under Crab and under Crab's runtime without checkpoints,
//! and once crashed at its middle step and recovered (Claude Code: `crabctl
//! restore` and a fast-forward; mini-swe-agent: `docker start` and `crabctl
//! rollback`). Every run must end verified, in the same state for both
//! agents, the recovery must bring back the newest durable checkpoint, and
//! the LLM must not be asked again for a step before the crash. About a
//! minute on two cores.

// Needs root, the private containerd, the agent image, dockerd and
// mini-swe-agent's venv: built only with the `host-tests` feature (hack/test.sh
// enables it).
#![cfg(feature = "host-tests")]

use std::sync::Arc;

use crab_integration::agent_eval::{self, percent, Agent, Pace};
use crab_integration::trajectory;

#[test]
fn claude_code_inside_and_mini_swe_agent_outside_skip_most_turns_of_a_read_heavy_task_and_recover_a_crash_to_the_same_end(
) {
    let t = Arc::new(trajectory::load("read-logs-triage"));
    let agents = [Agent::ClaudeCode, Agent::MiniSweAgent];
    // Both agents' fault-free runs under Crab end in the same state, or this fails.
    let row = agent_eval::evaluate(t, Pace { speedup: 40.0 }, &agents)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let outside = percent(row.outside.0, row.outside.1);

    let c = row.claude.as_ref().expect("Claude Code's runs");
    let k = c.crab.turns.clone().expect("crab's turn counters");
    eprintln!(
        "Claude Code inside: {k:?}\noutside: {:?}\nplain {:?}, crab {:?}\n{:?}",
        row.outside, c.plain.wall, c.crab.wall, c.crash
    );
    assert_eq!(k.failed, 0, "a turn's checkpoint failed");
    assert_eq!(
        k.turns as usize, c.crab.requests,
        "a request was not a turn"
    );
    // The trajectory reads logs for 25 of its 28 steps: with the agent's own
    // memory and files left out, those turns change nothing.
    assert!(
        percent(k.skip, k.turns) >= 70.0,
        "only {} of {} turns skipped",
        k.skip,
        k.turns
    );
    assert!(
        c.crash.replay.is_some(),
        "the restored agent was not fast-forwarded"
    );

    let m = row.mini.as_ref().expect("mini-swe-agent's runs");
    let k = m.crab.turns.clone().expect("crab's turn counters");
    eprintln!(
        "mini-swe-agent outside: {k:?}\nplain {:?}, crab {:?}\n{:?}",
        m.plain.wall, m.crab.wall, m.crash
    );
    assert_eq!(k.failed, 0, "a turn's checkpoint failed");
    assert_eq!(
        k.turns as usize, m.crab.requests,
        "a request was not a turn"
    );
    // mini-swe-agent is not in the sandbox: its skip share is that of
    // crab-eval's own agent outside, give or take the first turn (the
    // sandbox's start) and the submission.
    let share = percent(k.skip, k.turns);
    assert!(
        share >= 70.0,
        "only {} of {} turns skipped",
        k.skip,
        k.turns
    );
    assert!(
        (share - outside).abs() <= 10.0,
        "mini-swe-agent skipped {share:.0}%, crab-eval's agent outside {outside:.0}%"
    );
    // The crash came once the turn that asked for the held step (seq step + 1;
    // the first turn holds the sandbox's start) was durable: the sandbox went
    // back to that checkpoint.
    assert_eq!(
        m.crash.recovery.rolled_back_to,
        m.crash.crash_step as u64 + 1,
        "{:?}",
        m.crash.recovery
    );
}
