//! Crash at any step, CRIU's steps (issue 17 item 13): the configuration's
//! `[checkpoint] criu` is a wrapper that runs the real CRIU and kills the helper that
//! called it (its parent) just before or just after, as an OOM kill or a crash of the
//! helper would. After each: nothing stays frozen or running outside containerd's
//! view, and the operation works again once the fault is gone.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use crab_integration::*;

const COUNTER: &str = "i=0; while true; do i=$((i+1)); \
    echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done";

/// A CRIU wrapper and the file that arms it (`dump-before`, `restore-after`, ...).
struct Wrapper {
    dir: PathBuf,
}

impl Wrapper {
    fn new() -> Wrapper {
        let dir = std::env::temp_dir().join(unique_id("criu-wrap"));
        std::fs::create_dir_all(&dir).expect("wrapper dir");
        let real = String::from_utf8(
            std::process::Command::new("sh")
                .args(["-c", "command -v criu"])
                .output()
                .expect("find criu")
                .stdout,
        )
        .expect("path");
        let script = format!(
            "#!/bin/sh\n\
             mode=$(cat {mode} 2>/dev/null)\n\
             if [ \"$1-before\" = \"$mode\" ]; then kill -9 $PPID; exit 1; fi\n\
             {real} \"$@\"; rc=$?\n\
             if [ \"$1-after\" = \"$mode\" ]; then kill -9 $PPID; exit 1; fi\n\
             exit $rc\n",
            mode = dir.join("mode").display(),
            real = real.trim(),
        );
        let path = dir.join("criu");
        std::fs::write(&path, script).expect("write wrapper");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        Wrapper { dir }
    }

    fn config(&self) -> String {
        config_with(&format!(
            "[checkpoint]\ncriu = \"{}\"",
            self.dir.join("criu").display()
        ))
        .display()
        .to_string()
    }

    fn arm(&self, mode: &str) {
        std::fs::write(self.dir.join("mode"), mode).expect("arm");
    }

    fn disarm(&self) {
        let _ = std::fs::remove_file(self.dir.join("mode"));
    }
}

impl Drop for Wrapper {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn count(g: &Guard) -> u64 {
    g.number("/tmp/count")
}

fn counter(w: &Wrapper) -> Guard {
    let config = w.config();
    let g = Guard::run_detached(
        CRAB,
        BUSYBOX,
        &["--runtime-config-path", &config],
        &["sh", "-c", COUNTER],
    );
    assert!(wait_until(Duration::from_secs(10), || count(&g) >= 3));
    g
}

fn assert_runs(g: &Guard, after: &str) {
    let c = count(g);
    assert!(
        wait_until(Duration::from_secs(5), || count(g) > c),
        "the counter stopped at {c} after {after} (left frozen?)"
    );
}

/// Processes in the container's cgroups (any hierarchy).
fn processes_of(id: &str) -> Vec<String> {
    cgroup_dirs_named(id)
        .iter()
        .flat_map(|d| {
            std::fs::read_to_string(d.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `ctr task checkpoint`: the helper dies while CRIU would dump (the container is
/// frozen then); the container runs on, and the next checkpoint works.
#[test]
fn helper_killed_before_a_containerd_dump_leaves_the_container_running() {
    let w = Wrapper::new();
    let g = counter(&w);
    w.arm("dump-before");
    let out = ctr()
        .args(["task", "checkpoint", &g.id])
        .output()
        .expect("ctr");
    w.disarm();
    assert!(!out.status.success(), "the checkpoint survived the crash");
    assert_runs(&g, "the crash");
    ctr_ok(&["task", "checkpoint", &g.id]);
    assert_runs(&g, "the next checkpoint");
}

/// `crabctl checkpoint`: the helper dies once CRIU has dumped (the images are there,
/// not renamed); the container runs, and the next checkpoint and a rollback work.
#[test]
fn helper_killed_after_a_dump_leaves_the_container_running_and_rollback_works() {
    let w = Wrapper::new();
    let g = counter(&w);
    let at = count(&g);
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    w.arm("dump-after");
    let out = crabctl(&["checkpoint", &g.id], &[]);
    w.disarm();
    assert!(!out.status.success());
    assert_runs(&g, "the crash");
    crabctl_ok(&["checkpoint", &g.id]);
    crabctl_ok(&["rollback", &g.id, "base"]);
    let now = count(&g);
    assert!(now >= at && now < at + 25, "count {now}, {at} at base");
}

/// `crabctl restore` after a crash: the helper dies just before, or just after CRIU
/// restored the processes (they are then the shim's children, unknown to it). The
/// restore fails, no process of the container is left running, and the next
/// `crabctl restore` brings the container back.
fn restore_with_the_helper_killed(mode: &str) {
    let w = Wrapper::new();
    let g = counter(&w);
    let at = count(&g);
    crabctl_ok(&["checkpoint", &g.id, "--name", "safe"]);
    let mut victims = shim_pids(&g.id);
    victims.push(g.pid());
    for pid in victims {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    assert!(wait_until(Duration::from_secs(20), || g
        .status()
        .as_deref()
        != Some("RUNNING")));
    w.arm(mode);
    let out = crabctl(&["restore", &g.id], &[]);
    w.disarm();
    let (o, e) = text(&out);
    assert!(!out.status.success(), "the restore survived {mode}: {o}{e}");
    assert!(
        wait_until(Duration::from_secs(10), || processes_of(&g.id).is_empty()),
        "processes left after the failed restore: {:?}",
        processes_of(&g.id)
    );
    let out = crabctl_ok(&["restore", &g.id]);
    assert!(out.contains("restored from checkpoint safe"), "{out}");
    let now = count(&g);
    assert!(
        now >= at && now < at + 25,
        "count {now}, {at} at the checkpoint"
    );
    assert_runs(&g, "the second restore");
}

#[test]
fn helper_killed_before_criu_restores_fails_cleanly_and_restore_works_again() {
    restore_with_the_helper_killed("restore-before");
}

#[test]
fn helper_killed_after_criu_restored_leaves_no_process_and_restore_works_again() {
    restore_with_the_helper_killed("restore-after");
}
