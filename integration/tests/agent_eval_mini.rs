//! The evaluation's quick mode with mini-swe-agent (`hack/eval.sh agents
//! --quick --agents mini-swe-agent`), in the test suite so that a regression in
//! correctness fails it: mini-swe-agent, on the host, runs one hand-written
//! trajectory through Docker on a crab sandbox, fault-free through the turn
//! proxy and without it (Crab's runtime, no turn, no checkpoint), and once
//! with the sandbox killed at its middle step, started again and rolled back.
//! Every run must end verified in the same state, the recovery must bring
//! back the newest durable checkpoint, and the LLM must be asked each step
//! once. A test of its own: with Claude Code's in `tests/agent_eval.rs` the
//! file would take several minutes.

// Needs root, the private containerd, dockerd and mini-swe-agent's venv: built
// only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::sync::Arc;

use crab_integration::agent_eval::{self, percent, Agent, Pace};
use crab_integration::trajectory;

#[test]
fn mini_swe_agent_on_a_read_heavy_task_skips_most_turns_and_recovers_a_crash_to_the_same_end() {
    let t = Arc::new(trajectory::load("read-logs-triage"));
    let row = agent_eval::evaluate(t, Pace { speedup: 40.0 }, &[Agent::MiniSweAgent])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let m = row.mini.as_ref().expect("mini-swe-agent's runs");
    let k = m.crab.turns.clone().expect("crab's turn counters");
    eprintln!(
        "mini-swe-agent: {k:?}\noutside: {:?}\nplain {:?}, crab {:?}\n{:?}",
        row.outside, m.plain.wall, m.crab.wall, m.crash
    );
    assert!(row.claude.is_none(), "Claude Code was not asked for");
    assert_eq!(k.failed, 0, "a turn's checkpoint failed");
    assert_eq!(
        k.turns as usize, m.crab.requests,
        "a request was not a turn"
    );
    // The trajectory reads logs for 25 of its 28 steps, and mini-swe-agent is
    // not in the sandbox: those turns change nothing. Its skip share is that
    // of crab-eval's own agent outside, give or take the first turn (the
    // sandbox's start) and the submission.
    let share = percent(k.skip, k.turns);
    assert!(
        share >= 70.0,
        "only {} of {} turns skipped",
        k.skip,
        k.turns
    );
    let outside = percent(row.outside.0, row.outside.1);
    assert!(
        (share - outside).abs() <= 10.0,
        "mini-swe-agent skipped {share:.0}%, crab-eval's agent outside {outside:.0}%"
    );
    // The crash came once the turn that asked for the held step (seq step + 1;
    // the first turn holds the sandbox's start) was durable: that is the
    // checkpoint the sandbox went back to.
    assert_eq!(
        m.crash.recovery.rolled_back_to,
        m.crash.crash_step as u64 + 1,
        "{:?}",
        m.crash.recovery
    );
}
