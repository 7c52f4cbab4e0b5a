//! `crab-eval`: replays the recorded trajectories in real sandboxes, injects a
//! crash, recovers by each strategy, and prints (and writes) the tables of
//! `docs/evaluation.md`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use crab_eval::replay::Replay;
use crab_eval::report::{self, Reference, Results};
use crab_eval::run::{run, Env, Outcome};
use crab_eval::sandbox::Ctr;
use crab_eval::strategy::Strategy;
use crab_eval::trajectory::Trajectory;

#[derive(Parser)]
#[command(
    about = "Replay agent trajectories with injected crashes against every recovery strategy"
)]
struct Cli {
    /// containerd's socket.
    #[arg(
        long,
        env = "CRAB_CONTAINERD_ADDRESS",
        default_value = "/run/crab/containerd/containerd.sock"
    )]
    address: String,
    /// containerd namespace holding the images.
    #[arg(long, env = "CRAB_NAMESPACE", default_value = "crab")]
    namespace: String,
    /// Crab's runtime configuration for the sandboxes.
    #[arg(long, env = "CRAB_CONFIG", default_value = "/etc/crab/config.toml")]
    config: PathBuf,
    /// The trajectories.
    #[arg(long, default_value = "eval/trajectories")]
    trajectories: PathBuf,
    /// Only these trajectories (names, comma-separated).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Recovery strategies (crab, chat-only, chat+fs, scratch, runc-full).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "crab,chat-only,chat+fs,scratch,runc-full"
    )]
    strategies: Vec<String>,
    /// Crash points per trajectory, drawn with the seed ("all": every turn).
    #[arg(long, default_value = "1")]
    crash_points: String,
    /// Crash points per trajectory for Crab, the strategy whose correctness
    /// is the claim; the first ones are shared with the other strategies.
    #[arg(long, default_value = "4")]
    crab_crash_points: String,
    /// Seed of the crash points.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Think times are divided by this.
    #[arg(long, default_value_t = 40.0)]
    speedup: f64,
    /// Concurrent sandboxes for the end-to-end figures ("none": skip them).
    #[arg(long, default_value = "1,4,8,16,32")]
    density: String,
    /// Think times of the density runs are divided by this: the overhead is
    /// measured at think times close to real ones.
    #[arg(long, default_value_t = 2.0)]
    density_speedup: f64,
    /// The quick mode: four short trajectories (build, server, repl,
    /// read-heavy), one crash point each, speed-up 60 (density runs too),
    /// density 1 and 4.
    #[arg(long)]
    quick: bool,
    /// Where to write the report (Markdown).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The demo: this one trajectory with Crab and a crash halfway, each turn
    /// shown, compared with a fault-free run.
    #[arg(long)]
    demo: Option<String>,
}

/// The quick mode's trajectories.
const QUICK: [&str; 4] = ["c-strlib", "srv-shortener", "repl-kv", "read-logs-triage"];

/// A small deterministic generator for the crash points (splitmix64).
fn next(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// How many crash points a spec asks of a trajectory of `n` turns (None: all).
fn wanted(spec: &str) -> Result<Option<usize>> {
    match spec {
        "all" => Ok(None),
        n => Ok(Some(n.parse().context("crash points: a number or all")?)),
    }
}

/// The crash points of `t` for each spec: one seeded draw, of which each spec
/// takes a prefix (so a larger sample contains the smaller one).
fn crash_points(t: &Trajectory, specs: [&str; 2], seed: &mut u64) -> Result<[Vec<usize>; 2]> {
    let n = t.turns.len();
    let wants = [wanted(specs[0])?, wanted(specs[1])?];
    let most = wants
        .iter()
        .map(|w| w.unwrap_or(0).min(n))
        .max()
        .unwrap_or(0);
    let draws: Vec<usize> = (0..most)
        .map(|_| (next(seed) % n as u64) as usize)
        .collect();
    Ok(wants.map(|w| match w {
        None => (0..n).collect(),
        Some(w) => {
            let mut points = draws[..w.min(n)].to_vec();
            points.sort();
            points.dedup();
            points
        }
    }))
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut cli = Cli::parse();
    let started = crab_eval::provenance::Run::start();
    if cli.quick {
        cli.speedup = cli.speedup.max(60.0);
        cli.crash_points = "1".into();
        cli.crab_crash_points = "1".into();
        cli.density = "1,4".into();
        cli.density_speedup = cli.speedup;
        if cli.only.is_empty() {
            cli.only = QUICK.iter().map(|s| s.to_string()).collect();
        }
    }
    let densities: Vec<usize> = match cli.density.as_str() {
        "none" => Vec::new(),
        d => d
            .split(',')
            .map(|n| n.trim().parse().context("--density: numbers, or none"))
            .collect::<Result<_>>()?,
    };
    let mut trajectories = Trajectory::load_dir(&cli.trajectories)?;
    if !cli.only.is_empty() {
        trajectories.retain(|t| cli.only.contains(&t.name));
    }
    anyhow::ensure!(!trajectories.is_empty(), "no trajectories");
    let strategies: Vec<Strategy> = cli
        .strategies
        .iter()
        .map(|s| Strategy::parse(s).with_context(|| format!("unknown strategy {s:?}")))
        .collect::<Result<_>>()?;

    let replay = Replay::default();
    let replay_addr = replay.start().await?;
    let env = Env {
        ctr: Ctr {
            address: cli.address.clone(),
            namespace: cli.namespace.clone(),
        },
        replay,
        replay_addr,
        speedup: cli.speedup,
        crab_config: eval_config(&cli.config, &format!("http://{replay_addr}"))?,
        progress: None,
    };
    if let Some(name) = &cli.demo {
        let path = cli.trajectories.join(format!("{name}.json"));
        return crab_eval::demo::story(&env, Trajectory::load(&path)?).await;
    }
    let mut results = Results {
        speedup: cli.speedup,
        seed: cli.seed,
        crash_points: cli.crash_points.clone(),
        crab_crash_points: Some(cli.crab_crash_points.clone()),
        density_speedup: cli.density_speedup,
        run: Some(started),
        ..Default::default()
    };
    let mut seed = cli.seed;
    for t in trajectories {
        let t = Arc::new(t);
        eprintln!("== {} ({} turns, {})", t.name, t.turns.len(), t.category);
        let plain = run(&env, t.clone(), Strategy::Plain, None).await;
        progress(&plain);
        let crab_plain = run(&env, t.clone(), Strategy::CrabPlain, None).await;
        progress(&crab_plain);
        let crab = run(&env, t.clone(), Strategy::Crab, None).await;
        progress(&crab);
        let [points, crab_points] = crash_points(
            &t,
            [cli.crash_points.as_str(), cli.crab_crash_points.as_str()],
            &mut seed,
        )?;
        let mut crashes = Vec::new();
        let mut every: Vec<usize> = points.iter().chain(&crab_points).copied().collect();
        every.sort();
        every.dedup();
        for k in every {
            for s in &strategies {
                let chosen = if *s == Strategy::Crab {
                    &crab_points
                } else {
                    &points
                };
                if !chosen.contains(&k) {
                    continue;
                }
                let o = run(&env, t.clone(), *s, Some(k)).await;
                progress(&o);
                crashes.push(o);
            }
        }
        let fault_free = Reference {
            trajectory: t.clone(),
            plain,
            crab_plain,
            crab,
        };
        results.add(fault_free, crashes);
    }
    let density_env = Env {
        speedup: results.density_speedup,
        ..env.clone()
    };
    for n in densities {
        eprintln!("== density {n}");
        let d = report::density(&density_env, &results, n).await;
        results.densities.push(d);
    }
    let mode = if cli.quick { "quick" } else { "full" };
    let mut plots = Vec::new();
    if let Some(out) = &cli.out {
        let dir = out.parent().unwrap_or(std::path::Path::new("."));
        plots = crab_eval::plot::all(&results, dir)?;
    }
    let text = results.document(mode, &plots);
    println!("{text}");
    if let Some(out) = cli.out {
        std::fs::write(&out, &text).with_context(|| format!("write {}", out.display()))?;
    }
    Ok(())
}

fn progress(o: &Outcome) {
    let end = match &o.ending {
        Ok(e) => format!("verified={} digest={}", e.verified, e.digest),
        Err(e) => format!("FAILED: {e}"),
    };
    let turn = |t: Option<usize>| t.map_or_else(|| "-".to_string(), |t| t.to_string());
    eprintln!(
        "  {:<10} crash={:<5} resumed={:<5} (promised {:<5}) {:>7.1}s  {end}",
        o.strategy.name(),
        turn(o.crash_at),
        turn(o.resumed_at),
        turn(o.promised_resume()),
        o.elapsed.as_secs_f64()
    );
}

/// The sandboxes' configuration: the given one, with every turn's checkpoint
/// kept (the figures read the history).
fn eval_config(base: &std::path::Path, upstream: &str) -> Result<PathBuf> {
    let text = std::fs::read_to_string(base).unwrap_or_default();
    let mut config = crab_runtime::config::Config::parse(&text, &base.display().to_string())?;
    // Every checkpoint of a run is kept (a recovery may go back to any), and the
    // sandboxes' annotation names the replay server: the host allows it.
    config.checkpoint.keep_last = 1000;
    config.proxy.upstreams.push(upstream.to_string());
    let path = std::env::temp_dir().join(format!("crab-eval-{}.toml", std::process::id()));
    std::fs::write(&path, config.to_toml()).with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trajectory(turns: usize) -> Trajectory {
        let turns: Vec<_> = (0..turns)
            .map(|_| serde_json::json!({"think_ms": 1000, "tool": "shell", "command": "true"}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "format": 1, "name": "t", "title": "t", "category": "build",
            "image": "i", "workdir": "/sandbox/t", "turns": turns,
            "verify": "true", "state": {"paths": []}}))
        .unwrap()
    }

    #[test]
    fn crabs_larger_sample_contains_the_shared_crash_points() {
        let t = trajectory(40);
        let [shared, crab] = crash_points(&t, ["2", "6"], &mut 7).unwrap();
        assert!(!shared.is_empty() && shared.len() <= 2);
        assert!(crab.len() > shared.len());
        assert!(shared.iter().all(|k| crab.contains(k)));
        assert!(crab.iter().all(|k| *k < 40));
        let [all, one] = crash_points(&t, ["all", "1"], &mut 7).unwrap();
        assert_eq!(all, (0..40).collect::<Vec<_>>());
        assert_eq!(one.len(), 1);
    }
}
