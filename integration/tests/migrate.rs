//! Migration: `crabctl export` on this host's containerd, `crabctl import` on a second
//! containerd with its own root, state and socket (a second host on this machine).

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crab_integration::*;

/// The second containerd's root and state: beside the first's (`CRAB_CONTAINERD_ROOT`,
/// `CRAB_CONTAINERD_STATE`) with `-b` appended, so that private instances never share one.
fn dirs_b() -> (String, String) {
    let of = |var: &str, default: &str| {
        std::env::var(var).map_or(default.to_string(), |first| format!("{first}-b"))
    };
    (
        of("CRAB_CONTAINERD_ROOT", "/var/lib/crab/containerd-b"),
        of("CRAB_CONTAINERD_STATE", "/run/crab/containerd-b"),
    )
}

/// The second containerd, started for the test and stopped after it.
struct SecondHost;

impl SecondHost {
    fn start() -> SecondHost {
        let out = script().arg("start").output().expect("containerd.sh");
        let (o, e) = text(&out);
        assert!(out.status.success(), "second containerd: {o}{e}");
        SecondHost
    }

    fn address(&self) -> String {
        format!("{}/containerd.sock", dirs_b().1)
    }

    fn ctr(&self, args: &[&str]) -> std::process::Output {
        Command::new("ctr")
            .args(["--address", &self.address(), "--namespace", &namespace()])
            .args(args)
            .output()
            .expect("ctr")
    }
}

impl Drop for SecondHost {
    fn drop(&mut self) {
        let _ = script().arg("stop").output();
    }
}

fn script() -> Command {
    let mut c = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/containerd.sh"));
    let (root, state) = dirs_b();
    c.env("CRAB_CONTAINERD_ROOT", root)
        .env("CRAB_CONTAINERD_STATE", state);
    c
}

fn count_in(host: &SecondHost, id: &str) -> u64 {
    let out = host.ctr(&[
        "task",
        "exec",
        "--exec-id",
        &unique_id("x"),
        id,
        "cat",
        "/tmp/count",
    ]);
    let (o, e) = text(&out);
    o.trim()
        .parse()
        .unwrap_or_else(|_| panic!("count in {id}: {o}{e}"))
}

#[test]
fn a_container_moves_to_another_containerd_with_its_files_memory_and_server() {
    let host = SecondHost::start();
    let g = Guard::sh(
        "mkdir -p /www && echo moved > /www/index.html && httpd -p 127.0.0.1:8080 -h /www && \
             i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done",
    );
    assert!(wait_until(Duration::from_secs(10), || {
        g.exec(&["cat", "/tmp/count"]).status.success()
    }));
    std::thread::sleep(Duration::from_secs(2));
    let archive = std::env::temp_dir().join(format!("{}.tar", unique_id("move")));
    let started = Instant::now();
    crabctl_ok(&["export", &g.id, "-o", &archive.display().to_string()]);
    let mode = std::fs::metadata(&archive).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o077,
        0,
        "the archive is readable by others: {mode:o}"
    );
    let at: u64 = g.exec_ok(&["cat", "/tmp/count"]).trim().parse().unwrap();
    g.remove();

    let new_id = unique_id("moved");
    let out = Command::new("crabctl")
        .args(["-a", &host.address(), "-n", &namespace(), "import"])
        .arg(&archive)
        .args(["--id", &new_id])
        .output()
        .expect("crabctl import");
    let (o, e) = text(&out);
    assert!(out.status.success(), "import: {o}{e}");
    eprintln!(
        "migration (export + import) took {} ms",
        started.elapsed().as_millis()
    );

    let tasks = host.ctr(&["task", "ls"]);
    let (t, _) = text(&tasks);
    assert!(
        t.lines()
            .any(|l| l.starts_with(&new_id) && l.contains("RUNNING")),
        "{t}"
    );
    let first = count_in(&host, &new_id);
    assert!(
        first + 5 >= at && first < at + 30,
        "count {first}, {at} at export"
    );
    assert!(wait_until(Duration::from_secs(5), || count_in(
        &host, &new_id
    ) > first));
    let page = host.ctr(&[
        "task",
        "exec",
        "--exec-id",
        &unique_id("x"),
        &new_id,
        "wget",
        "-qO-",
        "http://127.0.0.1:8080/index.html",
    ]);
    assert_eq!(text(&page).0.trim(), "moved", "{:?}", text(&page));

    let _ = host.ctr(&["task", "kill", "-s", "KILL", &new_id]);
    std::thread::sleep(Duration::from_millis(500));
    let _ = host.ctr(&["task", "rm", "-f", &new_id]);
    let _ = host.ctr(&["container", "rm", &new_id]);
    let _ = std::fs::remove_file(&archive);
}

#[test]
fn importing_a_corrupt_archive_fails_clearly_and_creates_nothing() {
    let host = SecondHost::start();
    let bad = std::env::temp_dir().join(format!("{}.tar", unique_id("bad")));
    std::fs::write(&bad, b"not a tar at all").unwrap();
    let new_id = unique_id("bad");
    let out = Command::new("crabctl")
        .args(["-a", &host.address(), "-n", &namespace(), "import"])
        .arg(&bad)
        .args(["--id", &new_id])
        .output()
        .expect("crabctl import");
    let (_, e) = text(&out);
    assert!(!out.status.success());
    assert!(e.contains("archive"), "{e}");
    let (containers, _) = text(&host.ctr(&["container", "ls", "-q"]));
    assert!(!containers.contains(&new_id), "{containers}");
    let _ = std::fs::remove_file(&bad);
}
