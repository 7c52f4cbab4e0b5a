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
fn overlay_store_tells_what_the_tree_of_a_writable_layer_wrote() {
    let dir = temp_dir("overlay-pool");
    support::written::written_is_found_by_owner(|| Box::new(OverlayStore::open(&dir).unwrap()));
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
        .prepare(&k, &ImageSource::from_layers(vec![image.clone()]).unwrap())
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

/// A snapshot archive as `export` writes it (`<name>/upper/...`, `<name>/lower`),
/// built by hand by whoever wrote the stream, with `lower` set to `lower` (a
/// symlink to `/` when `lower_link`) and `upper` a symlink to `/` when `upper_link`.
fn crafted_snapshot(name: &str, lower: &str, upper_link: bool, lower_link: bool) -> Vec<u8> {
    let dir = temp_dir("crafted");
    let snap = dir.join(name);
    std::fs::create_dir_all(&snap).unwrap();
    if upper_link {
        std::os::unix::fs::symlink("/", snap.join("upper")).unwrap();
    } else {
        std::fs::create_dir(snap.join("upper")).unwrap();
        std::fs::write(snap.join("upper/hello"), b"hi").unwrap();
    }
    if lower_link {
        std::os::unix::fs::symlink("/etc/hostname", snap.join("lower")).unwrap();
    } else {
        std::fs::write(snap.join("lower"), format!("{lower}\n")).unwrap();
    }
    let out = std::process::Command::new("tar")
        .arg("-C")
        .arg(&dir)
        .args(["-cf", "-", name])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let _ = std::fs::remove_dir_all(dir);
    out.stdout
}

#[test]
fn an_imported_overlay_snapshot_whose_lower_is_the_hosts_root_is_refused() {
    use crab_runtime::Error;
    let dir = temp_dir("overlay-pool");
    let s = OverlayStore::open(&dir).unwrap();
    let layer = temp_dir("layer");
    std::fs::write(layer.join("from-the-image"), b"image").unwrap();
    let outside = temp_dir("outside");
    let key = |tag: &str| ContainerKey::new("conformance", &unique(tag)).unwrap();
    // A container of the image makes its layer one the store uses.
    let a = key("a");
    s.prepare(&a, &ImageSource::from_layers(vec![layer.clone()]).unwrap())
        .unwrap();

    let layer_text = layer.display().to_string();
    let outside_text = outside.display().to_string();
    let attacks = [
        (
            "lower is /",
            crafted_snapshot("s", "/", false, false),
            "names / as a lower dir",
        ),
        (
            "lower is a host directory",
            crafted_snapshot("s", &outside_text, false, false),
            "not one of the image layers",
        ),
        (
            "upper is a symlink to /",
            crafted_snapshot("s", &layer_text, true, false),
            "s/upper is not part of an overlay snapshot",
        ),
        (
            "lower is a symlink to a host file",
            crafted_snapshot("s", &layer_text, false, true),
            "s/lower is not part of an overlay snapshot",
        ),
    ];
    for (what, archive, says) in attacks {
        let c = key("c");
        let e = s.import(&c, &mut archive.as_slice()).unwrap_err();
        assert!(matches!(e, Error::ImportRefused(_)), "{what}: {e}");
        assert!(e.to_string().contains(says), "{what}: {e}");
        // Nothing received, so no tree can be made over the host's root.
        assert!(s.list(&c).unwrap().is_empty(), "{what}");
        assert!(
            matches!(s.rollback(&c, "s"), Err(Error::SnapshotNotFound { .. })),
            "{what}"
        );
        assert!(!dir
            .join("snapshots/conformance")
            .join(c.id())
            .join("s")
            .exists());
        let tmp: Vec<_> = std::fs::read_dir(dir.join("tmp"))
            .unwrap()
            .flatten()
            .collect();
        assert!(tmp.is_empty(), "{what}: left {tmp:?}");
    }

    // The same archive naming the store's own layer is a snapshot like any other.
    let c = key("c");
    let good = crafted_snapshot("s", &layer_text, false, false);
    assert_eq!(s.import(&c, &mut good.as_slice()).unwrap().name, "s");
    s.rollback(&c, "s").unwrap();
    let tree = s.rootfs(&c).unwrap();
    assert_eq!(std::fs::read(tree.join("hello")).unwrap(), b"hi");
    assert_eq!(
        std::fs::read(tree.join("from-the-image")).unwrap(),
        b"image"
    );
    for k in [&a, &c] {
        s.release(k).unwrap();
        s.destroy(k).unwrap();
    }
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(layer);
    let _ = std::fs::remove_dir_all(outside);
}
