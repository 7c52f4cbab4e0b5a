//! mini-swe-agent (PyPI `mini-swe-agent`, unmodified) on the host, acting on a
//! crab sandbox it makes itself through Docker (`docker run --runtime crab`), its
//! LLM a scripted OpenAI chat completions server on the host, reached only through
//! the sandbox's turn proxy: every request it makes ends a turn.
//!
//! The agent runs outside the sandbox and acts on it with `docker exec`. It
//! reaches the sandbox's proxy one of two ways (docs/proxy.md):
//! - it joins the sandbox's network namespace, as "Where the agent lives" says
//!   an agent outside does, and the proxy is one started by hand; the sandbox
//!   has loopback only (`--network none`), so the proxy on 127.0.0.1:8787 is the
//!   agent's only way to its LLM;
//! - it stays in the host's network and asks through the host door of the
//!   proxy the shim started (an annotation chooses its upstream): an HTTP
//!   client over the door's unix socket.
//!
//! See docs/agents.md.

// Needs root, the private containerd, dockerd and mini-swe-agent's venv: built
// only with the `host-tests` feature.
#![cfg(feature = "host-tests")]

use std::time::{Duration, Instant};

use crab_integration::docker::{
    crabctl_moby, docker_inspect, DockerGuard, DOCKER_PYTHON, DOCKER_RUNTIME,
};
use crab_integration::mini_swe_agent::{
    new_api_key, Agent, Options, Proxy, DOOR_UPSTREAM, INPUT_COST, OUTPUT_COST,
};
use crab_integration::openai::{Scripted, Step};
use crab_integration::{interfaces, text};
use serde_json::Value;

const TASK: &str = "Write 'hello from mini-swe-agent' to /root/hello.txt, check it, and submit.";
const HELLO: &str = "hello from mini-swe-agent\n";
const SUBMIT: &str = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat /root/hello.txt";

/// The script: a read-only look, a write, a read back, a listing, the submission.
/// Each step but the last says what its output must hold in the next request.
fn script() -> Vec<(Step, Option<&'static str>)> {
    vec![
        (
            Step::new("First, which system is this?", "head -n 1 /etc/os-release"),
            Some("PRETTY_NAME="),
        ),
        (
            Step::new(
                "Write the file.",
                "printf 'hello from mini-swe-agent\\n' > /root/hello.txt && echo written",
            ),
            Some("written"),
        ),
        (
            Step::new("Read it back.", "cat /root/hello.txt"),
            Some("hello from mini-swe-agent"),
        ),
        (
            Step::new("Check its size.", "wc -c < /root/hello.txt"),
            Some("26"),
        ),
        (Step::new("Done: submit.", SUBMIT), None),
    ]
}

/// How the agent reaches the sandbox's proxy.
#[derive(PartialEq)]
enum Via {
    /// In the sandbox's network namespace, a proxy started by hand.
    Namespace,
    /// From the host's network, through the host door of the shim's proxy.
    Door,
}

fn run(model_class: &str, config: &str, via: Via) {
    let started = Instant::now();
    let script = script();
    let steps: Vec<Step> = script.iter().map(|(s, _)| s.clone()).collect();
    let key = new_api_key();
    let llm = match via {
        Via::Namespace => Scripted::start(steps),
        Via::Door => {
            let think = vec![Duration::ZERO; steps.len()];
            Scripted::paced_by_key(DOOR_UPSTREAM, &key, steps, think)
        }
    };
    let upstream = format!("io.crab.proxy.upstream={}", llm.url());
    let mut run_args = vec!["--rm", "--runtime", DOCKER_RUNTIME, "--network", "none"];
    if via == Via::Door {
        run_args.extend(["--annotation", &upstream]);
    }
    let mut agent = Agent::start(&Options {
        image: DOCKER_PYTHON,
        run_args: &run_args,
        config,
        model_class,
        task: TASK,
        api_base: None,
        api_key: Some(&key),
        attempts: 1,
    });
    let sandbox = DockerGuard::new(&agent.id);
    assert_eq!(
        docker_inspect(&sandbox.name, "{{.HostConfig.Runtime}}"),
        DOCKER_RUNTIME
    );
    let proxy_log = agent.dir.path().join("proxy.log");
    let pid: i32 = docker_inspect(&sandbox.name, "{{.State.Pid}}")
        .parse()
        .expect("the sandbox init's pid");
    let _proxy = match via {
        Via::Namespace => {
            let proxy = Proxy::start(&agent.id, &llm.url(), &proxy_log);
            // Loopback is the sandbox's only interface: the proxy is the agent's
            // only way out.
            assert_eq!(interfaces(pid), ["lo"]);
            agent.go(pid);
            Some(proxy)
        }
        Via::Door => {
            // The shim started the proxy with the task; `crabctl door` fails
            // when none runs.
            let door = crabctl_moby(&["door", &agent.id]);
            let door = door.trim();
            assert!(std::path::Path::new(door).exists(), "no door at {door:?}");
            agent.go_through_door(door);
            None
        }
    };
    let result: Value = serde_json::from_str(&agent.line("result ", Duration::from_secs(300)))
        .expect("the result is JSON");
    let seen = llm.seen();
    let log: Vec<String> = seen
        .iter()
        .map(|s| format!("{} {} step={:?}", s.method, s.target, s.step))
        .collect();
    eprintln!("requests the scripted server saw: {log:#?}");

    // mini-swe-agent's own account: it submitted, and the submission is what
    // the last command printed after the marker.
    assert_eq!(
        result["exit_status"],
        "Submitted",
        "{result}\nrequests: {log:#?}\nstderr:\n{}",
        agent.stderr()
    );
    assert_eq!(result["submission"], HELLO, "{result}");
    let trajectory = agent.trajectory();
    assert_eq!(trajectory["info"]["exit_status"], "Submitted");
    assert_eq!(
        trajectory["info"]["mini_version"],
        crab_integration::mini_swe_agent::VERSION
    );
    let messages = trajectory["messages"].as_array().expect("messages");
    assert_eq!(messages.last().unwrap()["role"], "exit");

    // The write really happened in the sandbox.
    let out = sandbox.exec(&["cat", "/root/hello.txt"]);
    assert_eq!(text(&out).0, HELLO, "{:?}", text(&out));

    // The script was played in order, one request per step, and each step's
    // output came back to the LLM in the request after it.
    let chats: Vec<_> = seen.iter().filter(|s| s.is_chat()).collect();
    let steps: Vec<usize> = chats.iter().filter_map(|s| s.step).collect();
    assert_eq!(steps, (0..script.len()).collect::<Vec<_>>(), "{log:#?}");
    assert_eq!(
        seen.len(),
        chats.len(),
        "requests other than chat completions: {log:#?}"
    );
    for (i, (step, expect)) in script.iter().enumerate() {
        let Some(expect) = expect else { continue };
        let next = chats[i + 1].since_last_answer();
        assert!(
            next.contains(expect),
            "the output of `{}` is not in the next request: {next}",
            step.command
        );
    }
    assert_eq!(
        chats.iter().all(|s| s.offers_tool()),
        model_class == "litellm",
        "tools offered"
    );

    // mini-swe-agent counted each call, at the registry's price (the server's
    // usage: 100 tokens in, 20 out).
    let stats = &trajectory["info"]["model_stats"];
    assert_eq!(stats["api_calls"], chats.len(), "{stats}");
    let cost = chats.len() as f64 * (100.0 * INPUT_COST + 20.0 * OUTPUT_COST);
    let counted = stats["instance_cost"].as_f64().unwrap_or(0.0);
    assert!((counted - cost).abs() < 1e-9, "{stats}, not {cost}");

    // One entry in the sandbox's history per chat completions request: the
    // request after step i ends the turn in which step i's command ran.
    let history: Vec<Value> = serde_json::from_str(&crabctl_moby(&["ls", &agent.id, "--json"]))
        .expect("crabctl ls --json is JSON");
    eprintln!(
        "{:<4} {:<9} {:>10}  the turn's command",
        "seq", "kind", "images"
    );
    for (i, h) in history.iter().enumerate() {
        let command = match i {
            0 => "(none: the sandbox's start)",
            i => script.get(i - 1).map_or("?", |(s, _)| s.command.as_str()),
        };
        eprintln!(
            "{:<4} {:<9} {:>10}  {command}",
            h["seq"].as_u64().unwrap_or(0),
            h["kind"].as_str().unwrap_or("?"),
            h["process_bytes"].as_u64().unwrap_or(0)
        );
    }
    assert_eq!(
        history.len(),
        chats.len(),
        "requests: {log:#?}\nhistory: {history:#?}\nproxy log:\n{}",
        std::fs::read_to_string(&proxy_log).unwrap_or_default()
    );
    // The turn of the write took the file system (the read-only turns may skip).
    let write = &history[2]["kind"];
    assert!(write == "fs-only" || write == "full", "{history:#?}");

    // The driver ends once told, with mini-swe-agent's success.
    assert_eq!(agent.finish(), Some(0), "stderr:\n{}", agent.stderr());
    eprintln!(
        "mini-swe-agent ({model_class}, {config}.yaml): {:?}",
        started.elapsed()
    );
}

#[test]
fn mini_swe_agent_with_tool_calls_works_in_a_docker_sandbox_one_checkpoint_per_request() {
    run("litellm", "mini", Via::Namespace);
}

#[test]
fn mini_swe_agent_with_fenced_commands_works_in_a_docker_sandbox_one_checkpoint_per_request() {
    run("litellm_textbased", "mini_textbased", Via::Namespace);
}

#[test]
fn mini_swe_agent_on_the_host_asks_through_the_door_one_checkpoint_per_request() {
    run("litellm", "mini", Via::Door);
}
