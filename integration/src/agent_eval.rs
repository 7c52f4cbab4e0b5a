//! The evaluation with real agents: Claude Code (the real CLI) inside the
//! sandbox runs a hand-written trajectory (`eval/trajectories/`) against the
//! scripted Anthropic server, whose answers wait the trajectory's think times.
//! Three runs per trajectory: under Crab (turn proxy, checkpoints,
//! fast-forward), under Crab's runtime with neither (the overhead's baseline),
//! and under Crab again with the sandbox killed while the agent waits for the
//! middle step's answer, then `crabctl restore`d. mini-swe-agent outside the
//! sandbox, through Docker, does the same ([`crate::mini_eval`]); crab-eval's
//! own agent outside gives the skip share to compare with. `crab-agent-eval`
//! prints them as tables; the quick mode, both agents, is in the test suite
//! (`tests/agent_eval.rs`). See docs/evaluation-agents.md.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use crab_eval::replay::Replay;
use crab_eval::run::{run, Env};
use crab_eval::sandbox::Ctr;
use crab_eval::state::Ending;
use crab_eval::strategy::Strategy;
use crab_eval::trajectory::Trajectory;
use crab_runtime::checkpoint::stats::TurnStats;
use serde_json::Value;

use crate::mini_eval::{self, Mini};
use crate::{
    address, anthropic, claude, config_with, crabctl_ok, kill_shim_and_init, namespace, proxy_pids,
    state_dir, trajectory, wait_until, Guard, CRAB,
};

/// A real agent the evaluation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Agent {
    /// Claude Code inside a `ctr` sandbox.
    ClaudeCode,
    /// mini-swe-agent on the host, acting on a Docker sandbox.
    MiniSweAgent,
}

impl Agent {
    /// Its name in a report.
    pub fn name(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "Claude Code",
            Agent::MiniSweAgent => "mini-swe-agent",
        }
    }

    /// Where its runs' times start and end.
    pub fn timed(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "from `ctr run` to Claude Code's exit",
            Agent::MiniSweAgent => "from the driver's start (its `docker run`) to the submission",
        }
    }
}

/// What the runs have in common.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// The trajectory's think times are divided by this (1: as recorded).
    pub speedup: f64,
}

impl Pace {
    /// How long a run may take: the script's think time, plus ten minutes
    /// for the agent itself (its start, its tools, the checkpoints).
    pub fn timeout(&self, think: &[Duration]) -> Duration {
        think.iter().sum::<Duration>() + Duration::from_secs(600)
    }
}

/// How the sandbox runs the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sandbox {
    /// Crab's shim with its turn proxy: every LLM request ends a turn and its
    /// checkpoint (skipped when nothing but the agent changed); fast-forward on.
    Crab,
    /// Crab's shim with no proxy and no checkpoint, the agent reaching its LLM
    /// in the host's network: what Crab's checkpoints cost is measured against it.
    CrabPlain,
}

impl Sandbox {
    /// Its name in the tables.
    pub fn name(&self) -> &'static str {
        match self {
            Sandbox::Crab => "crab",
            Sandbox::CrabPlain => "crab-plain",
        }
    }
}

/// A fault-free run.
#[derive(Debug)]
pub struct FaultFree {
    /// The sandbox's start (`ctr run`; mini-swe-agent's `docker run`) to
    /// the agent's end (Claude Code's exit; mini-swe-agent's submission).
    pub wall: Duration,
    /// The requests of the agent's main loop (one turn each).
    pub requests: usize,
    /// Crab's turn counters (`crabctl stats`), for [`Sandbox::Crab`].
    pub turns: Option<TurnStats>,
    /// The trajectory's check and state digest.
    pub ending: Ending,
}

/// A run crashed at one step and restored.
#[derive(Debug)]
pub struct Recovered {
    /// The step whose answer the crash came before.
    pub crash_step: usize,
    /// The newest durable checkpoint in the history after the crash.
    pub newest: u64,
    /// The checkpoint `crabctl restore` restored.
    pub restored_from: u64,
    /// The whole `crabctl restore`.
    pub restore: Duration,
    /// The proxy's fast-forward line ("N answers replayed in T ms (per turn:
    /// median M ms, p95 P ms), then live"), if it replayed.
    pub replay: Option<String>,
    /// Whether the replay diverged from the journal.
    pub diverged: bool,
    /// Steps before the crash's that the scripted LLM was asked more than
    /// once (a replayed answer never reaches it; the crash step's own answer
    /// was lost with the sandbox, so it is asked again).
    pub asked_again: Vec<usize>,
    /// The trajectory's check and state digest at the end.
    pub ending: Ending,
}

/// Claude Code's runs of one trajectory.
pub struct Claude {
    pub crab: FaultFree,
    pub plain: FaultFree,
    pub crash: Recovered,
}

/// One trajectory's runs, for the agents asked for.
pub struct Row {
    pub t: Arc<Trajectory>,
    /// crab-eval's agent outside the sandbox: (skipped turns, turns).
    pub outside: (u64, u64),
    pub claude: Option<Claude>,
    pub mini: Option<Mini>,
}

/// Every run of `t` by `agents`, and crab-eval's own agent outside, checked
/// (see [`check`], [`mini_eval::check`]); both agents must end in the same
/// state.
pub fn evaluate(t: Arc<Trajectory>, pace: Pace, agents: &[Agent]) -> Result<Row> {
    let name = &t.name;
    let claude = match agents.contains(&Agent::ClaudeCode) {
        true => Some(evaluate_claude(&t, pace)?),
        false => None,
    };
    eprintln!("{name}: crab-eval's agent outside");
    let outside = outside(&t, pace.speedup)?;
    let mini = match agents.contains(&Agent::MiniSweAgent) {
        true => Some(mini_eval::evaluate(&t, pace)?),
        false => None,
    };
    if let (Some(c), Some(m)) = (&claude, &mini) {
        ensure!(
            c.crab.ending.digest == m.crab.ending.digest,
            "{name}: Claude Code and mini-swe-agent end in different states"
        );
    }
    Ok(Row {
        t,
        outside,
        claude,
        mini,
    })
}

/// Claude Code's runs of `t`, checked (see [`check`]).
pub fn evaluate_claude(t: &Arc<Trajectory>, pace: Pace) -> Result<Claude> {
    let name = &t.name;
    eprintln!("{name}: Claude Code under crab");
    let crab = fault_free(t, Sandbox::Crab, pace);
    eprintln!("{name}: Claude Code under crab-plain");
    let plain = fault_free(t, Sandbox::CrabPlain, pace);
    eprintln!("{name}: Claude Code crashed at its middle step");
    let crash = crashed(t, middle_step(t), pace);
    let c = Claude { crab, plain, crash };
    check(name, &c)?;
    Ok(c)
}

/// The skip share crab-eval's own agent, acting from outside through exec,
/// gets on `t`: (skipped, turns).
pub fn outside(t: &Arc<Trajectory>, speedup: f64) -> Result<(u64, u64)> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let replay = Replay::default();
        let replay_addr = replay.start().await?;
        let env = Env {
            ctr: Ctr {
                address: address(),
                namespace: namespace(),
            },
            replay,
            replay_addr,
            speedup,
            crab_config: config_with(&format!(
                "[checkpoint]\nkeep_last = 1000\n[proxy]\nupstreams = [\"http://{replay_addr}\"]"
            )),
            progress: None,
        };
        let o = run(&env, t.clone(), Strategy::Crab, None).await;
        let ending = o.ending.map_err(anyhow::Error::msg)?;
        ensure!(
            ending.verified,
            "{}: the outside agent's run fails its check",
            t.name
        );
        let k = o.kinds;
        let turns = (k.skip + k.fs_only + k.process_only + k.full) as u64;
        Ok((k.skip as u64, turns))
    })
}

/// Fails unless every run of `agent` ended verified, and in the state of
/// the first (the fault-free run under Crab).
pub fn same_end(name: &str, agent: &str, runs: &[(&str, &Ending)]) -> Result<()> {
    for (what, e) in runs {
        ensure!(
            e.verified,
            "{name}: {agent}'s run under {what} fails the trajectory's check"
        );
    }
    if let Some(((first, reference), rest)) = runs.split_first() {
        for (what, e) in rest {
            ensure!(
                e.digest == reference.digest,
                "{name}: {agent}'s run under {what} ends in another state than under {first}"
            );
        }
    }
    Ok(())
}

/// Fails unless a recovery brought back the newest durable checkpoint.
pub fn restored_newest(name: &str, restored: u64, newest: u64) -> Result<()> {
    ensure!(
        restored == newest,
        "{name}: restored checkpoint {restored} where the newest durable one is {newest}"
    );
    Ok(())
}

/// A run of Claude Code that ended wrong fails the evaluation.
pub fn check(name: &str, c: &Claude) -> Result<()> {
    same_end(
        name,
        "Claude Code",
        &[
            ("crab", &c.crab.ending),
            ("crab-plain", &c.plain.ending),
            ("crab, crashed and restored", &c.crash.ending),
        ],
    )?;
    restored_newest(name, c.crash.restored_from, c.crash.newest)?;
    if c.crash.diverged {
        bail!("{name}: the fast-forward diverged from the journal");
    }
    ensure!(
        c.crash.asked_again.is_empty(),
        "{name}: the LLM was asked again for steps {:?} (a replay should answer them)",
        c.crash.asked_again
    );
    Ok(())
}

/// Claude Code's script of `t`, paced.
fn scripted(t: &Trajectory, pace: Pace) -> (anthropic::Scripted, Vec<Duration>) {
    let think = trajectory::claude_think_times(t, pace.speedup);
    let llm = anthropic::Scripted::paced(trajectory::claude_steps(t), think.clone());
    (llm, think)
}

/// Runs `t` under Claude Code in `sandbox`, fault-free, to its end.
pub fn fault_free(t: &Trajectory, sandbox: Sandbox, pace: Pace) -> FaultFree {
    let (llm, think) = scripted(t, pace);
    let start = Instant::now();
    let g = match sandbox {
        Sandbox::Crab => claude::run(&llm, &t.title, claude::STATE_PATHS),
        Sandbox::CrabPlain => claude::run_unproxied(&llm, CRAB, &t.title),
    };
    claude::finishes(&g, &llm, pace.timeout(&think));
    let wall = start.elapsed();
    let requests = llm.seen().iter().filter(|s| s.step.is_some()).count();
    let turns = (sandbox == Sandbox::Crab).then(|| stats(&g.id));
    let ending = trajectory::ending(&namespace(), &g.id, t);
    FaultFree {
        wall,
        requests,
        turns,
        ending,
    }
}

/// Runs `t` under `agent` in `n` sandboxes at once, fault-free; each must
/// end verified.
pub fn at_density(
    agent: Agent,
    t: &Trajectory,
    sandbox: Sandbox,
    n: usize,
    pace: Pace,
) -> Vec<FaultFree> {
    let run = match agent {
        Agent::ClaudeCode => fault_free,
        Agent::MiniSweAgent => crate::mini_eval::fault_free,
    };
    let runs: Vec<FaultFree> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n).map(|_| s.spawn(|| run(t, sandbox, pace))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    for r in &runs {
        assert!(
            r.ending.verified,
            "{}: a run of {n} of {} under {} fails its check",
            t.name,
            agent.name(),
            sandbox.name()
        );
    }
    runs
}

/// Runs `t` under Claude Code in a Crab sandbox, kills the sandbox (shim and
/// processes) while the agent waits for step `crash_step`'s answer, restores
/// it with `crabctl restore`, and lets it finish.
pub fn crashed(t: &Trajectory, crash_step: usize, pace: Pace) -> Recovered {
    let (llm, think) = scripted(t, pace);
    llm.hold_step(crash_step);
    let g = claude::run(&llm, &t.title, claude::STATE_PATHS);
    assert!(
        llm.wait_held(pace.timeout(&think)),
        "Claude Code never asked for step {crash_step}: {:#?}",
        claude::requests(&llm)
    );
    // The request's own checkpoint may still be under way: the crash cuts it
    // or not, as it may in life. The newest durable one is what the history
    // holds after the crash (`crabctl ls` reads it from the store).
    kill_shim_and_init(&g);
    assert!(
        wait_until(Duration::from_secs(10), || proxy_pids(&g.id).is_empty()),
        "the proxy outlived its shim"
    );
    let newest = newest_seq(&g.id);
    llm.let_go();
    let start = Instant::now();
    let out = crabctl_ok(&["restore", &g.id]);
    let restore = start.elapsed();
    let restored_from = restored_from(&out);
    claude::finishes(&g, &llm, pace.timeout(&think));
    let lines = fast_forward_lines(&g);
    let replay = lines
        .iter()
        .find(|l| l.contains("answers replayed"))
        .map(|l| {
            // The message, without the log line's head and its fields after.
            let from = l.find("fast-forward: ").map_or(0, |i| i + 14);
            let to = l.find(", then live").map_or(l.len(), |i| i + 11);
            l[from..to.max(from)].to_string()
        });
    let diverged = lines.iter().any(|l| l.contains("diverged"));
    let mut times = vec![0usize; crash_step];
    for step in llm.seen().iter().filter_map(|s| s.step) {
        if step < times.len() {
            times[step] += 1;
        }
    }
    let asked_again = (0..times.len()).filter(|&i| times[i] > 1).collect();
    let ending = trajectory::ending(&namespace(), &g.id, t);
    Recovered {
        crash_step,
        newest,
        restored_from,
        restore,
        replay,
        diverged,
        asked_again,
        ending,
    }
}

/// The step a crash test holds: the middle of the script.
pub fn middle_step(t: &Trajectory) -> usize {
    trajectory::claude_steps(t).len() / 2
}

/// `crabctl stats` of `id`.
pub fn stats(id: &str) -> TurnStats {
    serde_json::from_str(&crabctl_ok(&["stats", id, "--json"])).expect("crabctl stats --json")
}

/// The newest checkpoint's seq in `id`'s history (0 if none).
pub fn newest_seq(id: &str) -> u64 {
    let history: Vec<Value> =
        serde_json::from_str(&crabctl_ok(&["ls", id, "--json"])).expect("crabctl ls --json");
    history.last().and_then(|e| e["seq"].as_u64()).unwrap_or(0)
}

/// The checkpoint `crabctl restore` said it restored from ("restored from
/// checkpoint <name> in ..."); the turns' checkpoints are named by their seq.
pub fn restored_from(out: &str) -> u64 {
    out.split("restored from checkpoint ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|name| name.parse().ok())
        .unwrap_or_else(|| panic!("no checkpoint in {out:?}"))
}

/// The restored proxy's fast-forward lines (its log is the new task's: the
/// crashed task's went with it).
pub fn fast_forward_lines(g: &Guard) -> Vec<String> {
    let log = std::fs::read_to_string(
        state_dir()
            .join(namespace())
            .join(format!("{}.proxy.log", g.id)),
    )
    .unwrap_or_default();
    log.lines()
        .filter(|l| l.contains("fast-forward: "))
        .map(String::from)
        .collect()
}

/// The share of `n` in `of`, in percent.
pub fn percent(n: u64, of: u64) -> f64 {
    if of == 0 {
        0.0
    } else {
        100.0 * n as f64 / of as f64
    }
}
