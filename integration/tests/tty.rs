//! Checkpoints of containers with a terminal (`ctr run -t`): the shell on the terminal
//! is dumped with its pty slave as external, and restored on a new pty whose master
//! goes to the task's client; the restored shell answers what is typed at it.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_integration::pty::Pty;
use crab_integration::*;

const T: Duration = Duration::from_secs(15);

/// A background loop of the interactive shell: counts in memory, writes the count.
const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; \
                       mv /tmp/count.new /tmp/count; sleep 0.2; done &\n";

/// Answers `has-5-ctty` when the shell (the init) has a controlling terminal.
const CTTY: &str = "read -r pid comm state ppid pgrp sid tty rest < /proc/1/stat; \
                    [ $tty != 0 ] && echo x > /dev/tty && echo has-$((2+3))-ctty\n";

/// A checkpoint image, removed from containerd when dropped.
struct Ref(String);

impl Drop for Ref {
    fn drop(&mut self) {
        let _ = ctr_run(&["images", "rm", &self.0], None, Duration::from_secs(20));
    }
}

fn count(g: &Guard) -> u64 {
    g.number("/tmp/count")
}

/// Types `line` and waits for `answer` after it: the shell ran it (the echo of the
/// typed line never holds the answer, which the shell computes).
fn ask(client: &mut Pty, line: &str, answer: &str) {
    let mark = client.mark();
    client.send(line);
    assert!(
        client.wait_for_after(mark, answer, T),
        "no {answer:?} after typing {line:?}; the terminal shows:\n{}",
        client.output()
    );
}

/// `ctr run -t` of an interactive busybox shell with a counter running, on a terminal.
fn shell() -> (Guard, Pty) {
    let g = Guard::new(&unique_id("tty"));
    let mut client = Pty::ctr(&["run", "-t", "--runtime", CRAB, BUSYBOX, &g.id, "sh"]);
    ask(&mut client, "echo up-$((20+1))\n", "up-21");
    client.send(COUNTER);
    assert!(
        wait_until(T, || g.exec(&["cat", "/tmp/count"]).status.success()
            && count(&g) >= 5),
        "the counter did not count; the terminal shows:\n{}",
        client.output()
    );
    (g, client)
}

#[test]
fn a_terminal_shell_restored_live_keeps_its_memory_and_answers_its_new_client() {
    let (g, mut client) = shell();
    ask(&mut client, "secret=$((6*7)); echo set-$secret\n", "set-42");
    let reference = Ref(format!("crab.test/checkpoint/{}:1", unique_id("tty")));
    let before = count(&g);
    ctr_ok(&["container", "checkpoint", "--task", &g.id, &reference.0]);
    assert!(client.running(), "the client left at the checkpoint");
    ask(&mut client, "echo still-$secret\n", "still-42");
    g.remove();
    drop(client);

    let r = Guard::new(&unique_id("tty-r"));
    let mut restored = Pty::ctr(&["container", "restore", "--live", &r.id, &reference.0]);
    assert!(
        wait_until(T, || r.status().as_deref() == Some("RUNNING")),
        "restored task: {:?}; the terminal shows:\n{}",
        r.status(),
        restored.output()
    );
    // The shell's own memory, through the new terminal.
    ask(&mut restored, "echo again-$secret\n", "again-42");
    let first = count(&r);
    assert!(
        first >= before,
        "count {first} after restore, {before} at the dump"
    );
    assert!(
        wait_until(T, || count(&r) > first),
        "the restored counter does not count"
    );
    // Output of a command reaches the client; the terminal is the shell's controlling
    // terminal again (field 7 of stat), and /dev/tty works.
    ask(
        &mut restored,
        "[ -t 0 ] && echo is-a-$((1+1))-tty\n",
        "is-a-2-tty",
    );
    ask(&mut restored, CTTY, "has-5-ctty");
    drop(r);
}

#[test]
fn rollback_of_a_terminal_shell_keeps_its_client_attached() {
    let (g, mut client) = shell();
    ask(&mut client, CTTY, "has-5-ctty");
    // A window size of its own: the new terminal must get it back.
    ask(
        &mut client,
        "stty rows 22 cols 77; v=before-$((1+1)); echo $v\n",
        "before-2",
    );
    // Read before the checkpoint: the count goes on after it.
    let at = count(&g);
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    ask(
        &mut client,
        "v=after-$((2+2)); touch /after; echo $v\n",
        "after-4",
    );
    let later = count(&g) + 10;
    assert!(wait_until(T, || count(&g) >= later));
    let old_pid = g.pid();

    let out = crabctl_ok(&["rollback", &g.id, "base"]);
    assert!(out.contains("processes and files restored"), "{out}");
    assert_ne!(g.pid(), old_pid, "the init was not replaced");
    assert!(client.running(), "the client left at the rollback");
    ask(&mut client, "echo now-$v\n", "now-before-2");
    ask(&mut client, "echo size-$(stty size)\n", "size-22 77");
    ask(&mut client, CTTY, "has-5-ctty");
    let now = count(&g);
    assert!(
        (at..later).contains(&now),
        "count {now} after rollback: expected the dumped value (>= {at}, < {later})"
    );
    assert!(
        wait_until(T, || count(&g) > now),
        "the restored counter does not count"
    );
    assert_eq!(
        g.exec(&["test", "-e", "/after"]).status.code(),
        Some(1),
        "a file written after the checkpoint survived"
    );
    // Twice: the new terminal is checkpointed and rolled back as the first was.
    crabctl_ok(&["checkpoint", &g.id, "--name", "second"]);
    ask(&mut client, "v=third; echo $v-$((3*3))\n", "third-9");
    crabctl_ok(&["rollback", &g.id, "second"]);
    ask(&mut client, "echo again-$v\n", "again-before-2");
}

#[test]
fn a_fork_of_a_terminal_shell_gets_a_terminal_of_its_own() {
    let (g, mut client) = shell();
    let at = count(&g);
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    let prefix = unique_id("ttyfork");
    let f = Guard::new(&format!("{prefix}-1"));
    // crabctl's task has no terminal and no client: the fork gets a new pty anyway
    // (its processes had one), whose output the shim reads and drops.
    crabctl_ok(&["fork", &g.id, "base", "--prefix", &prefix]);
    assert_eq!(f.status().as_deref(), Some("RUNNING"));
    let first = count(&f);
    assert!(first >= at, "the fork counts afresh: {first} < {at}");
    assert!(
        wait_until(T, || count(&f) > first),
        "the fork does not count"
    );
    let stat = f.exec_ok(&["cat", "/proc/1/stat"]);
    let tty_nr = stat.split_whitespace().nth(6).unwrap_or("0");
    assert_ne!(
        tty_nr, "0",
        "the fork's shell has no controlling terminal: {stat}"
    );
    // The original keeps its own terminal and client.
    ask(&mut client, "echo own-$((5+5))\n", "own-10");
}

#[test]
fn a_checkpoint_during_a_foreground_job_is_refused_and_the_shell_goes_on() {
    // CRIU dumps the shell's /dev/tty only while the shell's own group is in the
    // foreground: the documented limit, with CRIU's error, and nothing broken.
    let (g, mut client) = shell();
    client.send("sleep 60\n");
    assert!(wait_until(T, || g
        .exec_ok(&["ps"])
        .lines()
        .any(|l| l.contains("sleep 60"))));
    let out = crabctl(&["checkpoint", &g.id], &[]);
    let (o, e) = text(&out);
    assert!(!out.status.success(), "checkpoint succeeded: {o}");
    assert!(e.contains("ctty"), "not CRIU's terminal error: {e}");
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    client.send("\x03");
    ask(&mut client, "echo back-$((3+4))\n", "back-7");
    crabctl_ok(&["checkpoint", &g.id]);
}
