//! Tests of [`super::rebuild`]: one per kind of thing beyond the allow-list.

use super::*;
use serde_json::json;

/// The spec `ctr run` (containerd 1.7, no flags) gives a busybox container.
fn ctr_spec() -> Value {
    let caps = DEFAULT_CAPS;
    json!({
        "ociVersion": "1.1.0",
        "process": {
            "user": {"uid": 0, "gid": 0},
            "args": ["sh", "-c", "sleep 1000"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": true
        },
        "root": {"path": "rootfs"},
        "hostname": "sandbox",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}
        ],
        "linux": {
            "resources": {
                "devices": [
                    {"allow": false, "access": "rwm"},
                    {"allow": true, "type": "c", "access": "m"},
                    {"allow": true, "type": "b", "access": "m"},
                    {"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"},
                    {"allow": true, "type": "c", "major": 136, "access": "rwm"},
                    {"allow": true, "type": "c", "major": 10, "minor": 200, "access": "rwm"}
                ],
                "memory": {"limit": 67108864},
                "pids": {"limit": 100}
            },
            "cgroupsPath": "/crab/old-id",
            "namespaces": [
                {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}
            ],
            "maskedPaths": [
                "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
                "/sys/devices/virtual/powercap", "/proc/scsi"
            ],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
        },
        "annotations": {"io.crab.storage.backend": "btrfs", "org.example/owner": "team"}
    })
}

const TARGET: Target<'static> = Target {
    namespace: "ns2",
    id: "new-id",
};

fn none() -> BTreeSet<Grant> {
    BTreeSet::new()
}

/// The refusal of `spec`, as text; checks that granting the kinds it names is enough.
fn refused(spec: &Value) -> String {
    let e = rebuild(spec, &none(), TARGET).unwrap_err();
    let kinds: BTreeSet<Grant> = e.0.iter().map(|(g, _)| *g).collect();
    rebuild(spec, &kinds, TARGET).expect("granting the named kinds imports it");
    e.to_string()
}

#[test]
fn test_a_default_ctr_spec_is_kept_with_its_own_cgroup() {
    let spec = ctr_spec();
    let out = rebuild(&spec, &none(), TARGET).unwrap();
    let mut expected = spec.clone();
    expected["linux"]["cgroupsPath"] = "/ns2/new-id".into();
    assert_eq!(out, expected);
    let mut systemd = spec;
    systemd["linux"]["cgroupsPath"] = "system.slice:crab:old-id".into();
    let out = rebuild(&systemd, &none(), TARGET).unwrap();
    assert_eq!(out["linux"]["cgroupsPath"], "system.slice:crab:new-id");
}

#[test]
fn test_an_idmapped_bind_of_the_host_in_an_archive_is_refused_saying_it_is_idmapped() {
    let mut spec = ctr_spec();
    spec["mounts"].as_array_mut().unwrap().push(json!(
        {"destination": "/host-etc", "type": "bind", "source": "/etc",
         "options": ["rbind", "rw"],
         "uidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
         "gidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}]}
    ));
    let e = refused(&spec);
    assert!(
        e.contains("idmapped bind mount of the host's /etc at /host-etc"),
        "{e}"
    );
    assert!(e.contains("--allow host-mounts"), "{e}");
}

#[test]
fn test_a_bind_mount_of_the_host_is_refused_naming_it() {
    let mut spec = ctr_spec();
    spec["mounts"].as_array_mut().unwrap().push(json!(
        {"destination": "/host", "type": "bind", "source": "/", "options": ["rbind", "ro"]}
    ));
    let e = refused(&spec);
    assert!(
        e.contains("host-mounts: bind mount of the host's / at /host"),
        "{e}"
    );
    assert!(e.contains("--allow host-mounts"), "{e}");
    // Also as type "none" with a bind option, and a disk.
    let mut spec = ctr_spec();
    spec["mounts"].as_array_mut().unwrap().extend([
        json!({"destination": "/etc/x", "type": "none", "source": "/etc", "options": ["bind"]}),
        json!({"destination": "/disk", "type": "ext4", "source": "/dev/sda1"}),
    ]);
    let e = refused(&spec);
    for needle in ["/etc at /etc/x", "ext4 /dev/sda1 at /disk"] {
        assert!(e.contains(needle), "{needle}: {e}");
    }
    // A tmpfs of the container's own is kept.
    let mut spec = ctr_spec();
    spec["mounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"destination": "/scratch", "type": "tmpfs", "source": "tmpfs"}));
    rebuild(&spec, &none(), TARGET).unwrap();
}

#[test]
fn test_the_root_is_always_the_imports_own_snapshot() {
    // The host's `/`, and Docker's overlay on the exporting host.
    for path in ["/", "/var/lib/docker/overlay2/6f1e/merged"] {
        let mut spec = ctr_spec();
        spec["root"] = json!({"path": path, "readonly": true});
        let out = rebuild(&spec, &none(), TARGET).unwrap();
        assert_eq!(out["root"], json!({"path": "rootfs", "readonly": true}));
    }
}

#[test]
fn test_dropped_kinds_are_left_out_and_the_others_still_refused() {
    let mut spec = ctr_spec();
    spec["mounts"].as_array_mut().unwrap().push(json!(
        {"destination": "/etc/hosts", "type": "bind", "source": "/var/lib/docker/containers/c/hosts", "options": ["rbind", "rprivate"]}
    ));
    spec["hooks"] = json!({"prestart": [{"path": "/proc/42/exe", "args": ["libnetwork-setkey"]}]});
    spec["annotations"]["io.crab.proxy.upstream"] = "http://169.254.169.254".into();
    let e = rebuild(&spec, &none(), TARGET).unwrap_err().to_string();
    assert!(
        e.contains("--drop host-mounts,hooks,annotations leaves it out"),
        "{e}"
    );
    let all = BTreeSet::from([Grant::HostMounts, Grant::Hooks, Grant::Annotations]);
    let out = rebuild_dropping(&spec, &none(), &all, TARGET).unwrap();
    let mut expected = ctr_spec();
    expected["linux"]["cgroupsPath"] = "/ns2/new-id".into();
    assert_eq!(out, expected, "only the dropped things are gone");
    // Granting wins over dropping; a kind that cannot be dropped is still refused.
    let out = rebuild_dropping(&spec, &BTreeSet::from([Grant::Hooks]), &all, TARGET).unwrap();
    assert_eq!(out["hooks"], spec["hooks"]);
    spec["linux"]["namespaces"] = json!([{"type": "network", "path": "/proc/1/ns/net"}]);
    let dropped = BTreeSet::from([
        Grant::HostNamespaces,
        Grant::HostMounts,
        Grant::Hooks,
        Grant::Annotations,
    ]);
    let e = rebuild_dropping(&spec, &none(), &dropped, TARGET).unwrap_err();
    assert!(e.0.iter().all(|(g, _)| *g == Grant::HostNamespaces), "{e}");
    assert!(!Grant::HostNamespaces.droppable() && !Grant::Privileged.droppable());
}

#[test]
fn test_added_capabilities_are_refused_naming_them() {
    let mut spec = ctr_spec();
    spec["process"]["capabilities"]["bounding"]
        .as_array_mut()
        .unwrap()
        .push("CAP_SYS_ADMIN".into());
    spec["process"]["capabilities"]["ambient"] = json!(["CAP_NET_ADMIN"]);
    let e = refused(&spec);
    assert!(
        e.contains("capabilities: CAP_NET_ADMIN, CAP_SYS_ADMIN beyond containerd's default set"),
        "{e}"
    );
    // Fewer capabilities are fine.
    let mut spec = ctr_spec();
    spec["process"]["capabilities"] = json!({"bounding": ["CAP_KILL"]});
    rebuild(&spec, &none(), TARGET).unwrap();
}

#[test]
fn test_devices_are_refused_naming_them() {
    let mut spec = ctr_spec();
    spec["linux"]["devices"] = json!([{"path": "/dev/sda", "type": "b", "major": 8, "minor": 0}]);
    spec["linux"]["resources"]["devices"]
        .as_array_mut()
        .unwrap()
        .push(json!({"allow": true, "access": "rwm"}));
    let e = refused(&spec);
    assert!(e.contains("devices: device nodes /dev/sda"), "{e}");
    assert!(e.contains("devices: device access a *:* rwm"), "{e}");
}

#[test]
fn test_host_namespaces_are_refused_naming_them() {
    let mut spec = ctr_spec();
    let ns = spec["linux"]["namespaces"].as_array_mut().unwrap();
    ns.retain(|n| n["type"] != "network");
    ns.push(json!({"type": "pid", "path": "/proc/1/ns/pid"}));
    let e = refused(&spec);
    assert!(e.contains("shares the host's network namespace"), "{e}");
    assert!(
        e.contains("joins the pid namespace at /proc/1/ns/pid"),
        "{e}"
    );
    let mut spec = ctr_spec();
    spec["linux"].as_object_mut().unwrap().remove("namespaces");
    assert!(refused(&spec).contains("no namespaces"));
}

#[test]
fn test_privileged_settings_are_refused_naming_them() {
    let mut spec = ctr_spec();
    spec["linux"]["maskedPaths"] = json!([]);
    spec["linux"]
        .as_object_mut()
        .unwrap()
        .remove("readonlyPaths");
    spec["process"]["apparmorProfile"] = "unconfined".into();
    spec["mounts"][5]["options"] = json!(["nosuid", "noexec", "nodev", "rw"]);
    spec["linux"]["sysctl"] = json!({"net.ipv4.ip_forward": "1", "kernel.panic": "1"});
    spec["linux"]["seccomp"] =
        json!({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/agent.sock"});
    let e = refused(&spec);
    for needle in [
        "/proc/kcore",
        "no longer masked",
        "/proc/sys, /proc/sysrq-trigger no longer read-only",
        "AppArmor unconfined",
        "/sys mounted writable",
        "kernel.panic",
        "seccomp notifications to the host's /run/agent.sock",
    ] {
        assert!(e.contains(needle), "{needle}: {e}");
    }
    assert!(!e.contains("ip_forward"), "{e}");
}

#[test]
fn test_hooks_are_refused_naming_their_programs() {
    let mut spec = ctr_spec();
    spec["hooks"] = json!({"createRuntime": [{"path": "/usr/bin/pwn", "args": ["pwn"]}]});
    let e = refused(&spec);
    assert!(e.contains("hooks: hooks createRuntime /usr/bin/pwn"), "{e}");
}

#[test]
fn test_crab_annotations_that_grant_are_refused() {
    let mut spec = ctr_spec();
    spec["annotations"]["io.crab.proxy.upstream"] = "http://169.254.169.254".into();
    spec["annotations"]["io.crab.proxy.listen"] = "0.0.0.0:8787".into();
    let e = refused(&spec);
    assert!(e.contains("annotation io.crab.proxy.upstream="), "{e}");
    assert!(e.contains("annotation io.crab.proxy.listen="), "{e}");
    let granted = BTreeSet::from([Grant::Annotations]);
    let out = rebuild(&spec, &granted, TARGET).unwrap();
    assert_eq!(out["annotations"]["io.crab.proxy.listen"], "0.0.0.0:8787");
}

#[test]
fn test_unknown_fields_are_refused_and_granting_one_kind_grants_no_other() {
    let mut spec = ctr_spec();
    spec["linux"]["personality"] = json!({"domain": "LINUX32"});
    spec["mounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"destination": "/host", "type": "bind", "source": "/"}));
    let e = rebuild(&spec, &BTreeSet::from([Grant::Other]), TARGET).unwrap_err();
    assert_eq!(e.0.len(), 1, "{e}");
    assert_eq!(e.0[0].0, Grant::HostMounts);
}

#[test]
fn test_grant_names_parse_and_unknown_ones_list_the_kinds() {
    for g in Grant::ALL {
        assert_eq!(g.name().parse::<Grant>().unwrap(), g);
    }
    let e = "everything".parse::<Grant>().unwrap_err();
    assert!(e.contains("host-mounts, capabilities"), "{e}");
}

#[test]
fn test_user_namespace_mappings_are_refused_unless_allowed() {
    // The archive picks host ids: another sandbox's range here, or host root.
    let mut spec = ctr_spec();
    spec["linux"]["namespaces"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "user"}));
    let map = json!([{"containerID": 0, "hostID": 100000, "size": 65536}]);
    spec["linux"]["uidMappings"] = map.clone();
    spec["linux"]["gidMappings"] = map;
    let e = refused(&spec);
    assert!(
        e.contains("user-mappings: uidMappings 0:100000:65536 (host ids chosen by the archive)"),
        "{e}"
    );
    assert!(
        e.contains("user-mappings: gidMappings 0:100000:65536"),
        "{e}"
    );
    // Other kinds do not grant it; it cannot be dropped (the processes would then
    // be host root, and CRIU's images would still carry the namespace).
    let others: BTreeSet<Grant> = Grant::ALL
        .into_iter()
        .filter(|g| *g != Grant::UserMappings)
        .collect();
    rebuild(&spec, &others, TARGET).unwrap_err();
    let drop: BTreeSet<Grant> = [Grant::UserMappings].into();
    rebuild_dropping(&spec, &none(), &drop, TARGET).unwrap_err();
    // Granted, the mappings are kept as they were.
    let granted: BTreeSet<Grant> = [Grant::UserMappings].into();
    let out = rebuild(&spec, &granted, TARGET).unwrap();
    assert_eq!(out["linux"]["uidMappings"][0]["hostID"], 100000);
}
