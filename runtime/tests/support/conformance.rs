//! The conformance suite every [`Store`] passes: real contents before and after
//! snapshot, rollback (also seen through a directory handle opened before it), clone,
//! export/import (full and incremental), listing, deletion and bad input.

use std::fs;
use std::path::Path;

use crab_runtime::storage::{ContainerKey, ImageSource, Store};
use crab_runtime::Error;

use super::*;

fn key(tag: &str) -> ContainerKey {
    ContainerKey::new("conformance", &unique(tag)).unwrap()
}

fn listing_through(fd_path: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(fd_path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Runs the whole suite against `store`.
pub fn run(store: &dyn Store) {
    let image_dir = temp_dir("image");
    populate_image(&image_dir);
    let image = ImageSource::from_layers(vec![image_dir.clone()]).unwrap();
    let base = fingerprint(&image_dir);

    let a = key("a");
    let live = store.prepare(&a, &image).expect("prepare");
    assert_same("prepared tree", &fingerprint(&live), &base);
    assert!(
        allocated(&live.join("home/crab/sparse.img")) < 8 << 20,
        "a sparse file became dense"
    );
    assert!(matches!(
        store.prepare(&a, &image),
        Err(Error::AlreadyExists(_))
    ));

    turn_one(&live);
    let fp1 = fingerprint(&live);
    store.snapshot(&a, "s1").expect("snapshot s1");
    turn_two(&live);
    let fp2 = fingerprint(&live);
    store.snapshot(&a, "s2").expect("snapshot s2");
    turn_three(&live);
    let fp3 = fingerprint(&live);
    assert_ne!(fp3, fp2);

    let names: Vec<String> = store
        .list(&a)
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["s1", "s2"]);

    // A process that has the tree open (here: a directory handle, as a process's cwd
    // or root would be) sees the rolled-back content.
    let handle = fs::File::open(&live).unwrap();
    let through = std::path::PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&handle)
    ));
    store.rollback(&a, "s1").expect("rollback to s1 (older)");
    assert_same("rolled back to s1", &fingerprint(&live), &fp1);
    assert!(listing_through(&through).contains(&"new-file.link".to_string()));
    assert!(!listing_through(&through)
        .iter()
        .any(|n| n.starts_with("junk-")));
    store.rollback(&a, "s2").expect("rollback to s2 (latest)");
    assert_same("rolled back to s2", &fingerprint(&live), &fp2);
    assert_eq!(
        fs::read_to_string(through.join("new-file/inside")).unwrap(),
        "inside\n"
    );
    drop(handle);
    // Rolling back twice to the same snapshot is harmless.
    store.rollback(&a, "s2").unwrap();
    assert_same("second rollback to s2", &fingerprint(&live), &fp2);

    // Clones are independent of their origin.
    let b = key("b");
    let cloned = store.clone_snapshot(&a, "s1", &b).expect("clone");
    assert_same("clone of s1", &fingerprint(&cloned), &fp1);
    fs::write(cloned.join("only-in-clone"), b"x").unwrap();
    assert!(!live.join("only-in-clone").exists());
    assert_same("origin after clone write", &fingerprint(&live), &fp2);

    // Export/import, full then incremental, under another container.
    let c = key("c");
    let mut full = Vec::new();
    store.export(&a, "s1", None, &mut full).expect("export s1");
    let mut incr = Vec::new();
    store
        .export(&a, "s2", Some("s1"), &mut incr)
        .expect("export s2 from s1");
    assert!(!full.is_empty() && !incr.is_empty());
    assert_eq!(
        store
            .import(&c, &mut full.as_slice())
            .expect("import full")
            .name,
        "s1"
    );
    assert_eq!(
        store
            .import(&c, &mut incr.as_slice())
            .expect("import incr")
            .name,
        "s2"
    );
    assert!(matches!(store.rootfs(&c), Err(Error::NoTree(_))));
    store.rollback(&c, "s2").expect("tree from imported s2");
    assert_same(
        "imported s2",
        &fingerprint(&store.rootfs(&c).unwrap()),
        &fp2,
    );
    store.rollback(&c, "s1").expect("rollback imported");
    assert_same(
        "imported s1",
        &fingerprint(&store.rootfs(&c).unwrap()),
        &fp1,
    );

    // Bad input: clear errors, nothing destroyed.
    let before = fingerprint(&live);
    assert!(matches!(
        store.snapshot(&a, "../x"),
        Err(Error::BadName { .. })
    ));
    assert!(matches!(
        store.snapshot(&a, ".tmp"),
        Err(Error::BadName { .. })
    ));
    assert!(matches!(
        store.snapshot(&a, "s1"),
        Err(Error::SnapshotExists { .. })
    ));
    assert!(matches!(
        store.rollback(&a, "nope"),
        Err(Error::SnapshotNotFound { .. })
    ));
    assert!(matches!(
        store.snapshot(&key("ghost"), "s"),
        Err(Error::NoTree(_))
    ));
    assert_same("after bad input", &fingerprint(&live), &before);
    assert_eq!(store.list(&a).unwrap().len(), 2);

    assert!(store.space_used(&a).unwrap() > 0);
    store.delete_snapshot(&a, "s2").expect("delete s2");
    let names: Vec<String> = store
        .list(&a)
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["s1"]);

    for k in [&b, &c, &a] {
        store.destroy(k).expect("destroy");
        assert!(matches!(store.rootfs(k), Err(Error::NoTree(_))));
        assert!(store.list(k).unwrap().is_empty());
    }
    store.destroy(&a).expect("destroying twice is fine");
    assert!(store.reconcile().is_ok());
    let _ = fs::remove_dir_all(image_dir);
}

/// Fifty containers of one image snapshot at once; each snapshot holds what its own
/// container wrote.
pub fn fifty_concurrent_snapshots(s: std::sync::Arc<dyn Store>) {
    let image = temp_dir("img");
    populate_image(&image);
    let img = ImageSource::from_layers(vec![image.clone()]).unwrap();
    let threads: Vec<_> = (0..50)
        .map(|i| {
            let (s, img) = (s.clone(), img.clone());
            std::thread::spawn(move || {
                let k = ContainerKey::new("conformance", &unique(&format!("many{i}"))).unwrap();
                let live = s.prepare(&k, &img).unwrap();
                fs::write(live.join("who"), format!("{i}")).unwrap();
                s.snapshot(&k, "turn").unwrap();
                fs::write(live.join("who"), "later").unwrap();
                k
            })
        })
        .collect();
    let keys: Vec<ContainerKey> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(s.list(k).unwrap().len(), 1);
        s.rollback(k, "turn").unwrap();
        let who = fs::read_to_string(s.rootfs(k).unwrap().join("who")).unwrap();
        assert_eq!(who, i.to_string());
        s.release(k).unwrap();
        s.destroy(k).unwrap();
    }
    let _ = fs::remove_dir_all(image);
}

/// On a pool that fills up: snapshots work or fail with `PoolFull` (never another
/// error), no snapshot is lost, and a rollback gives the earlier state back exactly.
pub fn full_pool(s: &dyn Store) {
    let image = temp_dir("img");
    populate_image(&image);
    let k = ContainerKey::new("conformance", &unique("full")).unwrap();
    let live = s
        .prepare(&k, &ImageSource::from_layers(vec![image.clone()]).unwrap())
        .unwrap();
    fs::write(live.join("before"), b"safe").unwrap();
    s.snapshot(&k, "before-full").unwrap();
    let want = fingerprint(&live);
    let mut filled = false;
    for i in 0..100 {
        let chunk: Vec<u8> = (0..8 << 20).map(|j| (i + j) as u8).collect();
        if fs::write(live.join(format!("fill-{i}")), &chunk).is_err() {
            filled = true;
            break;
        }
    }
    assert!(filled, "the pool never filled up");
    let mut saw_full = false;
    for n in 0..20 {
        match s.snapshot(&k, &format!("after-{n}")) {
            Ok(_) => {}
            Err(Error::PoolFull { .. }) => saw_full = true,
            Err(e) => panic!("unexpected error on a full pool: {e}"),
        }
        // Writing into the tree of a full pool fails, as it should.
        let _ = fs::write(live.join(format!("more-{n}")), vec![1u8; 1 << 20]);
    }
    let names: Vec<String> = s.list(&k).unwrap().into_iter().map(|i| i.name).collect();
    assert!(names.contains(&"before-full".to_string()), "{names:?}");
    match s.rollback(&k, "before-full") {
        Ok(()) => assert_same("after rollback on a full pool", &fingerprint(&live), &want),
        Err(Error::PoolFull { .. }) => saw_full = true,
        Err(e) => panic!("unexpected rollback error on a full pool: {e}"),
    }
    println!("pool full reported: {saw_full}");
    s.release(&k).unwrap();
    s.destroy(&k).unwrap();
    let _ = fs::remove_dir_all(image);
}
