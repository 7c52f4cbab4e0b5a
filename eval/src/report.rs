//! The evaluation's figures: correctness per strategy, the share of each
//! checkpoint kind, checkpoint latencies, bytes, and end-to-end time at
//! density; as Markdown.

use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use crate::run::{run, Env, Kinds, Outcome};
use crate::strategy::Strategy;
use crate::trajectory::Trajectory;

/// What `docs/evaluation.md` says before the figures.
const PREAMBLE: &str = r#"# Evaluation: replayed agent trajectories with injected crashes

This file is written by `hack/eval.sh` (`crab-eval`); do not edit it by hand.
`hack/eval.sh --quick` takes under ten minutes; `hack/eval.sh` runs everything.

## Method

- **Trajectories** (`eval/trajectories/`, format in its README): recorded
  agent tasks in the style of Terminal-Bench and SWE-bench, each 20 to 100
  turns. A turn is the LLM's think time (log-normal, median 3 s, 1 to 10 s),
  then a tool call: a shell command or a file write. Each task has its own
  verification script and names the state a recovered run must share with a
  fault-free one: files (content and mode) and, through a probe, what live
  processes hold (a server's data, a daemon's memory).
- **The replay LLM** answers each request with the trajectory's next tool
  call after its think time (divided by the speed-up). A request's turn is the
  number of tool results in its conversation, so replays are deterministic.
- **The agent** asks, runs the call in the sandbox through `exec`, and sends
  the result back. It lives outside the sandbox's processes, as an
  orchestrator does, and reaches its LLM through Crab's proxy inside the
  sandbox's network namespace. An agent among the checkpointed processes
  would change memory every turn, so no turn could be skipped, and a restore
  would rewind its own conversation (`docs/proxy.md`).
- **The crash** comes after the tool call of the chosen turn, when the agent
  asks for the next one: SIGKILL of the sandbox's processes and of its shim.
- **Recovery**, then the rest of the trajectory:
  - `crab`: `crabctl restore` of the newest checkpoint (processes and files);
    the agent's chat is rewound to that checkpoint's turn.
  - `chat-only`: a fresh sandbox; the agent keeps its whole chat.
  - `chat+fs`: the newest file-system snapshot (Crab's, without its
    processes); the chat rewound to it.
  - `scratch`: a fresh sandbox and a fresh chat.
  - `runc-full`: runc's shim with `ctr container checkpoint --task --rw` at
    every turn, overlapped with the think time like Crab's; `ctr container
    restore --live --rw` of the newest, chat rewound to it. containerd 1.7
    writes no process image into a checkpoint whose CRIU blob it already holds
    (an unchanged process, measured); such a checkpoint cannot restore, so the
    previous one stays the newest. runc's restore leaves loopback down here,
    so it is brought up (`ip link set lo up`) for the tasks' servers.
- **Correct** means the verification passes and the final state equals the
  fault-free run's (runc's shim, no checkpoints, no crash).
- **Time**: a run's wall time from the sandbox's start to its last turn,
  think times included. At density, N sandboxes run at once.

"#;

/// One trajectory's fault-free runs.
pub struct Reference {
    /// The trajectory.
    pub trajectory: Arc<Trajectory>,
    /// Without Crab, without a crash.
    pub plain: Outcome,
    /// With Crab, without a crash.
    pub crab: Outcome,
}

/// End-to-end times with `n` sandboxes at once.
#[derive(Debug, Clone)]
pub struct Density {
    /// Sandboxes at once.
    pub n: usize,
    /// Mean time of a fault-free run without Crab.
    pub plain: Duration,
    /// Mean time of a fault-free run with Crab.
    pub crab: Duration,
    /// Mean time of a Crab run with one crash (mid-trajectory).
    pub crab_crash: Duration,
    /// Crab runs with a crash that ended correct, of `n`.
    pub correct: usize,
}

/// Everything measured.
#[derive(Default)]
pub struct Results {
    /// Think-time speed-up.
    pub speedup: f64,
    /// Seed of the crash points.
    pub seed: u64,
    /// Crash points per trajectory.
    pub crash_points: String,
    /// Crash points per trajectory for Crab, when it has its own sample.
    pub crab_crash_points: Option<String>,
    /// Fault-free runs.
    pub references: Vec<Reference>,
    /// Runs with a crash.
    pub crashes: Vec<Outcome>,
    /// Think-time speed-up of the density runs.
    pub density_speedup: f64,
    /// End-to-end figures.
    pub densities: Vec<Density>,
}

/// Whether a run ended as the fault-free run did, its task done.
pub fn correct(o: &Outcome, reference: &Outcome) -> bool {
    match (&o.ending, &reference.ending) {
        (Ok(a), Ok(b)) => a.verified && b.verified && a.digest == b.digest,
        _ => false,
    }
}

/// The `q` quantile of `v` (nearest rank).
pub fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn mean(v: &[Duration]) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.iter().sum::<Duration>() / v.len() as u32
}

impl Results {
    /// Adds one trajectory's runs.
    pub fn add(
        &mut self,
        t: Arc<Trajectory>,
        plain: Outcome,
        crab: Outcome,
        crashes: Vec<Outcome>,
    ) {
        self.references.push(Reference {
            trajectory: t,
            plain,
            crab,
        });
        self.crashes.extend(crashes);
    }

    fn reference(&self, name: &str) -> Option<&Reference> {
        self.references.iter().find(|r| r.trajectory.name == name)
    }

    /// The fault-free run without Crab of trajectory `name`.
    pub fn reference_of(&self, name: &str) -> Option<&Outcome> {
        self.reference(name).map(|r| &r.plain)
    }

    /// `docs/evaluation.md`: how the figures were made, the figures, and the
    /// plots (file names beside the document).
    pub fn document(&self, mode: &str, plots: &[String]) -> String {
        let mut s = String::from(PREAMBLE);
        let _ = writeln!(s, "## This run ({mode} mode)\n");
        s.push_str(&self.markdown());
        if !plots.is_empty() {
            let _ = writeln!(s, "## Plots\n");
            for p in plots {
                let _ = writeln!(s, "![{p}]({p})\n");
            }
        }
        s
    }

    /// The figures.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let turns: usize = self
            .references
            .iter()
            .map(|r| r.trajectory.turns.len())
            .sum();
        let crab = match &self.crab_crash_points {
            Some(c) if *c != self.crash_points => {
                format!("; Crab at {c} per trajectory, a larger sample of the same draw")
            }
            _ => String::new(),
        };
        let _ = writeln!(
            s,
            "{} trajectories, {turns} turns; think times divided by {}; crash points: {} per \
             trajectory (seed {}), each recovered by every strategy{crab}.\n",
            self.references.len(),
            self.speedup,
            self.crash_points,
            self.seed
        );
        self.correctness(&mut s);
        self.kinds(&mut s);
        self.latency(&mut s);
        self.density_table(&mut s);
        self.per_trajectory(&mut s);
        s
    }

    fn correctness(&self, s: &mut String) {
        let _ = writeln!(s, "## Recovery correctness\n");
        let _ = writeln!(
            s,
            "Correct = the task's verification passes and the final state (files, and what \
             the probe reads from live processes) equals the fault-free run's.\n"
        );
        let _ = writeln!(
            s,
            "| strategy | correct | runs | share | time of a run with the crash | vs fault-free without Crab |\n|---|---|---|---|---|---|"
        );
        for strat in Strategy::RECOVERING {
            let runs: Vec<&Outcome> = self
                .crashes
                .iter()
                .filter(|o| o.strategy == strat)
                .collect();
            if runs.is_empty() {
                continue;
            }
            let ok = runs
                .iter()
                .filter(|o| {
                    self.reference(&o.trajectory)
                        .is_some_and(|r| correct(o, &r.plain))
                })
                .count();
            let time = mean(&runs.iter().map(|o| o.elapsed).collect::<Vec<_>>());
            let plain = mean(
                &runs
                    .iter()
                    .filter_map(|o| self.reference(&o.trajectory).map(|r| r.plain.elapsed))
                    .collect::<Vec<_>>(),
            );
            let _ = writeln!(
                s,
                "| {strat} | {ok} | {} | {:.0}% | {:.1} s | {:.2}x |",
                runs.len(),
                100.0 * ok as f64 / runs.len() as f64,
                time.as_secs_f64(),
                time.as_secs_f64() / plain.as_secs_f64().max(1e-9)
            );
        }
        let _ = writeln!(
            s,
            "\nA replayed LLM answers the same way every time, so starting over (`scratch`) \
             ends correct here; it pays with time, and a real LLM would not repeat itself.\n"
        );
    }

    fn kinds(&self, s: &mut String) {
        let _ = writeln!(s, "## Turns by checkpoint kind (Crab, fault-free)\n");
        let _ = writeln!(
            s,
            "| trajectories | turns | skip | fs-only | process-only | full |\n|---|---|---|---|---|---|"
        );
        let row = |s: &mut String, label: &str, refs: Vec<&Reference>| {
            let mut k = Kinds::default();
            for r in &refs {
                k.skip += r.crab.kinds.skip;
                k.fs_only += r.crab.kinds.fs_only;
                k.process_only += r.crab.kinds.process_only;
                k.full += r.crab.kinds.full;
            }
            let n = (k.skip + k.fs_only + k.process_only + k.full).max(1) as f64;
            let pct = |x: u32| format!("{:.0}%", 100.0 * x as f64 / n);
            let _ = writeln!(
                s,
                "| {label} | {} | {} | {} | {} | {} |",
                n as u32,
                pct(k.skip),
                pct(k.fs_only),
                pct(k.process_only),
                pct(k.full)
            );
        };
        row(s, "all", self.references.iter().collect());
        let mut categories: Vec<&str> = self
            .references
            .iter()
            .map(|r| r.trajectory.category.as_str())
            .collect();
        categories.sort();
        categories.dedup();
        for c in categories {
            row(
                s,
                c,
                self.references
                    .iter()
                    .filter(|r| r.trajectory.category == c)
                    .collect(),
            );
        }
        let _ = writeln!(s);
    }

    fn latency(&self, s: &mut String) {
        let _ = writeln!(s, "## Checkpoints: latency and bytes\n");
        let _ = writeln!(
            s,
            "| strategy | checkpoints | p50 ms | p95 ms | p99 ms | MiB written per run | answer held p50 / p99 ms |\n|---|---|---|---|---|---|---|"
        );
        let crab: Vec<&Outcome> = self.references.iter().map(|r| &r.crab).collect();
        let runc: Vec<&Outcome> = self
            .crashes
            .iter()
            .filter(|o| o.strategy == Strategy::RuncFull)
            .collect();
        for (label, runs) in [("crab (fault-free)", crab), ("runc-full", runc)] {
            if runs.is_empty() {
                continue;
            }
            let ms: Vec<f64> = runs
                .iter()
                .flat_map(|o| o.checkpoint_ms.iter().copied())
                .collect();
            let mib =
                runs.iter().map(|o| o.bytes).sum::<u64>() as f64 / runs.len() as f64 / 1048576.0;
            let held: Vec<(f64, f64)> = runs.iter().filter_map(|o| o.gating_ms).collect();
            let held = if held.is_empty() {
                "-".to_string()
            } else {
                let p50: Vec<f64> = held.iter().map(|h| h.0).collect();
                let p99: Vec<f64> = held.iter().map(|h| h.1).collect();
                format!(
                    "{:.1} / {:.1}",
                    percentile(&p50, 0.5),
                    percentile(&p99, 1.0)
                )
            };
            let _ = writeln!(
                s,
                "| {label} | {} | {:.0} | {:.0} | {:.0} | {mib:.1} | {held} |",
                ms.len(),
                percentile(&ms, 0.5),
                percentile(&ms, 0.95),
                percentile(&ms, 0.99)
            );
        }
        let _ = writeln!(
            s,
            "\nCrab's latencies are of the turns that took a checkpoint (skips excluded); its \
             bytes are process images (file-system snapshots share blocks with the pool and \
             are not counted). runc's are whole `ctr container checkpoint --task --rw` \
             commands and their images. Held answers: the median of each run's p50, the \
             largest p99.\n"
        );
    }

    fn density_table(&self, s: &mut String) {
        if self.densities.is_empty() {
            return;
        }
        let _ = writeln!(s, "## End-to-end time at density\n");
        let _ = writeln!(
            s,
            "| sandboxes | fault-free, no Crab | fault-free, Crab | Crab, one crash | Crab overhead | with the crash | correct after the crash |\n|---|---|---|---|---|---|---|"
        );
        for d in &self.densities {
            let r = |x: Duration| x.as_secs_f64() / d.plain.as_secs_f64().max(1e-9);
            let _ = writeln!(
                s,
                "| {} | {:.1} s | {:.1} s | {:.1} s | {:+.1}% | {:.2}x | {}/{} |",
                d.n,
                d.plain.as_secs_f64(),
                d.crab.as_secs_f64(),
                d.crab_crash.as_secs_f64(),
                (r(d.crab) - 1.0) * 100.0,
                r(d.crab_crash),
                d.correct,
                d.n
            );
        }
        let _ = writeln!(
            s,
            "\nMean time of one run (the trajectories taken in turn), all sandboxes at once; \
             think times divided by {}. The three columns run one after the other.\n",
            self.density_speedup
        );
    }

    fn per_trajectory(&self, s: &mut String) {
        let _ = writeln!(s, "## Per trajectory\n");
        let mut head =
            "| trajectory | category | turns | plain s | crab s | skip/fs/proc/full |".to_string();
        let mut sep = "|---|---|---|---|---|---|".to_string();
        for strat in Strategy::RECOVERING {
            let _ = write!(head, " {strat} |");
            sep.push_str("---|");
        }
        let _ = writeln!(s, "{head}\n{sep}");
        for r in &self.references {
            let k = r.crab.kinds;
            let mut line = format!(
                "| {} | {} | {} | {:.1} | {:.1} | {}/{}/{}/{} |",
                r.trajectory.name,
                r.trajectory.category,
                r.trajectory.turns.len(),
                r.plain.elapsed.as_secs_f64(),
                r.crab.elapsed.as_secs_f64(),
                k.skip,
                k.fs_only,
                k.process_only,
                k.full
            );
            for strat in Strategy::RECOVERING {
                let runs: Vec<&Outcome> = self
                    .crashes
                    .iter()
                    .filter(|o| o.strategy == strat && o.trajectory == r.trajectory.name)
                    .collect();
                let ok = runs.iter().filter(|o| correct(o, &r.plain)).count();
                let _ = write!(line, " {ok}/{} |", runs.len());
            }
            let _ = writeln!(s, "{line}");
        }
        let _ = writeln!(s);
    }
}

/// `n` sandboxes at once: fault-free without Crab, fault-free with Crab, then
/// with Crab and one crash each, halfway through.
pub async fn density(env: &Env, results: &Results, n: usize) -> Density {
    let pick: Vec<Arc<Trajectory>> = results
        .references
        .iter()
        .map(|r| r.trajectory.clone())
        .cycle()
        .take(n)
        .collect();
    let batch = |s: Strategy, crash: bool| {
        let pick = pick.clone();
        let env = env.clone();
        async move {
            let mut set = tokio::task::JoinSet::new();
            for t in pick {
                let env = env.clone();
                let k = crash.then_some(t.turns.len() / 2);
                set.spawn(async move { run(&env, t, s, k).await });
            }
            let mut out = Vec::new();
            while let Some(o) = set.join_next().await {
                if let Ok(o) = o {
                    out.push(o);
                }
            }
            out
        }
    };
    let plain = batch(Strategy::Plain, false).await;
    let crab = batch(Strategy::Crab, false).await;
    let crashed = batch(Strategy::Crab, true).await;
    let correct_n = crashed
        .iter()
        .filter(|o| {
            results
                .reference(&o.trajectory)
                .is_some_and(|r| correct(o, &r.plain))
        })
        .count();
    let times = |v: &[Outcome]| mean(&v.iter().map(|o| o.elapsed).collect::<Vec<_>>());
    Density {
        n,
        plain: times(&plain),
        crab: times(&crab),
        crab_crash: times(&crashed),
        correct: correct_n,
    }
}
