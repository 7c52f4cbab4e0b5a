//! The real Claude Code CLI, unmodified, as an agent in a crab sandbox: its
//! LLM is a scripted Anthropic server on the host, reached only through the
//! sandbox's turn proxy, and every request it makes ends a turn.
//!
//! The sandbox has loopback only (ctr's default: a network namespace of its
//! own with nothing but `lo`), so the proxy on 127.0.0.1:8787 inside it is the
//! only way out. Claude Code finds it through the `ANTHROPIC_BASE_URL` the
//! shim injects; telemetry, error reporting, auto-updates and other
//! non-essential traffic are turned off through its environment variables, and
//! its API key is a dummy the scripted server ignores. See docs/agents.md.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_integration::anthropic::{tool_use_id, Scripted, Step};
use crab_integration::{config_with, crabctl_ok, ctr_ok, wait_until, Guard, AGENT, CRAB};
use serde_json::{json, Value};

/// What Claude Code is asked to do; the script below does it.
const TASK: &str = "Create /root/hello.txt saying hello, then write notes.md.";

/// The init: Claude Code headless in root's home (stdin closed, which it
/// would otherwise wait 3 s for), its output and exit code kept, then idle so
/// the test can look inside.
const INIT: &str = "cd /root && \
    claude -p \"$TASK\" --output-format stream-json --verbose \
      --dangerously-skip-permissions </dev/null >/tmp/claude.out 2>/tmp/claude.err; \
    echo $? >/dev/shm/claude.exit; exec sleep infinity";

/// The files the script makes and what they must hold.
const HELLO: &str = "hello from crab\n";
const NOTES: &str = "# Notes\n\nWritten by Claude Code's Write tool.\n";

fn script() -> Vec<Step> {
    vec![
        Step::Tool(
            "Bash",
            json!({"command": "printf 'hello from crab\\n' > /root/hello.txt && cat /root/hello.txt",
                "description": "Write hello.txt"}),
        ),
        Step::Tool(
            "Write",
            json!({"file_path": "/root/notes.md", "content": NOTES}),
        ),
        Step::Text("Done: hello.txt and notes.md are written."),
    ]
}

/// A file inside the sandbox, read from the host through the init's root (an
/// exec while Claude Code runs would refuse the turn's checkpoint).
fn read_inside(pid: i32, path: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/root{path}")).ok()
}

#[test]
fn claude_code_runs_a_scripted_task_through_the_proxy_one_checkpoint_per_request() {
    let images = ctr_ok(&["images", "ls", "-q"]);
    assert!(
        images.lines().any(|l| l == AGENT),
        "{AGENT} is not imported: run `hack/build-images.sh agent`, then `hack/containerd.sh start`"
    );
    let llm = Scripted::start(script());
    let upstream = llm.url();
    let config = config_with(&format!("[proxy]\nupstreams = [\"{upstream}\"]\n"));
    let task = format!("TASK={TASK}");
    let g = Guard::run_detached(
        CRAB,
        AGENT,
        &[
            "--runtime-config-path",
            &config.to_string_lossy(),
            "--annotation",
            &format!("io.crab.proxy.upstream={upstream}"),
            "--env",
            "HOME=/root",
            // As root, Claude Code refuses --dangerously-skip-permissions
            // unless told it is in a sandbox. (A non-root init cannot be
            // checkpointed where root lacks CAP_SYS_RESOURCE: CRIU's prlimit
            // of another user's process gets EPERM.)
            "--env",
            "IS_SANDBOX=1",
            "--env",
            &task,
            "--env",
            "ANTHROPIC_API_KEY=sk-ant-dummy-for-the-scripted-server",
            "--env",
            "DISABLE_TELEMETRY=1",
            "--env",
            "DISABLE_ERROR_REPORTING=1",
            "--env",
            "DISABLE_AUTOUPDATER=1",
            "--env",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
        ],
        &["sh", "-c", INIT],
    );
    let pid = g.pid();
    // Loopback is the sandbox's only interface: the proxy is its only way out.
    let dev = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).expect("the init's net/dev");
    let ifaces: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next().map(str::trim))
        .collect();
    assert_eq!(ifaces, ["lo"], "{dev}");
    // Claude Code is not told where its LLM is: the shim injected the proxy.
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("the init's environ");
    assert!(
        environ
            .split(|&b| b == 0)
            .any(|v| v == b"ANTHROPIC_BASE_URL=http://127.0.0.1:8787"),
        "no injected ANTHROPIC_BASE_URL: {}",
        String::from_utf8_lossy(&environ)
    );
    let exited = wait_until(Duration::from_secs(240), || {
        read_inside(pid, "/dev/shm/claude.exit").is_some_and(|s| s.ends_with('\n'))
    });
    let out = read_inside(pid, "/tmp/claude.out").unwrap_or_default();
    let err = read_inside(pid, "/tmp/claude.err").unwrap_or_default();
    let seen = llm.seen();
    let log: Vec<String> = seen
        .iter()
        .map(|s| format!("{} {} step={:?}", s.method, s.target, s.step))
        .collect();
    eprintln!("requests the scripted server saw: {log:#?}");
    assert!(
        exited,
        "Claude Code did not finish\nrequests: {log:#?}\nstdout: {out}\nstderr: {err}"
    );
    let code = read_inside(pid, "/dev/shm/claude.exit").unwrap();
    assert_eq!(
        code.trim(),
        "0",
        "requests: {log:#?}\nstdout: {out}\nstderr: {err}"
    );

    // The tools really ran, inside the sandbox.
    assert_eq!(g.exec_ok(&["cat", "/root/hello.txt"]), HELLO);
    assert_eq!(g.exec_ok(&["cat", "/root/notes.md"]), NOTES);

    // The script was played in order, and each step's result came back in the
    // request after it.
    let main: Vec<_> = seen.iter().filter(|s| s.step.is_some()).collect();
    let steps: Vec<usize> = main.iter().filter_map(|s| s.step).collect();
    assert_eq!(steps, [0, 1, 2], "requests: {log:#?}");
    let bash = &main[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "Bash")
        .unwrap()["input_schema"];
    assert!(bash["properties"]["command"].is_object(), "{bash}");
    let results = main[1].tool_results();
    assert!(
        results
            .iter()
            .any(|(id, c)| *id == tool_use_id(0) && c.contains("hello from crab")),
        "the Bash step's result is not in the next request: {results:?}"
    );
    assert!(
        main[2]
            .tool_results()
            .iter()
            .any(|(id, _)| *id == tool_use_id(1)),
        "the Write step's result is not in the next request: {:?}",
        main[2].tool_results()
    );

    // Claude Code's own account: a successful result with the final answer.
    let last: Value = out
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .rfind(|v: &Value| v["type"] == "result")
        .unwrap_or_else(|| panic!("no result line in stdout:\n{out}"));
    assert_eq!(last["subtype"], "success", "{last}");
    assert_eq!(last["result"], "Done: hello.txt and notes.md are written.");

    // One checkpoint per Messages request, side requests included.
    let messages = seen.iter().filter(|s| s.is_message()).count();
    let history: Vec<Value> = serde_json::from_str(&crabctl_ok(&["ls", &g.id, "--json"]))
        .expect("crabctl ls --json is JSON");
    eprintln!("history: {history:#?}");
    assert_eq!(
        history.len(),
        messages,
        "requests: {log:#?}\nhistory: {history:?}"
    );
}
