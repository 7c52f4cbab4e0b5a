//! Idmapped bind mounts (a mount's `idmap` option with the container's maps, what
//! containerd 2.x's CRI asks for each mount of a `hostUsers: false` pod): the
//! container's root sees the host root's files as its own and writes them as the
//! host's root; the mapping stays through a rollback and a restore after a crash;
//! delete detaches the staged copy and leaves the source's files alone.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crab_integration::*;

const MAPS: &[&str] = &["--uidmap", "0:100000:65536", "--gidmap", "0:100000:65536"];

/// Counts in memory and writes the count to a file, five times a second.
const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done";

/// A host directory owned by root (mode 0755), holding a root-owned file.
struct HostDir(PathBuf);

impl HostDir {
    fn new() -> HostDir {
        let dir = std::env::temp_dir().join(unique_id("crab-idmap"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("hosts"), "127.0.0.1 localhost\n").unwrap();
        HostDir(dir)
    }
}

impl Drop for HostDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run_with(dir: &Path, options: &str) -> Guard {
    let mount = format!(
        "type=bind,src={},dst=/data,options={options}",
        dir.display()
    );
    let flags: Vec<&str> = MAPS.iter().copied().chain(["--mount", &mount]).collect();
    let g = Guard::run_detached(CRAB, BUSYBOX, &flags, &["sh", "-c", COUNTER]);
    assert!(
        wait_until(Duration::from_secs(10), || g.number("/tmp/count") >= 3),
        "counter did not count"
    );
    g
}

/// Asserts the mount is idmapped as the container sees it: the host root's file
/// is root's inside, and what root writes there is the host root's on disk.
fn assert_idmapped(g: &Guard, dir: &Path, written: &str) {
    let out = g.exec_ok(&["stat", "-c", "%u:%g", "/data/hosts"]);
    assert_eq!(out.trim(), "0:0", "the host root's file seen inside");
    g.exec_ok(&["sh", "-c", &format!("echo {written} > /data/{written}")]);
    let meta = std::fs::metadata(dir.join(written)).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid()),
        (0, 0),
        "written by the container's root (host 100000) through the mount"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join(written)).unwrap().trim(),
        written
    );
    // The idmapped copy is the container's only: no mount of the host's holds
    // it, where host users of the mapped ids could write the source as root.
    let on_host: Vec<String> = mounts_mentioning(&g.id)
        .into_iter()
        .filter(|m| m.contains(".idmap"))
        .collect();
    assert!(
        on_host.is_empty(),
        "staged copies left on the host: {on_host:?}"
    );
}

#[test]
fn an_idmapped_bind_shows_host_root_files_as_the_containers_root_through_rollback_and_restore() {
    let dir = HostDir::new();
    let g = run_with(&dir.0, "rbind:rw:idmap");
    assert_idmapped(&g, &dir.0, "created");
    // The container's processes are still the mapped ids.
    let status = std::fs::read_to_string(format!("/proc/{}/status", g.pid())).unwrap();
    assert!(status.contains("Uid:\t100000\t"), "{status}");

    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    let at_checkpoint = g.number("/tmp/count");
    assert!(wait_until(Duration::from_secs(10), || g
        .number("/tmp/count")
        >= at_checkpoint + 5));
    let out = crabctl_ok(&["rollback", &g.id, "base"]);
    assert!(out.contains("processes and files restored"), "{out}");
    assert!(
        g.number("/tmp/count") < at_checkpoint + 5,
        "memory rolled back"
    );
    assert_idmapped(&g, &dir.0, "after-rollback");

    kill_shim_and_init(&g);
    let out = crabctl_ok(&["restore", &g.id]);
    assert!(out.contains("restored from checkpoint"), "{out}");
    assert_idmapped(&g, &dir.0, "after-restore");

    // libcontainer's record of the spec is Crab's copy without the idmapped
    // mount's request (libcontainer 0.7 refuses one at exec); the points where
    // copies were staged are empty.
    let ns_dir = state_dir().join(namespace());
    let bundle = ns_dir.join(format!(".bundle-{}", g.id));
    let recorded: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    let data = recorded["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["destination"] == "/data")
        .unwrap();
    assert_eq!(data["source"], dir.0.display().to_string());
    assert_eq!(data["options"], serde_json::json!(["rbind", "rw"]));
    let mut points = state_dir().into_os_string();
    points.push(".idmap");
    let points = PathBuf::from(points).join(namespace()).join(&g.id);
    assert_eq!(
        std::fs::read_dir(&points).unwrap().count(),
        0,
        "{}",
        points.display()
    );
    assert_eq!(
        std::fs::metadata(&points).unwrap().uid(),
        100_000,
        "the sandbox root's"
    );
    g.remove();
    assert!(!bundle.exists() && !points.exists(), "removed at delete");
    // The source keeps its files (a staging point is never removed recursively).
    for f in ["hosts", "created", "after-rollback", "after-restore"] {
        assert!(dir.0.join(f).exists(), "{f} is still in the host directory");
    }
}

#[test]
fn a_plain_bind_of_the_same_directory_shows_host_root_files_as_nobody_through_a_rollback() {
    // The control: without the option, the same mount is not mapped (it is
    // staged all the same, as every bind of a sandbox with a user namespace).
    let dir = HostDir::new();
    let g = run_with(&dir.0, "rbind:rw");
    let assert_plain = || {
        let out = g.exec_ok(&["stat", "-c", "%u:%g", "/data/hosts"]);
        assert_eq!(out.trim(), "65534:65534");
        let denied = g.exec(&["sh", "-c", "echo x > /data/x"]);
        assert_ne!(
            denied.status.code(),
            Some(0),
            "root inside cannot write there"
        );
    };
    assert_plain();
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    let out = crabctl_ok(&["rollback", &g.id, "base"]);
    assert!(out.contains("processes and files restored"), "{out}");
    assert_plain();
    assert!(
        mounts_mentioning(&g.id)
            .iter()
            .all(|m| !m.contains(".idmap")),
        "nothing staged is left on the host"
    );
    g.remove();
    assert!(dir.0.join("hosts").exists());
}

#[test]
fn an_idmap_option_without_a_user_namespace_is_refused_naming_the_mount() {
    let dir = HostDir::new();
    let mount = format!(
        "type=bind,src={},dst=/data,options=rbind:rw:idmap",
        dir.0.display()
    );
    let id = unique_id("idmap-refused");
    let out = ctr_run(
        &[
            "run",
            "-d",
            "--runtime",
            CRAB,
            "--mount",
            &mount,
            BUSYBOX,
            &id,
            "true",
        ],
        None,
        Duration::from_secs(60),
    );
    let (_, err) = text(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("/data") && err.contains("no user namespace"),
        "{err}"
    );
    let _ = ctr_run(&["container", "rm", &id], None, Duration::from_secs(30));
    assert!(dir.0.join("hosts").exists());
}
