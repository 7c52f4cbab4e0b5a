//! Exec processes beside checkpoints (issue 18): a platform's probe, a monitoring
//! `ctr task exec`, runs while an agent's turns end. A checkpoint that dumps
//! processes waits for a running exec (up to `[checkpoint] exec_wait_ms`), an exec
//! started during a checkpoint waits for it, and neither fails. A checkpoint
//! asked for through the agent API from inside an exec fails at once.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crab_integration::*;
use serde_json::Value;

/// Writes a count to a file five times a second.
const COUNTER: &str =
    "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done";

/// A counter container whose shim reads `config` (the test configuration and `extra`).
fn counter(extra: &str) -> (Guard, ConfigFile) {
    let config = ConfigFile(config_with(extra));
    let path = config.0.display().to_string();
    let g = Guard::run_detached(
        CRAB,
        BUSYBOX,
        &["--runtime-config-path", &path],
        &["sh", "-c", COUNTER],
    );
    assert!(
        wait_until(Duration::from_secs(10), || count(&g) >= 3),
        "counter did not count"
    );
    (g, config)
}

/// A configuration file, removed when dropped.
struct ConfigFile(std::path::PathBuf);

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The counter, read from the host (no exec: an exec would wait for a checkpoint).
fn count(g: &Guard) -> u64 {
    std::fs::read_to_string(format!("/proc/{}/root/tmp/count", g.pid()))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Whether the counter moves (the container is not left frozen).
fn keeps_counting(g: &Guard) -> bool {
    let before = count(g);
    wait_until(Duration::from_secs(10), || count(g) > before)
}

/// `ctr task exec --exec-id EXEC ID sh -c SCRIPT` in the background, once it runs
/// (its first line, `started`, has reached ctr); its output piped.
fn spawn_exec(g: &Guard, exec_id: &str, script: &str) -> (Child, BufReader<ChildStdout>) {
    let mut child = ctr()
        .args(["task", "exec", "--exec-id", exec_id, &g.id, "sh", "-c"])
        .arg(format!("echo started; {script}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ctr task exec");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("read the exec's output");
    assert_eq!(line.trim(), "started", "exec {exec_id} did not start");
    (child, out)
}

/// Runs a probe (`ctr task exec`) every 200 ms until stopped; answers each one's output.
struct Prober {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<Output>>,
}

impl Prober {
    fn start(g: &Guard) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, id) = (stop.clone(), g.id.clone());
        let handle = std::thread::spawn(move || {
            let mut outputs = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let next = Instant::now() + Duration::from_millis(200);
                let exec_id = unique_id("probe");
                let args = ["task", "exec", "--exec-id", &exec_id, &id];
                let probe = [&args[..], &["sh", "-c", "sleep 0.05; echo probe"]].concat();
                outputs.push(ctr_run(&probe, None, Duration::from_secs(60)));
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            outputs
        });
        Prober { stop, handle }
    }

    fn finish(self) -> Vec<Output> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("prober")
    }
}

#[test]
fn probes_every_200_ms_beside_turns_fail_no_turn_and_no_probe() {
    // Every turn dumps the processes (the classification might skip some).
    let (g, _config) = counter("[policy]\nmode = \"full\"");
    let prober = Prober::start(&g);
    let started = Instant::now();
    let mut turns = Vec::new();
    while started.elapsed() < Duration::from_secs(15) {
        let out = crabctl(&["turn", &g.id, "--json"], &[]);
        let (o, e) = text(&out);
        assert!(out.status.success(), "turn {} failed: {o}{e}", turns.len());
        let v: Value = serde_json::from_str(&o).unwrap_or_else(|err| panic!("{err}: {o}"));
        turns.push(v);
        // The agent thinks.
        std::thread::sleep(Duration::from_millis(100));
    }
    let probes = prober.finish();
    assert!(turns.len() >= 5, "only {} turns in 15 s", turns.len());
    assert!(probes.len() >= 20, "only {} probes in 15 s", probes.len());
    for (i, p) in probes.iter().enumerate() {
        let (o, e) = text(p);
        assert!(
            p.status.success(),
            "probe {i} failed: {:?} {o}{e}",
            p.status
        );
        assert_eq!(o.trim(), "probe", "probe {i}: {o}{e}");
    }
    for t in &turns {
        assert_eq!(t["classification"]["kind"], "full", "{t}");
    }
    let history: Vec<Value> =
        serde_json::from_str(&crabctl_ok(&["ls", &g.id, "--json"])).expect("history");
    // Retention may have dropped the oldest; the newest is the last turn's.
    assert_eq!(
        history.last().map(|e| &e["seq"]),
        turns.last().map(|t| &t["entry"]["seq"]),
        "{history:?}"
    );
    assert!(keeps_counting(&g), "the container was left frozen");
}

#[test]
fn an_exec_that_outlives_the_bound_fails_the_checkpoint_with_the_reason() {
    let (g, _config) = counter("[checkpoint]\nexec_wait_ms = 1500");
    let exec_id = unique_id("sleeper");
    let (mut sleeper, _out) = spawn_exec(&g, &exec_id, "exec sleep 1000");

    // The files alone: the exec is frozen with the rest, nothing waits for it.
    crabctl_ok(&["checkpoint", &g.id, "--kind", "fs-only"]);

    // Crab's checkpoint: waits for the bound, then fails naming the exec.
    let started = Instant::now();
    let out = crabctl(&["checkpoint", &g.id], &[]);
    let waited = started.elapsed();
    let (o, e) = text(&out);
    assert_eq!(out.status.code(), Some(5), "failed precondition: {o}{e}");
    assert!(e.contains("still run after waiting 1500 ms"), "{e}");
    assert!(e.contains(&exec_id), "{e}");
    assert!(
        waited >= Duration::from_millis(1400),
        "gave up after {waited:?}"
    );
    assert!(waited < Duration::from_secs(30), "took {waited:?}");
    assert!(keeps_counting(&g), "the container was left frozen");

    // containerd's checkpoint (the task paused by ctr meanwhile) fails the same way
    // and the task is running again.
    let out = ctr_run(
        &["task", "checkpoint", &g.id],
        None,
        Duration::from_secs(60),
    );
    let (o, e) = text(&out);
    assert!(!out.status.success(), "checkpoint succeeded: {o}");
    assert!(e.contains("still run after waiting 1500 ms"), "{e}");
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    assert!(keeps_counting(&g), "the container was left frozen");

    // The exec was never stopped by the waits.
    assert!(sleeper.try_wait().expect("try_wait").is_none());
    ctr_ok(&["task", "kill", "--exec-id", &exec_id, "-s", "KILL", &g.id]);
    let _ = sleeper.wait();
    let out = crabctl_ok(&["checkpoint", &g.id]);
    assert!(out.contains("(full, seq"), "{out}");
}

/// `ctr ARGS`, a checkpoint, while an exec runs (`sleep 2`): the checkpoint
/// succeeds (it could not dump the exec: it waited for it), and the exec ends
/// with its output.
fn checkpoint_waits_for_an_exec(g: &Guard, args: &[&str]) -> String {
    let exec_id = unique_id("x");
    let (exec, mut rest) = spawn_exec(g, &exec_id, "sleep 2; echo done");
    let out = ctr_run(args, None, Duration::from_secs(60));
    let (o, e) = text(&out);
    assert!(out.status.success(), "ctr {args:?}: {o}{e}");
    let mut line = String::new();
    rest.read_line(&mut line).expect("read the exec's output");
    assert_eq!(line.trim(), "done");
    let status = exec.wait_with_output().expect("exec").status;
    assert!(status.success(), "exec: {status:?}");
    o
}

#[test]
fn containerd_checkpoints_wait_for_a_running_exec() {
    let (g, _config) = counter("");
    // `ctr task checkpoint` pauses the task first: the exec can end only because
    // the shim thaws it while the checkpoint waits.
    let name = checkpoint_waits_for_an_exec(&g, &["task", "checkpoint", &g.id]);
    let name = name.trim().to_string();
    assert!(!name.is_empty());
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    assert!(keeps_counting(&g), "the container was left frozen");
    let _ = ctr_run(&["images", "rm", &name], None, Duration::from_secs(20));

    let reference = format!("crab.test/checkpoint/{}:1", unique_id("exec"));
    checkpoint_waits_for_an_exec(
        &g,
        &["container", "checkpoint", "--task", &g.id, &reference],
    );
    let images = ctr_ok(&["images", "ls", "-q"]);
    assert!(images.contains(&reference), "{images}");
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    assert!(keeps_counting(&g), "the container was left frozen");
    let _ = ctr_run(&["images", "rm", &reference], None, Duration::from_secs(20));
}

#[test]
fn a_paused_container_is_thawed_for_the_wait_and_paused_again() {
    let (g, _config) = counter("");
    let exec_id = unique_id("x");
    let (exec, mut rest) = spawn_exec(&g, &exec_id, "sleep 2; echo done");
    ctr_ok(&["task", "pause", &g.id]);
    // Frozen, the exec could not end: the checkpoint thaws the container to wait.
    let out = crabctl_ok(&["checkpoint", &g.id]);
    assert!(out.contains("(full, seq"), "{out}");
    let mut line = String::new();
    rest.read_line(&mut line).expect("read the exec's output");
    assert_eq!(line.trim(), "done");
    assert!(exec.wait_with_output().expect("exec").status.success());
    // Paused again, as the user left it.
    assert_eq!(g.status().as_deref(), Some("PAUSED"));
    let frozen = count(&g);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(count(&g), frozen, "a paused container counted");
    ctr_ok(&["task", "resume", &g.id]);
    assert!(keeps_counting(&g), "the container was left frozen");
}

/// An agent's tool in an exec: asks its sandbox's agent API for a checkpoint,
/// prints the status, the body and how long the answer took (ms) as JSON, then
/// goes on (`/tmp/after`).
const CHECKPOINT_FROM_EXEC: &str = r#"
import json, os, time, urllib.request, urllib.error
req = urllib.request.Request('http://127.0.0.1:8787/.crab/v1/checkpoints', method='POST',
    data=json.dumps({'name': 'from-exec'}).encode(),
    headers={'Content-Type': 'application/json',
             'Authorization': 'Bearer ' + os.environ['CRAB_API_TOKEN']})
started = time.monotonic()
try:
    r = urllib.request.urlopen(req, timeout=60)
    status, body = r.status, r.read().decode()
except urllib.error.HTTPError as e:
    status, body = e.code, e.read().decode()
ms = (time.monotonic() - started) * 1000
print(json.dumps({'status': status, 'body': body, 'ms': ms}), flush=True)
"#;

#[test]
fn an_agent_api_checkpoint_asked_from_inside_an_exec_is_refused_without_waiting_for_it() {
    let wait_ms = 20_000;
    let g = crab_integration::llm::proxied_sandbox(
        Duration::ZERO,
        &format!("[checkpoint]\nexec_wait_ms = {wait_ms}"),
        &["sleep", "infinity"],
    );
    // The caller is a child of the exec's shell: its exec is found through its parents.
    let script = "python3 -c \"$0\"; echo after > /tmp/after";
    let started = Instant::now();
    let out = g.exec(&["sh", "-c", script, CHECKPOINT_FROM_EXEC]);
    let took = started.elapsed();
    let (o, e) = text(&out);
    assert!(out.status.success(), "exec: {:?} {o}{e}", out.status);
    let answer: Value = serde_json::from_str(o.trim()).unwrap_or_else(|err| panic!("{err}: {o}"));
    assert_eq!(answer["status"], 412, "{answer}");
    let body: Value = serde_json::from_str(answer["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["kind"], "failed-precondition", "{body}");
    let why = body["error"].as_str().unwrap();
    assert!(why.contains("from inside exec process"), "{why}");
    // No wait for the bound: the exec it would wait for is the one asking.
    let bound = Duration::from_millis(wait_ms / 2);
    assert!(
        answer["ms"].as_f64().unwrap() < bound.as_millis() as f64 && took < bound,
        "answered in {} ms, the exec took {took:?}",
        answer["ms"]
    );
    // The exec went on after the answer, nothing was recorded, and the
    // container is not left frozen: a checkpoint from the host now succeeds.
    assert_eq!(g.exec_ok(&["cat", "/tmp/after"]).trim(), "after");
    let h: Vec<Value> = serde_json::from_str(&crabctl_ok(&["ls", &g.id, "--json"])).unwrap();
    assert!(h.is_empty(), "{h:?}");
    let out = crabctl_ok(&["checkpoint", &g.id]);
    assert!(out.contains("(full, seq"), "{out}");
}

/// An agent started with `ctr task exec` (as `docker exec sandbox agent` would):
/// starts a tool in the background, then asks its LLM through the proxy; prints
/// the status and how long the answer took (ms) as JSON.
const AGENT_IN_EXEC: &str = r#"
import json, subprocess, time, urllib.request, urllib.error
subprocess.Popen(['sleep', '300'])
req = urllib.request.Request('http://127.0.0.1:8787/v1/chat/completions', method='POST',
    data=b'{"messages": []}', headers={'Content-Type': 'application/json'})
started = time.monotonic()
try:
    r = urllib.request.urlopen(req, timeout=60)
    status = r.status
except urllib.error.HTTPError as e:
    status = e.code
print(json.dumps({'status': status, 'ms': (time.monotonic() - started) * 1000}), flush=True)
"#;

#[test]
fn a_turn_whose_agent_runs_in_an_exec_fails_at_once_instead_of_waiting_for_its_own_exec() {
    let wait_ms = 20_000;
    let g = crab_integration::llm::proxied_sandbox(
        Duration::ZERO,
        &format!("[checkpoint]\nexec_wait_ms = {wait_ms}\n[policy]\nfail_closed = false"),
        &["sleep", "infinity"],
    );
    // The sandbox's first turn dumps its processes; the agent's exec cannot be
    // dumped and waits for the turn's answer.
    let started = Instant::now();
    let out = g.exec(&["python3", "-c", AGENT_IN_EXEC]);
    let took = started.elapsed();
    let (o, e) = text(&out);
    assert!(out.status.success(), "exec: {:?} {o}{e}", out.status);
    let answer: Value = serde_json::from_str(o.trim()).unwrap_or_else(|err| panic!("{err}: {o}"));
    // Not failed closed: the LLM's answer comes through, and at once.
    assert_eq!(answer["status"], 200, "{answer}");
    let bound = Duration::from_millis(wait_ms / 2);
    assert!(
        answer["ms"].as_f64().unwrap() < bound.as_millis() as f64 && took < bound,
        "answered in {} ms, the exec took {took:?}",
        answer["ms"]
    );
    // The turn is counted failed and recorded nothing.
    let stats: Value = serde_json::from_str(&crabctl_ok(&["stats", &g.id, "--json"])).unwrap();
    assert_eq!(
        (stats["turns"].as_u64(), stats["failed"].as_u64()),
        (Some(1), Some(1)),
        "{stats}"
    );
    let h: Vec<Value> = serde_json::from_str(&crabctl_ok(&["ls", &g.id, "--json"])).unwrap();
    assert!(h.is_empty(), "{h:?}");
}
