//! The turn proxy as the shim runs it: started for each container whose
//! configuration or annotation names an upstream, found by an agent in the
//! sandbox through `OPENAI_BASE_URL`, and offering the agent API (REST and MCP)
//! that checkpoints, rolls back and forks the agent's own container.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use crab_integration::llm::{self, sandbox_with_proxy, SSE};
use crab_integration::{
    config_with, crabctl, crabctl_ok, ctr_ok, proxy_pids, text, wait_until, Guard, CRAB, PYTHON,
};
use serde_json::{json, Value};

/// Where the shim's proxy listens by default, inside the container.
const LISTEN: &str = "127.0.0.1:8787";

/// An agent in the sandbox: one LLM request to wherever its SDK's variable
/// points, the answer and the variables kept in files, then idle.
const SANDBOXED_AGENT: &str = r#"
import json, os, time, urllib.request
base = os.environ['OPENAI_BASE_URL']
open('/tmp/env', 'w').write(base + ' ' + os.environ['ANTHROPIC_BASE_URL'])
req = urllib.request.Request(base + '/chat/completions', method='POST',
    data=json.dumps({'model': 'stub', 'stream': True, 'messages': []}).encode(),
    headers={'Content-Type': 'application/json'})
body = urllib.request.urlopen(req, timeout=60).read().decode()
open('/tmp/answer', 'w').write(body)
time.sleep(100000)
"#;

#[test]
fn the_shim_starts_the_proxy_and_a_sandboxed_agent_finds_it_through_its_environment() {
    let (port, seen) = llm::stub(Duration::from_millis(300), Duration::from_millis(10));
    let config = config_with(&format!("[proxy]\nupstream = \"http://127.0.0.1:{port}\""));
    let path = config.to_string_lossy().into_owned();
    let g = Guard::run_detached(
        CRAB,
        PYTHON,
        &["--runtime-config-path", &path],
        &["python3", "-c", SANDBOXED_AGENT],
    );
    // No exec until the turn is recorded: a checkpoint is refused while an
    // exec'd process runs, and the fail-closed proxy would answer 503.
    assert!(
        wait_until(Duration::from_secs(60), || {
            crab_integration::crabctl(&["stats", &g.id, "--json"], &[])
                .status
                .success()
                && serde_json::from_str::<Value>(&crabctl_ok(&["stats", &g.id, "--json"]))
                    .is_ok_and(|s| s["turns"] == 1)
        }),
        "the agent's turn was never recorded"
    );
    assert!(
        wait_until(Duration::from_secs(60), || g
            .exec(&["cat", "/tmp/answer"])
            .status
            .success()),
        "the agent never got its answer"
    );
    assert_eq!(g.exec_ok(&["cat", "/tmp/answer"]), SSE.concat());
    assert_eq!(
        g.exec_ok(&["cat", "/tmp/env"]),
        format!("http://{LISTEN}/v1 http://{LISTEN}")
    );
    let req = seen.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(
        req.head.starts_with("POST /v1/chat/completions "),
        "{}",
        req.head
    );
    // The request was a turn: one checkpoint, and the metrics say so.
    let h: Vec<Value> = serde_json::from_str(&crabctl_ok(&["ls", &g.id, "--json"])).unwrap();
    assert_eq!(h.len(), 1, "{h:?}");
    let stats: Value = serde_json::from_str(&crabctl_ok(&["stats", &g.id, "--json"])).unwrap();
    assert_eq!(stats["turns"], 1, "{stats}");
    assert_eq!(stats["full"], 1, "{stats}");
    assert_eq!(stats["checkpoint_ms"]["count"], 1, "{stats}");
    // The full turn froze the container and wrote a process image: one sample
    // of each step, each within the whole checkpoint.
    let ms = |what: &str| stats[what]["max"].as_f64().expect("a figure");
    for step in ["freeze_ms", "sync_ms"] {
        assert_eq!(stats[step]["count"], 1, "{step}: {stats}");
    }
    assert!(
        ms("freeze_ms") + ms("sync_ms") <= ms("checkpoint_ms"),
        "{stats}"
    );
    let text = crabctl_ok(&["stats", &g.id]);
    for line in ["  freeze      ms: p50 ", "  sync        ms: p50 "] {
        assert!(text.contains(line), "no {line:?} in {text}");
    }
    assert!(
        wait_until(Duration::from_secs(5), || {
            let s: Value = serde_json::from_str(&crabctl_ok(&["stats", &g.id, "--json"])).unwrap();
            s["gating_ms"]["count"] == 1
        }),
        "the held answer was not reported"
    );
}

/// The agent outside the sandbox: a long-lived process in the network
/// namespace it was started in, making one HTTP request through the proxy per
/// line on stdin (`METHOD PATH BODY`) and printing the status and body.
/// It sends the sandbox's agent API token when it was given one (`AGENT_TOKEN`).
const HOST_AGENT: &str = r#"
import http.client, sys, json, os
headers = {'Content-Type': 'application/json'}
if os.environ.get('AGENT_TOKEN'):
    headers['Authorization'] = 'Bearer ' + os.environ['AGENT_TOKEN']
for line in sys.stdin:
    method, path, body = (line.rstrip('\n').split(' ', 2) + [''])[:3]
    c = http.client.HTTPConnection('127.0.0.1', 8787, timeout=120)
    c.request(method, path, body=body or None, headers=headers)
    r = c.getresponse()
    print(json.dumps({'status': r.status, 'body': r.read().decode()}), flush=True)
"#;

/// A running [`HOST_AGENT`].
struct Agent {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Agent {
    /// Starts it in the network namespace of `pid`, with the sandbox's token
    /// (read, as a platform would, from the environment the shim gave the init).
    fn start(pid: i32) -> Agent {
        let token = crab_runtime::api_token::from_environ(pid)
            .unwrap_or_else(|| panic!("the init {pid} has no {}", crab_runtime::api_token::ENV));
        Agent::start_with(pid, &token)
    }

    /// A sidecar in the namespace of `pid` that does not know the token.
    fn start_without_token(pid: i32) -> Agent {
        Agent::start_with(pid, "")
    }

    fn start_with(pid: i32, token: &str) -> Agent {
        let mut child = Command::new("nsenter")
            .env("AGENT_TOKEN", token)
            .arg(format!("--net=/proc/{pid}/ns/net"))
            .args(["python3", "-c", HOST_AGENT])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the agent");
        let out = BufReader::new(child.stdout.take().unwrap());
        Agent { child, out }
    }

    fn request(&mut self, method: &str, path: &str, body: &Value) -> (u16, String) {
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{method} {path} {body}").unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        (
            v["status"].as_u64().unwrap() as u16,
            v["body"].as_str().unwrap().to_string(),
        )
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A runtime configuration whose proxy allows `upstream` (none by default).
fn allowing(upstream: &str) -> String {
    config_with(&format!("[proxy]\nupstreams = [\"{upstream}\"]"))
        .to_string_lossy()
        .into_owned()
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[test]
fn an_agent_checkpoints_rolls_back_and_forks_its_sandbox_and_carries_on() {
    let g = sandbox_with_proxy(Duration::ZERO);
    // The agent lives outside the sandbox's processes, in its network
    // namespace as it was when the agent started.
    let first = g.pid();
    let mut agent = Agent::start(first);

    let (status, body) = agent.request("POST", "/.crab/v1/checkpoints", &json!({"name": "before"}));
    assert_eq!(status, 201, "{body}");
    assert_eq!(json_of(&body)["checkpoint"]["name"], "before");
    // A checkpoint that does not exist: not found, from the agent API and crabctl alike.
    let (status, body) = agent.request(
        "POST",
        "/.crab/v1/rollback",
        &json!({"checkpoint": "never-taken"}),
    );
    assert_eq!(status, 404, "{body}");
    assert_eq!(json_of(&body)["kind"], "not-found", "{body}");
    let out = crabctl(&["rollback", &g.id, "never-taken"], &[]);
    assert_eq!(out.status.code(), Some(3), "crabctl: {}", text(&out).1);
    assert!(text(&out).1.contains("never-taken"), "{}", text(&out).1);

    g.exec_ok(&["sh", "-c", "echo oops > /root/mistake"]);
    let (status, body) = agent.request(
        "POST",
        "/.crab/v1/rollback",
        &json!({"checkpoint": "before"}),
    );
    assert_eq!(status, 200, "{body}");
    assert!(
        !g.exec(&["test", "-e", "/root/mistake"]).status.success(),
        "the file written after the checkpoint is still there"
    );

    // The agent carries on: its next LLM request is a turn, as before.
    let (status, body) = agent.request("POST", "/v1/chat/completions", &json!({}));
    assert_eq!((status, body.as_str()), (200, llm::JSON_ANSWER));

    // The restored processes are in a new network namespace, and the proxy
    // listens there too.
    let restored = g.pid();
    assert_ne!(restored, first);
    let mut inside = Agent::start(restored);
    let (status, body) = inside.request("GET", "/.crab/v1/checkpoints", &Value::Null);
    assert_eq!(status, 200, "{body}");
    let names: Vec<String> = json_of(&body)["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert!(names.contains(&"before".to_string()), "{names:?}");

    // The same operations as MCP tools.
    let mut call = |name: &str, args: Value| {
        let msg = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": name, "arguments": args}});
        let (status, body) = inside.request("POST", "/.crab/mcp", &msg);
        assert_eq!(status, 200, "{body}");
        let v = json_of(&body);
        assert_eq!(v["result"]["isError"], false, "{v}");
        json_of(v["result"]["content"][0]["text"].as_str().unwrap())
    };
    let listed = call("sandbox_list_checkpoints", json!({}));
    assert!(listed.to_string().contains("\"before\""), "{listed}");
    let forked = call("sandbox_fork", json!({"checkpoint": "before", "count": 1}));
    let ids: Vec<String> = serde_json::from_value(forked["ids"].clone()).unwrap();
    assert_eq!(ids.len(), 1, "{forked}");
    let fork = Guard::new(&ids[0]);
    let tasks = ctr_ok(&["task", "ls"]);
    assert!(
        tasks
            .lines()
            .any(|l| l.starts_with(&fork.id) && l.contains("RUNNING")),
        "{tasks}"
    );
    assert!(!fork.exec(&["test", "-e", "/root/mistake"]).status.success());

    // Rollback as an MCP tool, then the first agent carries on.
    g.exec_ok(&["sh", "-c", "echo again > /root/mistake"]);
    let rolled = call("sandbox_rollback", json!({"checkpoint": "before"}));
    assert_eq!(
        rolled["rolled_back"]["checkpoint"]["name"], "before",
        "{rolled}"
    );
    assert!(!g.exec(&["test", "-e", "/root/mistake"]).status.success());
    let (status, _) = agent.request("POST", "/v1/chat/completions", &json!({}));
    assert_eq!(status, 200);
}

/// An agent in the sandbox that checkpoints, changes a file, rolls back through
/// the agent API and writes down what it got and what it remembers.
const ROLLING_AGENT: &str = r#"
import json, os, time, urllib.request
def call(path, body):
    req = urllib.request.Request('http://127.0.0.1:8787' + path, method='POST',
        data=json.dumps(body).encode(),
        headers={'Content-Type': 'application/json',
                 'Authorization': 'Bearer ' + os.environ['CRAB_API_TOKEN']})
    return json.loads(urllib.request.urlopen(req, timeout=120).read())
memory = ['started']
open('/root/f', 'w').write('v1')
memory.append(call('/.crab/v1/checkpoints', {'name': 'a'})['checkpoint']['name'])
open('/root/f', 'w').write('v2')
answer = call('/.crab/v1/rollback', {'checkpoint': 'a'})
memory.append('rolled back')
result = {'memory': memory, 'answer': answer, 'file': open('/root/f').read(), 'pid': os.getpid()}
open('/dev/shm/result', 'w').write(json.dumps(result))
time.sleep(100000)
"#;

#[test]
fn an_agent_inside_that_rolls_back_gets_the_answer_and_only_its_files_go_back() {
    let g = llm::proxied_sandbox(Duration::ZERO, "", &["python3", "-c", ROLLING_AGENT]);
    let pid = g.pid();
    let result = format!("/proc/{pid}/root/dev/shm/result");
    assert!(
        wait_until(Duration::from_secs(60), || std::path::Path::new(&result)
            .exists()),
        "the agent never wrote its result"
    );
    let r = json_of(&std::fs::read_to_string(&result).unwrap());
    // The files went back; the agent kept running (same process, same memory)
    // and got the rollback's answer, which says the processes were kept.
    assert_eq!(r["file"], "v1", "{r}");
    assert_eq!(r["memory"], json!(["started", "a", "rolled back"]), "{r}");
    // The agent is the init (pid 1 in its namespace), and it was not replaced.
    assert_eq!(r["pid"].as_i64(), Some(1), "{r}");
    let report = &r["answer"]["rolled_back"];
    assert_eq!(report["checkpoint"]["name"], "a", "{r}");
    assert_eq!(report["processes"], false, "{r}");
    assert_eq!(report["pid"].as_i64(), Some(i64::from(pid)), "{r}");
    assert_eq!(g.pid(), pid, "the init was replaced");
    // The rollback changed the files behind the inspector: the next turn takes them.
    let dry = crabctl_ok(&["turn", &g.id, "--dry-run"]);
    assert!(!dry.contains("skip"), "{dry}");
}

fn stats(id: &str) -> Value {
    serde_json::from_str(&crabctl_ok(&["stats", id, "--json"])).unwrap()
}

#[test]
fn answers_are_held_only_while_their_checkpoint_is_pending() {
    let g = sandbox_with_proxy(Duration::from_millis(5));
    let mut agent = Agent::start(g.pid());

    // The LLM answers at once; the turn's first checkpoint (full) is still
    // running: the answer waits for it, and the checkpoint is promoted.
    g.exec_ok(&["sh", "-c", "echo 1 > /root/a"]);
    let (status, body) = agent.request(
        "POST",
        "/v1/chat/completions",
        &json!({"stream": true, "think_ms": 0}),
    );
    assert_eq!((status, body.as_str()), (200, SSE.concat().as_str()));
    let s = stats(&g.id);
    assert_eq!(
        (s["turns"].clone(), s["full"].clone()),
        (json!(1), json!(1)),
        "{s}"
    );
    // The promotion reaches the shim beside the answer, not before it.
    assert!(
        wait_until(Duration::from_secs(5), || stats(&g.id)["promoted"] == 1),
        "{}",
        stats(&g.id)
    );

    // The LLM thinks for 3 s; the fs-only checkpoint is durable long before:
    // nothing is promoted and the answer (not streamed) passes at once.
    g.exec_ok(&["sh", "-c", "echo 2 > /root/b"]);
    let (status, body) = agent.request(
        "POST",
        "/v1/messages",
        &json!({"stream": false, "think_ms": 3000}),
    );
    assert_eq!((status, body.as_str()), (200, llm::JSON_ANSWER));
    let s = stats(&g.id);
    assert_eq!(
        (s["turns"].clone(), s["fs_only"].clone()),
        (json!(2), json!(1)),
        "{s}"
    );
    assert_eq!(s["promoted"], 1, "{s}");
    assert!(
        wait_until(Duration::from_secs(5), || stats(&g.id)["gating_ms"]
            ["count"]
            == 2),
        "{}",
        stats(&g.id)
    );
}

#[test]
fn a_container_reaches_only_its_own_agent_api() {
    let a = sandbox_with_proxy(Duration::ZERO);
    let b = sandbox_with_proxy(Duration::ZERO);
    a.exec_ok(&["sh", "-c", "echo kept > /root/a-file"]);
    crabctl_ok(&["checkpoint", &a.id, "--name", "only-a"]);
    a.exec_ok(&["sh", "-c", "echo later > /root/a-file"]);

    let mut from_b = Agent::start(b.pid());
    let (status, body) = from_b.request("GET", "/.crab/v1/checkpoints", &Value::Null);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        json_of(&body)["checkpoints"],
        json!([]),
        "b sees a's history"
    );
    let (status, body) = from_b.request(
        "POST",
        "/.crab/v1/rollback",
        &json!({"checkpoint": "only-a"}),
    );
    // b has no such checkpoint: not found, and a is untouched.
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("only-a"), "{body}");
    assert_eq!(a.exec_ok(&["cat", "/root/a-file"]), "later\n");
    assert_eq!(a.status().as_deref(), Some("RUNNING"));
}

#[test]
fn the_proxy_dies_with_its_shim_and_comes_back_with_a_restored_container() {
    let g = sandbox_with_proxy(Duration::ZERO);
    assert_eq!(proxy_pids(&g.id).len(), 1, "one proxy per container");
    crabctl_ok(&["checkpoint", &g.id, "--name", "safe"]);
    // The crash: the shim and the container's processes, SIGKILL.
    let mut victims = crab_integration::shim_pids(&g.id);
    victims.push(g.pid());
    for pid in victims {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    assert!(
        wait_until(Duration::from_secs(10), || proxy_pids(&g.id).is_empty()),
        "the proxy outlived its shim"
    );
    assert!(wait_until(Duration::from_secs(20), || g
        .status()
        .as_deref()
        != Some("RUNNING")));
    crabctl_ok(&["restore", &g.id]);
    assert_eq!(proxy_pids(&g.id).len(), 1, "no proxy after the restore");
    let mut agent = Agent::start(g.pid());
    let (status, body) = agent.request("GET", "/.crab/v1/checkpoints", &Value::Null);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"safe\""), "{body}");
    let (status, _) = agent.request("POST", "/v1/chat/completions", &json!({}));
    assert_eq!(status, 200);
}

/// Issue 17 item 8: a process that shares the sandbox's network namespace but was
/// not given its token (a sidecar, a web page's fetch) gets 401 from every agent
/// API route, REST and MCP, and takes no checkpoint, rollback or fork.
#[test]
fn a_sidecar_without_the_token_gets_401_and_takes_no_checkpoint() {
    let g = sandbox_with_proxy(Duration::ZERO);
    let mut sidecar = Agent::start_without_token(g.pid());
    let mcp = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                     "params": {"name": "sandbox_checkpoint", "arguments": {}}});
    for (method, path, body) in [
        ("GET", "/.crab/v1/checkpoints", Value::Null),
        ("POST", "/.crab/v1/checkpoints", json!({"name": "sidecar"})),
        ("POST", "/.crab/v1/fork", json!({"count": 3})),
        ("POST", "/.crab/v1/rollback", json!({"checkpoint": 1})),
        ("POST", "/.crab/mcp", mcp),
    ] {
        let (status, body) = sidecar.request(method, path, &body);
        assert_eq!(status, 401, "{method} {path}: {body}");
        assert!(body.contains("CRAB_API_TOKEN"), "{body}");
    }
    let h: Vec<Value> = serde_json::from_str(&crabctl_ok(&["ls", &g.id, "--json"])).unwrap();
    assert!(h.is_empty(), "the sidecar took a checkpoint: {h:?}");
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    // The LLM routes are not the agent API's: they pass without the token.
    let (status, body) = sidecar.request("POST", "/v1/chat/completions", &json!({}));
    assert_eq!((status, body.as_str()), (200, llm::JSON_ANSWER));
    // The sandbox's own processes have the token, in the init's and each exec's
    // environment, and their requests pass.
    let token = g.exec_ok(&["sh", "-c", "printf %s \"$CRAB_API_TOKEN\""]);
    assert_eq!(token.len(), 64, "{token:?}");
    assert_eq!(
        crab_runtime::api_token::from_environ(g.pid()).as_deref(),
        Some(token.as_str())
    );
    let mut agent = Agent::start(g.pid());
    let (status, body) = agent.request("POST", "/.crab/v1/checkpoints", &json!({"name": "own"}));
    assert_eq!(status, 201, "{body}");
}

/// The error `ctr run` reports for a container of the crab runtime with `flags`.
fn refused_run(flags: &[&str]) -> String {
    let id = crab_integration::unique_id("t");
    let _g = Guard::new(&id);
    let mut args = vec!["run", "-d", "--runtime", CRAB];
    args.extend_from_slice(flags);
    args.extend([PYTHON, id.as_str(), "sleep", "infinity"]);
    let out = crab_integration::ctr_run(&args, None, Duration::from_secs(60));
    assert!(!out.status.success(), "ctr run {flags:?} succeeded");
    text(&out).1
}

/// Issue 17 item 8: an annotation cannot open the agent API to the network.
#[test]
fn a_listen_annotation_beyond_loopback_is_refused() {
    let config = allowing("http://127.0.0.1:9");
    for listen in ["0.0.0.0:8787", "[::]:8787"] {
        let err = refused_run(&[
            "--runtime-config-path",
            &config,
            "--annotation",
            "io.crab.proxy.upstream=http://127.0.0.1:9",
            "--annotation",
            &format!("io.crab.proxy.listen={listen}"),
        ]);
        assert!(err.contains("io.crab.proxy.listen"), "{err}");
        assert!(err.contains("not a loopback address"), "{err}");
        assert!(err.to_lowercase().contains("invalid argument"), "{err}");
    }
    // The host may allow it.
    let config =
        config_with("[proxy]\nupstreams = [\"http://127.0.0.1:9\"]\nallow_listen = [\"0.0.0.0\"]");
    let g = Guard::run_detached(
        CRAB,
        PYTHON,
        &[
            "--runtime-config-path",
            &config.to_string_lossy(),
            "--annotation",
            "io.crab.proxy.upstream=http://127.0.0.1:9",
            "--annotation",
            "io.crab.proxy.listen=0.0.0.0:8787",
        ],
        &["sleep", "infinity"],
    );
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
}

/// Issue 17 item 8: an annotation chooses among the host's upstreams and never
/// adds one (the proxy connects from the host's network: the host's loopback, a
/// metadata address).
#[test]
fn an_upstream_annotation_not_on_the_list_is_refused() {
    let config = allowing("http://127.0.0.1:9");
    for upstream in ["http://169.254.169.254", "http://127.0.0.1:22"] {
        let err = refused_run(&[
            "--runtime-config-path",
            &config,
            "--annotation",
            &format!("io.crab.proxy.upstream={upstream}"),
        ]);
        assert!(err.contains("not an upstream the host allows"), "{err}");
        assert!(err.to_lowercase().contains("invalid argument"), "{err}");
    }
    // The host's own configuration, without this runtime configuration: the same.
    let err = refused_run(&["--annotation", "io.crab.proxy.upstream=http://127.0.0.1:2"]);
    assert!(err.contains("not an upstream the host allows"), "{err}");
}

/// The agent's state paths are left out of every turn's signal: an annotation
/// cannot name the root, climb out with `..`, or give a relative path; nor can
/// it turn fast-forward into anything but true or false.
#[test]
fn an_agent_state_paths_annotation_that_is_not_plain_is_refused() {
    let config = allowing("http://127.0.0.1:9");
    for paths in ["/", "/root/../etc", "root/.claude", "/root/.claude,/tmp//x"] {
        let err = refused_run(&[
            "--runtime-config-path",
            &config,
            "--annotation",
            "io.crab.proxy.upstream=http://127.0.0.1:9",
            "--annotation",
            "io.crab.agent.fast-forward=true",
            "--annotation",
            &format!("io.crab.agent.state-paths={paths}"),
        ]);
        assert!(err.contains("io.crab.agent.state-paths"), "{paths}: {err}");
        assert!(err.contains("plain absolute path"), "{paths}: {err}");
        assert!(err.to_lowercase().contains("invalid argument"), "{err}");
    }
    let err = refused_run(&[
        "--runtime-config-path",
        &config,
        "--annotation",
        "io.crab.proxy.upstream=http://127.0.0.1:9",
        "--annotation",
        "io.crab.agent.fast-forward=yes",
    ]);
    assert!(err.contains("io.crab.agent.fast-forward"), "{err}");
}
