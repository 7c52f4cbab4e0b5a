//! The workloads an agent's sandbox holds, each checkpointed with `crabctl checkpoint`,
//! disturbed, and rolled back in place: what comes back must be exactly what was there.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_integration::*;

fn wait_for_file(g: &Guard, path: &str, timeout: Duration) -> String {
    let mut last = String::new();
    let ok = wait_until(timeout, || {
        let out = g.exec(&["cat", path]);
        last = text(&out).0;
        out.status.success() && !last.trim().is_empty()
    });
    assert!(ok, "{path} never appeared in {}", g.id);
    last.trim().to_string()
}

fn number(g: &Guard, path: &str) -> u64 {
    g.number(path)
}

#[test]
fn a_pipeline_of_processes_joined_by_pipes_continues_after_rollback() {
    let g = Guard::sh(
        "i=0; while true; do i=$((i+1)); echo $i; sleep 0.1; done | \
             while read n; do echo $n > /tmp/p.new; mv /tmp/p.new /tmp/p; done",
    );
    wait_for_file(&g, "/tmp/p", Duration::from_secs(10));
    crabctl_ok(&["checkpoint", &g.id, "--name", "pipe"]);
    let at = number(&g, "/tmp/p");
    std::thread::sleep(Duration::from_secs(1));
    crabctl_ok(&["rollback", &g.id, "pipe"]);
    let now = number(&g, "/tmp/p");
    assert!(now >= at.saturating_sub(2) && now < at + 8, "{now} vs {at}");
    assert!(wait_until(Duration::from_secs(5), || number(&g, "/tmp/p") > now + 3));
}

#[test]
fn a_deleted_but_open_file_and_an_appended_log_come_back() {
    let g = Guard::sh(
        "echo secret-$$ > /tmp/ghost && exec 3</tmp/ghost && rm /tmp/ghost && \
             exec 4>>/tmp/log && i=0; while true; do i=$((i+1)); echo $i >&4; sleep 0.1; done",
    );
    wait_for_file(&g, "/tmp/log", Duration::from_secs(10));
    let ghost = g.exec_ok(&["cat", "/proc/1/fd/3"]);
    assert!(ghost.starts_with("secret-"), "{ghost:?}");
    crabctl_ok(&["checkpoint", &g.id, "--name", "files"]);
    std::thread::sleep(Duration::from_millis(700));
    crabctl_ok(&["rollback", &g.id, "files"]);
    assert_eq!(
        g.exec_ok(&["cat", "/proc/1/fd/3"]),
        ghost,
        "the deleted file's content"
    );
    assert_eq!(g.exec(&["test", "-e", "/tmp/ghost"]).status.code(), Some(1));
    std::thread::sleep(Duration::from_millis(500));
    // The log goes on where the dump left it: one line per number, no gap, no repeat.
    let log = g.exec_ok(&["cat", "/tmp/log"]);
    let nums: Vec<u64> = log.lines().map(|l| l.parse().unwrap()).collect();
    assert!(nums.len() > 5, "{log}");
    assert!(
        nums.windows(2).all(|w| w[1] == w[0] + 1),
        "the appended log has a gap or a repeat: {nums:?}"
    );
}

/// The long-lived processes of a container as (pid, parent, command). The loops'
/// `sleep`s and the `ps` itself come and go between samples, so they are left out.
fn long_lived(g: &Guard) -> std::collections::BTreeSet<(u32, u32, String)> {
    g.exec_ok(&["ps", "-o", "pid,ppid,args"])
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let pid = f.next()?.parse().ok()?;
            let ppid = f.next()?.parse().ok()?;
            let args = f.collect::<Vec<_>>().join(" ");
            let transient = ["sleep ", "ps ", "mv "].iter().any(|c| args.starts_with(c));
            (!transient).then_some((pid, ppid, args))
        })
        .collect()
}

#[test]
fn a_process_tree_three_levels_deep_comes_back_whole() {
    let g = Guard::sh(
        "sh -c 'sh -c \"while true; do sleep 1; done\" & wait' & \
             i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done",
    );
    wait_for_file(&g, "/tmp/count", Duration::from_secs(10));
    // A sample can catch a loop's fork before its exec (it shows the parent's
    // command), so the tree is read until it holds just the three.
    let mut before = long_lived(&g);
    wait_until(Duration::from_secs(5), || {
        before = long_lived(&g);
        before.len() == 3
    });
    assert_eq!(
        before.len(),
        3,
        "the init, its child and grandchild: {before:?}"
    );
    crabctl_ok(&["checkpoint", &g.id, "--name", "tree"]);
    let grandchild = before
        .iter()
        .find(|(_, _, args)| args == "sh -c while true; do sleep 1; done")
        .unwrap_or_else(|| panic!("no grandchild in {before:?}"))
        .0;
    g.exec_ok(&["kill", "-9", &grandchild.to_string()]);
    assert!(
        wait_until(Duration::from_secs(5), || long_lived(&g).len() < 3),
        "the grandchild was not killed"
    );
    crabctl_ok(&["rollback", &g.id, "tree"]);
    // The same three processes under the same pids and parents: the tree is whole.
    let mut after = long_lived(&g);
    wait_until(Duration::from_secs(5), || {
        after = long_lived(&g);
        after == before
    });
    assert_eq!(after, before);
}

#[test]
fn a_unix_socket_pair_keeps_talking_after_rollback() {
    let script = "import os, socket, time\n\
        a, b = socket.socketpair()\n\
        n = 0\n\
        while True:\n\
        \x20   n += 1\n\
        \x20   a.sendall(b'%d\\n' % n)\n\
        \x20   got = b.recv(64).strip()\n\
        \x20   open('/tmp/sock.new', 'w').write(got.decode())\n\
        \x20   os.replace('/tmp/sock.new', '/tmp/sock')\n\
        \x20   time.sleep(0.1)\n";
    let g = Guard::run_detached(CRAB, PYTHON, &[], &["python3", "-c", script]);
    wait_for_file(&g, "/tmp/sock", Duration::from_secs(20));
    crabctl_ok(&["checkpoint", &g.id, "--name", "sock"]);
    let at = number(&g, "/tmp/sock");
    crabctl_ok(&["rollback", &g.id, "sock"]);
    let now = number(&g, "/tmp/sock");
    assert!(now + 3 >= at && now < at + 10, "{now} vs {at}");
    assert!(wait_until(Duration::from_secs(5), || number(
        &g,
        "/tmp/sock"
    ) > now + 3));
}

#[test]
fn two_hundred_megabytes_of_memory_come_back_with_the_same_checksum() {
    let script = "import hashlib, os, time\n\
        data = bytearray(os.urandom(1 << 20)) * 200\n\
        for i in range(0, len(data), 4096):\n\
        \x20   data[i] = i % 251\n\
        open('/tmp/before', 'w').write(hashlib.sha256(data).hexdigest())\n\
        while not os.path.exists('/tmp/go'):\n\
        \x20   time.sleep(0.1)\n\
        open('/tmp/after', 'w').write(hashlib.sha256(data).hexdigest())\n\
        while True:\n\
        \x20   time.sleep(1)\n";
    let g = Guard::run_detached(CRAB, PYTHON, &[], &["python3", "-c", script]);
    let before = wait_for_file(&g, "/tmp/before", Duration::from_secs(60));
    crabctl_ok(&["checkpoint", &g.id, "--name", "big"]);
    crabctl_ok(&["rollback", &g.id, "big"]);
    g.exec_ok(&["touch", "/tmp/go"]);
    let after = wait_for_file(&g, "/tmp/after", Duration::from_secs(30));
    assert_eq!(
        after, before,
        "the 200 MB changed across checkpoint and rollback"
    );
    let listing: serde_json::Value =
        serde_json::from_str(&crabctl_ok(&["ls", &g.id, "--json"])).unwrap();
    let bytes = listing[0]["process_bytes"].as_u64().unwrap();
    assert!(
        bytes > 200 << 20,
        "process image of {bytes} bytes cannot hold 200 MB"
    );
}

#[test]
fn node_compiles_webassembly_again_after_a_rollback() {
    let node = wasm::Node::start(&[]);
    crabctl_ok(&["checkpoint", &node.guard.id, "--name", "wasm"]);
    crabctl_ok(&["rollback", &node.guard.id, "wasm"]);
    node.assert_compiles_again(&node.guard);
}
