//! Crab's own checkpoints through `crabctl` (the shim's control socket): history,
//! retention, and rollback in place of processes and files.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crab_integration::*;

/// Counts in memory and writes the count to a file, five times a second.
const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done";

fn count(g: &Guard) -> u64 {
    g.number("/tmp/count")
}

fn counter(flags: &[&str]) -> Guard {
    let g = Guard::run_detached(CRAB, BUSYBOX, flags, &["sh", "-c", COUNTER]);
    assert!(
        wait_until(Duration::from_secs(10), || count(&g) >= 5),
        "counter did not count"
    );
    g
}

fn entries(id: &str) -> Vec<serde_json::Value> {
    let out = crabctl_ok(&["ls", id, "--json"]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn seqs(id: &str) -> Vec<u64> {
    entries(id)
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect()
}

/// Where the shim keeps the CRIU images of checkpoint `seq` of container `id`.
fn criu_images(id: &str, seq: u64) -> std::path::PathBuf {
    std::path::Path::new("/var/lib/crab/checkpoints")
        .join(namespace())
        .join(id)
        .join(seq.to_string())
        .join("criu")
}

#[test]
fn rollback_in_place_restores_memory_and_files_and_keeps_the_task() {
    let g = counter(&[]);
    let before = count(&g);
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    let old_pid = g.pid();
    g.exec_ok(&["sh", "-c", "echo later > /later.txt"]);
    let later = count(&g) + 10;
    assert!(wait_until(Duration::from_secs(10), || count(&g) >= later));

    let out = crabctl_ok(&["rollback", &g.id, "base"]);
    assert!(out.contains("processes and files restored"), "{out}");
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    assert_ne!(g.pid(), old_pid, "the init was not replaced");
    let now = count(&g);
    assert!(
        (before..later).contains(&now),
        "count {now} after rollback: expected the dumped value (>= {before}, < {later})"
    );
    assert!(
        wait_until(Duration::from_secs(5), || count(&g) > now),
        "the restored process does not count"
    );
    let gone = g.exec(&["test", "-e", "/later.txt"]);
    assert_eq!(
        gone.status.code(),
        Some(1),
        "a file written after the checkpoint survived"
    );
}

#[test]
fn checkpoint_and_rollback_repeat_many_times() {
    let g = counter(&[]);
    for round in 0..5 {
        let name = format!("round{round}");
        crabctl_ok(&["checkpoint", &g.id, "--name", &name]);
        let at = count(&g);
        g.exec_ok(&["sh", "-c", &format!("echo {round} > /round")]);
        crabctl_ok(&["rollback", &g.id, &name]);
        let now = count(&g);
        assert!(
            now >= at.saturating_sub(1) && now < at + 5,
            "round {round}: {now} vs {at}"
        );
        let round_file = g.exec(&["cat", "/round"]);
        let expected = if round == 0 {
            None
        } else {
            Some(format!("{}", round - 1))
        };
        let (o, _) = text(&round_file);
        assert_eq!(
            round_file.status.success().then(|| o.trim().to_string()),
            expected,
            "round {round}: /round"
        );
        // Write it again, as the next round's checkpoint should see it.
        g.exec_ok(&["sh", "-c", &format!("echo {round} > /round")]);
    }
    assert_eq!(seqs(&g.id), vec![1, 2, 3, 4, 5]);
}

#[test]
fn output_after_a_rollback_still_reaches_the_client() {
    let id = unique_id("out");
    let _guard = Guard::new(&id);
    let mut run = ctr()
        .args(["run", "--runtime", CRAB, BUSYBOX, &id, "sh", "-c"])
        .arg("i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("ctr run");
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let stdout = run.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(l);
        }
    });
    assert!(wait_until(Duration::from_secs(10), || lines
        .lock()
        .unwrap()
        .len()
        >= 5));
    crabctl_ok(&["checkpoint", &id]);
    assert!(wait_until(Duration::from_secs(10), || lines
        .lock()
        .unwrap()
        .len()
        >= 15));
    crabctl_ok(&["rollback", &id, "1"]);
    let seen = lines.lock().unwrap().len();
    assert!(
        wait_until(Duration::from_secs(10), || lines.lock().unwrap().len()
            >= seen + 5),
        "no output after the rollback"
    );
    // The restored process repeats numbers it had printed: it went back in time.
    let all = lines.lock().unwrap().clone();
    let last: Vec<u64> = all
        .iter()
        .filter_map(|l| l.strip_prefix("tick ")?.parse().ok())
        .collect();
    assert!(
        last.windows(2).any(|w| w[1] < w[0]),
        "the counter never went back: {last:?}"
    );
    let _ = run.kill();
    let _ = run.wait();
}

#[test]
fn fs_only_checkpoint_rolls_back_files_and_keeps_processes() {
    let g = counter(&[]);
    g.exec_ok(&["sh", "-c", "echo one > /state"]);
    crabctl_ok(&["checkpoint", &g.id, "--kind", "fs-only", "--name", "files"]);
    g.exec_ok(&["sh", "-c", "echo two > /state && echo new > /new"]);
    let pid = g.pid();
    let before = count(&g);
    let out = crabctl_ok(&["rollback", &g.id, "files"]);
    assert!(out.contains("processes kept"), "{out}");
    assert_eq!(g.pid(), pid);
    assert_eq!(g.exec_ok(&["cat", "/state"]).trim(), "one");
    assert_eq!(g.exec(&["test", "-e", "/new"]).status.code(), Some(1));
    // The process kept its memory: it goes on from where it was.
    assert!(wait_until(Duration::from_secs(5), || count(&g) > before));
}

#[test]
fn process_only_checkpoint_shares_the_earlier_snapshot() {
    let g = counter(&[]);
    let refused = crabctl(&["checkpoint", &g.id, "--kind", "process-only"], &[]);
    assert!(
        !refused.status.success(),
        "a first process-only checkpoint was accepted"
    );
    crabctl_ok(&["checkpoint", &g.id]);
    crabctl_ok(&["checkpoint", &g.id, "--kind", "process-only"]);
    crabctl_ok(&["checkpoint", &g.id, "--kind", "fs-only"]);
    let e = entries(&g.id);
    assert_eq!(e[1]["kind"], "process-only");
    assert_eq!(e[1]["fs_snapshot"], "ckpt-1");
    assert_eq!(e[1]["process_image"], 2);
    assert_eq!(e[2]["kind"], "fs-only");
    assert_eq!(e[2]["fs_snapshot"], "ckpt-3");
    assert_eq!(e[2]["process_image"], 2);
    assert_eq!(e[2]["process_bytes"], 0);
    let before = count(&g);
    crabctl_ok(&["rollback", &g.id, "2"]);
    let now = count(&g);
    assert!(
        now <= before + 2,
        "rollback to the process-only checkpoint: {now} vs {before}"
    );
}

#[test]
fn retention_keeps_the_last_n_and_the_marked_and_rm_deletes() {
    let config = config_with("[checkpoint]\nkeep_last = 2");
    let path = config.display().to_string();
    let g = counter(&["--runtime-config-path", &path]);
    crabctl_ok(&["checkpoint", &g.id, "--mark"]);
    for _ in 0..3 {
        crabctl_ok(&["checkpoint", &g.id]);
    }
    assert_eq!(seqs(&g.id), vec![1, 3, 4]);
    let snaps = crabctl_ok(&["fs", "ls", &g.id]);
    assert!(
        !snaps.contains("ckpt-2"),
        "snapshot of a dropped checkpoint is left:\n{snaps}"
    );
    assert!(
        snaps.contains("ckpt-1") && snaps.contains("ckpt-4"),
        "{snaps}"
    );
    crabctl_ok(&["rm", &g.id, "3"]);
    assert_eq!(seqs(&g.id), vec![1, 4]);
    crabctl_ok(&["rollback", &g.id, "1"]);
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    let _ = std::fs::remove_file(&config);
}

#[test]
fn bad_requests_get_clear_errors_and_change_nothing() {
    let g = counter(&[]);
    crabctl_ok(&["checkpoint", &g.id]);
    let pid = g.pid();
    let out = crabctl(&["rollback", &g.id, "no-such"], &[]);
    let (_, e) = text(&out);
    assert!(!out.status.success());
    assert!(e.contains("no-such"), "{e}");
    assert_eq!(g.pid(), pid, "a failed rollback touched the processes");
    let out = crabctl(&["checkpoint", &g.id, "--name", "1"], &[]);
    assert!(!out.status.success(), "a duplicate name was accepted");
    let out = crabctl(&["checkpoint", "no-such-container"], &[]);
    let (_, e) = text(&out);
    assert!(!out.status.success());
    assert!(e.contains("no running task"), "{e}");
    assert_eq!(seqs(&g.id), vec![1]);
}

#[test]
fn the_control_socket_is_root_only_and_refuses_other_namespaces() {
    let g = counter(&[]);
    let socket = state_dir().join(namespace()).join(format!("{}.ctl", g.id));
    let mode = std::fs::metadata(&socket)
        .unwrap_or_else(|e| panic!("{}: {e}", socket.display()))
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
    let mut conn = UnixStream::connect(&socket).unwrap();
    let request = serde_json::json!({"op": "list", "namespace": "other", "id": g.id});
    conn.write_all(format!("{request}\n").as_bytes()).unwrap();
    let mut answer = String::new();
    BufReader::new(conn).read_line(&mut answer).unwrap();
    assert!(
        answer.contains("\"error\"") && answer.contains("other"),
        "{answer}"
    );
}

#[test]
fn a_failing_criu_dump_leaves_the_container_running_and_the_history_unchanged() {
    let config = config_with("[checkpoint]\ncriu = \"/bin/false\"");
    let path = config.display().to_string();
    let g = counter(&["--runtime-config-path", &path]);
    let out = crabctl(&["checkpoint", &g.id], &[]);
    let (_, e) = text(&out);
    assert!(
        !out.status.success(),
        "a checkpoint with a failing CRIU succeeded"
    );
    assert!(e.contains("CRIU dump failed"), "{e}");
    assert!(seqs(&g.id).is_empty(), "a failed checkpoint was recorded");
    let snaps = crabctl_ok(&["fs", "ls", &g.id]);
    assert!(
        !snaps.contains("ckpt-"),
        "a failed checkpoint left its snapshot:\n{snaps}"
    );
    let before = count(&g);
    assert!(
        wait_until(Duration::from_secs(5), || count(&g) > before),
        "the container was left frozen"
    );
    let _ = std::fs::remove_file(&config);
}

#[test]
fn a_rollback_to_a_damaged_image_is_refused_and_the_container_runs_on() {
    let g = counter(&[]);
    crabctl_ok(&["checkpoint", &g.id, "--name", "damaged"]);
    // Truncate the memory pages: the sizes recorded at the dump no longer match.
    let dir = criu_images(&g.id, 1);
    let mode = std::fs::metadata(dir.parent().unwrap().parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o077,
        0,
        "the checkpoint dir is open to others: {mode:o}"
    );
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("pages-") {
            std::fs::write(e.path(), b"").unwrap();
        }
    }
    let pid = g.pid();
    let out = crabctl(&["rollback", &g.id, "damaged"], &[]);
    let (_, e) = text(&out);
    assert!(
        !out.status.success(),
        "a rollback from a damaged image succeeded"
    );
    assert!(e.contains("truncated or damaged"), "{e}");
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    assert_eq!(g.pid(), pid, "the processes were touched");
    let before = count(&g);
    assert!(wait_until(Duration::from_secs(5), || count(&g) > before));
}

/// A namespace with only `lo` is dumped without the network images whose restore
/// changes nothing (they cost each restore about 30 ms), and a server bound to
/// 127.0.0.1 answers after the rollback all the same.
#[test]
fn a_loopback_only_namespace_rolls_back_without_its_no_op_network_images() {
    let g = Guard::sh(
        "mkdir -p /www && echo before > /www/index.html && \
             exec httpd -f -p 127.0.0.1:8080 -h /www",
    );
    let get = ["wget", "-qO-", "http://127.0.0.1:8080/index.html"];
    assert!(
        wait_until(Duration::from_secs(10), || g.exec(&get).status.success()),
        "server not reachable before the checkpoint"
    );
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    let dir = criu_images(&g.id, 1);
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with("netdev-")),
        "the links are always kept: {names:?}"
    );
    for kind in [
        "ifaddr-",
        "route-",
        "route6-",
        "rule-",
        "iptables-",
        "ip6tables-",
        "nftables-",
    ] {
        assert!(
            !names.iter().any(|n| n.starts_with(kind)),
            "{kind}*.img restores nothing here, yet it is kept: {names:?}"
        );
    }
    g.exec_ok(&["sh", "-c", "echo after > /www/index.html"]);
    assert_eq!(g.exec_ok(&get).trim(), "after");

    crabctl_ok(&["rollback", &g.id, "base"]);
    assert_eq!(g.exec_ok(&get).trim(), "before");
    let lo = g.exec_ok(&["cat", "/sys/class/net/lo/operstate"]);
    assert_ne!(lo.trim(), "down", "loopback is down after the rollback");
}

#[test]
fn a_rollback_whose_restore_fails_reports_the_task_stopped() {
    // CRIU that dumps but fails every restore half-way (after the old processes are
    // gone, which a rollback cannot avoid).
    let wrapper = std::env::temp_dir().join(format!("{}.sh", unique_id("criu")));
    std::fs::write(
        &wrapper,
        "#!/bin/sh\nif [ \"$1\" = restore ]; then echo 'injected restore failure' >&2; exit 1; fi\nexec criu \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = config_with(&format!("[checkpoint]\ncriu = \"{}\"", wrapper.display()));
    let g = counter(&["--runtime-config-path", &config.display().to_string()]);
    crabctl_ok(&["checkpoint", &g.id, "--name", "doomed"]);
    let out = crabctl(&["rollback", &g.id, "doomed"], &[]);
    let (_, e) = text(&out);
    assert!(!out.status.success(), "a failing restore reported success");
    assert!(e.contains("the task is now stopped"), "{e}");
    assert!(e.contains("injected restore failure"), "{e}");
    assert!(
        wait_until(Duration::from_secs(10), || g.status().as_deref()
            == Some("STOPPED")),
        "containerd was not told: {:?}",
        g.status()
    );
    let procs = std::fs::read_to_string(format!(
        "/sys/fs/cgroup/unified/crab/{}/{}/cgroup.procs",
        namespace(),
        g.id
    ))
    .unwrap_or_default();
    assert!(
        procs.trim().is_empty(),
        "processes left after a failed restore: {procs}"
    );
    let _ = std::fs::remove_file(&wrapper);
    let _ = std::fs::remove_file(&config);
}

#[test]
fn rollback_in_place_works_on_every_backend() {
    for backend in ["btrfs", "zfs", "overlay"] {
        let annotation = format!("io.crab.storage.backend={backend}");
        let g = counter(&["--annotation", &annotation]);
        crabctl_ok(&["checkpoint", &g.id, "--name", "a"]);
        let at = count(&g);
        g.exec_ok(&["sh", "-c", "echo later > /later"]);
        crabctl_ok(&["rollback", &g.id, "a"]);
        let now = count(&g);
        assert!(now + 2 >= at && now < at + 10, "{backend}: {now} vs {at}");
        assert_eq!(
            g.exec(&["test", "-e", "/later"]).status.code(),
            Some(1),
            "{backend}: a file written after the checkpoint survived"
        );
        assert!(
            wait_until(Duration::from_secs(5), || count(&g) > now),
            "{backend}: not counting"
        );
    }
}

#[test]
fn a_container_recreated_under_a_deleted_ones_id_starts_a_fresh_history() {
    let id = unique_id("rb");
    let store = std::path::Path::new("/var/lib/crab/checkpoints")
        .join(namespace())
        .join(&id);
    for round in 1..=3 {
        let g = Guard::new(&id);
        // Right after the last round's delete: containerd has not collected
        // that container's snapshot yet.
        ctr_ok(&[
            "run",
            "-d",
            "--runtime",
            CRAB,
            BUSYBOX,
            &id,
            "sh",
            "-c",
            COUNTER,
        ]);
        assert!(wait_until(Duration::from_secs(10), || count(&g) >= 2));
        g.exec_ok(&["mkdir", "-p", "/data"]);
        crabctl_ok(&["checkpoint", &id]);
        assert_eq!(
            seqs(&id),
            vec![1],
            "round {round}: the history is not fresh"
        );
        let images: Vec<String> = std::fs::read_dir(&store)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| !n.starts_with('.') && n != "history.json")
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(images, vec!["1"], "round {round}: old process images left");
        g.exec_ok(&["sh", "-c", "echo junk > /data/g"]);
        crabctl_ok(&["rollback", &id, "1"]);
        let left = g.exec(&["test", "-e", "/data/g"]);
        assert_eq!(
            left.status.code(),
            Some(1),
            "round {round}: a file made after the checkpoint survived its rollback"
        );
        drop(g);
    }
}

#[test]
fn names_that_are_not_utf8_are_created_changed_and_deleted_across_a_rollback() {
    let g = counter(&[]);
    // `\377` and `\376` are no UTF-8.
    g.exec_ok(&[
        "sh",
        "-c",
        "mkdir -p /s && echo one > \"/s/$(printf 'a\\377')\" && echo two > \"/s/$(printf 'b\\376')\"",
    ]);
    crabctl_ok(&["checkpoint", &g.id, "--name", "names"]);
    g.exec_ok(&[
        "sh",
        "-c",
        "echo changed > \"/s/$(printf 'a\\377')\" && rm \"/s/$(printf 'b\\376')\" && echo new > \"/s/$(printf 'c\\375')\"",
    ]);
    crabctl_ok(&["checkpoint", &g.id, "--name", "after"]);
    let out = crabctl_ok(&["rollback", &g.id, "names"]);
    assert!(out.contains("restored"), "{out}");
    let state = g.exec_ok(&[
        "sh",
        "-c",
        "cat \"/s/$(printf 'a\\377')\" \"/s/$(printf 'b\\376')\"; test -e \"/s/$(printf 'c\\375')\" && echo c-kept || echo c-gone",
    ]);
    assert_eq!(
        state.split_whitespace().collect::<Vec<_>>(),
        ["one", "two", "c-gone"],
        "{state}"
    );
    let out = crabctl_ok(&["rollback", &g.id, "after"]);
    assert!(out.contains("restored"), "{out}");
    let state = g.exec_ok(&[
        "sh",
        "-c",
        "cat \"/s/$(printf 'a\\377')\" \"/s/$(printf 'c\\375')\"; test -e \"/s/$(printf 'b\\376')\" && echo b-kept || echo b-gone",
    ]);
    assert_eq!(
        state.split_whitespace().collect::<Vec<_>>(),
        ["changed", "new", "b-gone"],
        "{state}"
    );
}
