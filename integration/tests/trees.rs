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

use crab_integration::image_copies::{
    assert_kept_copy, copies_since, image_copies, own_image, recorded_layer,
};
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

/// An image removed from containerd (its layers collected) loses its copy in the
/// pool at the next create, once no container of it is left; the copies of images
/// still in use stay.
#[test]
fn a_removed_image_loses_its_copy_at_the_next_create() {
    let id = unique_id("gcimg");
    let name = format!("docker.io/crab/{id}:latest");
    let dir = std::env::temp_dir().join(&id);
    std::fs::create_dir_all(&dir).unwrap();
    let tar = own_image(&name, &dir);
    trigger_collect(); // busybox's copy exists, with its record
    let before = image_copies();
    ctr_ok(&["images", "import", tar.to_str().unwrap()]);

    // A stopped container of the image: its tree is a snapshot of the new copy.
    let g = Guard::run_detached(CRAB, &name, &[], &["sh", "-c", "cat /name > /seen"]);
    assert!(wait_until(Duration::from_secs(10), || {
        g.status().as_deref() == Some("STOPPED")
    }));
    ctr_ok(&["task", "rm", &g.id]);
    let made = copies_since(&before);
    assert_eq!(made.len(), 1, "one copy made for {name}: {made:?}");
    let copy = Path::new(POOL).join("images").join(&made[0]);
    let record = Path::new(POOL)
        .join("images")
        .join(format!("{}.layers", made[0]));
    assert!(copy.join("name").is_file(), "{}", copy.display());
    assert!(record.is_file(), "{}", record.display());
    let seen = tree(&g.id).join("seen");
    assert_eq!(std::fs::read_to_string(&seen).unwrap().trim(), name);

    // The image removed while its container is kept: containerd keeps the layer
    // (the container's snapshot is its child), and a create's collect the copy.
    ctr_ok(&["images", "rm", "--sync", &name]);
    trigger_collect();
    std::thread::sleep(Duration::from_secs(2));
    assert!(copy.is_dir(), "the copy went while its layer was kept");

    // The container removed too: containerd collects the layer, and the next
    // create the tree and the copy with its record.
    let layer = recorded_layer(&made[0]);
    assert!(
        layer.is_dir(),
        "the record names the layer: {}",
        layer.display()
    );
    drop(g);
    assert!(
        wait_until(Duration::from_secs(30), || !layer.exists()),
        "containerd kept the layer {}",
        layer.display()
    );
    trigger_collect();
    let gone = wait_until(Duration::from_secs(20), || !copy.exists() && !seen.exists());
    assert!(
        gone,
        "the copy of the removed image stays: {}",
        copy.display()
    );
    assert!(!record.exists(), "its record went with it");

    // busybox's copy was kept: its next container makes none.
    assert_kept_copy(trigger_collect, "busybox");
    let _ = std::fs::remove_dir_all(dir);
}
