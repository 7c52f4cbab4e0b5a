//! What containerd's own client tests (`integration/client` of containerd 1.7) expect
//! of a runtime, reproduced with the project's own tests: runc's shim passes them,
//! and so must Crab's. The suite itself is another project's code and is not run here.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_integration::*;

/// Whether `pid` is gone (or a zombie nobody reaped yet: dead all the same).
fn dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

/// TestContainerKillInitPidHost: with the host's pid namespace (joined here through
/// the runtime's own `/proc/self/ns/pid`), killing the init does not take its
/// children with it in the kernel; the shim kills them before it reports the
/// init's exit.
#[test]
fn with_the_hosts_pid_namespace_the_inits_exit_ends_its_children_first() {
    for round in 0..5 {
        let c = Guard::run_detached(
            CRAB,
            BUSYBOX,
            &["--with-ns", "pid:/proc/self/ns/pid"],
            &[
                "sh",
                "-c",
                "sleep 1000 & echo $! > /tmp/child; sleep 1000 & echo $! >> /tmp/child; wait",
            ],
        );
        let init = c.pid();
        let file = format!("/proc/{init}/root/tmp/child");
        assert!(wait_until(Duration::from_secs(10), || {
            std::fs::read_to_string(&file).is_ok_and(|s| s.lines().count() == 2)
        }));
        let children: Vec<i32> = std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .map(|l| l.trim().parse().expect("a pid"))
            .collect();
        assert!(children.iter().all(|&p| !dead(p)), "round {round}");
        ctr_ok(&["task", "kill", "-s", "KILL", &c.id]);
        assert!(wait_until(Duration::from_secs(10), || {
            c.status().as_deref() == Some("STOPPED")
        }));
        // Reported stopped: its children must already be dead (not at delete).
        let alive: Vec<i32> = children.iter().copied().filter(|&p| !dead(p)).collect();
        assert!(
            alive.is_empty(),
            "round {round}: {alive:?} outlived the init"
        );
    }
}
