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
//!
//! Nothing turns fast-forward on or off here: this is the default path, where
//! the proxy journals each answer and Claude Code's own turns may be skipped
//! (`agent_fast_forward.rs` tests the skips and the recovery).

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_integration::anthropic::{tool_use_id, Scripted, Step};
use crab_integration::{claude, crabctl_ok, interfaces, journal_dir};
use serde_json::{json, Value};

/// What Claude Code is asked to do; the script below does it.
const TASK: &str = "Create /root/hello.txt saying hello, then write notes.md.";

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

#[test]
fn claude_code_runs_a_scripted_task_through_the_proxy_one_checkpoint_per_request() {
    let llm = Scripted::start(script());
    let g = claude::run(&llm, TASK, &[]);
    let pid = g.pid();
    // Loopback is the sandbox's only interface: the proxy is its only way out.
    assert_eq!(interfaces(pid), ["lo"]);
    // Claude Code is not told where its LLM is: the shim injected the proxy.
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("the init's environ");
    assert!(
        environ
            .split(|&b| b == 0)
            .any(|v| v == b"ANTHROPIC_BASE_URL=http://127.0.0.1:8787"),
        "no injected ANTHROPIC_BASE_URL: {}",
        String::from_utf8_lossy(&environ)
    );
    let (code, out, err) = claude::finished(&g, &llm, Duration::from_secs(240));
    let seen = llm.seen();
    let log = claude::requests(&llm);
    eprintln!("requests the scripted server saw: {log:#?}");
    assert_eq!(
        code, "0",
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

    // One checkpoint per Messages request, side requests included (a skipped
    // turn records a skip entry).
    let messages = seen.iter().filter(|s| s.is_message()).count();
    let history: Vec<Value> = serde_json::from_str(&crabctl_ok(&["ls", &g.id, "--json"]))
        .expect("crabctl ls --json is JSON");
    eprintln!("history: {history:#?}");
    assert_eq!(
        history.len(),
        messages,
        "requests: {log:#?}\nhistory: {history:?}"
    );
    // Fast-forward is on by default: the agent goes with every checkpoint, so a
    // turn is a skip or full, never one half.
    let kinds: Vec<&str> = history.iter().filter_map(|e| e["kind"].as_str()).collect();
    eprintln!("kinds: {kinds:?}");
    assert!(
        kinds.iter().all(|k| *k == "skip" || *k == "full"),
        "{kinds:?}"
    );
    // And each answer Claude Code got is in the journal under its turn's seq.
    let journal = journal_dir(&g.id);
    let mut bytes = 0;
    for e in &history {
        let file = journal.join(format!("{}.exchange", e["seq"]));
        let len = std::fs::metadata(&file)
            .unwrap_or_else(|err| panic!("{}: {err}", file.display()))
            .len();
        bytes += len;
    }
    eprintln!(
        "journal: {} exchanges, {bytes} bytes ({} per turn)",
        history.len(),
        bytes / history.len() as u64
    );
}
