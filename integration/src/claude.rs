//! Claude Code in a crab sandbox, for the tests that run the real agent
//! (`tests/claude_code.rs`, `tests/agent_fast_forward.rs`): how it is started,
//! and how the test reads what it did. See docs/agents.md.

use std::time::Duration;

use serde_json::Value;

use crate::anthropic::Scripted;
use crate::{config_with, ctr_ok, wait_until, Guard, AGENT, CRAB};

/// Claude Code's own files are its state, not the task's (docs/agents.md):
/// the annotation that says so, as `ctr run` arguments.
pub const STATE_PATHS: &[&str] = &[
    "--annotation",
    "io.crab.agent.state-paths=/root/.claude,/tmp/claude-0,/tmp/claude.out,/tmp/claude.err",
];

/// The same, for Claude Code run as the image's user `crab` ([`User::Crab`]).
pub const STATE_PATHS_AS_CRAB: &[&str] = &[
    "--annotation",
    "io.crab.agent.state-paths=/home/crab/.claude,/tmp/claude-1000,/tmp/claude.out,/tmp/claude.err",
];

/// Who Claude Code runs as in the sandbox.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum User {
    /// Root, the init's user, in `/root`.
    Root,
    /// The agent image's user `crab` (uid and gid 1000), in `/home/crab`,
    /// started by the init (root) with `setpriv`: in a sandbox with a user
    /// namespace, the agent holds no capability even there. (Without one,
    /// where host root lacks CAP_SYS_RESOURCE, CRIU's prlimit of another
    /// user's process gets EPERM: such a tree cannot be checkpointed.)
    Crab,
}

impl User {
    /// Its `ctr run` arguments: the home, and for root the word that lets it
    /// skip permissions (Claude Code refuses `--dangerously-skip-permissions`
    /// to root unless told it is in a sandbox).
    fn env(self) -> &'static [&'static str] {
        match self {
            User::Root => &["--env", "HOME=/root", "--env", "IS_SANDBOX=1"],
            User::Crab => &["--env", "HOME=/home/crab"],
        }
    }

    /// The init: Claude Code headless in the user's home (stdin closed, which
    /// it would otherwise wait 3 s for), its output and exit code kept, then
    /// idle so the test can look inside. `$TASK` is what it is asked to do.
    fn init(self) -> String {
        let (home, run_as) = match self {
            User::Root => ("/root", ""),
            User::Crab => (
                "/home/crab",
                "setpriv --reuid 1000 --regid 1000 --init-groups ",
            ),
        };
        format!(
            "cd {home} && \
             {run_as}claude -p \"$TASK\" --output-format stream-json --verbose \
               --dangerously-skip-permissions </dev/null >/tmp/claude.out 2>/tmp/claude.err; \
             echo $? >/dev/shm/claude.exit; exec sleep infinity"
        )
    }
}

/// Its environment: the scripted server's dummy key, no telemetry, error
/// reports or updates (`ctr run` arguments; [`User::env`] adds the rest).
const ENV: &[&str] = &[
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
];

/// Claude Code running `task` in a sandbox whose proxy goes to `llm`, with
/// these extra `ctr run` arguments (annotations).
pub fn run(llm: &Scripted, task: &str, extra: &[&str]) -> Guard {
    run_configured(llm, task, extra, "")
}

/// [`run`], with `config` (TOML) added to the shim's configuration: say a
/// `fault_file` for a test that crashes the shim at a chosen point.
pub fn run_configured(llm: &Scripted, task: &str, extra: &[&str], config: &str) -> Guard {
    run_as(User::Root, llm, task, extra, config)
}

/// [`run_configured`], Claude Code run as `user`.
pub fn run_as(user: User, llm: &Scripted, task: &str, extra: &[&str], config: &str) -> Guard {
    assert_agent_image();
    let upstream = llm.url();
    let config = config_with(&format!(
        "{config}\n[proxy]\nupstreams = [\"{upstream}\"]\n"
    ));
    let task = format!("TASK={task}");
    let upstream_annotation = format!("io.crab.proxy.upstream={upstream}");
    let mut args = vec![
        "--runtime-config-path",
        config.to_str().expect("utf-8 path"),
        "--annotation",
        &upstream_annotation,
        "--env",
        &task,
    ];
    args.extend_from_slice(ENV);
    args.extend_from_slice(user.env());
    args.extend_from_slice(extra);
    Guard::run_detached(CRAB, AGENT, &args, &["sh", "-c", &user.init()])
}

/// Claude Code running `task` under `runtime` without a proxy or a
/// checkpoint: in the host's network, its base URL the scripted server's
/// (the evaluation's baselines).
pub fn run_unproxied(llm: &Scripted, runtime: &str, task: &str) -> Guard {
    assert_agent_image();
    let task = format!("TASK={task}");
    let base_url = format!("ANTHROPIC_BASE_URL={}", llm.url());
    let mut args = vec!["--net-host", "--env", &task, "--env", &base_url];
    args.extend_from_slice(ENV);
    args.extend_from_slice(User::Root.env());
    Guard::run_detached(runtime, AGENT, &args, &["sh", "-c", &User::Root.init()])
}

fn assert_agent_image() {
    let images = ctr_ok(&["images", "ls", "-q"]);
    assert!(
        images.lines().any(|l| l == AGENT),
        "{AGENT} is not imported: run `hack/build-images.sh agent`, then `hack/containerd.sh start`"
    );
}

/// A file inside the sandbox, read from the host through the init's root (an
/// exec while Claude Code runs would hold up the turn's checkpoint).
pub fn read_inside(pid: i32, path: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/root{path}")).ok()
}

/// Waits for Claude Code to finish in `g`; its exit code, stdout and stderr.
/// Panics, with what it printed and what the server saw, when it does not
/// finish in time.
pub fn finished(g: &Guard, llm: &Scripted, timeout: Duration) -> (String, String, String) {
    let exited = wait_until(timeout, || {
        read_inside(g.pid(), "/dev/shm/claude.exit").is_some_and(|s| s.ends_with('\n'))
    });
    let pid = g.pid();
    let out = read_inside(pid, "/tmp/claude.out").unwrap_or_default();
    let err = read_inside(pid, "/tmp/claude.err").unwrap_or_default();
    assert!(
        exited,
        "Claude Code did not finish\nrequests: {:#?}\nstdout: {out}\nstderr: {err}",
        requests(llm)
    );
    let code = read_inside(pid, "/dev/shm/claude.exit").unwrap_or_default();
    (code.trim().to_string(), out, err)
}

/// What the scripted server saw, a line each.
pub fn requests(llm: &Scripted) -> Vec<String> {
    llm.seen()
        .iter()
        .map(|s| format!("{} {} step={:?}", s.method, s.target, s.step))
        .collect()
}

/// The `tool_result`s Claude Code marked as errors in its last request, but
/// the `Read`s of files the task has not written yet (a `Write` of a new file
/// comes after one).
pub fn failed_tools(llm: &Scripted) -> Vec<String> {
    let seen = llm.seen();
    let Some(last) = seen
        .iter()
        .rev()
        .find(|s| s.is_message() && s.step.is_some())
    else {
        return vec!["no request".into()];
    };
    let mut failed = Vec::new();
    for m in last.body["messages"].as_array().into_iter().flatten() {
        for b in m["content"].as_array().into_iter().flatten() {
            if b["type"] == "tool_result" && b["is_error"] == true {
                let text = match &b["content"] {
                    Value::String(s) => s.clone(),
                    v => v.to_string(),
                };
                if !text.contains("does not exist") {
                    failed.push(text);
                }
            }
        }
    }
    failed
}

/// Waits (up to `timeout`) for Claude Code in `g` to finish the task `llm`
/// scripts: it exited 0, and no tool call failed.
pub fn finishes(g: &Guard, llm: &Scripted, timeout: Duration) {
    let (code, out, err) = finished(g, llm, timeout);
    assert_eq!(code, "0", "stdout: {out}\nstderr: {err}");
    assert_eq!(failed_tools(llm), Vec::<String>::new());
}
