//! A crash of mini-swe-agent's Docker sandbox while the agent waits for its
//! LLM, and its recovery the way Docker allows: `docker start`, then `crabctl
//! rollback` to the newest durable checkpoint. The agent, outside the sandbox,
//! sees its request in flight fail (it went through the host door of the
//! shim's proxy) and asks again once the new shim opened the door. Used by
//! `tests/mini_swe_agent_crash.rs` and the evaluation (`crate::mini_eval`).
//!
//! Why not `crabctl restore`, as for a `ctr` container: dockerd deletes the
//! container from containerd once its task is gone, so there is nothing to
//! restore into; Docker's own container (made without `--rm`) stays, and
//! `docker start` makes it again, with its tree and Crab's history. See
//! docs/docker.md, "A crashed container".

use std::time::{Duration, Instant};

use crab_runtime::error::ErrorKind;
use serde_json::Value;

use crate::docker::{
    crabctl_moby, crabctl_moby_out, ctr_moby, docker_inspect, docker_ok, DOCKER_RUNTIME,
};
use crate::mini_trajectory::Run;
use crate::{kill_shim_of, shim_pids, text, wait_until};

/// The run args of a sandbox that can be recovered: no `--rm` (with it,
/// dockerd removes the crashed container, and nothing is left to start
/// again); loopback only.
pub const RUN_ARGS: &[&str] = &["--runtime", DOCKER_RUNTIME, "--network", "none"];

/// `crabctl -n moby ls ID --json`: the history, oldest first (read from the
/// store when no shim serves the container).
pub fn history(id: &str) -> Vec<Value> {
    serde_json::from_str(&crabctl_moby(&["ls", id, "--json"])).expect("crabctl ls --json")
}

/// The newest checkpoint's seq in Docker container `id`'s history (0 if none).
pub fn newest_seq(id: &str) -> u64 {
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

/// `crabctl rollback ID SEQ`, run again while the container is busy (crabctl's
/// exit code for [`ErrorKind::Busy`]: another operation holds it, here a turn of
/// the agent's request asked again through the door), for up to 30 s; its
/// stdout and how many times it was busy. What an orchestrator does: the agent
/// need not wait for the recovery, and a turn ends in a checkpoint before the
/// rollback runs.
fn rollback_when_free(id: &str, seq: u64) -> (String, u32) {
    let busy_code = ErrorKind::Busy.exit_code();
    let seq = seq.to_string();
    let args = ["rollback", id, seq.as_str()];
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut busy = 0;
    loop {
        let out = crabctl_moby_out(&args);
        let (o, e) = text(&out);
        if out.status.code() == Some(busy_code) && Instant::now() < deadline {
            busy += 1;
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        assert!(out.status.success(), "crabctl {args:?}: {o}{e}");
        return (o, busy);
    }
}

/// A crash and its recovery.
#[derive(Debug)]
pub struct Recovery {
    /// The seq of the turn that asked for the held step.
    pub asking: u64,
    /// The newest durable checkpoint in the history after the crash.
    pub newest: u64,
    /// The checkpoint `crabctl rollback` restored.
    pub rolled_back_to: u64,
    /// How many times `crabctl rollback` found the container busy (a turn of
    /// the agent's repeated request, which came first through the new shim's
    /// door) and was run again.
    pub busy: u32,
    /// `crabctl rollback`'s output (it says what it restored).
    pub rollback_out: String,
    /// `docker start`.
    pub docker_start: Duration,
    /// `crabctl rollback`, as the caller waits for it.
    pub rollback: Duration,
    /// The rollback in the shim, as it reports it.
    pub shim_rollback: Duration,
    /// The restored init's pid.
    pub pid: i32,
}

impl Recovery {
    /// From `docker start` to the end of the rollback.
    pub fn total(&self) -> Duration {
        self.docker_start + self.rollback
    }
}

/// Once mini-swe-agent's request for `step` is held by the LLM and the turn
/// that asked for it is durable and closed, SIGKILLs the sandbox's shim and
/// init; once dockerd took the container out of containerd, starts it again
/// and rolls it back to the newest durable checkpoint. The held answer is not
/// let go. Panics when the agent does not get there within `timeout`, or when
/// the crash is not seen as one.
pub fn crash_and_recover(run: &Run, step: usize, timeout: Duration) -> Recovery {
    let id = run.id().to_string();
    assert!(
        run.llm.wait_held(timeout),
        "mini-swe-agent never asked for step {step}\nstderr:\n{}",
        run.agent.stderr()
    );
    // Each chat completions request ends a turn, and the first (seq 1) holds
    // the sandbox's start: the turn that asked for the held step is seq
    // step + 1. The crash comes once its checkpoint is durable and the shim
    // has closed the turn, so that the proxy has its gate open and only the
    // LLM holds the answer back. The server records a request once it
    // answers it: the held one is not among them yet.
    let asking = run.llm.seen().iter().filter(|s| s.is_chat()).count() as u64 + 1;
    assert_eq!(asking, step as u64 + 1);
    assert!(
        wait_until(Duration::from_secs(60), || newest_seq(&id) == asking
            && turns_closed(&id) == asking),
        "the turn asking for step {step} was not recorded: {:#?}",
        history(&id)
    );
    // The shim answers the proxy right after it counts the turn; nothing
    // outside shows that answer leaving, so give it a moment.
    std::thread::sleep(Duration::from_millis(300));

    // The crash: the shim and the sandbox's init, SIGKILLed (the kernel kills
    // the rest of its pid namespace).
    kill_shim_of(&id);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.pid),
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
    // The history outlived the shim.
    let newest = newest_seq(&id);

    let start = Instant::now();
    docker_ok(&["start", &run.sandbox.name]);
    let docker_start = start.elapsed();
    let (out, busy) = rollback_when_free(&id, newest);
    let rollback = start.elapsed() - docker_start;
    eprintln!("{}", out.trim());
    let (rolled_back_to, shim_ms, pid) = rolled_back(&out);
    Recovery {
        asking,
        newest,
        rolled_back_to,
        busy,
        rollback_out: out,
        docker_start,
        rollback,
        shim_rollback: Duration::from_millis(shim_ms),
        pid,
    }
}
