use super::*;

fn spec(uids: &[(u32, u32, u32)], gids: &[(u32, u32, u32)], userns: bool) -> Spec {
    let map = |v: &[(u32, u32, u32)]| {
        v.iter()
            .map(|(c, h, n)| serde_json::json!({"containerID": c, "hostID": h, "size": n}))
            .collect::<Vec<_>>()
    };
    let mut namespaces = vec![
        serde_json::json!({"type": "pid"}),
        serde_json::json!({"type": "mount"}),
    ];
    if userns {
        namespaces.push(serde_json::json!({"type": "user"}));
    }
    serde_json::from_value(serde_json::json!({
        "ociVersion": "1.0.2",
        "linux": {"namespaces": namespaces, "uidMappings": map(uids), "gidMappings": map(gids)}
    }))
    .unwrap()
}

const RANGE: (u32, u32, u32) = (0, 100_000, 65_536);

#[test]
fn test_a_plain_range_is_taken() {
    let maps = check(&spec(&[RANGE], &[RANGE], true)).unwrap().unwrap();
    assert_eq!(maps.root_uid(), Some(100_000));
    assert_eq!(maps.root_gid(), Some(100_000));
    assert_eq!(check(&spec(&[], &[], false)).unwrap(), None);
}

#[test]
fn test_host_root_inside_is_refused() {
    for uids in [[(0, 0, 65_536)], [(0, 0, 1)]] {
        let e = check(&spec(&uids, &[RANGE], true)).unwrap_err();
        assert!(matches!(e, Refused::HostRoot { kind: "uid", .. }), "{e}");
    }
    // Host gid 0 as the container's group 1000.
    let e = check(&spec(&[RANGE], &[RANGE, (1000, 0, 1)], true)).unwrap_err();
    assert!(
        matches!(e, Refused::HostRoot { kind: "gid", .. }) || matches!(e, Refused::Overlap { .. }),
        "{e}"
    );
    let e = check(&spec(&[RANGE], &[(70_000, 0, 1), RANGE], true)).unwrap_err();
    assert!(matches!(e, Refused::HostRoot { kind: "gid", .. }), "{e}");
}

#[test]
fn test_overlapping_extents_are_refused() {
    let e = check(&spec(&[RANGE, (65_535, 300_000, 10)], &[RANGE], true)).unwrap_err();
    assert!(matches!(e, Refused::Overlap { .. }), "inside: {e}");
    let e = check(&spec(&[RANGE, (70_000, 165_535, 10)], &[RANGE], true)).unwrap_err();
    assert!(matches!(e, Refused::Overlap { .. }), "host: {e}");
    // Adjacent is fine.
    check(&spec(&[RANGE, (65_536, 165_536, 10)], &[RANGE], true)).unwrap();
}

#[test]
fn test_absurd_sizes_are_refused() {
    for bad in [(0, 100_000, 0), (0, 100_000, u32::MAX), (10, 1, u32::MAX)] {
        let e = check(&spec(&[bad], &[RANGE], true)).unwrap_err();
        assert!(matches!(e, Refused::BadExtent { .. }), "{bad:?}: {e}");
    }
    let many: Vec<_> = (0..=MAX_EXTENTS as u32)
        .map(|i| (i, 100_000 + i, 1))
        .collect();
    let e = check(&spec(&many, &[RANGE], true)).unwrap_err();
    assert!(matches!(e, Refused::TooMany { .. }), "{e}");
}

#[test]
fn test_maps_without_a_namespace_or_half_maps_are_refused() {
    let e = check(&spec(&[RANGE], &[RANGE], false)).unwrap_err();
    assert!(matches!(e, Refused::Inconsistent(_)), "{e}");
    let e = check(&spec(&[RANGE], &[], true)).unwrap_err();
    assert!(matches!(e, Refused::Inconsistent(_)), "{e}");
}

#[test]
fn test_a_tree_of_host_root_is_not_one_for_the_mappings() {
    let maps = check(&spec(&[RANGE], &[RANGE], true)).unwrap().unwrap();
    assert_eq!(tree_owner_mismatch(&maps, (100_000, 100_000)), None);
    assert!(tree_owner_mismatch(&maps, (0, 0)).is_some());
    assert!(tree_owner_mismatch(&maps, (200_000, 200_000)).is_some());
}

#[test]
fn test_joining_the_hosts_own_user_namespace_is_refused_as_host_root() {
    let mut s = spec(&[], &[], false);
    let mut linux = s.linux().clone().unwrap();
    let mut namespaces = linux.namespaces().clone().unwrap();
    namespaces.push(
        serde_json::from_value(serde_json::json!({
            "type": "user",
            "path": format!("/proc/{}/ns/user", std::process::id()),
        }))
        .unwrap(),
    );
    linux.set_namespaces(Some(namespaces));
    s.set_linux(Some(linux));
    assert!(in_user_namespace(&s));
    let e = check(&s).unwrap_err();
    assert!(matches!(e, Refused::HostRoot { kind: "uid", .. }), "{e}");
}
