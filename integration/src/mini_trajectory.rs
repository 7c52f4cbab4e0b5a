//! A recorded task (`eval/trajectories/`) done by mini-swe-agent on the host,
//! acting on a crab sandbox it makes through Docker, its LLM the scripted
//! OpenAI server reached through the sandbox's turn proxy: the fault-free run
//! of `tests/trajectory_agents.rs`, and both runs of
//! `tests/mini_swe_agent_crash.rs`. See docs/agents.md.

use std::time::Duration;

use crab_eval::state::Ending;
use crab_eval::trajectory::Trajectory;
use serde_json::Value;

use crate::docker::{docker_inspect, DockerGuard, DOCKER_PYTHON, MOBY};
use crate::mini_swe_agent::{Agent, Options, Proxy};
use crate::{openai, trajectory};

/// How long the agent may take to do the whole task.
const TASK_TIMEOUT: Duration = Duration::from_secs(900);

/// mini-swe-agent doing a trajectory, and what it runs against. Dropped in
/// this order: the proxy, the sandbox (`docker rm -f`), the driver.
pub struct Run {
    /// The sandbox's turn proxy, started by hand (`crabctl -n moby proxy`).
    pub proxy: Proxy,
    /// The sandbox, by its container id.
    pub sandbox: DockerGuard,
    /// The driver.
    pub agent: Agent,
    /// The scripted LLM.
    pub llm: openai::Scripted,
    /// The sandbox init's pid when the agent joined its network namespace.
    pub pid: i32,
    /// The script's length: the chat completions requests of a whole run.
    pub steps: usize,
}

impl Run {
    /// Starts mini-swe-agent (its `mini` configuration, tool calls) on `t`,
    /// its sandbox made with `run_args` (the runtime and the rest), and lets it
    /// go. With `hold`, the scripted LLM holds that step's answers from the
    /// start (see [`openai::Scripted::hold_step`]).
    pub fn start(t: &Trajectory, run_args: &[&str], hold: Option<usize>) -> Run {
        let steps = trajectory::mini_steps(t);
        let n = steps.len();
        let llm = openai::Scripted::start(steps);
        if let Some(step) = hold {
            llm.hold_step(step);
        }
        let mut agent = Agent::start(&Options {
            image: DOCKER_PYTHON,
            run_args,
            config: "mini",
            model_class: "litellm",
            task: &t.title,
        });
        let sandbox = DockerGuard::new(&agent.id);
        let proxy = Proxy::start(&agent.id, &llm.url(), &agent.dir.path().join("proxy.log"));
        let pid: i32 = docker_inspect(&sandbox.name, "{{.State.Pid}}")
            .parse()
            .expect("the sandbox init's pid");
        agent.go(pid);
        Run {
            proxy,
            sandbox,
            agent,
            llm,
            pid,
            steps: n,
        }
    }

    /// The sandbox's container id (Docker's, containerd's and the shim's).
    pub fn id(&self) -> &str {
        &self.agent.id
    }

    /// Waits for the agent to submit, and checks the run: the LLM was asked
    /// each step once, in order; every command exited 0. Then takes the
    /// trajectory's ending in the sandbox, and lets the driver end (it exits
    /// 0; mini-swe-agent stops the sandbox).
    pub fn finishes(&mut self, t: &Trajectory) -> Ending {
        let result: Value = serde_json::from_str(&self.agent.line("result ", TASK_TIMEOUT))
            .expect("the result is JSON");
        assert_eq!(
            result["exit_status"],
            "Submitted",
            "{result}\nstderr:\n{}",
            self.agent.stderr()
        );
        let asked: Vec<usize> = self
            .llm
            .seen()
            .iter()
            .filter(|s| s.is_chat())
            .filter_map(|s| s.step)
            .collect();
        assert_eq!(asked, (0..self.steps).collect::<Vec<_>>());
        // Every command exited 0: mini-swe-agent's observations (its `mini`
        // configuration's template) carry `"returncode": N`.
        let trajectory = self.agent.trajectory();
        let observations: Vec<&str> = trajectory["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["role"] != "assistant")
            .filter_map(|m| m["content"].as_str())
            .filter(|text| text.contains("\"returncode\": "))
            .collect();
        assert_eq!(observations.len(), self.steps - 1, "{observations:#?}");
        let failed: Vec<&&str> = observations
            .iter()
            .filter(|text| !text.contains("\"returncode\": 0,"))
            .collect();
        assert!(failed.is_empty(), "{failed:#?}");
        let ending = trajectory::ending(MOBY, &self.agent.id, t);
        assert_eq!(
            self.agent.finish(),
            Some(0),
            "stderr:\n{}",
            self.agent.stderr()
        );
        ending
    }
}
