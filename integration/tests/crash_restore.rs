//! `crabctl restore` right after a crash: the shim and the container's processes
//! killed with SIGKILL, and the restore run at once, without waiting for
//! containerd to notice. The newest durable checkpoint comes back (memory and
//! files), the old task's leftovers are gone, and a container with a turn proxy
//! gets its proxy back in the same step. A task that did not crash is not
//! restored over.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_integration::llm;
use crab_integration::*;

/// A web server on loopback (daemonized: a child of the shell) and a counter.
const SERVER_AND_COUNTER: &str = "mkdir -p /www && echo served > /www/index.html && \
    httpd -p 127.0.0.1:8080 -h /www && \
    i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done";

/// A python counter: the count lives in the interpreter's memory.
const PY_COUNTER: &str = "import os, time\ni = 0\nwhile True:\n    i += 1\n    \
    open('/tmp/count.new', 'w').write(str(i))\n    os.rename('/tmp/count.new', '/tmp/count')\n    \
    time.sleep(0.2)\n";

/// GET `path` from the container's proxy, from inside the container.
const PROXY_GET: &str = "import sys, urllib.request\n\
    r = urllib.request.urlopen('http://127.0.0.1:8787' + sys.argv[1], timeout=20)\n\
    print(r.status, r.read().decode())\n";

fn count(g: &Guard) -> u64 {
    g.number("/tmp/count")
}

/// Writes `/f` = `value` and takes checkpoint `name`; returns the count just before.
fn checkpoint_with(g: &Guard, value: &str, name: &str) -> u64 {
    g.exec_ok(&["sh", "-c", &format!("echo {value} > /f")]);
    let at = count(g);
    crabctl_ok(&["checkpoint", &g.id, "--name", name]);
    at
}

#[test]
fn a_container_killed_with_its_shim_is_restored_at_once_from_its_newest_checkpoint() {
    let g = Guard::sh(SERVER_AND_COUNTER);
    assert!(wait_until(Duration::from_secs(10), || count(&g) >= 5));
    checkpoint_with(&g, "first", "first");
    let at = checkpoint_with(&g, "newest", "newest");
    g.exec_ok(&["sh", "-c", "echo lost > /f && echo lost > /lost"]);
    let old_shim = shim_pids(&g.id);
    kill_shim_and_init(&g);
    let out = crabctl_ok(&["restore", &g.id]);
    assert!(out.contains("restored from checkpoint newest"), "{out}");
    assert!(out.contains("the old task cleared in"), "{out}");
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    let shims = shim_pids(&g.id);
    assert_eq!(shims.len(), 1, "one shim after the restore: {shims:?}");
    assert_ne!(shims, old_shim);
    // Memory and files of the newest checkpoint.
    let now = count(&g);
    assert!(
        now >= at && now < at + 25,
        "count {now} after restore, {at} at the checkpoint"
    );
    assert_eq!(g.exec_ok(&["cat", "/f"]).trim(), "newest");
    assert_eq!(g.exec(&["test", "-e", "/lost"]).status.code(), Some(1));
    let get = ["wget", "-qO-", "http://127.0.0.1:8080/index.html"];
    assert_eq!(g.exec_ok(&get).trim(), "served");
    // The restored task is a whole one: it checkpoints, and keeps counting.
    crabctl_ok(&["checkpoint", &g.id, "--name", "after"]);
    let c = count(&g);
    assert!(wait_until(Duration::from_secs(5), || count(&g) > c));
}

#[test]
fn a_sandbox_killed_with_its_shim_gets_its_proxy_back_in_the_same_restore() {
    let g = llm::proxied_sandbox(Duration::ZERO, "", &["python3", "-c", PY_COUNTER]);
    // The counter's file exists once python runs (`count` wants it there).
    assert!(wait_until(Duration::from_secs(20), || g
        .exec(&["test", "-e", "/tmp/count"])
        .status
        .success()));
    assert!(wait_until(Duration::from_secs(20), || count(&g) >= 3));
    let old_proxy = proxy_pids(&g.id);
    assert_eq!(old_proxy.len(), 1, "one proxy per container");
    let at = checkpoint_with(&g, "kept", "safe");
    g.exec_ok(&["sh", "-c", "echo lost > /f"]);
    kill_shim_and_init(&g);
    let out = crabctl_ok(&["restore", &g.id]);
    assert!(out.contains("restored from checkpoint safe"), "{out}");
    // The new proxy was started by the restore; the old one ends on its own
    // (its shim's lifeline closed).
    assert!(
        wait_until(Duration::from_secs(10), || proxy_pids(&g.id).len() == 1),
        "proxies after the restore: {:?}",
        proxy_pids(&g.id)
    );
    assert_ne!(proxy_pids(&g.id), old_proxy);
    let answer = g.exec_ok(&["python3", "-c", PROXY_GET, "/v1/models"]);
    assert_eq!(answer.trim(), format!("200 {}", llm::JSON_ANSWER));
    let now = count(&g);
    assert!(
        now >= at && now < at + 25,
        "count {now}, {at} at the checkpoint"
    );
    assert_eq!(g.exec_ok(&["cat", "/f"]).trim(), "kept");
}

#[test]
fn restore_over_a_running_task_is_refused_and_the_task_runs_on() {
    let g = Guard::sh(SERVER_AND_COUNTER);
    assert!(wait_until(Duration::from_secs(10), || count(&g) >= 2));
    crabctl_ok(&["checkpoint", &g.id, "--name", "safe"]);
    let pid = g.pid();
    let out = crabctl(&["restore", &g.id], &[]);
    let (o, e) = text(&out);
    assert!(!out.status.success(), "{o}{e}");
    assert!(e.contains("not a crashed one"), "{e}");
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    assert_eq!(g.pid(), pid);
    let c = count(&g);
    assert!(wait_until(Duration::from_secs(5), || count(&g) > c));
}

#[test]
fn a_restore_finishes_the_cleanup_the_dead_shims_delete_did_not() {
    // The dead shim's cleanup (the shim binary's `delete`, which containerd runs
    // once and kills after 5 s) dies before it removes anything: the container's
    // record and the task's bundle are left, and a create under its id would fail
    // ("mkdir <bundle>: file exists" in containerd, "already exists" in Crab).
    let c = crab_integration::crash::Crashable::start();
    let at = crab_integration::crash::base_checkpoint(&c);
    c.guard.exec_ok(&["sh", "-c", "echo lost > /f"]);
    c.arm("shim:delete.started");
    kill_shim_and_init(&c.guard);
    // containerd ran that cleanup (and dropped the task) before it lets go.
    assert!(wait_until(Duration::from_secs(20), || c
        .guard
        .status()
        .is_none()));
    c.disarm();
    assert!(
        bundle_dir(c.id()).is_dir(),
        "containerd removed the bundle: the cleanup was not cut off"
    );
    let out = crabctl(&["restore", c.id()], &[]);
    let (o, e) = text(&out);
    assert!(out.status.success(), "{o}{e}");
    assert!(
        e.contains("removed what the dead shim's cleanup had left"),
        "the dead shim's cleanup was not cut off: {o}{e}"
    );
    assert!(o.contains("restored from checkpoint base"), "{o}");
    assert_eq!(c.guard.status().as_deref(), Some("RUNNING"));
    assert_eq!(c.guard.exec_ok(&["cat", "/f"]).trim(), "before");
    let now = c.count();
    assert!(
        now >= at && now < at + 25,
        "count {now} after the restore, {at} at the checkpoint"
    );
    c.assert_runs("the restore");
    // The restored task is a whole one: it checkpoints and rolls back.
    c.assert_rolls_back_to("base", at);
}
