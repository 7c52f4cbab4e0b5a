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

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crab_integration::*;

/// A counter the container rewrites every 0.2 s, and a file the test changes.
const COUNTER: &str = "echo before > /f; i=0; while true; do i=$((i+1)); \
    echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done";

/// A container of the crab runtime whose shim reads faults from its own file.
struct Crashable {
    guard: Guard,
    fault_file: PathBuf,
}

impl Crashable {
    fn start() -> Crashable {
        Crashable::start_with("")
    }

    /// With `extra` TOML tables after the fault file's key.
    fn start_with(extra: &str) -> Crashable {
        let fault_file = std::env::temp_dir().join(format!("{}.fault", unique_id("f")));
        let config = config_with(&format!(
            "fault_file = \"{}\"\n{extra}",
            fault_file.display()
        ));
        let config = config.display().to_string();
        let guard = Guard::run_detached(
            CRAB,
            BUSYBOX,
            &["--runtime-config-path", &config],
            &["sh", "-c", COUNTER],
        );
        let c = Crashable { guard, fault_file };
        assert!(wait_until(Duration::from_secs(10), || c.count() >= 3));
        c
    }

    fn id(&self) -> &str {
        &self.guard.id
    }

    fn count(&self) -> u64 {
        self.guard.number("/tmp/count")
    }

    /// Runs crabctl with the fault armed for this one call; answers its output.
    fn crash_during(&self, point: &str, args: &[&str]) -> std::process::Output {
        std::fs::write(&self.fault_file, point).expect("arm the fault");
        let out = crabctl(args, &[]);
        std::fs::remove_file(&self.fault_file).expect("disarm the fault");
        out
    }

    /// The counter moves: the container runs and is not frozen.
    fn assert_runs(&self, after: &str) {
        let c = self.count();
        assert!(
            wait_until(Duration::from_secs(5), || self.count() > c),
            "{}: the counter stopped at {c} after {after} (left frozen?)",
            self.id()
        );
    }

    /// The checkpoints' entries: (seq, fs snapshot, process image).
    fn entries(&self) -> Vec<serde_json::Value> {
        let out = crabctl_ok(&["ls", self.id(), "--json"]);
        serde_json::from_str(&out).expect("crabctl ls --json")
    }

    /// Nothing but the recorded checkpoints' parts is left: no process image
    /// directory (or temporary one) and no checkpoint snapshot that no entry names.
    fn assert_nothing_left_over(&self) {
        let entries = self.entries();
        let images: BTreeSet<String> = entries
            .iter()
            .filter_map(|e| e["process_image"].as_u64())
            .map(|s| s.to_string())
            .collect();
        let snapshots: BTreeSet<String> = entries
            .iter()
            .filter_map(|e| e["fs_snapshot"].as_str().map(String::from))
            .collect();
        let dir = history_dir(self.id());
        let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
            .expect("history dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.') || n.parse::<u64>().is_ok())
            .collect();
        assert_eq!(on_disk, images, "process images in {}", dir.display());
        let listed = crabctl_ok(&["fs", "ls", self.id()]);
        let in_store: BTreeSet<String> = listed
            .lines()
            .filter_map(|l| l.split('\t').next())
            .filter(|n| n.starts_with("ckpt-"))
            .map(String::from)
            .collect();
        assert_eq!(in_store, snapshots, "checkpoint snapshots in the store");
    }

    /// A file written after checkpoint `name`, then a rollback to it: the file and
    /// the counter are those of the checkpoint.
    fn assert_rolls_back_to(&self, name: &str, count_at: u64) {
        self.guard
            .exec_ok(&["sh", "-c", "echo after > /f; echo x > /after"]);
        crabctl_ok(&["rollback", self.id(), name]);
        assert_eq!(self.guard.exec_ok(&["cat", "/f"]).trim(), "before");
        assert_eq!(
            self.guard.exec(&["test", "-e", "/after"]).status.code(),
            Some(1)
        );
        let now = self.count();
        assert!(
            now >= count_at && now < count_at + 25,
            "count {now} after the rollback, {count_at} at checkpoint {name}"
        );
    }

    /// Fifty files written after the snapshot or checkpoint a rollback goes to: a
    /// mirror that dies part of the way leaves some of them.
    fn write_fifty_files(&self) {
        self.guard.exec_ok(&[
            "sh",
            "-c",
            "for i in $(seq 1 50); do echo $i > /file$i; done",
        ]);
    }

    /// Waits until containerd sees the task gone (its shim was killed).
    fn wait_gone(&self) {
        assert!(
            wait_until(Duration::from_secs(30), || self.guard.status().as_deref()
                != Some("RUNNING")),
            "containerd did not notice the shim's crash"
        );
    }
}

impl Drop for Crashable {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.fault_file);
    }
}

/// Where the checkpoints of container `id` live (the test configuration's
/// `[checkpoint] store`, else the default).
fn history_dir(id: &str) -> PathBuf {
    let config: toml::Table = std::env::var("CRAB_CONFIG")
        .ok()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default()
        .parse()
        .expect("CRAB_CONFIG is TOML");
    let store = config
        .get("checkpoint")
        .and_then(|c| c.get("store"))
        .and_then(|s| s.as_str())
        .unwrap_or("/var/lib/crab/checkpoints");
    Path::new(store).join(namespace()).join(id)
}

/// A checkpoint named `base`, the counter's value just before it.
fn base_checkpoint(c: &Crashable) -> u64 {
    let at = c.count();
    crabctl_ok(&["checkpoint", c.id(), "--name", "base"]);
    at
}

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
