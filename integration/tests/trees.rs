//! When a container's tree in the store goes: with its containerd container, and only
//! the collect of the containerd that made it may remove it.
//!
//! The store here is the test configuration's (btrfs: a tree is
//! `<pool>/containers/<ns>/<id>`, its owner, containerd's writable layer, is recorded
//! in `<id>.owner` beside it).

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::path::{Path, PathBuf};
use std::time::Duration;

use crab_integration::*;

const POOL: &str = "/var/lib/crab/pool";

fn tree(id: &str) -> PathBuf {
    Path::new(POOL)
        .join("containers")
        .join(namespace())
        .join(id)
}

fn owner_file(id: &str) -> PathBuf {
    Path::new(POOL)
        .join("containers")
        .join(namespace())
        .join(format!("{id}.owner"))
}

/// This containerd's overlay snapshotter's snapshots directory.
fn our_snapshots() -> String {
    let root = std::env::var("CRAB_CONTAINERD_ROOT").unwrap_or("/var/lib/crab/containerd".into());
    format!("{root}/io.containerd.snapshotter.v1.overlayfs/snapshots")
}

/// `ctr run --read-only` (containerd 1.7's ctr gives it a writable snapshot and a
/// read-only root): ten in a row under one id, each on a fresh tree.
#[test]
fn a_read_only_container_under_one_id_runs_ten_times() {
    let id = unique_id("ro");
    let _guard = Guard::new(&id);
    for round in 0..10 {
        let out = ctr_run(
            &[
                "run",
                "--rm",
                "--read-only",
                "--runtime",
                CRAB,
                BUSYBOX,
                &id,
                "sh",
                "-c",
                "test ! -e /written && ! touch /written 2>/dev/null && echo ok",
            ],
            None,
            Duration::from_secs(60),
        );
        let (stdout, stderr) = text(&out);
        assert!(
            out.status.success() && stdout.trim() == "ok",
            "round {round}: {:?} {stdout}{stderr}",
            out.status
        );
    }
}

/// A stopped container (task deleted, container kept) whose tree stays in the store.
fn stopped_container() -> Guard {
    let g = Guard::run_detached(CRAB, BUSYBOX, &[], &["sh", "-c", "echo x > /kept"]);
    assert!(wait_until(Duration::from_secs(10), || {
        g.status().as_deref() == Some("STOPPED")
    }));
    ctr_ok(&["task", "rm", &g.id]);
    assert!(tree(&g.id).is_dir(), "{}", tree(&g.id).display());
    g
}

/// Creates (and removes) one container, which collects in the background.
fn trigger_collect() {
    let g = Guard::sh("sleep 600");
    drop(g);
}

#[test]
fn a_create_collects_gone_owners_of_its_own_containerd_but_not_of_another() {
    // Another containerd's tree, whose owner this one cannot see: kept.
    let theirs = stopped_container();
    std::fs::write(
        owner_file(&theirs.id),
        "/var/lib/crab/another-containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/7/fs",
    )
    .unwrap();
    // A tree of this containerd whose owner (writable layer) is gone: collected.
    let ours = stopped_container();
    std::fs::write(
        owner_file(&ours.id),
        format!("{}/999999999/fs", our_snapshots()),
    )
    .unwrap();
    trigger_collect();
    let collected = wait_until(Duration::from_secs(20), || !tree(&ours.id).exists());
    assert!(collected, "{} not collected", tree(&ours.id).display());
    assert!(
        tree(&theirs.id).join("kept").is_file(),
        "another containerd's tree was removed: {}",
        tree(&theirs.id).display()
    );
    // Its own containerd's collect (here, on demand) removes it once it is ours.
    let root = std::env::var("CRAB_CONTAINERD_ROOT").unwrap_or("/var/lib/crab/containerd".into());
    let other = format!("{root}-gone/io.containerd.snapshotter.v1.overlayfs/snapshots");
    std::fs::write(owner_file(&theirs.id), format!("{other}/7/fs")).unwrap();
    let out = crabctl_ok(&["fs", "--backend", "btrfs", "gc", "--snapshots", &other]);
    assert!(out.contains(&theirs.id), "{out}");
    assert!(!tree(&theirs.id).exists());
}
