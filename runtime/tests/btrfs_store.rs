//! The btrfs store against the real btrfs pool the set-up mounts (`hack/pool.sh`).

// Needs root and the real store: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

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
fn btrfs_store_tells_what_the_tree_of_a_writable_layer_wrote() {
    support::written::written_is_found_by_owner(|| Box::new(store()));
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
        .prepare(&k, &ImageSource::from_layers(vec![image.clone()]).unwrap())
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
        .prepare(&k, &ImageSource::from_layers(vec![image.clone()]).unwrap())
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

#[test]
fn fifty_containers_snapshot_concurrently_and_every_snapshot_is_right() {
    support::conformance::fifty_concurrent_snapshots(std::sync::Arc::new(store()));
}

#[test]
fn a_full_pool_fails_with_pool_full_and_keeps_earlier_snapshots() {
    let pool = SmallPool::new("300M");
    support::conformance::full_pool(&BtrfsStore::open(&pool.dir).unwrap());
}

#[test]
fn rollback_of_a_large_tree_restores_renames_moves_and_metadata() {
    let s = store();
    let image = temp_dir("img");
    for d in 0..20 {
        let dir = image.join(format!("d{d}"));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        for f in 0..100 {
            std::fs::write(dir.join(format!("f{f}")), format!("{d}/{f}")).unwrap();
        }
        std::fs::write(dir.join("sub/deep"), b"deep").unwrap();
    }
    let k = ContainerKey::new("conformance", &unique("large")).unwrap();
    let live = s
        .prepare(&k, &ImageSource::from_layers(vec![image.clone()]).unwrap())
        .unwrap();
    let want = fingerprint(&live);
    s.snapshot(&k, "base").unwrap();
    // Changes of every kind, including renames of whole directories, which btrfs send
    // describes through temporary names.
    std::fs::rename(live.join("d1"), live.join("d1-renamed")).unwrap();
    std::fs::rename(live.join("d2/sub"), live.join("d3/moved-sub")).unwrap();
    std::fs::rename(live.join("d4"), live.join("d5/d4-inside")).unwrap();
    std::fs::remove_dir_all(live.join("d6")).unwrap();
    std::fs::write(live.join("d7/f7"), b"rewritten").unwrap();
    std::fs::write(live.join("d8/new"), b"new").unwrap();
    std::fs::create_dir_all(live.join("brand/new/dirs")).unwrap();
    std::os::unix::fs::PermissionsExt::set_mode(
        &mut std::fs::metadata(live.join("d9/f9")).unwrap().permissions(),
        0o600,
    );
    std::fs::set_permissions(
        live.join("d9/f9"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    xattr::set(live.join("d10/f10"), "user.turn", b"x").unwrap();
    std::fs::rename(live.join("d11/f1"), live.join("d11/f2")).unwrap();
    s.rollback(&k, "base").unwrap();
    assert_same("large tree after rollback", &fingerprint(&live), &want);
    s.destroy(&k).unwrap();
    let _ = std::fs::remove_dir_all(image);
}

#[test]
fn rollback_never_follows_a_symlink_target_out_of_the_tree() {
    let s = store();
    let image = temp_dir("img");
    std::fs::write(image.join("kept"), b"kept").unwrap();
    let outside = temp_dir("outside");
    let victim = outside.join("victim");
    std::fs::write(&victim, b"host data").unwrap();
    let k = ContainerKey::new("conformance", &unique("symlink")).unwrap();
    let live = s
        .prepare(&k, &ImageSource::from_layers(vec![image.clone()]).unwrap())
        .unwrap();
    let want = fingerprint(&live);
    s.snapshot(&k, "base").unwrap();
    // Targets a container may write: the victim's absolute path, and relative
    // ones that climb out of the store's directories by 1 to 16 levels.
    let rel = victim.strip_prefix("/").unwrap().display().to_string();
    std::os::unix::fs::symlink(&victim, live.join("abs")).unwrap();
    for up in 1..=16 {
        let target = format!("{}{rel}", "../".repeat(up));
        std::os::unix::fs::symlink(target, live.join(format!("up{up}"))).unwrap();
    }
    s.rollback(&k, "base").unwrap();
    assert_same("tree after rollback", &fingerprint(&live), &want);
    assert_eq!(std::fs::read(&victim).unwrap(), b"host data");
    s.destroy(&k).unwrap();
    let _ = std::fs::remove_dir_all(image);
    let _ = std::fs::remove_dir_all(outside);
}

/// The checkpoint's file delta from the names a send stream gives equals the
/// delta from a walk of both whole trees.
#[test]
fn the_delta_from_the_changed_names_equals_the_delta_of_a_whole_walk() {
    use crab_runtime::checkpoint::fs_diff;
    use std::os::unix::fs::{symlink, PermissionsExt};
    let s = store();
    let image = temp_dir("img");
    for d in ["keep", "moved", "gone/deep", "becomes-file", "chmod"] {
        std::fs::create_dir_all(image.join(d)).unwrap();
    }
    for f in [
        "keep/a",
        "keep/b",
        "moved/x",
        "gone/deep/y",
        "becomes-dir",
        "chmod/f",
    ] {
        std::fs::write(image.join(f), f).unwrap();
    }
    symlink("keep/a", image.join("link")).unwrap();
    let source = ImageSource::from_layers(vec![image.clone()]).unwrap();
    let k = ContainerKey::new("conformance", &unique("delta")).unwrap();
    let live = s.prepare(&k, &source).unwrap();
    std::fs::write(live.join("keep/a"), b"rewritten").unwrap();
    std::fs::write(live.join("new-file"), b"new").unwrap();
    std::fs::create_dir_all(live.join("new-dir/sub")).unwrap();
    std::fs::write(live.join("new-dir/sub/z"), b"z").unwrap();
    std::fs::rename(live.join("moved"), live.join("keep/moved-in")).unwrap();
    std::fs::remove_dir_all(live.join("gone")).unwrap();
    std::fs::remove_dir_all(live.join("becomes-file")).unwrap();
    std::fs::write(live.join("becomes-file"), b"file now").unwrap();
    std::fs::remove_file(live.join("becomes-dir")).unwrap();
    std::fs::create_dir(live.join("becomes-dir")).unwrap();
    std::fs::write(live.join("becomes-dir/inside"), b"i").unwrap();
    std::fs::set_permissions(live.join("chmod/f"), PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::remove_file(live.join("link")).unwrap();
    symlink("keep/b", live.join("link")).unwrap();
    symlink("/etc", live.join("escape")).unwrap();

    let paths = s
        .changed_since_image(&k, &source)
        .unwrap()
        .expect("btrfs names them");
    let sorted = |mut d: fs_diff::Diff| {
        d.changed.sort();
        d.deleted.sort();
        d
    };
    let whole = sorted(fs_diff::diff(Some(&image), &live).unwrap());
    let named = sorted(
        fs_diff::diff_paths(&image, &live, &paths)
            .unwrap()
            .expect("no hard links"),
    );
    assert_eq!(named, whole, "send names: {paths:?}");
    assert!(
        whole.changed.contains(&"keep/moved-in/x".into()),
        "{whole:?}"
    );

    // A changed file with another link: the names alone are not enough.
    std::fs::hard_link(live.join("keep/b"), live.join("keep/b2")).unwrap();
    std::fs::write(live.join("keep/b"), b"both names").unwrap();
    let paths = s.changed_since_image(&k, &source).unwrap().unwrap();
    assert!(fs_diff::diff_paths(&image, &live, &paths)
        .unwrap()
        .is_none());
    s.destroy(&k).unwrap();
    let _ = std::fs::remove_dir_all(image);
}

/// What a refused import must leave: no snapshot of the container, nothing in its
/// snapshots directory, nothing in the host directory the attack aimed at, nothing
/// escaped into the pool's directories.
fn assert_nothing_received(s: &BtrfsStore, k: &ContainerKey, outside: &Path) {
    assert!(s.list(k).unwrap().is_empty());
    let dir = Path::new(POOL).join("snapshots/conformance").join(k.id());
    let left: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in {}: {left:?}", dir.display());
    let host: Vec<_> = std::fs::read_dir(outside).unwrap().flatten().collect();
    assert!(host.is_empty(), "written on the host: {host:?}");
    for area in ["", "snapshots", "snapshots/conformance"] {
        let escaped = Path::new(POOL).join(area).join("escaped");
        assert!(!escaped.exists(), "{} exists", escaped.display());
    }
}

#[test]
fn a_crafted_btrfs_stream_cannot_reach_outside_the_containers_snapshots() {
    use crab_runtime::Error;
    use support::crafted::Crafted;
    let s = store();
    let outside = temp_dir("outside");
    let key = |tag: &str| ContainerKey::new("conformance", &unique(tag)).unwrap();

    // A harmless crafted stream is received: the crafted streams are ones `btrfs
    // receive` takes, so what stops the attacks below is the store's check.
    let ok = key("crafted-ok");
    let stream = Crafted::subvolume(b"ok").file(b"f", b"data").end();
    assert_eq!(s.import(&ok, &mut stream.as_slice()).unwrap().name, "ok");
    s.rollback(&ok, "ok").unwrap();
    assert_eq!(
        std::fs::read(s.rootfs(&ok).unwrap().join("f")).unwrap(),
        b"data"
    );
    s.destroy(&ok).unwrap();

    let target = |name: &str| outside.join(name).display().to_string().into_bytes();
    let attacks: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "a file climbing out of the subvolume",
            Crafted::subvolume(b"s")
                .file(b"../../../escaped", b"x")
                .end(),
            "not a path inside its subvolume",
        ),
        (
            "a file at an absolute host path",
            Crafted::subvolume(b"s").file(&target("pwned"), b"x").end(),
            "not a path inside its subvolume",
        ),
        (
            "a file through a symlink to a host directory the stream made",
            Crafted::subvolume(b"s")
                .symlink(b"x", outside.display().to_string().as_bytes())
                .file(b"x/pwned", b"x")
                .end(),
            "through the symlink \"x\"",
        ),
        (
            "a subvolume named out of the snapshots directory",
            Crafted::subvolume(b"../../escaped").end(),
            "invalid snapshot name",
        ),
        (
            "a second subvolume after the first",
            [
                Crafted::subvolume(b"a").end(),
                Crafted::subvolume(b"escaped").end(),
            ]
            .concat(),
            "data follows the stream's end",
        ),
    ];
    for (what, stream, says) in attacks {
        let k = key("crafted");
        let e = s.import(&k, &mut stream.as_slice()).unwrap_err();
        assert!(matches!(e, Error::ImportRefused(_)), "{what}: {e}");
        assert!(e.to_string().contains(says), "{what}: {e}");
        assert_nothing_received(&s, &k, &outside);
        s.destroy(&k).unwrap();
    }

    // A real incremental stream whose parent is another container's snapshot:
    // `btrfs receive` alone finds that parent anywhere in the pool, and the new
    // snapshot would hold the other container's files.
    let image = temp_dir("img");
    let victim = key("victim");
    let live = s
        .prepare(
            &victim,
            &ImageSource::from_layers(vec![image.clone()]).unwrap(),
        )
        .unwrap();
    std::fs::write(live.join("secret"), b"the victim's").unwrap();
    s.snapshot(&victim, "s1").unwrap();
    std::fs::write(live.join("more"), b"more").unwrap();
    s.snapshot(&victim, "s2").unwrap();
    let mut incremental = Vec::new();
    s.export(&victim, "s2", Some("s1"), &mut incremental)
        .unwrap();
    let thief = key("thief");
    let e = s.import(&thief, &mut incremental.as_slice()).unwrap_err();
    assert!(
        e.to_string()
            .contains("not one of this container's snapshots"),
        "{e}"
    );
    assert_nothing_received(&s, &thief, &outside);
    s.destroy(&thief).unwrap();
    s.destroy(&victim).unwrap();
    let _ = std::fs::remove_dir_all(image);
    let _ = std::fs::remove_dir_all(outside);
}

/// `btrfs subvolume create`, the same ioctl a container can make.
fn subvolume_create(p: &Path) {
    let out = std::process::Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(p)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn a_nested_subvolume_fails_the_snapshot_naming_it_and_rollback_and_destroy_delete_it() {
    let s = store();
    let image = temp_dir("img");
    std::fs::write(image.join("kept"), b"kept").unwrap();
    let source = ImageSource::from_layers(vec![image.clone()]).unwrap();
    let k = ContainerKey::new("conformance", &unique("nested")).unwrap();
    let live = s.prepare(&k, &source).unwrap();
    s.snapshot(&k, "before").unwrap();
    std::fs::create_dir(live.join("work")).unwrap();
    subvolume_create(&live.join("work/nested"));
    std::fs::write(live.join("work/nested/data"), b"in the nested one").unwrap();
    subvolume_create(&live.join("work/nested/deeper"));
    std::fs::write(live.join("work/nested/deeper/file"), b"deeper").unwrap();

    let e = s.snapshot(&k, "after").unwrap_err().to_string();
    assert!(e.contains("subvolume at /work/nested"), "{e}");
    let names: Vec<String> = s.list(&k).unwrap().into_iter().map(|i| i.name).collect();
    assert_eq!(names, ["before"]);
    // The checkpoint's file delta (the names a send stream gives) refuses too.
    let e = s.changed_since_image(&k, &source).unwrap_err().to_string();
    assert!(e.contains("subvolume at /work/nested"), "{e}");

    // A rollback makes the tree the snapshot's: the nested subvolumes go.
    s.rollback(&k, "before").unwrap();
    assert!(!live.join("work").exists());
    assert_eq!(std::fs::read(live.join("kept")).unwrap(), b"kept");
    s.snapshot(&k, "after").unwrap();

    // Destroy deletes them, however deep.
    subvolume_create(&live.join("nested"));
    subvolume_create(&live.join("nested/deeper"));
    std::fs::write(live.join("nested/deeper/file"), b"deeper").unwrap();
    s.destroy(&k).unwrap();
    assert!(!live.exists());
    let list = std::process::Command::new("btrfs")
        .args(["subvolume", "list", POOL])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(!list.contains(k.id()), "left in the pool:\n{list}");
    let _ = std::fs::remove_dir_all(image);
}

/// A fork's taken tree (a replica's) is owned by the fork's writable layer
/// through a link recorded before the move: read back, reused by that layer,
/// found by it, and collected once it is gone. A second take for the same
/// container is refused before anything is recorded: the tree in place keeps
/// its owner, and the second tree stays where it was.
#[test]
fn a_taken_tree_records_its_owner_first_and_never_replaces_another() {
    let s = store();
    let image_dir = temp_dir("take-image");
    populate_image(&image_dir);
    let layers = temp_dir("take-snapshots");
    let (first, second) = (layers.join("7/fs"), layers.join("8/fs"));
    std::fs::create_dir_all(&first).unwrap();
    std::fs::create_dir_all(&second).unwrap();
    let image = ImageSource::from_layers(vec![image_dir]).unwrap();
    let src = ContainerKey::new("take", &unique("src")).unwrap();
    let fork = ContainerKey::new("take", &unique("fork")).unwrap();
    s.prepare(&src, &image).unwrap();
    s.snapshot(&src, "base").unwrap();

    let tree = s.standby_tree(&src, "base").unwrap();
    let live = s.take_tree(&fork, &tree, Some(&first)).unwrap();
    assert!(!tree.exists(), "the replica's tree moved");
    assert_eq!(s.rootfs(&fork).unwrap(), live);
    assert_eq!(s.owner(&fork).unwrap().as_deref(), Some(first.as_path()));
    let mut by_first = image.clone();
    by_first.owner = Some(first.clone());
    assert_eq!(
        s.existing(&fork, &by_first).unwrap(),
        Some(crab_runtime::storage::work::Existing::Reuse)
    );
    assert_eq!(s.owned_by(&first).unwrap(), Some(fork.clone()));

    let other = s.standby_tree(&src, "base").unwrap();
    let e = s.take_tree(&fork, &other, Some(&second)).unwrap_err();
    assert!(e.to_string().contains("exists"), "{e}");
    assert_eq!(s.owner(&fork).unwrap().as_deref(), Some(first.as_path()));
    assert!(other.exists(), "the refused tree stays for its discard");
    s.discard_tree(&other).unwrap();

    // The owner gone: the collect of its snapshotter removes the tree.
    std::fs::remove_dir_all(&first).unwrap();
    assert_eq!(s.collect(&layers).unwrap(), vec![fork.clone()]);
    assert!(s.rootfs(&fork).is_err());
    assert_eq!(s.owner(&fork).unwrap(), None);
    s.destroy(&src).unwrap();
}

/// Collects `scope`'s stale image copies until `key`'s goes (a create of another
/// test may hold the copies for a moment: the collect then leaves them).
fn collect_image(s: &BtrfsStore, scope: &Path, key: &str) -> bool {
    for _ in 0..100 {
        if s.collect_images(scope).unwrap().iter().any(|k| k == key) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

/// An image's copy goes once the collecting snapshotter removed one of its
/// layers or put another at the same path, never while they are there nor for
/// another snapshotter; a tree made of it outlives it, and a create of the new
/// layer makes a new copy. While a create holds the copies' lock, none goes.
#[test]
fn an_image_copy_goes_once_its_layers_are_gone_and_its_trees_stay() {
    let s = store();
    let snapshots = temp_dir("copies").join("snapshots");
    let (l1, l2) = (snapshots.join("1/fs"), snapshots.join("2/fs"));
    populate_image(&l1);
    std::fs::create_dir_all(&l2).unwrap();
    std::fs::write(l2.join("second"), "2").unwrap();
    let a = ImageSource::from_layers(vec![l1.clone()]).unwrap();
    let b = ImageSource::from_layers(vec![l2.clone(), l1.clone()]).unwrap();
    let (ka, kb) = (
        ContainerKey::new("copies", &unique("a")).unwrap(),
        ContainerKey::new("copies", &unique("b")).unwrap(),
    );
    s.prepare(&ka, &a).unwrap();
    let live_b = s.prepare(&kb, &b).unwrap();
    let copy = |k: &str| Path::new(POOL).join("images").join(k);
    assert!(copy(&a.key).join("etc").is_dir() && copy(&b.key).join("second").is_file());

    let gone = s.collect_images(&snapshots).unwrap();
    assert!(!gone.contains(&a.key) && !gone.contains(&b.key), "{gone:?}");
    std::fs::remove_dir_all(&l2).unwrap();
    let elsewhere = s.collect_images(&temp_dir("elsewhere")).unwrap();
    assert!(!elsewhere.contains(&b.key), "{elsewhere:?}");
    assert!(copy(&b.key).is_dir());
    assert!(collect_image(&s, &snapshots, &b.key), "b's copy stays");
    assert!(!copy(&b.key).exists());
    assert!(copy(&a.key).is_dir(), "a's layer is there: its copy stays");

    // b's tree is its own: its files, a snapshot and a rollback.
    assert_eq!(std::fs::read_to_string(live_b.join("second")).unwrap(), "2");
    s.snapshot(&kb, "s").unwrap();
    std::fs::write(live_b.join("later"), "x").unwrap();
    s.rollback(&kb, "s").unwrap();
    assert!(!live_b.join("later").exists());
    assert!(live_b.join("second").is_file());

    // l1 made again at its path (a containerd set up afresh): a new key, a new
    // copy, and the old one goes.
    std::fs::remove_dir_all(&l1).unwrap();
    populate_image(&l1);
    let a2 = ImageSource::from_layers(vec![l1.clone()]).unwrap();
    assert_ne!(a2.key, a.key);
    let ka2 = ContainerKey::new("copies", &unique("a2")).unwrap();
    s.prepare(&ka2, &a2).unwrap();
    assert!(collect_image(&s, &snapshots, &a.key), "a's old copy stays");
    assert!(copy(&a2.key).is_dir());

    for k in [&ka, &kb, &ka2] {
        s.destroy(k).unwrap();
    }
    std::fs::remove_dir_all(&l1).unwrap();

    // While a create holds the copies (`images/.lock`, shared), a collect leaves
    // them: the copy it may be snapshotting stays.
    let lock = std::fs::File::open(Path::new(POOL).join("images/.lock")).unwrap();
    // SAFETY: flock on a descriptor this test owns; no memory is passed.
    let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_SH) };
    assert_eq!(rc, 0);
    assert!(!s.collect_images(&snapshots).unwrap().contains(&a2.key));
    assert!(copy(&a2.key).is_dir(), "a copy went while a create held it");
    drop(lock);
    assert!(collect_image(&s, &snapshots, &a2.key));
    assert!(!copy(&a2.key).exists());
}
