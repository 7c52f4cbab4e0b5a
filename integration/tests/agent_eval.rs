//! The evaluation's quick mode with a real agent (`hack/eval.sh agents
//! --quick`), in the test suite so that a regression in correctness fails it:
//! Claude Code runs one hand-written trajectory inside a crab sandbox,
//! fault-free under Crab and under Crab's runtime without checkpoints, and once
//! crashed at its middle step and restored. Every run must end verified in the
//! same state, the restore must bring back the newest durable checkpoint, and
//! the fast-forward must replay the journal without asking the LLM again.

// Needs root, the private containerd and the agent image: built only with the
// `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::sync::Arc;

use crab_integration::agent_eval::{self, percent, Agent, Pace};
use crab_integration::trajectory;

#[test]
fn claude_code_on_a_read_heavy_task_skips_most_turns_and_recovers_a_crash_to_the_same_end() {
    let t = Arc::new(trajectory::load("read-logs-triage"));
    let row = agent_eval::evaluate(t, Pace { speedup: 40.0 }, &[Agent::ClaudeCode])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let c = row.claude.as_ref().expect("Claude Code's runs");
    let k = c.crab.turns.clone().expect("crab's turn counters");
    eprintln!(
        "inside: {k:?}\noutside: {:?}\nplain {:?}, crab {:?}\n{:?}",
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
}
