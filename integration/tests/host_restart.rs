//! Recovery after a host restart: containerd, every shim and every container
//! process killed at once, `/run`'s part of them gone (containerd's state
//! directory, the shims' crab `state_dir` and ttrpc sockets), containerd started
//! again on the same root, then `crabctl restore`. Nothing noticed the crash: no
//! shim's clean-up ran, and the restarted containerd knows the containers but no
//! task. The histories, journals and trees are on disk, as `/var/lib` is after a
//! restart.
//!
//! Each test runs its sandbox on a private containerd of its own
//! ([`SecondContainerd`]), which it may kill without touching the test
//! containerd the other tests share.

// Needs root, CRIU, the store and the images of hack/build-images.sh: built only
// with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::process::Command;
use std::time::{Duration, Instant};

use crab_integration::agent_eval::{fast_forward_lines, newest_seq, restored_from};
use crab_integration::reboot::{self, Timings};
use crab_integration::second_containerd::SecondContainerd;
use crab_integration::*;
use serde_json::Value;

/// The private containerd's name: `/var/lib/crab/containerd-host-restart`,
/// `/run/crab/containerd-host-restart`, `/run/crab/state-host-restart`.
const HOST: &str = "host-restart";

/// A shell that counts in memory (the file only shows the count), and a file.
const COUNTER_AND_FILE: &str = "echo started > /f; i=0; while true; do i=$((i+1)); \
    echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done";

/// The host's containerd for one test, its helpers pointed at it.
fn host_with(images: &[&str]) -> SecondContainerd {
    let mut host = SecondContainerd::start(HOST, images)
        .unwrap_or_else(|e| panic!("the test's own containerd: {e:#}"));
    host.serve_helpers();
    host
}

/// The host restart; prints its steps' times.
fn restart(host: &mut SecondContainerd) -> Timings {
    report(reboot::restart(host))
}

fn report(t: anyhow::Result<Timings>) -> Timings {
    let t = t.unwrap_or_else(|e| panic!("the host restart: {e:#}"));
    eprintln!(
        "host restart: killed in {} ms, /run emptied in {} ms, containerd answered {} ms after its start",
        t.killed.as_millis(),
        t.emptied.as_millis(),
        t.started.as_millis()
    );
    t
}

/// `crabctl -a ADDRESS -n NS restore ID` on `host`, which must succeed; its
/// output and how long it took.
fn restore(host: &SecondContainerd, id: &str) -> (String, Duration) {
    let started = Instant::now();
    let out = Command::new("crabctl")
        .args(["-a", &host.address(), "-n", &host.namespace, "restore", id])
        .env("CRAB_CONFIG", &host.crab_config)
        .output()
        .expect("run crabctl restore");
    let took = started.elapsed();
    let (o, e) = text(&out);
    assert!(out.status.success(), "crabctl restore {id}: {o}{e}");
    eprintln!("{}", o.trim());
    (o, took)
}

/// Nothing of the sandbox runs after the restart, containerd knows no task of
/// it, and its history is read from the store, without a shim.
fn assert_gone_but_listed(g: &Guard, checkpoint: &str) {
    assert_eq!(
        shim_pids(&g.id),
        Vec::<i32>::new(),
        "a shim outlived the restart"
    );
    assert_eq!(
        proxy_pids(&g.id),
        Vec::<i32>::new(),
        "a proxy outlived the restart"
    );
    assert_eq!(
        g.status(),
        None,
        "containerd kept a task across the restart"
    );
    let history: Vec<Value> =
        serde_json::from_str(&crabctl_ok(&["ls", &g.id, "--json"])).expect("crabctl ls --json");
    assert!(
        history.iter().any(|e| e["name"] == checkpoint),
        "checkpoint {checkpoint} is not listed after the restart: {history:#?}"
    );
}

/// Claude Code's output and its proxy's log, for a failure's message.
fn what_the_sandbox_said(g: &Guard) -> String {
    let pid = g.pid();
    let proxy_log = state_dir()
        .join(namespace())
        .join(format!("{}.proxy.log", g.id));
    format!(
        "stdout: {}\nstderr: {}\nproxy log: {}",
        claude::read_inside(pid, "/tmp/claude.out").unwrap_or_default(),
        claude::read_inside(pid, "/tmp/claude.err").unwrap_or_default(),
        std::fs::read_to_string(&proxy_log)
            .unwrap_or_else(|e| format!("{}: {e}", proxy_log.display()))
    )
}

fn count(g: &Guard) -> u64 {
    g.number("/tmp/count")
}

#[test]
fn a_busybox_sandbox_comes_back_after_a_host_restart_with_the_files_and_the_count_in_memory_of_its_checkpoint(
) {
    busybox_comes_back_after(restart, "busybox");
}

/// The shims' sockets kept, dead, across the restart: the restored container's
/// shim binds its own again (its `start` removes the dead one first).
#[test]
fn a_busybox_sandbox_comes_back_after_a_host_restart_that_left_its_shims_dead_socket() {
    busybox_comes_back_after(
        |host| {
            let sockets = host.shim_sockets();
            assert_eq!(sockets.len(), 1, "one shim socket: {sockets:?}");
            let t = report(reboot::restart_keeping_shim_sockets(host));
            let dead = std::os::unix::net::UnixStream::connect(&sockets[0]);
            assert_eq!(
                dead.map_err(|e| e.kind()).err(),
                Some(std::io::ErrorKind::ConnectionRefused),
                "{} is not a dead socket after the restart",
                sockets[0].display()
            );
            t
        },
        "busybox, its shim's dead socket kept",
    );
}

/// A busybox counter and file, a checkpoint, more writes, the restart `restart`
/// makes, and `crabctl restore`: the checkpoint's files and count come back.
fn busybox_comes_back_after(restart: impl FnOnce(&mut SecondContainerd) -> Timings, what: &str) {
    let mut host = host_with(&["busybox"]);
    let g = Guard::sh(COUNTER_AND_FILE);
    assert!(wait_until(Duration::from_secs(20), || g
        .exec(&["test", "-e", "/tmp/count"])
        .status
        .success()));
    assert!(wait_until(Duration::from_secs(20), || count(&g) >= 5));
    g.exec_ok(&["sh", "-c", "echo checkpointed > /f"]);
    let at = count(&g);
    crabctl_ok(&["checkpoint", &g.id, "--name", "before-restart"]);
    // What the restart loses: written after the checkpoint.
    g.exec_ok(&["sh", "-c", "echo lost > /f && echo lost > /lost"]);
    let old_shims = shim_pids(&g.id);
    assert_eq!(old_shims.len(), 1, "one shim serves {}", g.id);

    restart(&mut host);
    assert_gone_but_listed(&g, "before-restart");

    let (out, took) = restore(&host, &g.id);
    assert!(
        out.contains("restored from checkpoint before-restart"),
        "{out}"
    );
    eprintln!(
        "{what}: crabctl restore after the host restart took {} ms",
        took.as_millis()
    );
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    let shims = shim_pids(&g.id);
    assert_eq!(shims.len(), 1, "one shim after the restore: {shims:?}");
    assert_ne!(shims, old_shims);
    // The count goes on from the checkpoint's (a new start would count from 1),
    // and the files are the checkpoint's.
    let now = count(&g);
    assert!(
        now >= at && now < at + 25,
        "count {now} after the restore, {at} at the checkpoint"
    );
    assert!(
        wait_until(Duration::from_secs(5), || count(&g) > now),
        "the restored counter does not count"
    );
    assert_eq!(g.exec_ok(&["cat", "/f"]).trim(), "checkpointed");
    assert_eq!(g.exec(&["test", "-e", "/lost"]).status.code(), Some(1));
    // A whole task again: it checkpoints.
    crabctl_ok(&["checkpoint", &g.id, "--name", "after-restart"]);
}

/// The evaluation task both agents run (`eval/trajectories/data-sales.json`).
const TASK: &str = "data-sales";

/// The step held across the restart: the `awk` that writes the cleaned data,
/// after read-only turns, so the turn asking for it is a skip and its
/// restore is a fast-forward from an older image.
const HELD_STEP: usize = 8;

#[test]
fn claude_code_held_after_a_durable_checkpoint_comes_back_after_a_host_restart_fast_forwarded_and_ends_verified(
) {
    let mut host = host_with(&["agent"]);
    let t = trajectory::load(TASK);
    let steps = trajectory::claude_steps(&t);
    let n = steps.len();
    assert!(
        matches!(&steps[HELD_STEP], anthropic::Step::Tool("Bash", input)
            if input["command"].as_str().is_some_and(|c| c.contains("> stage/clean.csv"))),
        "step {HELD_STEP} is no longer the write of the cleaned data: {:?}",
        steps[HELD_STEP]
    );
    let llm = anthropic::Scripted::start(steps);
    llm.hold_step(HELD_STEP);
    let g = claude::run(&llm, &t.title, claude::STATE_PATHS);
    assert!(
        llm.wait_held(Duration::from_secs(300)),
        "Claude Code never asked for step {HELD_STEP}: {:#?}\n{}",
        claude::requests(&llm),
        what_the_sandbox_said(&g)
    );
    // The turn asking for it is durable before the restart: each Messages
    // request is a turn, the held one included, after the sandbox's start.
    let asking = llm.seen().iter().filter(|s| s.is_message()).count() as u64 + 1;
    assert!(
        wait_until(Duration::from_secs(30), || newest_seq(&g.id) == asking),
        "the turn asking for step {HELD_STEP} is not recorded as seq {asking}"
    );

    restart(&mut host);
    assert_gone_but_listed(&g, &asking.to_string());
    // The LLM answers the request the restart cut, to nobody.
    llm.let_go();

    let (out, took) = restore(&host, &g.id);
    assert_eq!(restored_from(&out), asking);
    claude::finishes(&g, &llm, Duration::from_secs(900));
    let lines = fast_forward_lines(&g);
    eprintln!(
        "Claude Code: crabctl restore after the host restart took {} ms\n{}",
        took.as_millis(),
        lines.join("\n")
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("answers replayed") && l.contains("then live")),
        "no fast-forward: {lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("diverged")),
        "the fast-forward diverged: {lines:#?}"
    );
    // The journal answered the steps before the held one; the held one, never
    // released before the restart, was asked again.
    let mut times = vec![0; n];
    for step in llm.seen().iter().filter_map(|s| s.step) {
        times[step] += 1;
    }
    let mut expected = vec![1; n];
    expected[HELD_STEP] = 2;
    assert_eq!(times, expected, "{:#?}", claude::requests(&llm));
    let ending = trajectory::ending(&namespace(), &g.id, &t);
    eprintln!("{ending:?}");
    assert!(ending.verified, "{TASK}'s verify fails after the restart");
}
