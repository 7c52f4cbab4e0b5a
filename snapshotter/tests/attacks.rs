//! What a caller of the snapshotter's socket could try: keys that look like paths,
//! a parent that is not a layer, and (root only) a connection from another user.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use crab_snapshotter::meta::Kind;
use crab_snapshotter::Error;
use support::{open, option};

#[test]
fn test_keys_never_name_paths() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let (s, _) = open(&root);
    let outside = dir.path().join("outside");
    for key in ["../../outside", "/etc", "..", "a/../../../outside", "x/./y"] {
        let m = s.create(Kind::Active, key, "", BTreeMap::new()).unwrap();
        let src = Path::new(&m[0].source).canonicalize().unwrap();
        assert!(
            src.starts_with(root.canonicalize().unwrap().join("snapshots")),
            "{key}: {src:?}"
        );
        s.commit(&format!("{key}-c"), key, BTreeMap::new()).unwrap();
        let m = s
            .create(Kind::Active, key, &format!("{key}-c"), BTreeMap::new())
            .unwrap();
        let upper = option(&m[0].options, "upperdir").unwrap();
        assert!(Path::new(upper).starts_with(root.canonicalize().unwrap()));
        s.remove(key).unwrap();
        s.remove(&format!("{key}-c")).unwrap();
    }
    assert!(!outside.exists());
    assert!(root.join("snapshots").read_dir().unwrap().next().is_none());
}

#[test]
fn test_malformed_keys_and_parents_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open(dir.path());
    let long = "k".repeat(5000);
    for key in ["", "a\0b", long.as_str()] {
        let r = s.create(Kind::Active, key, "", BTreeMap::new());
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{key:?}");
    }
    // A parent must be a committed layer: not missing, not someone's active layer.
    let r = s.create(Kind::Active, "a", "missing", BTreeMap::new());
    assert!(matches!(r, Err(Error::NotFound(_))));
    s.create(Kind::Active, "active", "", BTreeMap::new())
        .unwrap();
    let r = s.create(Kind::Active, "b", "active", BTreeMap::new());
    assert!(matches!(r, Err(Error::InvalidArgument(_))));
    let r = s.commit("active", "active", BTreeMap::new());
    assert!(matches!(r, Err(Error::AlreadyExists(_))));
    let r = s.create(Kind::Active, "active", "", BTreeMap::new());
    assert!(matches!(r, Err(Error::AlreadyExists(_))));
}

#[test]
fn test_only_root_is_served() {
    assert!(crab_snapshotter::serve::allowed(0));
    assert!(!crab_snapshotter::serve::allowed(65534));
    assert!(!crab_snapshotter::serve::allowed(1000));
}

#[test]
fn test_socket_and_its_directory_are_root_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("d/snapshotter.sock");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _l = rt
        .block_on(async { crab_snapshotter::serve::bind(&sock) })
        .unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&sock), 0o600);
    assert_eq!(mode(sock.parent().unwrap()), 0o700);
    let (root, _) = open(&dir.path().join("root"));
    assert_eq!(mode(root.root()), 0o700);
    assert_eq!(mode(&root.root().join("snapshots")), 0o700);
}
