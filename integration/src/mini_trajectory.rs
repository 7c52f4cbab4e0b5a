//! A recorded task (`eval/trajectories/`) done by mini-swe-agent on the host,
//! acting on a crab sandbox it makes through Docker, its LLM the scripted
//! OpenAI server reached through the host door of the sandbox's turn proxy (the
//! agent stays in the host's network, as an orchestrator does), or directly,
//! for the evaluation's baseline: the fault-free run of
//! `tests/trajectory_agents.rs`, both runs of `tests/mini_swe_agent_crash.rs`,
//! and the evaluation's runs (`crate::mini_eval`). See docs/agents.md.

use std::time::{Duration, Instant};

use crab_eval::state::Ending;
use crab_eval::trajectory::Trajectory;
use serde_json::Value;

use crate::docker::{crabctl_moby, docker_inspect, DockerGuard, DOCKER_PYTHON, MOBY};
use crate::mini_swe_agent::{new_api_key, Agent, Options, DOOR_UPSTREAM};
use crate::{openai, trajectory};

/// How long the agent may take to do the whole task, besides its LLM's think times.
const TASK_TIMEOUT: Duration = Duration::from_secs(900);

/// How many times mini-swe-agent asks in a run that is crashed: the request in
/// flight at the crash dies with the shim's proxy, and it asks again (its
/// retries wait 4 s, then 8 s). Each of its attempts is up to three tries of
/// the OpenAI client under litellm (two retries of its own, after about a
/// second), so the first repeat may reach the new shim's door before the
/// recovery's rollback (see `mini_crash::rollback_when_free`).
const CRASH_ATTEMPTS: u32 = 4;
/// The most times the server may see the crashed step asked.
pub const CRASH_ASKS: usize = 3 * CRASH_ATTEMPTS as usize;

/// mini-swe-agent doing a trajectory, and what it runs against. Dropped in
/// this order: the sandbox (`docker rm -f`), the driver.
pub struct Run {
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
    /// A step the agent may ask again: the one held for a crash through the
    /// door (see [`CRASH_ATTEMPTS`]).
    may_repeat: Option<usize>,
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
    /// Through the host door of the sandbox's turn proxy (the shim's, its
    /// upstream chosen by annotation; every request a turn); else asking the
    /// LLM directly (no turn, no checkpoint: a baseline). The agent stays in
    /// the host's network either way.
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
        // Only a crash through the door kills the agent's request in flight.
        let may_repeat = setup.hold.filter(|_| setup.proxied);
        // Through the door, the upstream is the one listener the host's
        // configuration names, and the run's key picks its script there.
        let key = new_api_key();
        let llm = if setup.proxied {
            openai::Scripted::paced_by_key(DOOR_UPSTREAM, &key, steps, think)
        } else {
            openai::Scripted::paced(steps, think)
        };
        if let Some(step) = setup.hold {
            llm.hold_step(step);
        }
        let direct = format!("{}/v1", llm.url());
        let upstream = format!("io.crab.proxy.upstream={}", llm.url());
        let mut run_args = setup.run_args.to_vec();
        if setup.proxied {
            run_args.extend(["--annotation", &upstream]);
        }
        let mut agent = Agent::start(&Options {
            image: DOCKER_PYTHON,
            run_args: &run_args,
            config: "mini",
            model_class: "litellm",
            task: &t.title,
            api_base: (!setup.proxied).then_some(direct.as_str()),
            api_key: Some(&key),
            attempts: if may_repeat.is_some() {
                CRASH_ATTEMPTS
            } else {
                1
            },
        });
        let sandbox = DockerGuard::new(&agent.id);
        let pid: i32 = docker_inspect(&sandbox.name, "{{.State.Pid}}")
            .parse()
            .expect("the sandbox init's pid");
        if setup.proxied {
            // The shim started the proxy with the task; `crabctl door` fails
            // when none runs.
            let door = crabctl_moby(&["door", &agent.id]);
            agent.go_through_door(door.trim());
        } else {
            agent.go_in_host_network();
        }
        Run {
            sandbox,
            agent,
            llm,
            pid,
            steps: n,
            may_repeat,
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
    /// each step once, in order (the step held for a crash through the door
    /// at most [`CRASH_ASKS`] times in a row); every command exited 0. Then
    /// takes the trajectory's ending in the sandbox, which still runs.
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
        let mut asked: Vec<usize> = self
            .llm
            .seen()
            .iter()
            .filter(|s| s.is_chat())
            .filter_map(|s| s.step)
            .collect();
        if let Some(step) = self.may_repeat {
            let times = asked.iter().filter(|&&s| s == step).count();
            assert!(
                times <= CRASH_ASKS,
                "step {step} asked {times} times: {asked:?}"
            );
            asked.dedup_by(|a, b| *a == step && *b == step);
        }
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
