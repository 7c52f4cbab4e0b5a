//! `crabctl fork` and `crabctl restore`: new tasks from Crab's checkpoints, made through
//! containerd and visible to every client.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_integration::*;

/// A web server on loopback (daemonized: a child of the shell) and a counter.
const SERVER_AND_COUNTER: &str = "mkdir -p /www && echo served > /www/index.html && \
    echo orig > /f && httpd -p 127.0.0.1:8080 -h /www && \
    i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done";

const GET: [&str; 3] = ["wget", "-qO-", "http://127.0.0.1:8080/index.html"];

fn count(g: &Guard) -> u64 {
    g.number("/tmp/count")
}

fn server() -> Guard {
    let g = Guard::sh(SERVER_AND_COUNTER);
    assert!(wait_until(Duration::from_secs(10), || count(&g) >= 5));
    g
}

#[test]
fn fork_makes_independent_running_containers_visible_to_containerd() {
    let g = server();
    let before = count(&g);
    let prefix = unique_id("fork");
    let forks: Vec<Guard> = (1..=3)
        .map(|i| Guard::new(&format!("{prefix}-{i}")))
        .collect();
    let out = crabctl_ok(&["fork", &g.id, "--count", "3", "--prefix", &prefix]);
    assert!(out.contains("3 forks"), "{out}");
    let tasks = ctr_ok(&["task", "ls"]);
    for f in &forks {
        assert_eq!(f.status().as_deref(), Some("RUNNING"), "{}:\n{tasks}", f.id);
        assert!(count(f) >= before, "{} starts afresh", f.id);
        assert_eq!(f.exec_ok(&GET).trim(), "served", "{}: server", f.id);
        assert_ne!(f.pid(), g.pid());
    }
    forks[0].exec_ok(&["sh", "-c", "echo changed > /f"]);
    assert_eq!(forks[1].exec_ok(&["cat", "/f"]).trim(), "orig");
    assert_eq!(g.exec_ok(&["cat", "/f"]).trim(), "orig");
    let c = count(&forks[2]);
    assert!(wait_until(Duration::from_secs(5), || count(&forks[2]) > c));
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
}

#[test]
fn fork_from_a_named_checkpoint_has_that_checkpoints_files() {
    let g = server();
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    g.exec_ok(&["sh", "-c", "echo later > /later"]);
    let prefix = unique_id("named");
    let f = Guard::new(&format!("{prefix}-1"));
    crabctl_ok(&["fork", &g.id, "base", "--prefix", &prefix]);
    assert_eq!(f.status().as_deref(), Some("RUNNING"));
    assert_eq!(f.exec(&["test", "-e", "/later"]).status.code(), Some(1));
    assert_eq!(g.exec_ok(&["cat", "/later"]).trim(), "later");
}

#[test]
fn a_fork_of_node_compiles_webassembly_again() {
    let node = wasm::Node::start(&[]);
    let prefix = unique_id("wasm");
    let f = Guard::new(&format!("{prefix}-1"));
    crabctl_ok(&["fork", &node.guard.id, "--prefix", &prefix]);
    node.assert_compiles_again(&f);
    node.assert_compiles_again(&node.guard);
}

#[test]
fn a_killed_container_comes_back_under_its_id_from_its_checkpoint() {
    let g = server();
    // Read before the checkpoint: the counter ticks on after it (every 0.2 s),
    // and the restored one starts from its value at the dump.
    let at = count(&g);
    crabctl_ok(&["checkpoint", &g.id, "--name", "safe"]);
    g.exec_ok(&["sh", "-c", "echo lost > /lost"]);
    // The crash: the shim and every process of the container, SIGKILL.
    let mut victims = shim_pids(&g.id);
    victims.push(g.pid());
    for pid in victims {
        let _ = nix_kill(pid);
    }
    assert!(
        wait_until(Duration::from_secs(20), || g.status().as_deref()
            != Some("RUNNING")),
        "containerd did not notice the crash"
    );
    let out = crabctl_ok(&["restore", &g.id]);
    assert!(out.contains("restored from checkpoint safe"), "{out}");
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    let now = count(&g);
    assert!(
        now >= at && now < at + 25,
        "count {now} after restore, {at} at the checkpoint"
    );
    assert_eq!(g.exec(&["test", "-e", "/lost"]).status.code(), Some(1));
    assert_eq!(g.exec_ok(&GET).trim(), "served");
}

#[test]
fn restore_of_a_container_without_checkpoints_fails_clearly() {
    let g = server();
    let out = crabctl(&["restore", &g.id], &[]);
    let (_, e) = text(&out);
    assert!(!out.status.success());
    assert!(e.contains("has no checkpoints"), "{e}");
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
}

fn nix_kill(pid: i32) -> std::io::Result<()> {
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("kill -9 {pid}")))
    }
}
