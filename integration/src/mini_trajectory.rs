//! A recorded task (`eval/trajectories/`) done by mini-swe-agent on the host,
//! acting on a crab sandbox it makes through Docker, its LLM the scripted
//! OpenAI server reached through the sandbox's turn proxy (or directly, for
//! the evaluation's baseline): the fault-free run of
//! `tests/trajectory_agents.rs`, both runs of `tests/mini_swe_agent_crash.rs`,
//! and the evaluation's runs (`crate::mini_eval`). See docs/agents.md.

use std::time::{Duration, Instant};

use crab_eval::state::Ending;
use crab_eval::trajectory::Trajectory;
use serde_json::Value;

use crate::docker::{docker_inspect, DockerGuard, DOCKER_PYTHON, MOBY};
use crate::mini_swe_agent::{Agent, Options, Proxy};
use crate::{openai, trajectory};

/// How long the agent may take to do the whole task, besides its LLM's think times.
const TASK_TIMEOUT: Duration = Duration::from_secs(900);

/// mini-swe-agent doing a trajectory, and what it runs against. Dropped in
/// this order: the proxy, the sandbox (`docker rm -f`), the driver.
pub struct Run {
    /// The sandbox's turn proxy, started by hand (`crabctl -n moby proxy`);
    /// none for a run whose agent reaches its LLM directly.
    pub proxy: Option<Proxy>,
    /// The sandbox, by its container id.
    pub sandbox: DockerGuard,
    /// The driver.
    pub agent: Agent,
    /// The scripted LLM.
    pub llm: openai::Scripted,
    /// The sandbox init's pid when the agent was let go.
    pub pid: i32,
    /// The script's length: the chat completions requests of a whole run.
    pub steps: usize,
    /// How long the agent may take to do the whole task: its think times
    /// and [`TASK_TIMEOUT`].
    pub timeout: Duration,
    /// When the driver was started.
    started: Instant,
    /// From the driver's start (the sandbox's `docker run` is its first act)
    /// to the agent's submission, once it submitted.
    pub took: Option<Duration>,
}

/// How a [`Run`] is set up.
pub struct Setup<'a> {
    /// The sandbox's run args (the runtime and the rest).
    pub run_args: &'a [&'a str],
    /// A step whose answers the scripted LLM holds from the start (see
    /// [`openai::Scripted::hold_step`]).
    pub hold: Option<usize>,
    /// Each step's think time ([`trajectory::mini_think_times`]); empty: none.
    pub think: Vec<Duration>,
    /// Through the sandbox's turn proxy, the agent in the sandbox's network
    /// namespace (every request a turn); else in the host's network, asking
    /// the LLM directly (no turn, no checkpoint: a baseline).
    pub proxied: bool,
}

impl Run {
    /// Starts mini-swe-agent (its `mini` configuration, tool calls) on `t`
    /// through the turn proxy, its sandbox made with `run_args`, with no
    /// think time, and lets it go; see [`Run::start_with`].
    pub fn start(t: &Trajectory, run_args: &[&str], hold: Option<usize>) -> Run {
        Run::start_with(
            t,
            Setup {
                run_args,
                hold,
                think: Vec::new(),
                proxied: true,
            },
        )
    }

    /// Starts mini-swe-agent (its `mini` configuration, tool calls) on `t`
    /// as `setup` says, and lets it go.
    pub fn start_with(t: &Trajectory, setup: Setup) -> Run {
        let started = Instant::now();
        let steps = trajectory::mini_steps(t);
        let n = steps.len();
        let think = if setup.think.is_empty() {
            vec![Duration::ZERO; n]
        } else {
            setup.think
        };
        let timeout = think.iter().sum::<Duration>() + TASK_TIMEOUT;
        let llm = openai::Scripted::paced(steps, think);
        if let Some(step) = setup.hold {
            llm.hold_step(step);
        }
        let direct = format!("{}/v1", llm.url());
        let mut agent = Agent::start(&Options {
            image: DOCKER_PYTHON,
            run_args: setup.run_args,
            config: "mini",
            model_class: "litellm",
            task: &t.title,
            api_base: (!setup.proxied).then_some(direct.as_str()),
        });
        let sandbox = DockerGuard::new(&agent.id);
        let pid: i32 = docker_inspect(&sandbox.name, "{{.State.Pid}}")
            .parse()
            .expect("the sandbox init's pid");
        let proxy = if setup.proxied {
            let log = agent.dir.path().join("proxy.log");
            let proxy = Proxy::start(&agent.id, &llm.url(), &log);
            agent.go(pid);
            Some(proxy)
        } else {
            agent.go_in_host_network();
            None
        };
        Run {
            proxy,
            sandbox,
            agent,
            llm,
            pid,
            steps: n,
            timeout,
            started,
            took: None,
        }
    }

    /// The sandbox's container id (Docker's, containerd's and the shim's).
    pub fn id(&self) -> &str {
        &self.agent.id
    }

    /// [`Run::submitted`], then lets the driver end (it exits 0;
    /// mini-swe-agent stops the sandbox).
    pub fn finishes(&mut self, t: &Trajectory) -> Ending {
        let ending = self.submitted(t);
        self.end();
        ending
    }

    /// Waits for the agent to submit, and checks the run: the LLM was asked
    /// each step once, in order; every command exited 0. Then takes the
    /// trajectory's ending in the sandbox, which still runs.
    pub fn submitted(&mut self, t: &Trajectory) -> Ending {
        let result = self.agent.line("result ", self.timeout);
        self.took = Some(self.started.elapsed());
        let result: Value = serde_json::from_str(&result).expect("the result is JSON");
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
        trajectory::ending(MOBY, &self.agent.id, t)
    }

    /// Lets the driver end once the agent submitted: it exits 0, and
    /// mini-swe-agent stops the sandbox.
    pub fn end(&mut self) {
        assert_eq!(
            self.agent.finish(),
            Some(0),
            "stderr:\n{}",
            self.agent.stderr()
        );
    }
}
