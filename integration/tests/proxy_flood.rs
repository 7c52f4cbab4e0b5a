//! A hostile sandbox floods its turn proxy (issue 17 item 7): 300 connections
//! that send a request line slowly and never finish it. The proxy serves at
//! most `[proxy] max_connections` of them, refuses the rest at once, cuts the
//! ones it holds at the header timeout, keeps its log small, and answers
//! properly afterwards; meanwhile the shim that serves the sandbox (and here
//! also a second container, grouped in the same shim) answers `ctr task kill`
//! of that other container promptly.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crab_integration::*;
use serde_json::Value;

/// The annotation by which containers share one shim.
const SANDBOX_ANNOTATION: &str = "io.kubernetes.cri.sandbox-id";
/// The proxy's upstream: nothing listens there, and nothing here needs it.
const UPSTREAM: &str = "http://127.0.0.1:9";
/// The flood's size.
const CONNECTIONS: usize = 300;
/// The proxy's connection cap and header timeout in this test.
const MAX_CONNECTIONS: usize = 64;
const HEADER_TIMEOUT_SECS: u64 = 8;
/// The log cap in this test.
const LOG_MAX: u64 = 64 << 10;
/// A generous bound on `ctr task kill` + the shim's exit event for it: only
/// to tell a stalled shim from a busy one.
const KILL_LIVENESS: Duration = Duration::from_secs(10);

/// The flood, run in the sandbox: argv[1] connections to the proxy, each
/// sending `GET /v1/mo` and then one byte every 0.5 s, never ending the line.
/// Prints `started <CLOCK_MONOTONIC>` once all are open, then one JSON line:
/// for each connection, when (seconds after it was opened) the proxy answered 503
/// or closed it, or null if still open after argv[2] seconds.
///
/// An answer is timed by the kernel's receive timestamp (`SO_TIMESTAMPNS`), so
/// the time is the proxy's, not the flooding script's: on a loaded machine the
/// script itself may read an answer that came at once a second or two later. A
/// bare close carries no timestamp and is timed when it is read.
const FLOOD: &str = r#"
import json, selectors, socket, struct, sys, time
SO_TIMESTAMPNS = 35
n, hold = int(sys.argv[1]), float(sys.argv[2])
start = time.monotonic()
sel = selectors.DefaultSelector()
socks, opened, ended, refused = [], {}, {}, 0

def answered(key):
    # Times count from each connection's own open: on a loaded machine opening
    # all of them takes seconds, and a refusal must not look late for that.
    global refused
    i = key.data
    arrived = None
    try:
        data, ancillary, _, _ = key.fileobj.recvmsg(4096, socket.CMSG_SPACE(16))
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = struct.unpack('qq', value[:16])
                arrived = sec + nsec / 1e9
    except OSError:
        data = b''
    if data.startswith(b'HTTP/1.1 503'):
        refused += 1
    if not data or data.startswith(b'HTTP/'):
        ended[i] = (arrived if arrived is not None else time.time()) - opened[i]
        sel.unregister(key.fileobj)

for i in range(n):
    s = socket.socket()
    s.settimeout(5)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    opened[i] = time.time()
    try:
        s.connect(('127.0.0.1', 8787))
        s.sendall(b'GET /v1/mo')
    except OSError:
        pass
    socks.append(s)
    s.setblocking(False)
    try:
        sel.register(s, selectors.EVENT_READ, i)
    except (OSError, ValueError):
        pass
    # Answers that came already are read as they come, not after the last open.
    for key, _ in sel.select(timeout=0):
        answered(key)
print('started', start, flush=True)
next_drip = 0.0
while time.monotonic() < start + hold and len(ended) < n:
    now = time.monotonic()
    if now >= next_drip:
        for i, s in enumerate(socks):
            if i not in ended:
                try:
                    s.send(b'd')
                except OSError:
                    pass
        next_drip = now + 0.5
    for key, _ in sel.select(timeout=0.1):
        answered(key)
print(json.dumps({'ended': [ended.get(i) for i in range(n)], 'refused_503': refused}), flush=True)
"#;

/// One proper request from inside the sandbox, and the absolute-form line
/// that once panicked a handler; prints both statuses and bodies as JSON.
const PROPER: &str = r#"
import json, os, socket, urllib.request, urllib.error
req = urllib.request.Request('http://127.0.0.1:8787/.crab/v1/checkpoints',
    headers={'Authorization': 'Bearer ' + os.environ['CRAB_API_TOKEN']})
r = urllib.request.urlopen(req, timeout=30)
status, body = r.status, r.read().decode()
s = socket.create_connection(('127.0.0.1', 8787), timeout=30)
s.sendall(b'GET http://x?y HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')
raw = b''
while True:
    d = s.recv(4096)
    if not d:
        break
    raw += d
print(json.dumps({'status': status, 'body': body, 'absolute': raw.decode()}))
"#;

fn monotonic_now() -> f64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9
}

/// The pid of the turn proxy of container `id`.
fn proxy_pid(id: &str) -> Option<i32> {
    crab_integration::proxy_pids(id).first().copied()
}

/// A process's resident memory, in KiB.
fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_flood_of_slow_connections_does_not_stall_the_shim_and_the_proxy_recovers() {
    let config = config_with(&format!(
        "[proxy]\nupstreams = [\"{UPSTREAM}\"]\nmax_connections = {MAX_CONNECTIONS}\n\
         header_timeout_secs = {HEADER_TIMEOUT_SECS}\nlog_max_size = \"{LOG_MAX}\""
    ));
    let config = config.to_string_lossy().into_owned();
    let a = Guard::run_detached(
        CRAB,
        PYTHON,
        &[
            "--runtime-config-path",
            &config,
            "--annotation",
            &format!("io.crab.proxy.upstream={UPSTREAM}"),
        ],
        &["sleep", "infinity"],
    );
    let group = format!("{SANDBOX_ANNOTATION}={}", a.id);
    let b = Guard::run_detached(
        CRAB,
        BUSYBOX,
        &["--annotation", &group],
        &["sleep", "100000"],
    );
    assert_eq!(shim_pids(&a.id).len(), 1, "one shim serves both");
    assert!(shim_pids(&b.id).is_empty(), "B got a shim of its own");
    let proxy = proxy_pid(&a.id).expect("A's proxy runs");
    let rss_before = rss_kib(proxy);
    let events = Events::subscribe();

    // The flood, from inside A.
    let hold = HEADER_TIMEOUT_SECS + 6;
    let exec_id = unique_id("flood");
    let mut flood = Command::new("timeout")
        .args(["--kill-after=5", "90", "ctr", "--address", &address()])
        .args([
            "--namespace",
            &namespace(),
            "task",
            "exec",
            "--exec-id",
            &exec_id,
        ])
        .args([&a.id, "python3", "-c", FLOOD])
        .args([CONNECTIONS.to_string(), hold.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the flood");
    let mut lines = BufReader::new(flood.stdout.take().unwrap()).lines();
    let started: f64 = lines
        .next()
        .expect("the flood printed nothing")
        .unwrap()
        .strip_prefix("started ")
        .and_then(|t| t.trim().parse().ok())
        .expect("a `started` line");
    // Let the flood settle: the cap reached, the held connections dripping.
    std::thread::sleep(Duration::from_secs(1));
    let rss_during = rss_kib(proxy);

    // While the connections hang: kill B; the shim's exit event for it, and
    // then `ctr task ls`, must follow.
    let t = Instant::now();
    ctr_ok(&["task", "kill", "-s", "KILL", &b.id]);
    let kill_ms = t.elapsed().as_secs_f64() * 1000.0;
    let exited = events.wait_for("/tasks/exit", &b.id, KILL_LIVENESS);
    let exit_ms = t.elapsed().as_secs_f64() * 1000.0;
    let status = b.status();
    let listed_ms = t.elapsed().as_secs_f64() * 1000.0;
    let done_at = monotonic_now() - started;
    println!(
        "ctr task kill of B answered in {kill_ms:.0} ms, its exit event came after {exit_ms:.0} ms, \
         `ctr task ls` said {status:?} after {listed_ms:.0} ms, {done_at:.1} s into the flood; \
         proxy RSS {rss_before} KiB before, {rss_during} KiB during"
    );
    assert!(
        exited,
        "no exit event for B within {KILL_LIVENESS:?}: the shim stalled"
    );
    assert_eq!(status.as_deref(), Some("STOPPED"));
    assert!(
        listed_ms < KILL_LIVENESS.as_secs_f64() * 1000.0,
        "`ctr task ls` took {listed_ms:.0} ms"
    );
    assert!(
        done_at < HEADER_TIMEOUT_SECS as f64,
        "the kill finished {done_at:.1} s into the flood, after the held connections were cut: \
         it did not run during the flood"
    );

    // What the flood saw.
    let result: Value =
        serde_json::from_str(&lines.next().expect("the flood's result").unwrap()).unwrap();
    let _ = flood.wait();
    let ended: Vec<Option<f64>> = result["ended"]
        .as_array()
        .unwrap()
        .iter()
        .map(Value::as_f64)
        .collect();
    let at_once = ended.iter().filter(|e| e.is_some_and(|t| t < 2.0)).count();
    let cut: Vec<f64> = ended
        .iter()
        .flatten()
        .copied()
        .filter(|&t| t >= 2.0)
        .collect();
    let still_open = ended.iter().filter(|e| e.is_none()).count();
    let first_cut = cut.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "{CONNECTIONS} slow connections: {at_once} refused at once ({} with a 503), {} cut by the \
         header timeout (first after {first_cut:.1} s), {still_open} still open after {hold} s",
        result["refused_503"],
        cut.len()
    );
    assert!(
        at_once >= CONNECTIONS - MAX_CONNECTIONS,
        "only {at_once} of {CONNECTIONS} were refused at once: the cap of {MAX_CONNECTIONS} did not hold"
    );
    assert_eq!(still_open, 0, "connections outlived the header timeout");
    assert!(
        first_cut >= HEADER_TIMEOUT_SECS as f64 - 1.0,
        "held connections were cut before the header timeout: {first_cut:.1} s"
    );

    // Afterwards the proxy answers a proper request, and the absolute-form
    // line gets 400.
    let out: Value = serde_json::from_str(&a.exec_ok(&["python3", "-c", PROPER])).unwrap();
    assert_eq!(out["status"], 200, "{out}");
    assert!(
        out["body"].as_str().unwrap().contains("checkpoints"),
        "{out}"
    );
    let absolute = out["absolute"].as_str().unwrap();
    assert!(absolute.starts_with("HTTP/1.1 400"), "{absolute}");

    // The log stayed small and holds no panic.
    let log = state_dir()
        .join(namespace())
        .join(format!("{}.proxy.log", a.id));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    println!("proxy log: {} bytes:\n{text}", text.len());
    assert!(text.len() as u64 <= LOG_MAX, "{}", log.display());
    assert!(!text.contains("panicked"), "{text}");
    // 236 refusals, logged at the rate limit's burst (10 per 10 s) at most.
    let refusals = text.matches("connection refused").count();
    assert!((1..=10).contains(&refusals), "{refusals} refusals logged");
    assert_eq!(proxy_pid(&a.id), Some(proxy), "the proxy restarted or died");
}
