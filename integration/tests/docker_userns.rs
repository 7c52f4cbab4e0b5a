//! Docker with `userns-remap`: a second dockerd (`hack/docker.sh` with
//! `CRAB_DOCKER_USERNS_REMAP=default`, its own data root, state and bridge)
//! against the suite's containerd. Docker then runs every container in a user
//! namespace mapping its root to the `dockremap` user's subordinate ids, chowns
//! the image layers to them, and keeps the containers in the containerd
//! namespace `moby-<uid>.<gid>`.

// Needs root, containerd and the trixie root: built only with the `host-tests` feature.
#![cfg(feature = "host-tests")]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crab_integration::docker::{crabctl_in, docker_run_at, DOCKER_BUSYBOX, DOCKER_RUNTIME};
use crab_integration::{text, unique_id, wait_until};

const STATE: &str = "/run/crab/docker-userns";

/// The remapping dockerd, stopped (its containers removed) when dropped.
struct RemappedDockerd;

impl RemappedDockerd {
    fn start() -> RemappedDockerd {
        let out = docker_sh("start");
        let (o, e) = text(&out);
        assert!(out.status.success(), "hack/docker.sh start: {o}{e}");
        RemappedDockerd
    }

    fn host(&self) -> String {
        format!("unix://{STATE}/docker.sock")
    }

    fn run(&self, args: &[&str]) -> Output {
        docker_run_at(&self.host(), args, None, Duration::from_secs(120))
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let (o, e) = text(&out);
        assert!(out.status.success(), "docker {args:?}: {o}{e}");
        o.trim().to_string()
    }
}

impl Drop for RemappedDockerd {
    fn drop(&mut self) {
        let _ = docker_sh("stop");
    }
}

fn docker_sh(action: &str) -> Output {
    Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/docker.sh"))
        .arg(action)
        .env("CRAB_DOCKER_DATA", "/var/lib/crab/docker-userns")
        .env("CRAB_DOCKER_STATE", STATE)
        .env("CRAB_DOCKER_BRIDGE", "crab-userns0")
        .env("CRAB_DOCKER_BRIDGE_CIDR", "10.88.229.1/24")
        .env("CRAB_DOCKER_USERNS_REMAP", "default")
        .stdin(Stdio::null())
        .output()
        .expect("hack/docker.sh")
}

/// The first host id of `dockremap`'s subordinate range in the root's `file`
/// (`/etc/subuid` or `/etc/subgid`).
fn first_subordinate(file: &str) -> u32 {
    let root = crab_integration::docker::docker_rootfs();
    let text = std::fs::read_to_string(Path::new(&root).join(file)).expect(file);
    text.lines()
        .find_map(|l| {
            l.strip_prefix("dockremap:")?
                .split(':')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no dockremap range in {file}: {text}"))
}

fn crabctl(ns: &str, args: &[&str]) -> String {
    let out = crabctl_in(ns, args);
    let (o, e) = text(&out);
    assert!(out.status.success(), "crabctl {args:?}: {o}{e}");
    o
}

/// The host uid of process `pid` (its `Uid:` line, real id).
fn host_uid(pid: &str) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix("Uid:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .expect("Uid line")
}

const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done";

/// A crab container of a remapping dockerd runs as the remapped ids, and Crab's
/// checkpoint and rollback work on it: the counter in memory and a file of
/// root's come back, the init is the remapped root again, and Docker's binds
/// (`/etc/hostname`) are in place. The rollback's CRIU copies the sharing of
/// those binds (slaves of the data root's mount) from the staged copies of
/// their sources, which must hold all three (a copy of each file failed with
/// EINVAL). Its control socket's path is longer than a socket address holds
/// under the suite's state directory, and is reached all the same.
#[test]
fn a_crab_container_of_a_remapping_dockerd_checkpoints_and_rolls_back() {
    let d = RemappedDockerd::start();
    let (uid, gid) = (
        first_subordinate("etc/subuid"),
        first_subordinate("etc/subgid"),
    );
    let ns = format!("moby-{uid}.{gid}");
    let name = unique_id("userns");
    d.ok(&[
        "run",
        "-d",
        "--runtime",
        DOCKER_RUNTIME,
        "--name",
        &name,
        DOCKER_BUSYBOX,
        "sh",
        "-c",
        COUNTER,
    ]);
    let id = d.ok(&["inspect", "-f", "{{.Id}}", &name]);
    let pid = d.ok(&["inspect", "-f", "{{.State.Pid}}", &name]);
    assert_eq!(host_uid(&pid), uid, "the init runs as the remapped root");
    let map = d.ok(&["exec", &name, "cat", "/proc/self/uid_map"]);
    assert_eq!(
        map.split_whitespace().collect::<Vec<_>>(),
        ["0", &uid.to_string(), "65536"]
    );

    let config_path = std::env::var("CRAB_CONFIG").expect("CRAB_CONFIG (hack/test.sh sets it)");
    let config = crab_runtime::config::Config::load(None, Some(Path::new(&config_path)), None)
        .expect("the suite's configuration")
        .0;
    let socket = crab_runtime::control::socket_path(&config, &ns, &id);
    assert!(
        socket.as_os_str().len() > crab_runtime::socket_path::MAX_SOCKET_PATH,
        "{} fits a socket address: the long-path case is not exercised",
        socket.display()
    );

    d.ok(&["exec", &name, "sh", "-c", "echo before > /root/f"]);
    let count = || -> u64 {
        d.ok(&["exec", &name, "cat", "/tmp/count"])
            .parse()
            .expect("a count")
    };
    crabctl(&ns, &["checkpoint", &id, "--name", "before"]);
    let at_checkpoint = count();
    assert!(wait_until(Duration::from_secs(20), || count() >= at_checkpoint + 10));
    d.ok(&["exec", &name, "sh", "-c", "echo after > /root/f"]);
    let before_rollback = count();

    let rolled = crabctl(&ns, &["rollback", &id, "before"]);
    let init = rolled
        .rsplit("init pid ")
        .next()
        .and_then(|p| p.trim().parse::<u32>().ok())
        .unwrap_or_else(|| panic!("no init pid in {rolled:?}"));
    assert_eq!(
        host_uid(&init.to_string()),
        uid,
        "the restored init is the remapped root"
    );
    let after = count();
    assert!(
        after < before_rollback,
        "the count went back: {after} after {before_rollback}"
    );
    assert_eq!(d.ok(&["exec", &name, "cat", "/root/f"]), "before");
    assert!(
        wait_until(Duration::from_secs(10), || count() > after),
        "the counter goes on"
    );
    assert_eq!(d.ok(&["exec", &name, "cat", "/etc/hostname"]), &id[..12]);
    assert_eq!(
        d.ok(&["inspect", "-f", "{{.State.Running}}", &name]),
        "true"
    );
    d.ok(&["rm", "-f", &name]);
}
