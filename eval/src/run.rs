//! One run: a trajectory replayed in a sandbox under a strategy, a crash
//! injected at a chosen turn, the recovery, the rest of the trajectory, and how
//! it ended.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use crab_runtime::checkpoint::history::Entry;
use crab_runtime::checkpoint::stats::TurnStats;
use crab_runtime::checkpoint::Kind;

use crate::agent::{Agent, Llm};
pub use crate::outcome::{Kinds, Outcome};
use crate::replay::Replay;
use crate::runc::{self, Checkpoints};
use crate::sandbox::Ctr;
use crate::state::ending;
use crate::strategy::Strategy;
use crate::trajectory::Trajectory;

/// Where Crab's proxy listens in each sandbox.
const PROXY: &str = "127.0.0.1:8787";
/// The runtimes.
const CRAB: &str = "io.containerd.crab.v2";
const RUNC: &str = "io.containerd.runc.v2";

/// What every run shares.
#[derive(Clone)]
pub struct Env {
    /// containerd.
    pub ctr: Ctr,
    /// The replay LLM.
    pub replay: Replay,
    /// Its address.
    pub replay_addr: SocketAddr,
    /// Think times are divided by this.
    pub speedup: f64,
    /// Crab's runtime configuration for the sandboxes (`--runtime-config-path`).
    pub crab_config: PathBuf,
    /// Told of each turn, crash and recovery (the demo's display).
    pub progress: Option<Arc<dyn Fn(Progress) + Send + Sync>>,
}

/// What a run tells [`Env::progress`].
#[derive(Debug, Clone)]
pub enum Progress {
    /// Turn `index` (of `of`) ran its tool call; with Crab, the checkpoint
    /// that recorded what it changed (taken at the next LLM request).
    Turn {
        /// The turn.
        index: usize,
        /// Turns in all.
        of: usize,
        /// The call, shortened.
        call: String,
        /// The checkpoint at its request.
        checkpoint: Option<(String, u64)>,
    },
    /// The sandbox was killed after turn `after`.
    Crashed {
        /// The turn.
        after: usize,
    },
    /// It is back; the agent resumes at `resume`.
    Recovered {
        /// The turn the agent asks for next.
        resume: usize,
        /// Crash to recovered.
        took: Duration,
    },
}

/// Unique container ids across runs of this process.
fn container_id(t: &Trajectory, s: Strategy) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let strategy = s.name().replace('+', "-");
    format!("ev-{}-{strategy}-{}-{n}", t.name, std::process::id())
}

/// A sandbox of a run: its id, and how its agent reaches the LLM.
struct Sandbox {
    id: String,
    strategy: Strategy,
}

impl Sandbox {
    async fn start(env: &Env, id: &str, s: Strategy, image: &str) -> Result<Sandbox> {
        let upstream = format!("io.crab.proxy.upstream=http://{}", env.replay_addr);
        let config = env.crab_config.to_string_lossy().into_owned();
        let mut args = vec!["run", "-d", "--runtime"];
        if s.crab_runtime() {
            args.extend([CRAB, "--runtime-config-path", &config]);
            if s.crab() {
                // The turn proxy, hence a checkpoint at every request.
                args.extend(["--annotation", &upstream]);
            }
        } else {
            args.push(RUNC);
        }
        args.extend([image, id, "sleep", "infinity"]);
        let mut started = env.ctr.ok(&args).await;
        for _ in 0..5 {
            // After a crash containerd forgets the dead task a little after
            // its container is gone: until then the id is taken.
            match &started {
                Err(e) if e.to_string().contains("already exists") => {
                    env.ctr.remove(id).await;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    started = env.ctr.ok(&args).await;
                }
                _ => break,
            }
        }
        started?;
        Ok(Sandbox {
            id: id.to_string(),
            strategy: s,
        })
    }

    async fn llm(&self, env: &Env) -> Result<Llm> {
        if self.strategy.crab() {
            Ok(Llm::InNetns {
                pid: env.ctr.pid(&self.id).await?,
                addr: PROXY.parse().expect("a socket address"),
            })
        } else {
            Ok(Llm::Direct(env.replay_addr))
        }
    }
}

/// A container's Crab history (`crabctl ls --json`).
async fn crab_history(env: &Env, id: &str) -> Result<Vec<Entry>> {
    let text = env.ctr.crabctl(&["ls", id, "--json"]).await?;
    serde_json::from_str(&text).with_context(|| format!("crabctl ls {id}: {text}"))
}

/// The newest turn checkpoint in a Crab history: the turn it was taken at
/// (each LLM request records exactly one entry, seq 1 for turn 0).
async fn crab_latest_turn(env: &Env, id: &str) -> Result<usize> {
    let seq = crab_history(env, id)
        .await?
        .last()
        .map(|e| e.seq)
        .context("no checkpoint")?;
    Ok(seq as usize - 1)
}

/// Waits (up to a minute) until the proxy's checkpoint at the request for
/// turn `turn` is in the history: the crash comes mid-think, after the last
/// completed turn's checkpoint, as it does with real think times of seconds
/// (at the speed-ups here a checkpoint can outlast the think time). Crab's
/// proxy checkpoints beside the think time, runc's gate before it is held.
async fn crab_settled(env: &Env, id: &str, turn: usize) {
    for _ in 0..3000 {
        if crab_latest_turn(env, id).await.is_ok_and(|t| t >= turn) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::warn!(
        id,
        turn,
        "no checkpoint of the last completed turn before the crash"
    );
}

/// The kind and time of the newest entry of a Crab history.
async fn crab_last_entry(env: &Env, id: &str) -> Option<(String, u64)> {
    let h = crab_history(env, id).await.ok()?;
    let e = h.last()?;
    Some((e.kind.name().to_string(), e.timings.total_ms))
}

/// Runs trajectory `t` under strategy `s`, crashing after the tool call of
/// turn `crash_at` (when the agent asks for the next one).
pub async fn run(env: &Env, t: Arc<Trajectory>, s: Strategy, crash_at: Option<usize>) -> Outcome {
    let id = container_id(&t, s);
    let runc = runc::Shared::default();
    let started = Instant::now();
    let result = drive(env, &t, s, crash_at, &id, &runc).await;
    let elapsed = started.elapsed();
    let mut out = Outcome {
        trajectory: t.name.clone(),
        category: t.category.clone(),
        strategy: s,
        crash_at,
        ending: Err(String::new()),
        elapsed,
        recovery: None,
        kinds: Kinds::default(),
        checkpoint_ms: Vec::new(),
        gating_ms: None,
        bytes: 0,
        incomplete: 0,
        resumed_at: None,
    };
    match result {
        Ok(recovered) => {
            out.recovery = recovered.map(|r| r.took);
            out.resumed_at = recovered.map(|r| r.resume);
            out.ending = ending(&env.ctr, &id, &t)
                .await
                .map_err(|e| format!("{e:#}"));
        }
        Err(e) => out.ending = Err(format!("{e:#}")),
    }
    out.check_resume();
    if s.crab_runtime() {
        crab_figures(env, &id, &mut out).await;
    }
    Checkpoints::settled(&runc).await;
    if s == Strategy::RuncFull {
        let r = runc.lock().unwrap_or_else(|e| e.into_inner());
        out.checkpoint_ms = r.ms.clone();
        out.bytes = r.bytes;
        out.incomplete = r.incomplete;
    }
    env.replay.unregister(&id);
    env.ctr.remove(&id).await;
    Checkpoints::remove_newest(&runc, &env.ctr).await;
    out
}

/// A run's recovery: how long it took, and the turn the agent resumed at.
#[derive(Debug, Clone, Copy)]
struct Recovered {
    took: Duration,
    resume: usize,
}

async fn crab_figures(env: &Env, id: &str, out: &mut Outcome) {
    for e in crab_history(env, id).await.unwrap_or_default() {
        match e.kind {
            Kind::Skip => out.kinds.skip += 1,
            Kind::FsOnly => out.kinds.fs_only += 1,
            Kind::ProcessOnly => out.kinds.process_only += 1,
            Kind::Full => out.kinds.full += 1,
        }
        if e.kind != Kind::Skip {
            out.checkpoint_ms.push(e.timings.total_ms as f64);
        }
        out.bytes += e.process_bytes;
    }
    if let Ok(text) = env.ctr.crabctl(&["stats", id, "--json"]).await {
        if let Ok(s) = serde_json::from_str::<TurnStats>(&text) {
            let g = &s.gating_ms;
            if g.count > 0 {
                out.gating_ms = Some((g.p50, g.p99));
            }
        }
    }
}

async fn drive(
    env: &Env,
    t: &Arc<Trajectory>,
    s: Strategy,
    crash_at: Option<usize>,
    id: &str,
    runc: &runc::Shared,
) -> Result<Option<Recovered>> {
    let gate = (s == Strategy::RuncFull).then(|| runc::gate(&env.ctr, id, runc.clone()));
    let mut handle = env.replay.register(id, t.clone(), env.speedup, gate);
    let mut sandbox = Sandbox::start(env, id, s, &t.image).await?;
    let mut llm = sandbox.llm(env).await?;
    let mut agent = Agent::new(id, t);
    let mut pending_crash = crash_at.filter(|_| s.recovers());
    if let Some(k) = pending_crash {
        handle.hold_from(Some(k + 1));
    }
    let mut recovery = None;
    let mut crashed_at = None;
    let mut resumed = None;
    loop {
        let event = {
            let step = agent.step(llm, &env.ctr, &sandbox.id, 50);
            let crash = async {
                match pending_crash {
                    Some(k) => loop {
                        match handle.asked.recv().await {
                            Some(a) if a.index > k => return,
                            Some(_) => continue,
                            None => std::future::pending::<()>().await,
                        }
                    },
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                more = step => Event::Stepped(more),
                () = crash => Event::Crash,
            }
        };
        match event {
            Event::Stepped(more) => {
                if let (Some(c), Some(resume), None) = (crashed_at, resumed, recovery) {
                    recovery = Some(Recovered {
                        took: Instant::elapsed(&c),
                        resume,
                    });
                }
                let more = more?;
                // The checkpoint at this request holds what the call before it
                // changed: that call's line can now be shown.
                if let (Some(p), Some(index)) = (
                    &env.progress,
                    agent.turn().checked_sub(if more { 2 } else { 1 }),
                ) {
                    let checkpoint = if s.crab() {
                        crab_last_entry(env, &sandbox.id).await
                    } else {
                        None
                    };
                    p(Progress::Turn {
                        index,
                        of: t.turns.len(),
                        call: t.turns[index].call.summary(),
                        checkpoint,
                    });
                }
                if !more {
                    break;
                }
            }
            Event::Crash => {
                pending_crash = None;
                crashed_at = Some(Instant::now());
                if let Some(p) = &env.progress {
                    p(Progress::Crashed {
                        after: agent.turn() - 1,
                    });
                }
                if s.crab() {
                    crab_settled(env, &sandbox.id, agent.turn()).await;
                }
                env.ctr.crash(&sandbox.id).await.context("crash")?;
                let resume = recover(env, &mut sandbox, t, s, &agent, runc)
                    .await
                    .context("recovery")?;
                if let Some(p) = &env.progress {
                    p(Progress::Recovered {
                        resume,
                        took: crashed_at.map(|c| c.elapsed()).unwrap_or_default(),
                    });
                }
                tracing::info!(id, strategy = %s, resume, "recovered");
                resumed = Some(resume);
                agent.rewind(resume);
                handle.hold_from(None);
                llm = sandbox.llm(env).await?;
            }
        }
    }
    Ok(recovery)
}

/// What ended one wait of the run loop.
enum Event {
    /// The agent finished a turn (false: the task is done).
    Stepped(Result<bool>),
    /// The agent asked for the turn after the crash point.
    Crash,
}

/// Brings the sandbox back after a crash; returns the turn the agent resumes at.
async fn recover(
    env: &Env,
    sandbox: &mut Sandbox,
    t: &Trajectory,
    s: Strategy,
    agent: &Agent,
    runc: &runc::Shared,
) -> Result<usize> {
    let id = sandbox.id.clone();
    match s {
        Strategy::Plain | Strategy::CrabPlain => bail!("the {s} strategy does not recover"),
        Strategy::Crab | Strategy::ChatFs => {
            env.ctr.crabctl(&["restore", &id]).await?;
            if s == Strategy::ChatFs {
                // Files only: every process but the init goes.
                let init = env.ctr.pid(&id).await?;
                for line in env.ctr.ok(&["task", "ps", &id]).await?.lines().skip(1) {
                    if let Some(pid) = line
                        .split_whitespace()
                        .next()
                        .and_then(|p| p.parse::<i32>().ok())
                    {
                        if pid != init {
                            // SAFETY: kill takes a pid and a signal only.
                            unsafe { libc::kill(pid, libc::SIGKILL) };
                        }
                    }
                }
            }
            crab_latest_turn(env, &id).await
        }
        Strategy::ChatOnly | Strategy::Scratch => {
            env.ctr.remove(&id).await;
            *sandbox = Sandbox::start(env, &id, s, &t.image).await?;
            Ok(if s == Strategy::ChatOnly {
                agent.turn()
            } else {
                0
            })
        }
        Strategy::RuncFull => {
            // The newest image once its check is done: one the gate is still
            // inspecting counts, an older one never does (containerd keeps one).
            let latest = Checkpoints::restorable(runc).await;
            env.ctr.remove(&id).await;
            match latest {
                Some((index, reference)) => {
                    runc::restore(&env.ctr, &id, &reference).await?;
                    Ok(index)
                }
                None => {
                    *sandbox = Sandbox::start(env, &id, s, &t.image).await?;
                    Ok(0)
                }
            }
        }
    }
}
