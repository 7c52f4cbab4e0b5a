//! The btrfs store against the real btrfs pool the set-up mounts (`hack/pool.sh`).

mod support;

use std::path::Path;

use crab_runtime::storage::btrfs::BtrfsStore;
use crab_runtime::storage::{ContainerKey, ImageSource, Store};
use support::*;

const POOL: &str = "/var/lib/crab/pool";

fn store() -> BtrfsStore {
    BtrfsStore::open(POOL).expect("the btrfs pool (run hack/pool.sh) must be mounted")
}

#[test]
fn btrfs_store_passes_the_conformance_suite() {
    support::conformance::run(&store());
}

#[test]
fn opening_a_directory_that_is_not_btrfs_fails_clearly() {
    let e = BtrfsStore::open("/proc").unwrap_err().to_string();
    assert!(e.contains("not a btrfs"), "{e}");
}

#[test]
fn a_gigabyte_file_survives_snapshot_and_rollback() {
    let s = store();
    let image = temp_dir("img");
    let k = ContainerKey::new("conformance", &unique("big")).unwrap();
    let live = s
        .prepare(&k, &ImageSource::from_layers(vec![image.clone()]))
        .unwrap();
    let big = live.join("big.bin");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&big).unwrap();
        let chunk: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
        for _ in 0..1024 {
            f.write_all(&chunk).unwrap();
        }
    }
    let want = fingerprint(&live);
    s.snapshot(&k, "big").unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&big).unwrap();
        f.write_all_at(b"changed", 512 << 20).unwrap();
    }
    assert_ne!(fingerprint(&live), want);
    s.rollback(&k, "big").unwrap();
    assert_same("1 GB file after rollback", &fingerprint(&live), &want);
    s.destroy(&k).unwrap();
    let _ = std::fs::remove_dir_all(image);
}

#[test]
fn reconcile_finishes_an_interrupted_rollback_and_removes_dead_work() {
    let s = store();
    let image = temp_dir("img");
    populate_image(&image);
    let k = ContainerKey::new("conformance", &unique("crash")).unwrap();
    let live = s
        .prepare(&k, &ImageSource::from_layers(vec![image.clone()]))
        .unwrap();
    turn_one(&live);
    let want = fingerprint(&live);
    s.snapshot(&k, "s").unwrap();
    turn_two(&live);
    // A rollback that died after writing its marker and changing part of the tree.
    let marker = Path::new(POOL)
        .join("containers/conformance")
        .join(format!("{}.rollback", k.id()));
    std::fs::write(&marker, "s").unwrap();
    std::fs::remove_file(live.join("etc/hostname")).unwrap();
    // Work of a process that no longer exists.
    let dead = Path::new(POOL).join("tmp/999999999.0.image-dead");
    std::fs::create_dir_all(&dead).unwrap();
    let report = s.reconcile().unwrap();
    assert!(
        report.completed.iter().any(|c| c.contains(k.id())),
        "{report:?}"
    );
    assert!(
        report.removed.iter().any(|r| r.contains("999999999")),
        "{report:?}"
    );
    assert!(!marker.exists() && !dead.exists());
    assert_same("after reconcile", &fingerprint(&live), &want);
    s.destroy(&k).unwrap();
    let _ = std::fs::remove_dir_all(image);
}
