//! Crashes in the middle of file-system operations: `crabctl` is killed (SIGKILL, the
//! way a crash or OOM kill stops a process) at injected points, then
//! `crabctl fs reconcile` repairs the pool and the container's files are exactly those
//! of a consistent state.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use crab_integration::*;

const T: Duration = Duration::from_secs(60);
const STATE_A: &str = "echo a > /root/f; mkdir -p /root/d; echo keep > /root/d/k";
const STATE_B: &str =
    "echo b > /root/f; rm -r /root/d; for i in 1 2 3 4 5 6 7 8; do echo $i > /root/n$i; done";
const LIST: &str = "cat /root/f; ls /root";

/// A container whose tree holds snapshot `s1` (state A) and then state B, with its
/// task deleted (the container and its tree remain).
fn prepared() -> (Guard, String) {
    prepared_on(&[])
}

fn prepared_on(flags: &[&str]) -> (Guard, String) {
    let g = Guard::run_detached(CRAB, BUSYBOX, flags, &["sleep", "1000"]);
    g.exec_ok(&["sh", "-c", STATE_A]);
    let want = g.exec_ok(&["sh", "-c", LIST]);
    crabctl_ok(&["fs", "snapshot", &g.id, "s1"]);
    g.exec_ok(&["sh", "-c", STATE_B]);
    assert_ne!(g.exec_ok(&["sh", "-c", LIST]), want);
    ctr_ok(&["task", "kill", "-s", "KILL", &g.id]);
    assert!(wait_until(T, || g.status().as_deref() == Some("STOPPED")));
    ctr_ok(&["task", "rm", &g.id]);
    (g, want)
}

fn assert_killed(out: &std::process::Output) {
    assert_eq!(
        out.status.signal(),
        Some(9),
        "not killed at the fault point: {:?}",
        text(out)
    );
}

fn rollback_crash_is_completed_by_reconcile(point: &str) {
    rollback_crash_on(&[], point)
}

fn rollback_crash_on(flags: &[&str], point: &str) {
    let (g, want) = prepared_on(flags);
    // The task is gone, so crabctl is told the store (the shim recorded it while the
    // task existed).
    let backend = if flags.iter().any(|f| f.contains("overlay")) {
        "overlay"
    } else {
        "btrfs"
    };
    let out = crabctl(
        &["fs", "--backend", backend, "rollback", &g.id, "s1"],
        &[("CRAB_FAULT", point)],
    );
    assert_killed(&out);
    let report = crabctl_ok(&["fs", "--backend", backend, "reconcile"]);
    assert!(
        report.contains("completed rollback") && report.contains(&g.id),
        "{report}"
    );
    ctr_ok(&["task", "start", "-d", &g.id]);
    assert_eq!(g.exec_ok(&["sh", "-c", LIST]), want);
    // Nothing is left to repair.
    assert!(!crabctl_ok(&["fs", "--backend", backend, "reconcile"]).contains(&g.id));
}

#[test]
fn crash_after_the_rollback_marker_is_completed_by_reconcile() {
    rollback_crash_is_completed_by_reconcile("btrfs.rollback.marked");
}

#[test]
fn crash_half_way_through_a_rollback_is_completed_by_reconcile() {
    rollback_crash_is_completed_by_reconcile("btrfs.rollback.mid");
}

#[test]
fn crash_half_way_through_an_overlay_rollback_is_completed_by_reconcile() {
    rollback_crash_on(
        &["--annotation", "io.crab.storage.backend=overlay"],
        "overlay.rollback.mid",
    );
}

#[test]
fn crash_during_import_leaves_no_snapshot_and_import_works_again() {
    let (g, _) = prepared();
    let file = std::env::temp_dir().join(unique_id("export"));
    let f = file.display().to_string();
    crabctl_ok(&["fs", "export", &g.id, "s1", "-o", &f]);
    let target = unique_id("imported");
    let out = crabctl(
        &["fs", "import", &target, &f],
        &[("CRAB_FAULT", "btrfs.import.marked")],
    );
    assert_killed(&out);
    crabctl_ok(&["fs", "--backend", "btrfs", "reconcile"]);
    assert_eq!(crabctl_ok(&["fs", "ls", &target]), "");
    assert_eq!(crabctl_ok(&["fs", "import", &target, &f]).trim(), "s1");
    assert!(crabctl_ok(&["fs", "ls", &target]).starts_with("s1\t"));
    crabctl_ok(&["fs", "rm", &target, "s1"]);
    let _ = std::fs::remove_file(file);
}

#[test]
fn snapshot_of_a_running_container_is_consistent_and_it_keeps_running() {
    let g = Guard::run_detached(
        CRAB,
        BUSYBOX,
        &[],
        &[
            "sh",
            "-c",
            "i=0; while true; do i=$((i+1)); echo $i > /tmp/t; mv /tmp/t /tmp/a; \
             echo $i > /tmp/t; mv /tmp/t /tmp/b; done",
        ],
    );
    for n in 0..5 {
        let name = format!("s{n}");
        crabctl_ok(&["fs", "snapshot", &g.id, &name]);
        let snap = std::path::PathBuf::from("/var/lib/crab/pool/snapshots")
            .join(namespace())
            .join(&g.id)
            .join(&name);
        let a = std::fs::read_to_string(snap.join("tmp/a")).unwrap_or_default();
        let b = std::fs::read_to_string(snap.join("tmp/b")).unwrap_or_default();
        // Each file is replaced atomically, a before b: frozen anywhere, b lags a by at
        // most one.
        let (a, b): (u64, u64) = (a.trim().parse().unwrap_or(0), b.trim().parse().unwrap_or(0));
        assert!(a == b || a == b + 1, "torn snapshot: a={a} b={b}");
    }
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    assert_eq!(crabctl_ok(&["fs", "ls", &g.id]).lines().count(), 5);
}

#[test]
fn rollback_of_a_running_container_is_seen_by_its_processes() {
    let g = Guard::run_detached(CRAB, BUSYBOX, &[], &["sh", "-c", "cd /root && sleep 1000"]);
    g.exec_ok(&["sh", "-c", "echo before > /root/f"]);
    crabctl_ok(&["fs", "snapshot", &g.id, "s1"]);
    g.exec_ok(&["sh", "-c", "echo after > /root/f; touch /root/new"]);
    crabctl_ok(&["fs", "rollback", &g.id, "s1"]);
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    assert_eq!(g.exec_ok(&["cat", "/root/f"]), "before\n");
    // The init's working directory is inside the tree: it sees the rollback too.
    let pid = g.pid();
    let cwd_listing: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/cwd"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!cwd_listing.contains(&"new".to_string()), "{cwd_listing:?}");
}

#[test]
fn bad_snapshot_names_and_unknown_snapshots_fail_clearly() {
    let g = Guard::run_detached(CRAB, BUSYBOX, &[], &["sleep", "1000"]);
    crabctl_ok(&["fs", "snapshot", &g.id, "good"]);
    for (args, needle) in [
        (
            vec!["fs", "snapshot", &g.id, "../evil"],
            "invalid snapshot name",
        ),
        (
            vec!["fs", "rollback", &g.id, "missing"],
            "no snapshot \"missing\"",
        ),
        (
            vec!["fs", "snapshot", &g.id, "good"],
            "already has a snapshot",
        ),
        (
            vec!["fs", "snapshot", "no-such-container", "x"],
            "no root file system",
        ),
    ] {
        let out = crabctl(&args, &[]);
        let (o, e) = text(&out);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(e.contains(needle), "{args:?}: {o}{e}");
    }
    assert_eq!(crabctl_ok(&["fs", "ls", &g.id]).lines().count(), 1);
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
}

#[test]
fn crashes_in_overlay_snapshot_and_clone_leave_nothing_recorded() {
    let overlay = ["--annotation", "io.crab.storage.backend=overlay"];
    let g = Guard::run_detached(CRAB, BUSYBOX, &overlay, &["sleep", "1000"]);
    g.exec_ok(&["sh", "-c", STATE_A]);
    // Without a shim (its task deleted, its tree kept), crabctl changes the store
    // itself; with one, the shim's helper does (and a crash there is the shim's).
    ctr_ok(&["task", "kill", "-s", "KILL", &g.id]);
    assert!(wait_until(T, || g.status().as_deref() == Some("STOPPED")));
    ctr_ok(&["task", "rm", &g.id]);
    let fs = ["fs", "--backend", "overlay"];
    let out = crabctl(
        &[&fs[..], &["snapshot", &g.id, "s1"]].concat(),
        &[("CRAB_FAULT", "overlay.snapshot.copied")],
    );
    assert_killed(&out);
    let report = crabctl_ok(&[&fs[..], &["reconcile"]].concat());
    assert!(report.contains("removed"), "{report}");
    assert_eq!(crabctl_ok(&[&fs[..], &["ls", &g.id]].concat()), "");
    crabctl_ok(&[&fs[..], &["snapshot", &g.id, "s1"]].concat());
    let clone = unique_id("clone");
    let out = crabctl(
        &[&fs[..], &["clone", &g.id, "s1", &clone]].concat(),
        &[("CRAB_FAULT", "overlay.tree.copied")],
    );
    assert_killed(&out);
    crabctl_ok(&[&fs[..], &["reconcile"]].concat());
    let dir = std::path::Path::new("/var/lib/crab/overlay/containers")
        .join(namespace())
        .join(&clone);
    assert!(
        !dir.exists(),
        "half a clone is recorded at {}",
        dir.display()
    );
    let path = crabctl_ok(&[&fs[..], &["clone", &g.id, "s1", &clone]].concat());
    assert_eq!(
        std::fs::read_to_string(std::path::Path::new(path.trim()).join("root/f")).unwrap(),
        "a\n"
    );
    let root = std::env::var("CRAB_CONTAINERD_ROOT").unwrap_or("/var/lib/crab/containerd".into());
    let snapshots = format!("{root}/io.containerd.snapshotter.v1.overlayfs/snapshots");
    crabctl_ok(&[
        "fs",
        "--backend",
        "overlay",
        "gc",
        "--snapshots",
        &snapshots,
    ]);
    let _ = std::process::Command::new("umount")
        .arg(path.trim())
        .status();
    let _ = std::fs::remove_dir_all(dir);
}
