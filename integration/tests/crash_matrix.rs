//! Crash at any step (issue 17 item 13): the helper that runs a checkpoint or a
//! rollback, or the shim above it, is killed with SIGKILL between two steps, as a
//! crash or an OOM kill would stop it. After each: the container is not left frozen,
//! the newest durable checkpoint rolls back or restores correctly, the next
//! checkpoint works, and nothing the dead operation made is left behind.
//!
//! The step is chosen through the configuration's `fault_file`: a file the test
//! writes before one operation and removes after it (the shim's helpers read it when
//! they start). docs/security.md reports the matrix these tests run.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::path::Path;
use std::time::Duration;

use crab_integration::crash::*;
use crab_integration::*;

/// The helper dies at `point` of a checkpoint; the shim survives.
fn helper_crash_in_checkpoint(point: &str) {
    let c = Crashable::start();
    let at = base_checkpoint(&c);
    let out = c.crash_during(point, &["checkpoint", c.id(), "--name", "crashed"]);
    let (o, e) = text(&out);
    assert!(
        !out.status.success(),
        "the checkpoint survived {point}: {o}{e}"
    );
    c.assert_runs(point);
    // The next checkpoint takes the seq the dead one had used.
    crabctl_ok(&["checkpoint", c.id(), "--name", "next"]);
    c.assert_nothing_left_over();
    crabctl_ok(&["rm", c.id(), "next"]);
    c.assert_rolls_back_to("base", at);
    c.assert_runs("the rollback");
}

#[test]
fn helper_killed_while_the_container_is_frozen_leaves_it_running() {
    helper_crash_in_checkpoint("checkpoint.frozen");
}

#[test]
fn helper_killed_after_the_snapshot_leaves_no_snapshot_behind() {
    helper_crash_in_checkpoint("checkpoint.snapshotted");
}

#[test]
fn helper_killed_after_the_dump_leaves_no_images_behind() {
    helper_crash_in_checkpoint("checkpoint.dumped");
}

#[test]
fn helper_killed_after_the_rename_leaves_no_images_behind() {
    helper_crash_in_checkpoint("checkpoint.renamed");
}

/// Killed once the entry is durable: the checkpoint exists (the reply was lost).
#[test]
fn helper_killed_after_recording_keeps_the_checkpoint() {
    let c = Crashable::start();
    base_checkpoint(&c);
    let out = c.crash_during(
        "checkpoint.recorded",
        &["checkpoint", c.id(), "--name", "recorded"],
    );
    assert!(!out.status.success());
    c.assert_runs("checkpoint.recorded");
    let names: Vec<String> = c
        .entries()
        .iter()
        .filter_map(|e| e["name"].as_str().map(String::from))
        .collect();
    assert_eq!(names, ["base", "recorded"]);
    // The recorded one holds what the container had then.
    let at = c.count();
    c.guard.exec_ok(&["sh", "-c", "echo later > /later"]);
    crabctl_ok(&["rollback", c.id(), "recorded"]);
    assert_eq!(
        c.guard.exec(&["test", "-e", "/later"]).status.code(),
        Some(1)
    );
    assert!(c.count() <= at + 25);
    crabctl_ok(&["checkpoint", c.id()]);
    c.assert_nothing_left_over();
}

/// Killed after retention dropped an entry but before its parts were deleted: the
/// next checkpoint collects them.
#[test]
fn helper_killed_during_retention_leaks_nothing_after_the_next_checkpoint() {
    let c = Crashable::start_with("[checkpoint]\nkeep_last = 1");
    crabctl_ok(&["checkpoint", c.id(), "--name", "first"]);
    let out = c.crash_during(
        "checkpoint.retained",
        &["checkpoint", c.id(), "--name", "second"],
    );
    assert!(!out.status.success());
    c.assert_runs("checkpoint.retained");
    crabctl_ok(&["checkpoint", c.id(), "--name", "third"]);
    let names: Vec<String> = c
        .entries()
        .iter()
        .filter_map(|e| e["name"].as_str().map(String::from))
        .collect();
    assert_eq!(names, ["third"]);
    c.assert_nothing_left_over();
}

/// The helper dies half-way through mirroring a snapshot into the tree of a running
/// container (`crabctl fs rollback`): the processes are stopped, not thawed onto a
/// tree that is half the old one; the newest checkpoint then restores the container.
#[test]
fn helper_killed_half_way_through_a_file_rollback_stops_the_processes() {
    let c = Crashable::start();
    let at = base_checkpoint(&c);
    crabctl_ok(&["fs", "snapshot", c.id(), "files"]);
    c.write_fifty_files();
    let out = c.crash_during("btrfs.rollback.mid", &["fs", "rollback", c.id(), "files"]);
    let (o, e) = text(&out);
    assert!(!out.status.success(), "{o}{e}");
    assert!(e.contains("processes were stopped"), "{e}");
    c.wait_gone();
    let out = crabctl_ok(&["restore", c.id()]);
    assert!(out.contains("restored from checkpoint base"), "{out}");
    assert_eq!(c.guard.exec_ok(&["cat", "/f"]).trim(), "before");
    assert_eq!(
        c.guard.exec(&["test", "-e", "/file1"]).status.code(),
        Some(1)
    );
    let now = c.count();
    assert!(now >= at && now < at + 25, "count {now}, {at} at base");
    c.assert_runs("the restore");
    crabctl_ok(&["checkpoint", c.id()]);
}

/// The same half-way crash in a rollback to a checkpoint with processes: the task is
/// reported stopped and the newest checkpoint restores it.
#[test]
fn helper_killed_half_way_through_a_checkpoint_rollback_leaves_the_task_stopped() {
    let c = Crashable::start();
    let at = base_checkpoint(&c);
    c.write_fifty_files();
    let out = c.crash_during("btrfs.rollback.mid", &["rollback", c.id(), "base"]);
    assert!(!out.status.success());
    c.wait_gone();
    crabctl_ok(&["restore", c.id(), "base"]);
    assert_eq!(
        c.guard.exec(&["test", "-e", "/file1"]).status.code(),
        Some(1)
    );
    let now = c.count();
    assert!(now >= at && now < at + 25, "count {now}, {at} at base");
    crabctl_ok(&["checkpoint", c.id()]);
    c.assert_nothing_left_over();
}

/// The shim itself dies at `point` of a checkpoint (the helper kills its parent,
/// then itself): containerd sees the task gone, `crabctl restore` brings back the
/// newest durable checkpoint, and the next checkpoint works.
fn shim_crash_in_checkpoint(point: &str) {
    let c = Crashable::start();
    let at = base_checkpoint(&c);
    let out = c.crash_during(
        &format!("shim:{point}"),
        &["checkpoint", c.id(), "--name", "crashed"],
    );
    assert!(!out.status.success());
    c.wait_gone();
    let out = crabctl_ok(&["restore", c.id()]);
    assert!(out.contains("restored from checkpoint base"), "{out}");
    let now = c.count();
    assert!(now >= at && now < at + 25, "count {now}, {at} at base");
    assert_eq!(c.guard.exec_ok(&["cat", "/f"]).trim(), "before");
    c.assert_runs("the restore");
    crabctl_ok(&["checkpoint", c.id(), "--name", "next"]);
    c.assert_nothing_left_over();
}

#[test]
fn shim_killed_while_the_container_is_frozen_restores_the_last_checkpoint() {
    shim_crash_in_checkpoint("checkpoint.frozen");
}

#[test]
fn shim_killed_after_the_snapshot_restores_the_last_checkpoint() {
    shim_crash_in_checkpoint("checkpoint.snapshotted");
}

#[test]
fn shim_killed_after_the_rename_restores_the_last_checkpoint() {
    shim_crash_in_checkpoint("checkpoint.renamed");
}

/// A rollback whose helper died leaves its durable marker; the next container to
/// start on the host reconciles the store (at most once a minute: the test removes
/// the stamp) and finishes it, so the tree is the snapshot's again.
#[test]
fn a_rollback_a_crash_left_half_done_is_finished_when_the_next_container_starts() {
    let c = Crashable::start();
    crabctl_ok(&["fs", "snapshot", c.id(), "files"]);
    c.write_fifty_files();
    let out = c.crash_during("btrfs.rollback.mid", &["fs", "rollback", c.id(), "files"]);
    assert!(!out.status.success());
    let tree = Path::new("/var/lib/crab/pool/containers")
        .join(namespace())
        .join(c.id());
    let marker = tree.with_extension("rollback");
    assert!(marker.exists(), "{} after the crash", marker.display());
    let half = (1..=50)
        .filter(|i| tree.join(format!("file{i}")).exists())
        .count();
    assert!(half > 0 && half < 50, "{half} of 50 files left half-way");
    let _ = std::fs::remove_file(state_dir().join(".reconciled-btrfs"));
    let _other = Guard::sh("sleep 60");
    assert!(
        wait_until(Duration::from_secs(20), || !marker.exists()),
        "the next container's shim did not finish the rollback"
    );
    let left = (1..=50)
        .filter(|i| tree.join(format!("file{i}")).exists())
        .count();
    assert_eq!(left, 0, "files written after the snapshot");
    assert_eq!(
        std::fs::read_to_string(tree.join("f")).unwrap().trim(),
        "before"
    );
}
