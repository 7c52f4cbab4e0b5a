//! The cgroup file system inside a container, as Docker and Kubernetes ask for it: a
//! `cgroup` mount at /sys/fs/cgroup with `ro` (ctr's `--mount` makes the same spec).
//!
//! The sandbox must not be able to raise its own limits or reach the host's
//! hierarchies (runc's behaviour, checked side by side), and such a container must
//! still checkpoint and restore: its cgroup binds are external to CRIU.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::path::Path;
use std::time::Duration;

use crab_integration::*;

/// Docker's and the CRI plugin's cgroup mount, in ctr's `--mount` syntax.
const CGROUP_MOUNT: &str =
    "type=cgroup,src=cgroup,dst=/sys/fs/cgroup,options=nosuid:noexec:nodev:relatime:ro";
const LIMIT: &str = "67108864";

fn with_cgroup_view(runtime: &str, script: &str) -> Guard {
    Guard::run_detached(
        runtime,
        BUSYBOX,
        &["--mount", CGROUP_MOUNT, "--memory-limit", LIMIT],
        &["sh", "-c", script],
    )
}

/// The host's directory of the container's cgroup in hierarchy `name`.
fn host_cgroup(name: &str, id: &str) -> std::path::PathBuf {
    Path::new("/sys/fs/cgroup")
        .join(name)
        .join(namespace())
        .join(id)
}

/// What a process inside sees and may do, one line per probe.
const PROBES: &str = "\
echo 1073741824 > /sys/fs/cgroup/memory/memory.limit_in_bytes && echo raised-limit; \
mkdir /sys/fs/cgroup/systemd/escape && echo made-cgroup; \
test -e /sys/fs/cgroup/systemd/release_agent && echo sees-release-agent; \
test -e /sys/fs/cgroup/memory/memory.limit_in_bytes && echo sees-own-memory; \
grep name=systemd /proc/self/cgroup";

#[test]
fn a_read_only_cgroup_view_stops_a_sandbox_raising_its_limits_as_with_runc() {
    for runtime in [CRAB, RUNC] {
        let c = with_cgroup_view(runtime, "sleep 600");
        let out = c.exec(&["sh", "-c", PROBES]);
        let (stdout, stderr) = text(&out);
        assert!(
            stdout.contains("sees-own-memory"),
            "{runtime}: {stdout}{stderr}"
        );
        for forbidden in ["raised-limit", "made-cgroup", "sees-release-agent"] {
            assert!(
                !stdout.contains(forbidden),
                "{runtime}: {forbidden}:\n{stdout}{stderr}"
            );
        }
        assert!(
            stderr.contains("Read-only file system"),
            "{runtime}: {stderr}"
        );
        let limit =
            std::fs::read_to_string(host_cgroup("memory", &c.id).join("memory.limit_in_bytes"))
                .expect("host memory cgroup");
        assert_eq!(limit.trim(), LIMIT, "{runtime}");
        // The exec'd process, like the init, is in the container's own cgroup of
        // the named systemd hierarchy.
        let own = format!("/{}/{}", namespace(), c.id);
        assert!(stdout.trim_end().ends_with(&own), "{runtime}: {stdout}");
        let init = std::fs::read_to_string(format!("/proc/{}/cgroup", c.pid())).unwrap();
        assert!(
            init.lines()
                .any(|l| l.ends_with(&format!("name=systemd:{own}"))),
            "{runtime}: {init}"
        );
    }
}

#[test]
fn deleting_a_container_removes_its_systemd_cgroup() {
    let c = with_cgroup_view(CRAB, "sleep 600");
    let dir = host_cgroup("systemd", &c.id);
    assert!(dir.is_dir(), "{}", dir.display());
    c.remove();
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
fn a_container_with_a_cgroup_view_checkpoints_and_rolls_back_read_only() {
    let c = with_cgroup_view(
        CRAB,
        "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done",
    );
    assert!(wait_until(Duration::from_secs(10), || c
        .number("/tmp/count")
        >= 3));
    let out = crabctl_ok(&["checkpoint", &c.id]);
    assert!(out.contains("checkpoint 1"), "{out}");
    let at_checkpoint = c.number("/tmp/count");
    assert!(wait_until(Duration::from_secs(10), || {
        c.number("/tmp/count") >= at_checkpoint + 20
    }));
    crabctl_ok(&["rollback", &c.id, "1"]);
    // Back near the checkpoint's value, and counting again.
    let after = c.number("/tmp/count");
    assert!(after < at_checkpoint + 20, "{after} vs {at_checkpoint}");
    assert!(wait_until(Duration::from_secs(10), || c
        .number("/tmp/count")
        > after));
    let out = c.exec(&["sh", "-c", PROBES]);
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("sees-own-memory"), "{stdout}{stderr}");
    assert!(!stdout.contains("raised-limit"), "{stdout}{stderr}");
    assert!(!stdout.contains("made-cgroup"), "{stdout}{stderr}");
    let mounts = c.exec_ok(&["grep", " /sys/fs/cgroup/memory ", "/proc/1/mountinfo"]);
    assert!(mounts.contains(" ro,"), "{mounts}");
    assert!(
        mounts.contains(&format!("/{}/{} ", namespace(), c.id)),
        "the restored init sees its own cgroup: {mounts}"
    );
}
