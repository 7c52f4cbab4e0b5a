//! The task API through `ctr`: run, exit codes, stdio, terminals, exec, kill,
//! pause/resume, ps, metrics, and the order of events.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_integration::*;

const T: Duration = Duration::from_secs(60);

fn run_rm(flags: &[&str], args: &[&str], stdin: Option<&[u8]>) -> std::process::Output {
    let id = unique_id("r");
    let _guard = Guard::new(&id);
    let mut all = vec!["run", "--rm", "--runtime", CRAB];
    all.extend_from_slice(flags);
    all.push(BUSYBOX);
    all.push(&id);
    all.extend_from_slice(args);
    ctr_run(&all, stdin, T)
}

/// Runs `cmd` under a pseudo-terminal (ctr -t needs one) via util-linux `script`.
fn in_pty(cmd: &str) -> std::process::Output {
    std::process::Command::new("timeout")
        .args(["60", "script", "-qec", cmd, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("script")
}

fn ctr_line() -> String {
    format!("ctr --address {} --namespace {}", address(), namespace())
}

#[test]
fn run_echo_prints_output() {
    let out = run_rm(&[], &["echo", "hi"], None);
    let (o, e) = text(&out);
    assert!(out.status.success(), "{e}");
    assert_eq!(o, "hi\n");
}

#[test]
fn exit_code_propagates() {
    let out = run_rm(&[], &["sh", "-c", "exit 3"], None);
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));
}

#[test]
fn stdout_and_stderr_are_separate() {
    let out = run_rm(&[], &["sh", "-c", "echo out; echo err >&2"], None);
    let (o, e) = text(&out);
    assert_eq!(o, "out\n");
    assert!(e.contains("err"), "{e}");
}

#[test]
fn stdin_is_piped_to_the_container_and_closed_at_eof() {
    let input = b"line one\nline two\n";
    let out = run_rm(&[], &["sh", "-c", "wc -l; echo done"], Some(input));
    let (o, e) = text(&out);
    assert!(out.status.success(), "{e}");
    assert_eq!(o.split_whitespace().collect::<Vec<_>>(), ["2", "done"]);
}

#[test]
fn large_output_arrives_complete() {
    let out = run_rm(
        &[],
        &["sh", "-c", "dd if=/dev/zero bs=1024 count=4096 2>/dev/null"],
        None,
    );
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), 4096 * 1024);
}

#[test]
fn terminal_container_gets_a_tty() {
    let id = unique_id("tty");
    let _g = Guard::new(&id);
    let out = in_pty(&format!(
        "{} run --rm -t --runtime {CRAB} {BUSYBOX} {id} sh -c 'tty; exit 7'",
        ctr_line()
    ));
    let (o, _) = text(&out);
    assert!(o.contains("/dev/pts/"), "{o}");
    assert_eq!(out.status.code(), Some(7), "{o}");
}

#[test]
fn sigkill_of_init_gives_137() {
    let g = Guard::run_detached(CRAB, BUSYBOX, &[], &["sleep", "1000"]);
    let ev = Events::subscribe();
    ctr_ok(&["task", "kill", "-s", "KILL", &g.id]);
    assert!(ev.wait_for("/tasks/exit", &g.id, T));
    let out = ctr_ok(&["task", "ls"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with(&g.id) && l.contains("STOPPED")),
        "{out}"
    );
    let del = ctr_run(&["task", "rm", &g.id], None, T);
    let (o, e) = text(&del);
    assert!(del.status.success(), "{o}{e}");
    assert!(
        e.contains("137") || o.contains("137"),
        "exit status 137 expected: {o}{e}"
    );
}

#[test]
fn init_with_a_term_handler_exits_on_sigterm() {
    // PID 1 of a pid namespace ignores signals it has no handler for (kernel rule), so
    // the init installs one; an exec'd process is killed by the default action.
    let g = Guard::run_detached(
        CRAB,
        BUSYBOX,
        &[],
        &[
            "sh",
            "-c",
            "trap 'exit 143' TERM; while true; do sleep 0.1; done",
        ],
    );
    let ev = Events::subscribe();
    ctr_ok(&["task", "kill", &g.id]);
    assert!(ev.wait_for("/tasks/exit", &g.id, T));
    assert_eq!(g.status().as_deref(), Some("STOPPED"));
}

#[test]
fn exec_has_its_own_stdio_and_exit_code() {
    let g = Guard::run_detached(CRAB, BUSYBOX, &[], &["sleep", "1000"]);
    let out = g.exec(&["sh", "-c", "echo from-exec; echo exec-err >&2; exit 5"]);
    let (o, e) = text(&out);
    assert_eq!(out.status.code(), Some(5));
    assert_eq!(o, "from-exec\n");
    assert!(e.contains("exec-err"), "{e}");
}

#[test]
fn exec_killed_by_sigterm_gives_143() {
    let g = Guard::run_detached(CRAB, BUSYBOX, &[], &["sleep", "1000"]);
    let exec_id = unique_id("x");
    let mut child = ctr()
        .args([
            "task",
            "exec",
            "--exec-id",
            &exec_id,
            &g.id,
            "sleep",
            "1000",
        ])
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("exec");
    assert!(wait_until(T, || ctr_ok(&["task", "ps", &g.id])
        .lines()
        .count()
        >= 3));
    ctr_ok(&["task", "kill", "--exec-id", &exec_id, &g.id]);
    let status = child.wait().expect("wait exec");
    assert_eq!(status.code(), Some(143));
}

#[test]
fn exec_with_stdin_and_terminal() {
    let g = Guard::run_detached(CRAB, BUSYBOX, &[], &["sleep", "1000"]);
    let exec_id = unique_id("x");
    let out = ctr_run(
        &[
            "task",
            "exec",
            "--exec-id",
            &exec_id,
            &g.id,
            "sh",
            "-c",
            "cat; echo end",
        ],
        Some(b"abc\n"),
        T,
    );
    assert_eq!(text(&out).0, "abc\nend\n");
    let out = in_pty(&format!(
        "{} task exec -t --exec-id {} {} sh -c 'tty; exit 4'",
        ctr_line(),
        unique_id("x"),
        g.id
    ));
    let (o, _) = text(&out);
    assert!(o.contains("/dev/pts/"), "{o}");
    assert_eq!(out.status.code(), Some(4));
}

#[test]
fn pause_freezes_every_process_and_resume_thaws() {
    let dir = tempfile_dir();
    let mount = format!("type=bind,src={},dst=/data,options=rbind:rw", dir.display());
    let g = Guard::run_detached(
        CRAB,
        BUSYBOX,
        &["--mount", &mount],
        &[
            "sh",
            "-c",
            "i=0; while true; do i=$((i+1)); echo $i > /data/n; usleep 20000; done",
        ],
    );
    let counter = || std::fs::read_to_string(dir.join("n")).unwrap_or_default();
    assert!(wait_until(T, || counter()
        .trim()
        .parse::<u32>()
        .unwrap_or(0)
        > 2));
    ctr_ok(&["task", "pause", &g.id]);
    assert_eq!(g.status().as_deref(), Some("PAUSED"));
    let frozen = counter();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(counter(), frozen, "the counter moved while paused");
    ctr_ok(&["task", "resume", &g.id]);
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    assert!(
        wait_until(T, || counter() != frozen),
        "the counter did not move after resume"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn ps_lists_every_process_of_the_container() {
    let g = Guard::run_detached(
        CRAB,
        BUSYBOX,
        &[],
        &["sh", "-c", "sleep 1000 & sleep 1000 & wait"],
    );
    assert!(wait_until(T, || ctr_ok(&["task", "ps", &g.id])
        .lines()
        .count()
        == 4));
    let ps = ctr_ok(&["task", "ps", &g.id]);
    assert!(ps.contains(&g.pid().to_string()), "{ps}");
}

#[test]
fn metrics_report_memory_and_pids() {
    let g = Guard::run_detached(
        CRAB,
        BUSYBOX,
        &["--memory-limit", "67108864"],
        &["sleep", "1000"],
    );
    let m = ctr_ok(&["task", "metrics", &g.id]);
    let value = |key: &str| -> u64 {
        m.lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next()? == key).then(|| f.next()?.parse().ok())?
            })
            .unwrap_or_else(|| panic!("{key} missing in:\n{m}"))
    };
    assert_eq!(value("memory.limit_in_bytes"), 67108864);
    assert!(value("memory.usage_in_bytes") > 0);
    assert_eq!(value("pids.current"), 1);
}

#[test]
fn events_arrive_in_lifecycle_order() {
    let ev = Events::subscribe();
    let g = Guard::run_detached(CRAB, BUSYBOX, &[], &["sleep", "1000"]);
    g.exec_ok(&["true"]);
    ctr_ok(&["task", "kill", "-s", "KILL", &g.id]);
    assert!(ev.wait_for("/tasks/exit", &g.id, T));
    // The exec's exit is a /tasks/exit of this container too: the init's may come
    // after it, and a delete before it is refused ("running").
    assert!(wait_until(T, || g.status().as_deref() == Some("STOPPED")));
    ctr_ok(&["task", "rm", &g.id]);
    assert!(ev.wait_for("/tasks/delete", &g.id, T));
    let topics = ev.topics_for(&g.id);
    let pos = |t: &str| {
        topics
            .iter()
            .position(|x| x == t)
            .unwrap_or_else(|| panic!("{t} missing in {topics:?}"))
    };
    assert!(pos("/tasks/create") < pos("/tasks/start"), "{topics:?}");
    assert!(pos("/tasks/start") < pos("/tasks/exec-added"), "{topics:?}");
    assert!(
        pos("/tasks/exec-added") < pos("/tasks/exec-started"),
        "{topics:?}"
    );
    assert!(
        pos("/tasks/exec-started") < pos("/tasks/delete"),
        "{topics:?}"
    );
    let last_exit = topics.iter().rposition(|x| x == "/tasks/exit").unwrap();
    assert!(last_exit < pos("/tasks/delete"), "{topics:?}");
}

#[test]
fn shim_exits_after_its_container_is_deleted() {
    let g = Guard::run_detached(CRAB, BUSYBOX, &[], &["sleep", "1000"]);
    assert_eq!(shim_pids(&g.id).len(), 1, "one shim per container");
    g.remove();
    assert!(
        wait_until(Duration::from_secs(10), || shim_pids(&g.id).is_empty()),
        "shim still running after delete"
    );
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(unique_id("crab-test"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
