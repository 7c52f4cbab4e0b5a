//! One run: a trajectory replayed in a sandbox under a strategy, a crash
//! injected at a chosen turn, the recovery, the rest of the trajectory, and how
//! it ended.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use crab_runtime::checkpoint::history::Entry;
use crab_runtime::checkpoint::stats::TurnStats;
use crab_runtime::checkpoint::Kind;
use serde_json::Value;

use crate::agent::{Agent, Llm};
use crate::replay::{Gate, Replay};
use crate::sandbox::Ctr;
use crate::state::{ending, Ending};
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

/// Checkpoint kinds of a Crab run's turns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kinds {
    /// Nothing to save.
    pub skip: u32,
    /// Files only.
    pub fs_only: u32,
    /// Processes only.
    pub process_only: u32,
    /// Both.
    pub full: u32,
}

/// How a run went.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The trajectory.
    pub trajectory: String,
    /// Its category.
    pub category: String,
    /// The strategy.
    pub strategy: Strategy,
    /// The turn after whose tool call the crash came.
    pub crash_at: Option<usize>,
    /// The task's check and the state digest, or why the run failed.
    pub ending: std::result::Result<Ending, String>,
    /// Start to the end of the last turn.
    pub elapsed: Duration,
    /// Crash to the agent's next request.
    pub recovery: Option<Duration>,
    /// Turn checkpoints by kind (Crab runs).
    pub kinds: Kinds,
    /// Each checkpoint's latency, ms (Crab: the history's timings; runc: the
    /// `ctr` command).
    pub checkpoint_ms: Vec<f64>,
    /// How long answers were held for checkpoints: (p50, p99) ms (Crab).
    pub gating_ms: Option<(f64, f64)>,
    /// Bytes of checkpoint images written.
    pub bytes: u64,
    /// runc: checkpoints containerd wrote without their process image.
    pub incomplete: u32,
}

/// Unique container ids across runs of this process.
fn container_id(t: &Trajectory, s: Strategy) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let strategy = s.name().replace('+', "-");
    format!("ev-{}-{strategy}-{}-{n}", t.name, std::process::id())
}

/// runc's per-turn checkpoints: the newest durable one, and the figures.
#[derive(Default)]
struct RuncCheckpoints {
    latest: Option<(usize, String)>,
    ms: Vec<f64>,
    bytes: u64,
    /// Checkpoints that came out without a process image.
    incomplete: u32,
    /// Bookkeeping of checkpoints still running.
    pending: Vec<tokio::task::JoinHandle<()>>,
}

impl RuncCheckpoints {
    /// Waits for the bookkeeping of every checkpoint made so far.
    async fn settled(figures: &Mutex<RuncCheckpoints>) {
        loop {
            let pending =
                std::mem::take(&mut figures.lock().unwrap_or_else(|e| e.into_inner()).pending);
            if pending.is_empty() {
                return;
            }
            for p in pending {
                let _ = p.await;
            }
        }
    }
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
        if s.crab() {
            args.extend([
                CRAB,
                "--runtime-config-path",
                &config,
                "--annotation",
                &upstream,
            ]);
        } else {
            args.push(RUNC);
        }
        args.extend([image, id, "sleep", "infinity"]);
        env.ctr.ok(&args).await?;
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
    let runc = Arc::new(Mutex::new(RuncCheckpoints::default()));
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
    };
    match result {
        Ok(recovery) => {
            out.recovery = recovery;
            out.ending = ending(&env.ctr, &id, &t)
                .await
                .map_err(|e| format!("{e:#}"));
        }
        Err(e) => out.ending = Err(format!("{e:#}")),
    }
    if s.crab() {
        crab_figures(env, &id, &mut out).await;
    }
    RuncCheckpoints::settled(&runc).await;
    {
        let r = runc.lock().unwrap_or_else(|e| e.into_inner());
        if s == Strategy::RuncFull {
            out.checkpoint_ms = r.ms.clone();
            out.bytes = r.bytes;
            out.incomplete = r.incomplete;
        }
    }
    env.replay.unregister(&id);
    env.ctr.remove(&id).await;
    let latest = runc.lock().unwrap_or_else(|e| e.into_inner()).latest.take();
    if let Some((_, reference)) = latest {
        let _ = env.ctr.ok(&["images", "rm", &reference]).await;
    }
    out
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

/// runc's gate: a full checkpoint at each request, overlapped with the think
/// time; the previous image is removed once the new one exists.
fn runc_gate(env: &Env, id: &str, figures: Arc<Mutex<RuncCheckpoints>>) -> Gate {
    let (ctr, id) = (env.ctr.clone(), id.to_string());
    Arc::new(move |index| {
        let (ctr, id, figures) = (ctr.clone(), id.clone(), figures.clone());
        Box::pin(async move {
            let reference = format!("crab.eval/{id}:{index}");
            let t = Instant::now();
            let made = ctr
                .ok(&["container", "checkpoint", "--task", "--rw", &id, &reference])
                .await;
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            if made.is_err() {
                return;
            }
            // The answer waits for the checkpoint only, as Crab's does; the
            // bookkeeping runs beside the next turn (a recovery waits for it).
            let book = figures.clone();
            let task = tokio::spawn(async move {
                // containerd 1.7 leaves the process image out of a checkpoint
                // whose CRIU blob it already holds (an unchanged process:
                // measured). Such a checkpoint cannot restore; the previous one
                // stays the newest.
                let (bytes, complete) = image_bytes(&ctr, &reference).await;
                let old = {
                    let mut f = book.lock().unwrap_or_else(|e| e.into_inner());
                    f.ms.push(ms);
                    f.bytes += bytes;
                    if complete {
                        f.latest.replace((index, reference.clone()))
                    } else {
                        f.incomplete += 1;
                        Some((index, reference.clone()))
                    }
                };
                if let Some((_, old)) = old {
                    let _ = ctr.ok(&["images", "rm", "--sync", &old]).await;
                }
            });
            figures
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pending
                .push(task);
        })
    })
}

/// Bytes a checkpoint image lists, and whether it holds a process image.
async fn image_bytes(ctr: &Ctr, reference: &str) -> (u64, bool) {
    let Ok(images) = ctr.ok(&["images", "ls"]).await else {
        return (0, false);
    };
    let Some(digest) = image_digest(&images, reference) else {
        return (0, false);
    };
    let index = ctr
        .ok(&["content", "get", digest])
        .await
        .unwrap_or_default();
    checkpoint_parts(&index)
}

/// The digest of image `reference` in the output of `ctr images ls`.
pub fn image_digest<'a>(images_ls: &'a str, reference: &str) -> Option<&'a str> {
    images_ls
        .lines()
        .find(|l| l.split_whitespace().next() == Some(reference))
        .and_then(|l| l.split_whitespace().find(|w| w.starts_with("sha256:")))
}

/// What a checkpoint image's index lists: its parts' bytes, and whether a
/// process image (CRIU's blob) is among them.
pub fn checkpoint_parts(index_json: &str) -> (u64, bool) {
    let index: Value = serde_json::from_str(index_json).unwrap_or_default();
    let manifests = index["manifests"].as_array().cloned().unwrap_or_default();
    let bytes = manifests.iter().filter_map(|d| d["size"].as_u64()).sum();
    let complete = manifests.iter().any(|d| {
        d["mediaType"]
            .as_str()
            .is_some_and(|m| m.contains("criu.checkpoint"))
    });
    (bytes, complete)
}

async fn drive(
    env: &Env,
    t: &Arc<Trajectory>,
    s: Strategy,
    crash_at: Option<usize>,
    id: &str,
    runc: &Arc<Mutex<RuncCheckpoints>>,
) -> Result<Option<Duration>> {
    let gate = (s == Strategy::RuncFull).then(|| runc_gate(env, id, runc.clone()));
    let mut handle = env.replay.register(id, t.clone(), env.speedup, gate);
    let mut sandbox = Sandbox::start(env, id, s, &t.image).await?;
    let mut llm = sandbox.llm(env).await?;
    let mut agent = Agent::new(id, t);
    let mut pending_crash = crash_at.filter(|_| s != Strategy::Plain);
    if let Some(k) = pending_crash {
        handle.hold_from(Some(k + 1));
    }
    let mut recovery = None;
    let mut crashed_at = None;
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
                if let (Some(c), None) = (crashed_at, recovery) {
                    recovery = Some(Instant::elapsed(&c));
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
    runc: &Arc<Mutex<RuncCheckpoints>>,
) -> Result<usize> {
    let id = sandbox.id.clone();
    match s {
        Strategy::Plain => bail!("the plain strategy does not recover"),
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
            let latest = runc
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .latest
                .clone();
            env.ctr.remove(&id).await;
            match latest {
                Some((index, reference)) => {
                    let restore = ["container", "restore", "--live", "--rw", &id, &reference];
                    let mut restored = env.ctr.ok(&restore).await;
                    for _ in 0..5 {
                        // containerd forgets a task whose shim was killed a
                        // little after the kill: until then its id is taken.
                        match &restored {
                            Err(e) if e.to_string().contains("already exists") => {
                                env.ctr.remove(&id).await;
                                tokio::time::sleep(Duration::from_millis(500)).await;
                                restored = env.ctr.ok(&restore).await;
                            }
                            _ => break,
                        }
                    }
                    if let Err(e) = restored {
                        let images = env.ctr.ok(&["images", "ls"]).await.unwrap_or_default();
                        let line = images
                            .lines()
                            .find(|l| l.contains(&reference))
                            .unwrap_or("");
                        bail!("{e:#} (image: {line})");
                    }
                    // runc's restore leaves loopback down on this kernel
                    // (machine-facts); the tasks' servers need it.
                    let pid = env.ctr.pid(&id).await?;
                    let lo = tokio::process::Command::new("nsenter")
                        .args([
                            "-t",
                            &pid.to_string(),
                            "-n",
                            "ip",
                            "link",
                            "set",
                            "lo",
                            "up",
                        ])
                        .status()
                        .await?;
                    anyhow::ensure!(lo.success(), "bring loopback up in {id}");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_image_is_complete_only_with_its_process_image() {
        let ls = "REF TYPE DIGEST SIZE\n\
                  crab.eval/a:1 application/vnd.oci.image.index.v1+json sha256:aa 1.0 KiB\n\
                  crab.eval/a:2 application/vnd.oci.image.index.v1+json sha256:bb 1.0 KiB\n";
        assert_eq!(image_digest(ls, "crab.eval/a:2"), Some("sha256:bb"));
        assert_eq!(image_digest(ls, "crab.eval/a:3"), None);
        let full = r#"{"manifests": [
            {"mediaType": "application/vnd.containerd.container.criu.checkpoint.criu.tar", "size": 100},
            {"mediaType": "application/vnd.containerd.container.checkpoint.config.v1+proto", "size": 20}]}"#;
        assert_eq!(checkpoint_parts(full), (120, true));
        let files_only = r#"{"manifests": [
            {"mediaType": "application/vnd.containerd.container.checkpoint.config.v1+proto", "size": 20}]}"#;
        assert_eq!(checkpoint_parts(files_only), (20, false));
        assert_eq!(checkpoint_parts("not json"), (0, false));
    }
}
