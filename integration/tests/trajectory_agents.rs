//! One recorded evaluation task (`eval/trajectories/data-sales.json`) driven
//! through both real agents, fault-free: Claude Code inside a crab sandbox
//! (`ctr`, its LLM through the shim's proxy) and mini-swe-agent outside one
//! (Docker, acting with `docker exec`). Each reaches the trajectory's checked
//! end (its `verify` script passes), and both end with the same state digest
//! (`crab_eval::state`): the trajectory means the same task to every agent.

// Needs root, the private containerd, dockerd, the agent image and
// mini-swe-agent's venv: built only with the `host-tests` feature.
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_integration::docker::{docker_inspect, DockerGuard, DOCKER_PYTHON, DOCKER_RUNTIME, MOBY};
use crab_integration::mini_swe_agent::{Agent, Options, Proxy};
use crab_integration::{
    anthropic, claude, crabctl_ok, kill_shim_and_init, namespace, openai, proxy_pids, trajectory,
    wait_until, Guard,
};
use serde_json::Value;

/// Data cleaning with awk and python, three files written: no server, so the
/// two agents' shells (Claude Code's bash, `docker exec`'s) see the same task.
const TASK: &str = "data-sales";

/// Claude Code's own files are its state, not the task's (docs/agents.md).
const AGENT_STATE: &[&str] = &[
    "--annotation",
    "io.crab.agent.state-paths=/root/.claude,/tmp/claude-0,/tmp/claude.out,/tmp/claude.err",
];

/// The `tool_result`s Claude Code marked as errors in its last request, but
/// the `Read`s of files the task has not written yet (a `Write` of a new file
/// comes after one).
fn failed_tools(llm: &anthropic::Scripted) -> Vec<String> {
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

/// Waits for Claude Code in `g` to finish the task `llm` scripts: it exited 0,
/// and no tool call failed.
fn claude_code_finishes(g: &Guard, llm: &anthropic::Scripted) {
    let (code, out, err) = claude::finished(g, llm, Duration::from_secs(900));
    assert_eq!(code, "0", "stdout: {out}\nstderr: {err}");
    assert_eq!(failed_tools(llm), Vec::<String>::new());
}

fn claude_code_does(t: &crab_eval::trajectory::Trajectory) -> crab_eval::state::Ending {
    let steps = trajectory::claude_steps(t);
    let n = steps.len();
    let llm = anthropic::Scripted::start(steps);
    let g = claude::run(&llm, &t.title, AGENT_STATE);
    claude_code_finishes(&g, &llm);
    let asked: Vec<usize> = llm.seen().iter().filter_map(|s| s.step).collect();
    assert_eq!(
        asked,
        (0..n).collect::<Vec<_>>(),
        "{:#?}",
        claude::requests(&llm)
    );
    let ending = trajectory::ending(&namespace(), &g.id, t);
    let history: Vec<Value> =
        serde_json::from_str(&crabctl_ok(&["ls", &g.id, "--json"])).expect("crabctl ls --json");
    let skipped = history.iter().filter(|e| e["kind"] == "skip").count();
    eprintln!(
        "Claude Code inside: {} requests; of the {} entries its history keeps, {skipped} skips; {ending:?}",
        n,
        history.len()
    );
    ending
}

fn mini_swe_agent_does(t: &crab_eval::trajectory::Trajectory) -> crab_eval::state::Ending {
    let steps = trajectory::mini_steps(t);
    let n = steps.len();
    let llm = openai::Scripted::start(steps);
    let mut agent = Agent::start(&Options {
        image: DOCKER_PYTHON,
        run_args: &["--rm", "--runtime", DOCKER_RUNTIME, "--network", "none"],
        config: "mini",
        model_class: "litellm",
        task: &t.title,
    });
    let sandbox = DockerGuard::new(&agent.id);
    let _proxy = Proxy::start(&agent.id, &llm.url(), &agent.dir.path().join("proxy.log"));
    let pid: i32 = docker_inspect(&sandbox.name, "{{.State.Pid}}")
        .parse()
        .expect("the sandbox init's pid");
    agent.go(pid);
    let result: Value = serde_json::from_str(&agent.line("result ", Duration::from_secs(900)))
        .expect("the result is JSON");
    assert_eq!(
        result["exit_status"],
        "Submitted",
        "{result}\nstderr:\n{}",
        agent.stderr()
    );
    let asked: Vec<usize> = llm
        .seen()
        .iter()
        .filter(|s| s.is_chat())
        .filter_map(|s| s.step)
        .collect();
    assert_eq!(asked, (0..n).collect::<Vec<_>>());
    // Every command exited 0: mini-swe-agent's observations (its `mini`
    // configuration's template) carry `"returncode": N`.
    let trajectory = agent.trajectory();
    let observations: Vec<&str> = trajectory["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] != "assistant")
        .filter_map(|m| m["content"].as_str())
        .filter(|text| text.contains("\"returncode\": "))
        .collect();
    assert_eq!(observations.len(), n - 1, "{observations:#?}");
    let failed: Vec<&&str> = observations
        .iter()
        .filter(|text| !text.contains("\"returncode\": 0,"))
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
    let ending = trajectory::ending(MOBY, &agent.id, t);
    eprintln!("mini-swe-agent outside: {n} requests; {ending:?}");
    assert_eq!(agent.finish(), Some(0), "stderr:\n{}", agent.stderr());
    ending
}

#[test]
fn one_recorded_task_ends_checked_and_the_same_under_claude_code_inside_and_mini_swe_agent_outside()
{
    let t = trajectory::load(TASK);
    let claude = claude_code_does(&t);
    assert!(claude.verified, "Claude Code: {TASK}'s verify failed");
    let mini = mini_swe_agent_does(&t);
    assert!(mini.verified, "mini-swe-agent: {TASK}'s verify failed");
    assert_eq!(claude.digest, mini.digest, "the two agents' states differ");
}

/// The step whose answer the crash test holds: after three of the task's
/// files were written and its data cleaned (turn 13 of 23).
const CRASH_AT_STEP: usize = 15;

#[test]
fn claude_code_crashed_in_the_middle_of_a_recorded_task_is_restored_and_ends_as_without_the_crash()
{
    let t = trajectory::load(TASK);
    let fault_free = claude_code_does(&t);
    assert!(fault_free.verified, "Claude Code: {TASK}'s verify failed");

    let llm = anthropic::Scripted::start(trajectory::claude_steps(&t));
    llm.hold_step(CRASH_AT_STEP);
    let g = claude::run(&llm, &t.title, AGENT_STATE);
    assert!(
        llm.wait_held(Duration::from_secs(600)),
        "Claude Code never asked for step {CRASH_AT_STEP}: {:#?}",
        claude::requests(&llm)
    );
    kill_shim_and_init(&g);
    // The whole sandbox is gone, its proxy too, before the held answer comes.
    assert!(
        wait_until(Duration::from_secs(10), || proxy_pids(&g.id).is_empty()),
        "the proxy outlived its shim"
    );
    llm.let_go();
    let out = crabctl_ok(&["restore", &g.id]);
    eprintln!("{out}");
    claude_code_finishes(&g, &llm);
    let recovered = trajectory::ending(&namespace(), &g.id, &t);
    let log = std::fs::read_to_string(
        crab_integration::state_dir()
            .join(namespace())
            .join(format!("{}.proxy.log", g.id)),
    )
    .unwrap_or_default();
    let replay = log.lines().filter(|l| l.contains("fast-forward: "));
    eprintln!(
        "after the crash at step {CRASH_AT_STEP}: {recovered:?}\n{}",
        replay.collect::<Vec<_>>().join("\n")
    );
    assert!(
        recovered.verified,
        "{TASK}'s verify failed after the restore"
    );
    assert_eq!(
        recovered.digest, fault_free.digest,
        "the restored run's state differs from the fault-free run's"
    );
}
