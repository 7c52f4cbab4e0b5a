//! The turn proxy (`crabctl proxy`) between an agent in a real container and a
//! stub LLM server on the host: each LLM request ends a turn (a checkpoint in
//! the history), SSE bytes arrive unchanged, the answer is held until the
//! checkpoint is durable, and other paths pass through without a turn.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crab_integration::llm::{self, SSE};
use crab_integration::{address, crabctl_ok, namespace, Guard, CRAB, PYTHON};
use serde_json::Value;

/// The stub LLM of the first test: answers at once, chunks 100 ms apart.
fn stub_llm() -> (u16, mpsc::Receiver<llm::Seen>) {
    llm::stub(Duration::ZERO, Duration::from_millis(100))
}

struct Proxy(Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_proxy(id: &str, port: u16) -> Proxy {
    let mut child = Command::new("crabctl")
        .args(["-a", &address(), "-n", &namespace(), "proxy", id])
        .args(["--upstream", &format!("http://127.0.0.1:{port}")])
        .args(["--listen", "127.0.0.1:8080"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start crabctl proxy");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("proxy listening"), "{line:?}");
    Proxy(child)
}

/// The agent: one request through the proxy; prints the answer's body and when
/// its first byte arrived (ms since the epoch). It runs on the host, in the
/// container's network namespace only: an agent outside the checkpointed
/// process set (its memory, the conversation, is not rolled back).
const AGENT: &str = r#"
import http.client, json, sys, time
method, path = sys.argv[1], sys.argv[2]
c = http.client.HTTPConnection('127.0.0.1', 8080, timeout=60)
body = json.dumps({'model': 'stub', 'stream': True, 'messages': [{'role': 'user', 'content': 'next?'}]})
c.request(method, path, body=body if method == 'POST' else None,
          headers={'Content-Type': 'application/json', 'Authorization': 'Bearer secret'})
r = c.getresponse()
first = r.read(1)
t = time.time()
rest = r.read()
print(json.dumps({'status': r.status, 'body': (first + rest).decode(), 'first_byte_ms': int(t * 1000)}))
"#;

fn agent(g: &Guard, method: &str, path: &str) -> Value {
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{}/ns/net", g.pid()))
        .args(["python3", "-c", AGENT, method, path])
        .output()
        .expect("run the agent");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "agent: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn history(id: &str) -> Vec<Value> {
    let out = crabctl_ok(&["ls", id, "--json"]);
    serde_json::from_str(&out).unwrap()
}

#[test]
fn llm_requests_through_the_proxy_end_turns_and_answers_wait_for_the_checkpoint() {
    let (port, seen) = stub_llm();
    let g = Guard::run_detached(CRAB, PYTHON, &[], &["sleep", "infinity"]);
    let _proxy = start_proxy(&g.id, port);

    // Turn 1: the agent changed a file, then asks its LLM.
    g.exec_ok(&["sh", "-c", "echo plan > /root/notes"]);
    let a = agent(&g, "POST", "/v1/chat/completions");
    assert_eq!(a["status"], 200, "{a}");
    assert_eq!(
        a["body"].as_str().unwrap(),
        SSE.concat(),
        "SSE bytes changed"
    );
    let req = seen.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(
        req.head.starts_with("POST /v1/chat/completions HTTP/1.1"),
        "{}",
        req.head
    );
    assert!(req
        .head
        .to_ascii_lowercase()
        .contains(&format!("host: 127.0.0.1:{port}")));
    assert!(req.body.contains("next?"), "{}", req.body);
    let h = history(&g.id);
    assert_eq!(h.len(), 1, "one turn, one checkpoint: {h:?}");
    // The answer was held until the checkpoint was recorded (durable).
    let created = h[0]["created_ms"].as_u64().unwrap();
    let first = a["first_byte_ms"].as_u64().unwrap();
    assert!(
        first >= created,
        "first byte at {first}, checkpoint at {created}"
    );

    // Other paths pass through and end no turn.
    let m = agent(&g, "GET", "/v1/models");
    assert_eq!(m["status"], 200);
    assert_eq!(history(&g.id).len(), 1);
    let _ = seen.recv_timeout(Duration::from_secs(5)).unwrap();

    // Turn 2: nothing changed: a skip entry.
    let b = agent(&g, "POST", "/v1/messages");
    assert_eq!(b["body"].as_str().unwrap(), SSE.concat());
    let h = history(&g.id);
    assert_eq!(h.len(), 2, "{h:?}");
    assert_eq!(h[1]["kind"], "skip", "{:?}", h[1]);
}
