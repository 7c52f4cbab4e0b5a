//! The overlay store, on a plain directory of the host file system (no reflinks) and
//! on the btrfs pool's file system (reflinks).

// Needs root and the real store: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

mod support;

use crab_runtime::storage::overlay::OverlayStore;
use crab_runtime::storage::{ContainerKey, ImageSource, Store};
use support::*;

#[test]
fn overlay_store_passes_the_conformance_suite_on_the_host_file_system() {
    let dir = temp_dir("overlay-pool");
    support::conformance::run(&OverlayStore::open(&dir).unwrap());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn overlay_store_passes_the_conformance_suite_with_reflinks() {
    let dir = std::path::Path::new("/var/lib/crab/pool/overlay-test").join(unique("pool"));
    support::conformance::run(&OverlayStore::open(&dir).unwrap());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn fifty_containers_snapshot_concurrently_and_every_snapshot_is_right() {
    let dir = temp_dir("overlay-pool");
    support::conformance::fifty_concurrent_snapshots(std::sync::Arc::new(
        OverlayStore::open(&dir).unwrap(),
    ));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_full_pool_fails_with_pool_full_and_keeps_earlier_snapshots() {
    // The overlay store's directory on a small file system of its own.
    let pool = SmallPool::new("300M");
    support::conformance::full_pool(&OverlayStore::open(pool.dir.join("overlay")).unwrap());
}

#[test]
fn snapshot_cost_follows_the_changes_not_the_image() {
    let dir = temp_dir("overlay-pool");
    let s = OverlayStore::open(&dir).unwrap();
    let image = temp_dir("big-image");
    for i in 0..2000 {
        std::fs::write(image.join(format!("f{i}")), vec![7u8; 4096]).unwrap();
    }
    let k = ContainerKey::new("conformance", &unique("cost")).unwrap();
    let live = s
        .prepare(&k, &ImageSource::from_layers(vec![image.clone()]))
        .unwrap();
    std::fs::write(live.join("changed"), b"one file").unwrap();
    s.snapshot(&k, "s").unwrap();
    // The snapshot holds the change only, not the 2000 image files.
    let snap_upper = dir
        .join("snapshots/conformance")
        .join(k.id())
        .join("s/upper");
    let held: Vec<_> = std::fs::read_dir(&snap_upper).unwrap().flatten().collect();
    assert_eq!(held.len(), 1, "{held:?}");
    s.release(&k).unwrap();
    s.destroy(&k).unwrap();
    let _ = std::fs::remove_dir_all(image);
    let _ = std::fs::remove_dir_all(dir);
}
