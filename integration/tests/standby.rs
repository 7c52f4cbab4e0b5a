//! Standby replicas (docs/standby.md): a container that asks for one keeps its
//! newest checkpoint (or the one it last rolled back to) restored and stopped,
//! and a rollback to that checkpoint adopts it. Every check of the slow path
//! holds: the counter in memory and the files are the checkpoint's, the task
//! keeps its id, and nothing of a replica outlives its container or its shim.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_integration::crash::Crashable;
use crab_integration::*;

/// Counts in memory and writes the count to a file, five times a second.
const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done";

const ASK_FOR_STANDBY: &[&str] = &["--annotation", "io.crab.standby=true"];

fn count(g: &Guard) -> u64 {
    g.number("/tmp/count")
}

fn counter(flags: &[&str]) -> Guard {
    let g = Guard::run_detached(CRAB, BUSYBOX, flags, &["sh", "-c", COUNTER]);
    assert!(
        wait_until(Duration::from_secs(10), || count(&g) >= 3),
        "counter did not count"
    );
    g
}

/// The standby `crabctl stats` shows: (checkpoint seq, init pid).
fn standby(id: &str) -> Option<(u64, i32)> {
    let out = crabctl_ok(&["stats", id, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let s = &v["standby"];
    Some((s["seq"].as_u64()?, s["pid"].as_i64()? as i32))
}

fn wait_for_standby(id: &str, seq: u64) -> i32 {
    let mut pid = 0;
    assert!(
        wait_until(Duration::from_secs(20), || match standby(id) {
            Some((s, p)) if s == seq => {
                pid = p;
                true
            }
            _ => false,
        }),
        "no standby of checkpoint {seq} for {id}: {:?}",
        standby(id)
    );
    pid
}

/// The seq of the newest checkpoint.
fn newest_seq(id: &str) -> u64 {
    let out = crabctl_ok(&["ls", id, "--json"]);
    let v: Vec<serde_json::Value> =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v.last()
        .and_then(|e| e["seq"].as_u64())
        .expect("a checkpoint")
}

/// Host pids of processes in a standby cgroup of container `id`.
fn standby_processes(id: &str) -> Vec<i32> {
    let needle = format!("/{id}@standby-");
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|c| c.contains(&needle))
        })
        .collect()
}

/// The options of the container's root mount, as its processes see it.
fn root_mount_options(g: &Guard) -> String {
    let info = g.exec_ok(&["cat", "/proc/self/mountinfo"]);
    info.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(4) == Some(&"/"))
        .and_then(|f| f.get(5).map(|s| s.to_string()))
        .unwrap_or_else(|| panic!("no root mount in {info}"))
}

/// State letter of process `pid` (`T`: stopped).
fn state_of(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.trim().chars().next()
}

/// Rolls `g` back to `name` and checks what the slow path's tests check: the
/// count is the dumped one (within `range`), `/mark` holds `mark`, the process
/// counts on. Answers whether a standby was adopted.
fn roll_back_and_check(g: &Guard, name: &str, range: std::ops::Range<u64>, mark: &str) -> bool {
    let out = crabctl_ok(&["rollback", &g.id, name]);
    assert!(out.contains("processes and files restored"), "{out}");
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    let now = count(g);
    assert!(
        range.contains(&now),
        "count {now} after the rollback to {name}: expected {range:?} ({out})"
    );
    assert_eq!(g.exec_ok(&["cat", "/mark"]).trim(), mark, "{out}");
    assert!(
        wait_until(Duration::from_secs(5), || count(g) > now),
        "the process does not count after the rollback to {name} ({out})"
    );
    out.contains("standby adopted")
}

#[test]
fn a_rollback_to_the_checkpoint_a_standby_holds_adopts_it_and_restores_memory_and_files() {
    let g = counter(ASK_FOR_STANDBY);
    g.exec_ok(&["sh", "-c", "echo base > /mark"]);
    let before = count(&g);
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    let seq = newest_seq(&g.id);
    for round in 0..5 {
        let standby_pid = wait_for_standby(&g.id, seq);
        assert_eq!(
            state_of(standby_pid),
            Some('T'),
            "the standby is not stopped"
        );
        g.exec_ok(&["sh", "-c", "echo later > /mark; echo x > /later.txt"]);
        let old_pid = g.pid();
        let later = count(&g) + 5;
        assert!(wait_until(Duration::from_secs(10), || count(&g) >= later));
        let adopted = roll_back_and_check(&g, "base", before..later, "base");
        assert!(
            adopted,
            "round {round}: the rollback did not adopt the standby"
        );
        assert_eq!(g.pid(), standby_pid, "the task's init is not the standby's");
        // As every container's root: setuid programs work (the pool is nosuid).
        let options = root_mount_options(&g);
        assert!(!options.contains("nosuid"), "root mounted {options}");
        assert_ne!(g.pid(), old_pid);
        assert_eq!(g.exec(&["test", "-e", "/later.txt"]).status.code(), Some(1));
    }
}

#[test]
fn node_adopted_from_a_standby_compiles_webassembly_again() {
    let node = wasm::Node::start(ASK_FOR_STANDBY);
    let g = &node.guard;
    crabctl_ok(&["checkpoint", &g.id, "--name", "wasm"]);
    let standby_pid = wait_for_standby(&g.id, newest_seq(&g.id));
    assert_eq!(
        state_of(standby_pid),
        Some('T'),
        "the standby is not stopped"
    );
    let out = crabctl_ok(&["rollback", &g.id, "wasm"]);
    assert!(out.contains("standby adopted"), "{out}");
    node.assert_compiles_again(g);
}

/// The spec's cgroup mount, as Docker, Kubernetes and containerd's CRI give every
/// container (`ctr`'s default spec has none).
const CGROUP_VIEW: &[&str] = &[
    "--mount",
    "type=cgroup,src=cgroup,dst=/sys/fs/cgroup,options=ro:nosuid:noexec:nodev",
];

#[test]
fn a_container_that_adopted_its_standby_sees_its_own_cgroup_files() {
    let flags = [
        ASK_FOR_STANDBY,
        &["--memory-limit", "268435456"],
        CGROUP_VIEW,
    ]
    .concat();
    let g = counter(&flags);
    let (limit, procs) = g.cgroup_view();
    assert_eq!(limit, "268435456");
    assert!(
        procs.lines().any(|p| p == "1"),
        "the init is not in {procs:?}"
    );
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    let seq = newest_seq(&g.id);
    wait_for_standby(&g.id, seq);
    let events = Events::subscribe();
    let out = crabctl_ok(&["rollback", &g.id, "base"]);
    assert!(out.contains("standby adopted"), "{out}");
    // In the container's own cgroup of every hierarchy, by whatever name the
    // replica's had before.
    let own = std::fs::read_to_string(format!("/proc/{}/cgroup", g.pid())).unwrap();
    for line in own
        .lines()
        .filter(|l| l.contains(":memory:") || l.contains(":pids:"))
    {
        assert!(
            line.ends_with(&format!("/{}", g.id)),
            "the adopted init is in {line}"
        );
    }
    // What the container's cgroups held is removed in the background (the
    // next replica is made after it): no OOM event for that removal.
    wait_for_standby(&g.id, seq);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !events.topics_for(&g.id).iter().any(|t| t == "/tasks/oom"),
        "an OOM event without an OOM: {:?}",
        events.topics_for(&g.id)
    );
    // The replica's own cgroups are gone by now: its view must not have shown them.
    let (limit, procs) = g.cgroup_view();
    assert_eq!(limit, "268435456", "after the adoption");
    assert!(
        procs.lines().any(|p| p == "1"),
        "the adopted init is not in the view's {procs:?}"
    );
    let write = g.exec(&[
        "sh",
        "-c",
        "echo 1 > /sys/fs/cgroup/pids/pids.max || echo 1 > /sys/fs/cgroup/pids.max",
    ]);
    assert_ne!(write.status.code(), Some(0), "the view is writable");
    // The adopted container's memory limit holds, and its OOM is reported.
    let hog = g.exec(&["dd", "if=/dev/zero", "of=/dev/null", "bs=300M", "count=1"]);
    assert_ne!(hog.status.code(), Some(0), "300 MiB fit under 256 MiB");
    assert!(
        events.wait_for("/tasks/oom", &g.id, Duration::from_secs(10)),
        "no /tasks/oom event after the adoption: {:?}",
        events.topics_for(&g.id)
    );
}

/// What the inspector makes of the turn so far (`crabctl turn --dry-run`).
fn turn_kind(g: &Guard) -> String {
    let out = crabctl_ok(&["turn", &g.id, "--dry-run", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v["classification"]["kind"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn the_inspector_follows_a_container_that_adopted_its_standby() {
    let g = Guard::run_detached(CRAB, BUSYBOX, ASK_FOR_STANDBY, &["sleep", "1000000"]);
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    wait_for_standby(&g.id, newest_seq(&g.id));
    g.exec_ok(&["sh", "-c", "echo later > /later"]);
    let out = crabctl_ok(&["rollback", &g.id, "base"]);
    assert!(out.contains("standby adopted"), "{out}");
    // The state is base's, which the newest entry does not describe.
    assert_ne!(turn_kind(&g), "skip", "a turn after the rollback");
    crabctl_ok(&["checkpoint", &g.id, "--name", "after"]);
    // Nothing ran since: a skip (so that the check below can fail).
    assert_eq!(turn_kind(&g), "skip", "an idle turn after the adoption");
    // A file written by an exec, in the adopted container's cgroup, is seen
    // as such: the inspector records that cgroup's events.
    g.exec_ok(&["sh", "-c", "echo new > /new"]);
    assert_eq!(turn_kind(&g), "fs-only", "a turn that wrote a file");
    let out = crabctl_ok(&["inspect", &g.id]);
    assert!(
        out.contains(&format!("{}", g.pid())),
        "the adopted init is not among the container's pids: {out}"
    );
}

#[test]
fn twenty_rollbacks_between_two_checkpoints_land_on_each_with_or_without_a_standby() {
    let g = counter(ASK_FOR_STANDBY);
    g.exec_ok(&["sh", "-c", "echo a > /mark"]);
    let at_a = count(&g);
    crabctl_ok(&["checkpoint", &g.id, "--name", "a"]);
    let seq_a = newest_seq(&g.id);
    // The count in memory may be one ahead of the file's, and under load the
    // counter (a tick per 200 ms) goes on for a tick or two between the rollback's
    // end and the read: the window stays below the other checkpoint's count.
    let after_a = count(&g) + 4;
    assert!(wait_until(Duration::from_secs(10), || count(&g) >= after_a + 3));
    g.exec_ok(&["sh", "-c", "echo b > /mark"]);
    let at_b = count(&g);
    crabctl_ok(&["checkpoint", &g.id, "--name", "b"]);
    let seq_b = newest_seq(&g.id);
    let after_b = count(&g) + 4;
    let mut adopted = 0;
    // a a b b a a ...: the first of each pair restores from the images (the
    // standby holds the other checkpoint), the second adopts the replica made
    // after the first.
    for i in 0..20 {
        let (name, seq, range) = if (i / 2) % 2 == 0 {
            ("a", seq_a, at_a..after_a)
        } else {
            ("b", seq_b, at_b..after_b)
        };
        if i % 2 == 1 {
            wait_for_standby(&g.id, seq);
        }
        g.exec_ok(&["sh", "-c", "echo moved > /mark"]);
        let was = roll_back_and_check(&g, name, range, name);
        if i % 2 == 1 {
            assert!(was, "rollback {i} to {name}: the standby was not adopted");
            adopted += 1;
        }
    }
    assert_eq!(adopted, 10);
}

#[test]
fn a_container_that_does_not_ask_keeps_no_standby() {
    let g = counter(&[]);
    g.exec_ok(&["sh", "-c", "echo base > /mark"]);
    let before = count(&g);
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(standby(&g.id), None);
    assert!(standby_processes(&g.id).is_empty());
    let adopted = roll_back_and_check(&g, "base", before..before + 50, "base");
    assert!(!adopted);
}

#[test]
fn deleting_a_container_kills_its_standby() {
    let g = counter(ASK_FOR_STANDBY);
    crabctl_ok(&["checkpoint", &g.id]);
    let pid = wait_for_standby(&g.id, newest_seq(&g.id));
    assert!(standby_processes(&g.id).contains(&pid));
    let id = g.id.clone();
    drop(g);
    assert!(
        wait_until(Duration::from_secs(10), || standby_processes(&id)
            .is_empty()),
        "the standby's processes outlived their container: {:?}",
        standby_processes(&id)
    );
    assert!(
        state_of(pid).is_none(),
        "the standby's init {pid} is still there"
    );
}

/// The shim dies at `point` while it adopts a standby (rolling back to `base`
/// while a newer checkpoint exists): `crabctl restore` brings back the newest
/// durable checkpoint whole, never a mix of the two, and the replica's stopped
/// processes are gone once a shim starts again.
fn shim_killed_while_adopting(point: &str) {
    let c = Crashable::start_with("[standby]\nenabled = true\n");
    let g = &c.guard;
    g.exec_ok(&["sh", "-c", "echo base > /mark"]);
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    let base = newest_seq(&g.id);
    g.exec_ok(&["sh", "-c", "echo newer > /mark"]);
    let at_newer = c.count();
    crabctl_ok(&["checkpoint", &g.id, "--name", "newer"]);
    // After the newer checkpoint's replica, a rollback to base makes base's.
    wait_for_standby(&g.id, newest_seq(&g.id));
    crabctl_ok(&["rollback", &g.id, "base"]);
    wait_for_standby(&g.id, base);
    let out = c.crash_during(&format!("shim:{point}"), &["rollback", &g.id, "base"]);
    assert!(!out.status.success(), "the rollback survived the crash");
    c.wait_gone();
    let out = crabctl_ok(&["restore", &g.id]);
    assert!(out.contains("restored from checkpoint newer"), "{out}");
    assert_eq!(g.exec_ok(&["cat", "/mark"]).trim(), "newer");
    let now = c.count();
    assert!(
        now >= at_newer && now < at_newer + 25,
        "count {now}, {at_newer} at newer"
    );
    c.assert_runs("the restore");
    assert!(
        wait_until(Duration::from_secs(10), || standby_processes(&g.id)
            .is_empty()),
        "stopped standby processes outlived the crashed shim: {:?}",
        standby_processes(&g.id)
    );
}

#[test]
fn a_shim_killed_after_the_trees_were_exchanged_restores_the_newest_checkpoint_whole() {
    shim_killed_while_adopting("standby.exchanged");
}

#[test]
fn a_shim_killed_after_the_processes_moved_restores_the_newest_checkpoint_whole() {
    shim_killed_while_adopting("standby.moved");
}

/// `crabctl stats ID --json`'s standby fields: (why there is none, how many
/// were dropped for memory).
fn standby_missing(id: &str) -> (Option<String>, u64) {
    let out = crabctl_ok(&["stats", id, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    (
        v["standby_missing"].as_str().map(str::to_string),
        v["standby_dropped"].as_u64().unwrap_or(0),
    )
}

/// A counter asking for replicas, its shims configured with `[standby] TOML`.
fn counter_with_standby_budget(toml: &str) -> Guard {
    let config = config_with(&format!("[standby]\n{toml}\n"));
    let path = config.to_string_lossy().to_string();
    let mut flags = ASK_FOR_STANDBY.to_vec();
    flags.extend(["--runtime-config-path", &path]);
    counter(&flags)
}

#[test]
fn no_standby_is_made_when_the_host_lacks_the_memory_it_must_leave_free() {
    // A floor no host reaches: 100 TiB.
    let g = counter_with_standby_budget("min_available_mib = 104857600");
    g.exec_ok(&["sh", "-c", "echo base > /mark"]);
    let before = count(&g);
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    assert!(
        wait_until(Duration::from_secs(10), || standby_missing(&g.id)
            .0
            .is_some()),
        "no reason given for the missing standby"
    );
    let (why, dropped) = standby_missing(&g.id);
    let why = why.unwrap();
    assert!(why.contains("min_available_mib"), "{why}");
    assert_eq!(dropped, 0);
    assert_eq!(standby(&g.id), None);
    assert!(standby_processes(&g.id).is_empty());
    let stats = crabctl_ok(&["stats", &g.id]);
    assert!(stats.contains("standby: none ("), "{stats}");
    assert!(!roll_back_and_check(
        &g,
        "base",
        before..before + 50,
        "base"
    ));
}

#[test]
fn a_standby_is_dropped_once_the_host_runs_short_of_memory_and_the_rollback_still_lands() {
    // The floor sits 3 GiB under what is free now; a process on the host then
    // takes 6 GiB.
    let floor = available_mib().saturating_sub(3 * 1024);
    let g = counter_with_standby_budget(&format!("min_available_mib = {floor}"));
    g.exec_ok(&["sh", "-c", "echo base > /mark"]);
    let before = count(&g);
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    let pid = wait_for_standby(&g.id, newest_seq(&g.id));
    let mut hog = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, time\nb = b'\\x01' * (6 << 30)\nprint('held', flush=True)\ntime.sleep(120)",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start python3");
    let dropped = wait_until(Duration::from_secs(30), || standby_missing(&g.id).1 == 1);
    let _ = hog.kill();
    let _ = hog.wait();
    assert!(
        dropped,
        "the standby was not dropped (floor {floor} MiB, now {} MiB free): {:?}",
        available_mib(),
        standby_missing(&g.id)
    );
    let (why, _) = standby_missing(&g.id);
    assert!(
        why.as_deref().is_some_and(|w| w.contains("dropped")),
        "{why:?}"
    );
    assert!(
        wait_until(Duration::from_secs(10), || state_of(pid).is_none()),
        "the dropped standby's init {pid} is still there"
    );
    assert!(standby_processes(&g.id).is_empty());
    // The rollback takes the slow way, and lands.
    g.exec_ok(&["sh", "-c", "echo later > /mark"]);
    assert!(!roll_back_and_check(
        &g,
        "base",
        before..before + 50,
        "base"
    ));
}
