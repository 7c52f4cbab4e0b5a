//! The evaluation's runs of mini-swe-agent (PyPI, unmodified) on the host,
//! acting through Docker on a crab sandbox (`docker run --runtime crab`), on a
//! hand-written trajectory at its think times (the scripted OpenAI server
//! paces its answers). Per trajectory:
//!
//! - under Crab: the agent in the host's network, its LLM reached through
//!   the host door of the sandbox's turn proxy (the shim's, its upstream
//!   chosen by annotation; [`crate::mini_trajectory`]), every request a turn
//!   and its checkpoint; Crab's turn counters give the skip share;
//! - under crab-plain, the fair equivalent for Docker of Claude Code's
//!   baseline: the same `docker run --runtime crab` (Crab's runtime, its
//!   store adopting Docker's root file system as for every crab container),
//!   but no proxy, so no turn and no checkpoint, the agent in the host's
//!   network asking the LLM directly;
//! - under Crab again, the sandbox's shim and init killed while the agent
//!   waits for the middle step's answer, recovered by `docker start` and
//!   `crabctl rollback` to the newest durable checkpoint
//!   ([`crate::mini_crash`]).
//!
//! A run fails the evaluation when it ends unverified or in another state
//! than the fault-free run under Crab, when the recovery restored anything
//! but the newest durable checkpoint, or (a panic of [`Run::submitted`]) when
//! a step was asked twice or out of order or a command failed.

use std::sync::Arc;

use anyhow::{ensure, Result};
use crab_eval::state::Ending;
use crab_eval::trajectory::Trajectory;
use crab_runtime::checkpoint::stats::TurnStats;

use crate::agent_eval::{restored_newest, same_end, FaultFree, Pace, Sandbox};
use crate::docker::crabctl_moby;
use crate::mini_crash::{crash_and_recover, Recovery, RUN_ARGS};
use crate::mini_trajectory::{Run, Setup};
use crate::trajectory;

/// mini-swe-agent's runs of one trajectory.
pub struct Mini {
    pub crab: FaultFree,
    pub plain: FaultFree,
    pub crash: Recovered,
}

/// A run crashed at one step and recovered.
#[derive(Debug)]
pub struct Recovered {
    /// The step whose answer the crash came before.
    pub crash_step: usize,
    /// What the crash and the recovery gave.
    pub recovery: Recovery,
    /// The trajectory's check and state digest at the end.
    pub ending: Ending,
}

/// mini-swe-agent's runs of `t`, checked (see [`check`]).
pub fn evaluate(t: &Arc<Trajectory>, pace: Pace) -> Result<Mini> {
    let name = &t.name;
    eprintln!("{name}: mini-swe-agent under crab");
    let crab = fault_free(t, Sandbox::Crab, pace);
    eprintln!("{name}: mini-swe-agent under crab-plain");
    let plain = fault_free(t, Sandbox::CrabPlain, pace);
    eprintln!("{name}: mini-swe-agent crashed at its middle step");
    let crash = crashed(t, middle_step(t), pace);
    let m = Mini { crab, plain, crash };
    check(name, &m)?;
    Ok(m)
}

/// A run of mini-swe-agent that ended wrong fails the evaluation.
pub fn check(name: &str, m: &Mini) -> Result<()> {
    same_end(
        name,
        "mini-swe-agent",
        &[
            ("crab", &m.crab.ending),
            ("crab-plain", &m.plain.ending),
            ("crab, crashed and recovered", &m.crash.ending),
        ],
    )?;
    let r = &m.crash.recovery;
    restored_newest(name, r.rolled_back_to, r.newest)?;
    ensure!(
        r.rollback_out.contains("processes and files restored"),
        "{name}: the rollback did not restore processes and files: {}",
        r.rollback_out
    );
    Ok(())
}

/// The step a crash holds: the middle of mini-swe-agent's script.
pub fn middle_step(t: &Trajectory) -> usize {
    trajectory::mini_steps(t).len() / 2
}

/// Every run's sandbox is made as the crashed one must be
/// ([`RUN_ARGS`]), so that they differ in the proxy alone.
fn setup(t: &Trajectory, sandbox: Sandbox, hold: Option<usize>, pace: Pace) -> Setup<'static> {
    Setup {
        run_args: RUN_ARGS,
        hold,
        think: trajectory::mini_think_times(t, pace.speedup),
        proxied: sandbox == Sandbox::Crab,
    }
}

/// `crabctl -n moby stats` of Docker container `id`.
pub fn stats(id: &str) -> TurnStats {
    serde_json::from_str(&crabctl_moby(&["stats", id, "--json"])).expect("crabctl stats --json")
}

/// Runs `t` under mini-swe-agent in `sandbox`, fault-free, to its end.
pub fn fault_free(t: &Trajectory, sandbox: Sandbox, pace: Pace) -> FaultFree {
    let mut run = Run::start_with(t, setup(t, sandbox, None, pace));
    let ending = run.submitted(t);
    let wall = run.took.expect("the time to the submission");
    // Before the driver ends: mini-swe-agent then stops the sandbox.
    let turns = (sandbox == Sandbox::Crab).then(|| stats(run.id()));
    run.end();
    FaultFree {
        wall,
        requests: run.steps,
        turns,
        ending,
    }
}

/// Runs `t` under mini-swe-agent in a Crab sandbox, kills the sandbox (shim
/// and init) while the agent waits for step `crash_step`'s answer, recovers
/// it ([`crash_and_recover`]), and lets the agent finish.
pub fn crashed(t: &Trajectory, crash_step: usize, pace: Pace) -> Recovered {
    let mut run = Run::start_with(t, setup(t, Sandbox::Crab, Some(crash_step), pace));
    let recovery = crash_and_recover(&run, crash_step, run.timeout);
    run.llm.let_go();
    let ending = run.submitted(t);
    run.end();
    Recovered {
        crash_step,
        recovery,
        ending,
    }
}
