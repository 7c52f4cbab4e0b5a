//! A sandbox holding a process stopped by a signal (a shell's stopped job, a
//! `kill -STOP`): its checkpoints are taken, and the process comes back stopped
//! from every restore, a standby's adoption included, and runs again when it is
//! continued. On a host with the v1 freezer the dump freezes through the
//! container's cgroup v2 tracking directory (docs/checkpoint.md).

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_integration::*;

/// A writer, stopped at once, then a counter in memory and in a file.
const SCRIPT: &str = "(while true; do echo x >> /tmp/w; sleep 0.1; done) & \
     echo $! > /tmp/parked; kill -STOP $!; \
     i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; \
     mv /tmp/count.new /tmp/count; sleep 0.2; done";

const ASK_FOR_STANDBY: &[&str] = &["--annotation", "io.crab.standby=true"];

fn count(g: &Guard) -> u64 {
    g.number("/tmp/count")
}

/// The state letter of the parked writer, read inside the sandbox.
fn parked_state(g: &Guard) -> String {
    g.exec_ok(&[
        "sh",
        "-c",
        "sed -n 's/^State:[[:space:]]*\\(.\\).*/\\1/p' /proc/$(cat /tmp/parked)/status",
    ])
    .trim()
    .to_string()
}

/// The bytes the writer wrote.
fn written(g: &Guard) -> u64 {
    g.exec_ok(&["sh", "-c", "cat /tmp/w 2>/dev/null | wc -c"])
        .trim()
        .parse()
        .unwrap()
}

fn sandbox(flags: &[&str]) -> Guard {
    let g = Guard::run_detached(CRAB, BUSYBOX, flags, &["sh", "-c", SCRIPT]);
    assert!(
        wait_until(Duration::from_secs(10), || count(&g) >= 2),
        "counter did not count"
    );
    assert!(
        wait_until(Duration::from_secs(5), || parked_state(&g) == "T"),
        "the writer is not stopped: {}",
        parked_state(&g)
    );
    g
}

/// The writer is stopped and stays so, and the counter counts (nothing left
/// frozen).
fn assert_parked_and_counting(g: &Guard, when: &str) {
    assert_eq!(parked_state(g), "T", "{when}: the writer runs");
    let before = written(g);
    let now = count(g);
    assert!(
        wait_until(Duration::from_secs(5), || count(g) > now),
        "{when}: the counter does not count"
    );
    assert_eq!(written(g), before, "{when}: the stopped writer wrote");
}

/// Continues the writer and sees it write.
fn continue_writer(g: &Guard, when: &str) {
    let before = written(g);
    g.exec_ok(&["sh", "-c", "kill -CONT $(cat /tmp/parked)"]);
    assert!(
        wait_until(Duration::from_secs(5), || written(g) > before),
        "{when}: the continued writer does not write"
    );
}

/// `ctr task checkpoint` (containerd's client pauses the task first).
fn containerd_checkpoint(g: &Guard) {
    let out = ctr_run(
        &["task", "checkpoint", &g.id],
        None,
        Duration::from_secs(120),
    );
    let (o, e) = text(&out);
    assert!(out.status.success(), "containerd's checkpoint: {o}{e}");
}

#[test]
fn a_sandbox_with_a_stopped_process_is_checkpointed_by_either_door_and_rolled_back_with_it_stopped()
{
    let g = sandbox(&[]);
    containerd_checkpoint(&g);
    assert_parked_and_counting(&g, "after containerd's checkpoint");
    let out = crabctl_ok(&["checkpoint", &g.id, "--name", "stopped"]);
    assert!(out.contains("stopped"), "{out}");
    let at_checkpoint = written(&g);
    assert_parked_and_counting(&g, "after crabctl's checkpoint");
    // Each dump leaves a SIGSTOP queued on a process that stays stopped (CRIU's
    // detach), which the next dump's seize steps over.
    for i in 0..6 {
        crabctl_ok(&["checkpoint", &g.id, "--name", &format!("again-{i}")]);
    }
    assert_parked_and_counting(&g, "after six more checkpoints");

    continue_writer(&g, "before the rollback");
    let out = crabctl_ok(&["rollback", &g.id, "stopped"]);
    assert!(out.contains("processes and files restored"), "{out}");
    assert_eq!(
        written(&g),
        at_checkpoint,
        "the file is not the checkpoint's"
    );
    assert_parked_and_counting(&g, "after the rollback");
    continue_writer(&g, "after the rollback");
}

#[test]
fn a_standby_adopted_by_a_rollback_leaves_the_process_stopped_that_its_checkpoint_held_stopped() {
    let g = sandbox(ASK_FOR_STANDBY);
    crabctl_ok(&["checkpoint", &g.id, "--name", "stopped"]);
    assert_parked_and_counting(&g, "after the checkpoint");
    let standby_ready = || {
        let out = crabctl_ok(&["stats", &g.id, "--json"]);
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        v["standby"]["pid"].as_i64().is_some()
    };
    assert!(
        wait_until(Duration::from_secs(20), standby_ready),
        "no standby was made"
    );
    continue_writer(&g, "before the rollback");
    let out = crabctl_ok(&["rollback", &g.id, "stopped"]);
    assert!(out.contains("standby adopted"), "{out}");
    assert_parked_and_counting(&g, "after the adoption");
    continue_writer(&g, "after the adoption");
}

/// The count the sandbox last wrote, read from the host (a paused sandbox runs no
/// exec).
fn count_from_host(g: &Guard) -> u64 {
    let file = bundle_dir(&g.id).join("rootfs/tmp/count");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

#[test]
fn a_paused_sandbox_with_a_stopped_process_is_checkpointed_by_either_door_and_stays_paused() {
    // The v1 freezer holds a paused sandbox, and CRIU cannot seize a task both
    // stopped and frozen there (it waited for its 300 s timeout): the dump hands
    // the freeze to the v2 freezer and back, and no task runs meanwhile.
    let g = sandbox(&[]);
    ctr_ok(&["task", "pause", &g.id]);
    let paused_at = count_from_host(&g);
    containerd_checkpoint(&g);
    // A second dump, still paused, of a writer the first left a SIGSTOP queued on.
    crabctl_ok(&["checkpoint", &g.id, "--name", "paused"]);
    assert_eq!(g.status().as_deref(), Some("PAUSED"), "the client's pause");
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(count_from_host(&g), paused_at, "the paused sandbox counted");

    ctr_ok(&["task", "resume", &g.id]);
    assert_parked_and_counting(&g, "after the resume");
    continue_writer(&g, "after the resume");
    let out = crabctl_ok(&["rollback", &g.id, "paused"]);
    assert!(out.contains("processes and files restored"), "{out}");
    assert_parked_and_counting(&g, "after the rollback");
}

#[test]
fn a_helper_killed_with_the_freeze_handed_over_leaves_a_running_sandbox_running_and_a_paused_one_paused(
) {
    let c = crab_integration::crash::Crashable::start();
    let g = &c.guard;
    // Reparented to the init once the exec ends: a process of the dumped tree.
    g.exec_ok(&[
        "sh",
        "-c",
        "sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > /tmp/parked; kill -STOP $!",
    ]);
    assert!(wait_until(Duration::from_secs(5), || parked_state(g) == "T"));

    let out = c.crash_during(
        "checkpoint.handed_over",
        &["checkpoint", c.id(), "--name", "cut"],
    );
    assert!(!out.status.success(), "the checkpoint survived its helper");
    c.assert_runs("a helper killed with the freeze handed over");
    assert_eq!(parked_state(g), "T");

    ctr_ok(&["task", "pause", c.id()]);
    let out = c.crash_during(
        "checkpoint.handed_over",
        &["checkpoint", c.id(), "--name", "cut"],
    );
    assert!(!out.status.success(), "the checkpoint survived its helper");
    assert_eq!(g.status().as_deref(), Some("PAUSED"), "the client's pause");
    let paused_at = count_from_host(g);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(count_from_host(g), paused_at, "the paused sandbox counted");
    // Its resume reaches every task: nothing stays with the v2 freezer.
    ctr_ok(&["task", "resume", c.id()]);
    c.assert_runs("the client's resume");
    assert_eq!(parked_state(g), "T");
    crabctl_ok(&["checkpoint", c.id(), "--name", "whole"]);
    c.assert_runs("the checkpoint after");
}
