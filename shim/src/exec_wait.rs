//! A checkpoint that dumps processes waits for the container's running exec
//! processes to exit, within a bound.
//!
//! CRIU dumps the init's tree. An exec process is the shim's child, not a
//! descendant of the init, so it cannot be dumped with it. A platform's probe
//! (`docker exec`, a Kubernetes exec probe) that runs when an agent's turn ends
//! must not fail the turn, so the checkpoint, once it has claimed its container,
//! waits up to `[checkpoint] exec_wait_ms` for the running execs to exit:
//!
//! - the claim keeps new execs out: their `Start` waits for the checkpoint to end
//!   (see `crate::task::OPERATION_WAIT`), so the wait ends;
//! - the container's lock is not held while it waits: an exec's exit is recorded
//!   under that lock;
//! - a paused container's execs are frozen and cannot exit (containerd's client
//!   pauses a task before it checkpoints it): the container is thawed while the
//!   checkpoint waits, and frozen again before the dump, whatever the outcome;
//! - after the bound the checkpoint fails as before, naming the execs it waited for;
//! - a checkpoint the agent API was asked for from inside one of those execs, or a
//!   turn whose agent (the process holding the proxy connection) runs in one,
//!   fails at once: that exec waits for the answer, so it would outlive any wait.

use std::time::Duration;

use containerd_shim::protos::api::Status;
use crab_runtime::container::Container;
use crab_runtime::control::AgentConn;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::containers::{InstanceGuard, Slot};
use crate::error::{ShimError, ShimResult};
use crate::instance::{status_name, Instance};
use crate::process::Exit;
use crate::task::blocking;

/// Refuses a container whose init does not run (or is not paused).
pub(crate) fn check_checkpointable(inst: &Instance, id: &str) -> ShimResult<()> {
    if matches!(inst.init.status, Status::RUNNING | Status::PAUSED) {
        return Ok(());
    }
    Err(ShimError::FailedPrecondition(format!(
        "cannot checkpoint container {id}: it is {}",
        status_name(inst.init.status)
    )))
}

/// Whether an exec process of `inst` runs (see [`running_execs`]).
pub(crate) fn execs_run(inst: &Instance) -> bool {
    !running_execs(inst).is_empty()
}

/// A running exec process: its id, its pid, and its exit to come.
struct Running {
    exec_id: String,
    pid: i32,
    exit: watch::Receiver<Option<Exit>>,
}

/// The exec processes of `inst` that run: started (an exec registered but not
/// started is no process yet; its start waits for the checkpoint) and not exited.
fn running_execs(inst: &Instance) -> Vec<Running> {
    let mut running: Vec<_> = inst
        .execs
        .values()
        .filter(|p| p.pid != 0 && p.status != Status::STOPPED && p.exit().is_none())
        .map(|p| Running {
            exec_id: p.exec_id.clone(),
            pid: p.pid,
            exit: p.subscribe(),
        })
        .collect();
    running.sort_by(|a, b| a.exec_id.cmp(&b.exec_id));
    running
}

/// The container's lock once no exec process of it runs, for a checkpoint that
/// dumps processes; the caller holds the container's claim. Waits up to the
/// container's `[checkpoint] exec_wait_ms` (see the module's docs), then fails
/// with [`ShimError::FailedPrecondition`] naming the execs still running.
/// `caller`: the agent API's connection, when the checkpoint was asked for
/// there; if a process holding it runs in one of the execs, fails at once.
pub(crate) async fn lock_dumpable<'a>(
    slot: &'a Slot,
    id: &str,
    mut caller: Option<AgentConn>,
) -> ShimResult<InstanceGuard<'a>> {
    let started = Instant::now();
    let mut thawed: Option<Container> = None;
    let mut waited_for: Vec<String> = Vec::new();
    let outcome = loop {
        let inst = match slot.lock().await {
            Ok(inst) => inst,
            Err(e) => break Err(e),
        };
        if let Err(e) = check_checkpointable(&inst, id) {
            break Err(e);
        }
        let running = running_execs(&inst);
        if running.is_empty() {
            break Ok(inst);
        }
        if let Some(conn) = caller.take() {
            // The caller's own exec waits for this answer while the checkpoint
            // would wait for it to exit: waiting could only end at the bound.
            let sandbox = inst.sandbox.clone();
            let pids: Vec<i32> = running.iter().map(|r| r.pid).collect();
            drop(inst);
            match blocking(move || Ok(sandbox.caller_under(conn, &pids))).await {
                Ok(None) => continue,
                Ok(Some(pid)) => {
                    let exec = running.iter().find(|r| r.pid == pid);
                    let exec = exec.map_or("?", |r| r.exec_id.as_str());
                    tracing::info!(%id, exec, "checkpoint asked for from inside an exec: refused without waiting");
                    break Err(asked_from_exec(id, exec));
                }
                Err(e) => break Err(e),
            }
        }
        let bound = inst.config().checkpoint.exec_wait();
        let names: Vec<String> = running.iter().map(|r| r.exec_id.clone()).collect();
        if started.elapsed() >= bound {
            break Err(still_running(id, &names, bound));
        }
        if inst.init.status == Status::PAUSED && thawed.is_none() {
            // Frozen, the execs could never exit.
            let c = inst.container().clone();
            let thaw = c.clone();
            if let Err(e) = blocking(move || thaw.resume()).await {
                break Err(e);
            }
            thawed = Some(c);
        }
        drop(inst);
        if waited_for != names {
            tracing::info!(%id, execs = ?names, bound_ms = bound.as_millis() as u64,
                "checkpoint waits for exec processes to exit");
            waited_for = names;
        }
        let exits = all_exited(running.into_iter().map(|r| r.exit));
        // Past the bound, the next round reports what still runs.
        let _ = tokio::time::timeout_at(started + bound, exits).await;
    };
    if let Some(c) = thawed {
        // Frozen again as the caller (containerd, a user) left it.
        if let Err(e) = blocking(move || c.pause()).await {
            tracing::warn!(%id, error = %e, "cannot freeze the container again after waiting for execs");
            // The first failure is the one to report (an init that exited meanwhile).
            drop(outcome?);
            return Err(e);
        }
    }
    if outcome.is_ok() && !waited_for.is_empty() {
        tracing::info!(%id, waited_ms = started.elapsed().as_millis() as u64,
            "exec processes exited: checkpoint goes on");
    }
    outcome
}

/// Waits until every receiver has seen its process's exit (or its sender is gone).
async fn all_exited(receivers: impl Iterator<Item = watch::Receiver<Option<Exit>>>) {
    for mut rx in receivers {
        let _ = rx.wait_for(Option::is_some).await;
    }
}

fn asked_from_exec(id: &str, exec: &str) -> ShimError {
    ShimError::FailedPrecondition(format!(
        "cannot checkpoint container {id}: it was asked for (through the agent API, or by \
         an LLM request ending a turn) from inside exec process {exec:?}, which the \
         checkpoint would wait for (it is not a descendant of the init, so it cannot be \
         dumped) while it waits for this answer; ask from the container's init or its \
         children, or from the host"
    ))
}

fn still_running(id: &str, execs: &[String], bound: Duration) -> ShimError {
    ShimError::FailedPrecondition(format!(
        "cannot checkpoint container {id}: exec processes {execs:?} still run after waiting \
         {} ms for them to exit (they are not descendants of the init, so they cannot be \
         dumped); wait for them or kill them first, or raise [checkpoint] exec_wait_ms",
        bound.as_millis()
    ))
}
