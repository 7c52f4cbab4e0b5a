//! The snapshotter's calls as containerd makes them when it unpacks an image and
//! runs containers, and its usage of a layer whose data a Crab tree holds.

mod support;

use std::collections::BTreeMap;

use crab_snapshotter::meta::Kind;
use crab_snapshotter::Error;
use support::{open, option};

fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn test_unpack_then_container_layer_over_the_image() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open(dir.path());
    // Layer 1: a bind mount of an empty directory, written, committed.
    let m = s
        .create(Kind::Active, "ns/1/extract-1", "", BTreeMap::new())
        .unwrap();
    assert_eq!(m[0].r#type, "bind");
    std::fs::write(std::path::Path::new(&m[0].source).join("a"), b"one").unwrap();
    s.commit("ns/2/sha256:l1", "ns/1/extract-1", labels(&[("x", "1")]))
        .unwrap();
    // Layer 2 over it, committed.
    let m = s
        .create(
            Kind::Active,
            "ns/3/extract-2",
            "ns/2/sha256:l1",
            BTreeMap::new(),
        )
        .unwrap();
    assert_eq!(m[0].r#type, "overlay");
    let upper = option(&m[0].options, "upperdir").unwrap().to_string();
    std::fs::write(std::path::Path::new(&upper).join("b"), vec![1u8; 8192]).unwrap();
    s.commit("ns/4/sha256:l2", "ns/3/extract-2", BTreeMap::new())
        .unwrap();
    // The container's writable layer: upper over both, topmost first.
    let m = s
        .create(Kind::Active, "ns/5/c1", "ns/4/sha256:l2", BTreeMap::new())
        .unwrap();
    let lower = option(&m[0].options, "lowerdir").unwrap();
    let lowers: Vec<_> = lower.split(':').collect();
    assert_eq!(lowers.len(), 2);
    assert!(lowers[0].ends_with("/fs") && lowers[0] != lowers[1]);
    assert!(std::path::Path::new(lowers[0]).join("b").exists());
    assert!(std::path::Path::new(lowers[1]).join("a").exists());
    assert_eq!(s.mounts("ns/5/c1").unwrap(), m);
    // A view of one layer is a read-only bind of it.
    let v = s
        .create(Kind::View, "ns/6/v", "ns/2/sha256:l1", BTreeMap::new())
        .unwrap();
    assert_eq!(v[0].r#type, "bind");
    assert!(v[0].options.contains(&"ro".to_string()));
    // Committed layers report what they held; the stat is containerd's.
    assert!(s.usage("ns/4/sha256:l2").unwrap().bytes >= 8192);
    let st = s.stat("ns/2/sha256:l1").unwrap();
    assert_eq!(
        (st.kind, st.labels.get("x").map(String::as_str)),
        (Kind::Committed, Some("1"))
    );
    assert_eq!(
        s.stat("ns/5/c1").unwrap().parent.as_deref(),
        Some("ns/4/sha256:l2")
    );
    assert_eq!(s.list().len(), 4);
}

#[test]
fn test_a_parent_is_not_removed_and_children_go_first() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open(dir.path());
    s.create(Kind::Active, "a", "", BTreeMap::new()).unwrap();
    s.commit("l", "a", BTreeMap::new()).unwrap();
    let m = s.create(Kind::Active, "c", "l", BTreeMap::new()).unwrap();
    let upper = option(&m[0].options, "upperdir").unwrap().to_string();
    assert!(matches!(s.remove("l"), Err(Error::FailedPrecondition(_))));
    s.remove("c").unwrap();
    assert!(!std::path::Path::new(&upper).exists());
    s.remove("l").unwrap();
    assert!(matches!(s.remove("l"), Err(Error::NotFound(_))));
    assert!(s.list().is_empty());
}

#[test]
fn test_records_survive_a_restart_and_cleanup_removes_unrecorded_dirs() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (s, _) = open(dir.path());
        s.create(Kind::Active, "a", "", labels(&[("k", "v")]))
            .unwrap();
    }
    // What a crash between a directory and its record leaves.
    std::fs::create_dir_all(dir.path().join("snapshots/77/fs")).unwrap();
    let (s, _) = open(dir.path());
    assert_eq!(s.stat("a").unwrap().labels, labels(&[("k", "v")]));
    assert_eq!(s.cleanup().unwrap(), vec!["77".to_string()]);
    assert!(s.mounts("a").is_ok());
    // The next snapshot does not reuse a recorded number.
    s.create(Kind::Active, "b", "", BTreeMap::new()).unwrap();
    assert_ne!(s.stat("a").unwrap().id, s.stat("b").unwrap().id);
}

#[test]
fn test_update_changes_labels_only() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open(dir.path());
    s.create(Kind::Active, "a", "", labels(&[("k", "v"), ("gone", "x")]))
        .unwrap();
    let paths = vec!["labels.new".to_string(), "labels.gone".to_string()];
    let r = s.update("a", labels(&[("new", "n")]), &paths).unwrap();
    assert_eq!(r.labels, labels(&[("k", "v"), ("new", "n")]));
    let r = s.update("a", labels(&[("only", "1")]), &[]).unwrap();
    assert_eq!(r.labels, labels(&[("only", "1")]));
    let bad = s.update("a", BTreeMap::new(), &["parent".to_string()]);
    assert!(matches!(bad, Err(Error::InvalidArgument(_))));
}

#[test]
fn test_usage_of_a_layer_crab_made_a_tree_for_is_what_the_tree_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let (s, trees) = open(dir.path());
    let m = s.create(Kind::Active, "runc", "", BTreeMap::new()).unwrap();
    std::fs::write(
        std::path::Path::new(&m[0].source).join("f"),
        vec![1u8; 1 << 20],
    )
    .unwrap();
    let runc = s.usage("runc").unwrap();
    assert!(runc.bytes >= 1 << 20 && runc.inodes == 2, "{runc:?}");
    let m = s.create(Kind::Active, "crab", "", BTreeMap::new()).unwrap();
    let empty = s.usage("crab").unwrap().bytes;
    trees
        .0
        .lock()
        .unwrap()
        .insert(m[0].source.clone().into(), 20 << 20);
    assert_eq!(s.usage("crab").unwrap().bytes, empty + (20 << 20));
    trees
        .0
        .lock()
        .unwrap()
        .insert(m[0].source.clone().into(), 0);
    assert_eq!(s.usage("crab").unwrap().bytes, empty);
}
