//! mini-swe-agent (PyPI, unmodified, on the host) doing a recorded task
//! (`eval/trajectories/data-sales.json`) in a Docker crab sandbox whose shim and
//! init are SIGKILLed in the middle, while the agent waits for its LLM. The
//! sandbox is recovered the way Docker allows: `docker start`, then `crabctl
//! rollback` to the newest durable checkpoint (`crab_integration::mini_crash`
//! says why not `crabctl restore`). The agent, on the host, asks its LLM through
//! the host door of the sandbox's turn proxy: its request in flight dies with
//! the shim, and mini-swe-agent asks again (its own retry) through the door the
//! new shim opens. The task ends as it does without the crash. See
//! docs/docker.md, "A crashed container".

// Needs root, the private containerd, dockerd and mini-swe-agent's venv: built
// only with the `host-tests` feature.
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_integration::docker::{docker_inspect, DOCKER_RUNTIME};
use crab_integration::mini_crash::{crash_and_recover, history, newest_seq, RUN_ARGS};
use crab_integration::mini_trajectory::{Run, CRASH_ASKS};
use crab_integration::{interfaces, shim_pids, trajectory};

/// Data cleaning with awk and python, three files written (23 turns).
const TASK: &str = "data-sales";

/// The step whose answer is held when the sandbox crashes: turn 14 of 23,
/// after the data was cleaned, aggregated and ranked, before the report is
/// written.
const CRASH_AT_STEP: usize = 13;

#[test]
fn mini_swe_agents_docker_sandbox_killed_mid_task_is_started_again_rolled_back_and_the_task_ends_as_without_the_crash(
) {
    let t = trajectory::load(TASK);
    let fault_free = Run::start(&t, RUN_ARGS, None).finishes(&t);
    assert!(
        fault_free.verified,
        "mini-swe-agent: {TASK}'s verify failed"
    );

    let mut run = Run::start(&t, RUN_ARGS, Some(CRASH_AT_STEP));
    let id = run.id().to_string();
    let r = crash_and_recover(&run, CRASH_AT_STEP, Duration::from_secs(600));
    // The history outlived the shim: its newest durable checkpoint is the
    // turn that asked for the held step, and the rollback restored it.
    assert_eq!(r.newest, r.asking, "{:#?}", history(&id));
    let newest = r.newest;
    assert_eq!(r.rolled_back_to, newest, "{}", r.rollback_out);
    assert!(
        r.rollback_out.contains("processes and files restored"),
        "{}",
        r.rollback_out
    );
    eprintln!(
        "recovery: {} ms (docker start {} ms, then crabctl rollback {} ms, of which the shim's rollback {} ms)",
        r.total().as_millis(),
        r.docker_start.as_millis(),
        r.rollback.as_millis(),
        r.shim_rollback.as_millis()
    );
    // The same container, under crab, its restored processes in a network
    // namespace of loopback only.
    assert_eq!(
        docker_inspect(&run.sandbox.name, "{{.HostConfig.Runtime}}"),
        DOCKER_RUNTIME
    );
    assert_eq!(shim_pids(&id).len(), 1, "one shim serves {id} again");
    assert_eq!(interfaces(r.pid), ["lo"]);

    // The agent's retry of the held step gets its answer through the new
    // shim's door, and it goes on against the restarted sandbox: each step
    // asked once but the held one, every command 0.
    run.llm.let_go();
    let recovered = run.finishes(&t);
    let after = newest_seq(&id);
    eprintln!(
        "after the crash at step {CRASH_AT_STEP}: rolled back to {newest}, history now ends at {after}; {recovered:?}"
    );
    // The turns after the crash were the new shim's: one checkpoint each, the
    // held step's request asked again among them (once, or more when a repeat
    // came before the rollback, see `mini_crash::rollback_when_free`).
    let repeats = after - newest - (run.steps - 1 - CRASH_AT_STEP) as u64;
    assert!(
        (1..=CRASH_ASKS as u64).contains(&repeats),
        "{repeats} repeats of the held step's request: {:#?}",
        history(&id)
    );
    assert!(
        recovered.verified,
        "{TASK}'s verify failed after the recovery"
    );
    assert_eq!(
        recovered.digest, fault_free.digest,
        "the recovered run's state differs from the fault-free run's"
    );
}
