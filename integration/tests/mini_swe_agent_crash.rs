//! mini-swe-agent (PyPI, unmodified, on the host) doing a recorded task
//! (`eval/trajectories/data-sales.json`) in a Docker crab sandbox whose shim and
//! init are SIGKILLed in the middle, while the agent waits for its LLM. The
//! sandbox is recovered the way Docker allows: `docker start`, then `crabctl
//! rollback` to the newest durable checkpoint; the agent, outside the sandbox,
//! never notices, and the task ends as it does without the crash.
//!
//! Why not `crabctl restore`, as for a `ctr` container: dockerd deletes the
//! container from containerd once its task is gone, so there is nothing to
//! restore into; Docker's own container (made without `--rm`) stays, and
//! `docker start` makes it again, with its tree and Crab's history. See
//! docs/docker.md, "A crashed container".

// Needs root, the private containerd, dockerd and mini-swe-agent's venv: built
// only with the `host-tests` feature.
#![cfg(feature = "host-tests")]

use std::time::{Duration, Instant};

use crab_integration::docker::{crabctl_moby, ctr_moby, docker_inspect, docker_ok, DOCKER_RUNTIME};
use crab_integration::mini_trajectory::Run;
use crab_integration::{interfaces, kill_shim_of, shim_pids, text, trajectory, wait_until};
use serde_json::Value;

/// Data cleaning with awk and python, three files written (23 turns).
const TASK: &str = "data-sales";

/// The step whose answer is held when the sandbox crashes: turn 14 of 23,
/// after the data was cleaned, aggregated and ranked, before the report is
/// written.
const CRASH_AT_STEP: usize = 13;

/// The sandbox's run args. No `--rm`: with it, dockerd removes the crashed
/// container, and nothing is left to start again.
const RUN_ARGS: &[&str] = &["--runtime", DOCKER_RUNTIME, "--network", "none"];

/// `crabctl -n moby ls ID --json`: the history, oldest first (read from the
/// store when no shim serves the container).
fn history(id: &str) -> Vec<Value> {
    serde_json::from_str(&crabctl_moby(&["ls", id, "--json"])).expect("crabctl ls --json")
}

fn newest_seq(id: &str) -> u64 {
    history(id)
        .last()
        .and_then(|e| e["seq"].as_u64())
        .unwrap_or(0)
}

/// The turns the container's shim has closed (`crabctl stats`).
fn turns_closed(id: &str) -> u64 {
    let stats: Value =
        serde_json::from_str(&crabctl_moby(&["stats", id, "--json"])).expect("crabctl stats");
    stats["turns"].as_u64().unwrap_or(0)
}

/// Whether containerd (dockerd's namespace) still has container `id`.
fn in_containerd(id: &str) -> bool {
    let out = ctr_moby(&["containers", "ls", "-q"]);
    assert!(out.status.success(), "ctr -n moby containers ls: {out:?}");
    text(&out).0.lines().any(|l| l.trim() == id)
}

/// From `crabctl rollback`'s line ("ID: rolled back to NAME (seq S) in MS ms;
/// WHAT; init pid P"): the seq, the shim's milliseconds, and the init's pid.
fn rolled_back(out: &str) -> (u64, u64, i32) {
    let after = |key: &str| {
        out.split(key)
            .nth(1)
            .and_then(|rest| {
                rest.split(|c: char| !c.is_ascii_digit())
                    .find(|w| !w.is_empty())
            })
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no `{key}` in {out:?}"))
    };
    (after("(seq "), after(" in "), after("init pid ") as i32)
}

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
    assert!(
        run.llm.wait_held(Duration::from_secs(600)),
        "mini-swe-agent never asked for step {CRASH_AT_STEP}\nstderr:\n{}",
        run.agent.stderr()
    );
    // Each chat completions request ends a turn, and the first (seq 1) holds
    // the sandbox's start: the turn that asked for the held step is seq
    // CRASH_AT_STEP + 1. The crash comes once its checkpoint is durable and
    // the shim has closed the turn, so that the proxy has its gate open and
    // only the LLM holds the answer back.
    // The server records a request once it answers it: the held one is not
    // among them yet.
    let asking = run.llm.seen().iter().filter(|s| s.is_chat()).count() as u64 + 1;
    assert_eq!(asking, CRASH_AT_STEP as u64 + 1);
    assert!(
        wait_until(Duration::from_secs(60), || newest_seq(&id) == asking
            && turns_closed(&id) == asking),
        "the turn asking for step {CRASH_AT_STEP} was not recorded: {:#?}",
        history(&id)
    );
    // The shim answers the proxy right after it counts the turn; nothing
    // outside shows that answer leaving, so give it a moment.
    std::thread::sleep(Duration::from_millis(300));

    // The crash: the shim and the sandbox's init, SIGKILLed (the kernel kills
    // the rest of its pid namespace).
    let init = run.pid;
    kill_shim_of(&id);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(init),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the sandbox's init");
    assert!(
        wait_until(Duration::from_secs(10), || shim_pids(&id).is_empty()),
        "the shim outlived SIGKILL"
    );
    // Docker saw its container exit and kept it (no --rm), but deleted it
    // from containerd: `crabctl restore` would have nothing to restore into.
    assert!(
        wait_until(Duration::from_secs(30), || docker_inspect(
            &run.sandbox.name,
            "{{.State.Running}}"
        ) == "false"
            && !in_containerd(&id)),
        "dockerd did not take the crashed container out of containerd"
    );
    // The history outlived the shim: its newest durable checkpoint is the
    // turn that asked for the held step.
    let newest = newest_seq(&id);
    assert_eq!(newest, asking, "{:#?}", history(&id));

    let start = Instant::now();
    docker_ok(&["start", &run.sandbox.name]);
    let started = start.elapsed();
    let out = crabctl_moby(&["rollback", &id, &newest.to_string()]);
    let recovery = start.elapsed();
    eprintln!("{}", out.trim());
    let (seq, shim_ms, pid) = rolled_back(&out);
    assert_eq!(seq, newest, "{out}");
    assert!(out.contains("processes and files restored"), "{out}");
    eprintln!(
        "recovery: {} ms (docker start {} ms, then crabctl rollback {} ms, of which the shim's rollback {shim_ms} ms)",
        recovery.as_millis(),
        started.as_millis(),
        (recovery - started).as_millis()
    );
    // The same container, under crab, its restored processes in a network
    // namespace of loopback only.
    assert_eq!(
        docker_inspect(&run.sandbox.name, "{{.HostConfig.Runtime}}"),
        DOCKER_RUNTIME
    );
    assert_eq!(shim_pids(&id).len(), 1, "one shim serves {id} again");
    assert_eq!(interfaces(pid), ["lo"]);

    // The agent gets its answer (through the proxy's listener in the network
    // namespace it joined, which it and the proxy kept alive), and goes on
    // against the restarted sandbox: each step asked once, every command 0.
    run.llm.let_go();
    let recovered = run.finishes(&t);
    let after = newest_seq(&id);
    eprintln!(
        "after the crash at step {CRASH_AT_STEP}: rolled back to {newest}, history now ends at {after}; {recovered:?}"
    );
    // The turns after the crash were the new shim's: one checkpoint each.
    assert_eq!(
        after,
        newest + (run.steps - 1 - CRASH_AT_STEP) as u64,
        "{:#?}",
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
