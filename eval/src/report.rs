//! The evaluation's figures: correctness per strategy, the share of each
//! checkpoint kind, checkpoint latencies, bytes, and end-to-end time at
//! density; as Markdown.

use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

pub use crate::density::{density, Density};
use crate::run::{Kinds, Outcome};
use crate::strategy::Strategy;
use crate::trajectory::Trajectory;

/// What `docs/evaluation.md` says before the figures.
const PREAMBLE: &str = include_str!("preamble.md");

/// One trajectory's fault-free runs.
pub struct Reference {
    /// The trajectory.
    pub trajectory: Arc<Trajectory>,
    /// Without Crab, without a crash.
    pub plain: Outcome,
    /// Crab's runtime without checkpoints, without a crash.
    pub crab_plain: Outcome,
    /// With Crab, without a crash.
    pub crab: Outcome,
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
    /// The run, named in the report.
    pub run: Option<crate::provenance::Run>,
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

pub(crate) fn mean(v: &[Duration]) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.iter().sum::<Duration>() / v.len() as u32
}

impl Results {
    /// Adds one trajectory's runs.
    pub fn add(&mut self, fault_free: Reference, crashes: Vec<Outcome>) {
        self.references.push(fault_free);
        self.crashes.extend(crashes);
    }

    pub(crate) fn reference(&self, name: &str) -> Option<&Reference> {
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
        if let Some(run) = &self.run {
            let _ = writeln!(s, "{}\n", run.line("crab-eval", "hack/eval.sh"));
        }
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
        self.failures(&mut s);
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
            "| strategy | correct | runs | share | resumed as promised | time of a run with the crash | vs fault-free without Crab |\n|---|---|---|---|---|---|---|"
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
            let promised = runs
                .iter()
                .filter(|o| o.resumed_at.is_some() && o.resumed_at == o.promised_resume())
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
                "| {strat} | {ok} | {} | {:.0}% | {promised} | {:.1} s | {:.2}x |",
                runs.len(),
                100.0 * ok as f64 / runs.len() as f64,
                time.as_secs_f64(),
                time.as_secs_f64() / plain.as_secs_f64().max(1e-9)
            );
        }
        let _ = writeln!(
            s,
            "\nA replayed LLM answers the same way every time, so starting over (`scratch`) \
             ends correct here; it pays with time, and a real LLM would not repeat itself. \
             A run that resumed at another turn than its strategy promises fails.\n"
        );
    }

    /// The runs that failed, and why.
    fn failures(&self, s: &mut String) {
        let failed: Vec<&Outcome> = self
            .references
            .iter()
            .flat_map(|r| [&r.plain, &r.crab_plain, &r.crab])
            .chain(&self.crashes)
            .filter(|o| o.ending.is_err())
            .collect();
        if failed.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "### Failed runs\n\n| trajectory | strategy | crash after turn | resumed at | error |\n|---|---|---|---|---|"
        );
        let turn = |t: Option<usize>| t.map_or("-".to_string(), |t| t.to_string());
        for o in failed {
            let e = o.ending.as_ref().err().map(String::as_str).unwrap_or("");
            let e: String = e
                .replace('|', "/")
                .replace('\n', " ")
                .chars()
                .take(200)
                .collect();
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {e} |",
                o.trajectory,
                o.strategy,
                turn(o.crash_at),
                turn(o.resumed_at)
            );
        }
        let _ = writeln!(s);
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
            "| sandboxes | fault-free, no Crab | fault-free, Crab's runtime, no checkpoints | fault-free, Crab | Crab overhead vs runc | vs its own runtime | Crab, one crash | with the crash | correct after the crash |\n|---|---|---|---|---|---|---|---|---|"
        );
        for d in &self.densities {
            let r = |x: Duration| x.as_secs_f64() / d.plain.as_secs_f64().max(1e-9);
            let _ = writeln!(
                s,
                "| {} | {:.1} s | {:.1} s | {:.1} s | {:+.1}% | {:+.1}% | {:.1} s | {:.2}x | {}/{} |",
                d.n,
                d.plain.as_secs_f64(),
                d.crab_plain.as_secs_f64(),
                d.crab.as_secs_f64(),
                (r(d.crab) - 1.0) * 100.0,
                (d.crab.as_secs_f64() / d.crab_plain.as_secs_f64().max(1e-9) - 1.0) * 100.0,
                d.crab_crash.as_secs_f64(),
                r(d.crab_crash),
                d.correct,
                d.n
            );
        }
        let _ = writeln!(
            s,
            "\nMean time of one run (the trajectories taken in turn), all sandboxes at once; \
             think times divided by {}. The four batches run one after the other. \
             Crab's overhead is given against runc's shim and against Crab's own runtime \
             without the turn proxy (no checkpoints).\n",
            self.density_speedup
        );
    }

    fn per_trajectory(&self, s: &mut String) {
        let _ = writeln!(s, "## Per trajectory\n");
        let mut head =
            "| trajectory | category | turns | plain s | crab-plain s | crab s | skip/fs/proc/full |"
                .to_string();
        let mut sep = "|---|---|---|---|---|---|---|".to_string();
        for strat in Strategy::RECOVERING {
            let _ = write!(head, " {strat} |");
            sep.push_str("---|");
        }
        let _ = writeln!(s, "{head}\n{sep}");
        for r in &self.references {
            let k = r.crab.kinds;
            let mut line = format!(
                "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {}/{}/{}/{} |",
                r.trajectory.name,
                r.trajectory.category,
                r.trajectory.turns.len(),
                r.plain.elapsed.as_secs_f64(),
                r.crab_plain.elapsed.as_secs_f64(),
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
