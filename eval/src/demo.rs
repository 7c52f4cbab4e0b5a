//! The demo's story: one trajectory in a Crab sandbox, each turn's checkpoint
//! shown as it happens, a crash halfway, the sandbox back with its processes
//! and files, and the end compared with a fault-free run made beside it.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::report::correct;
use crate::run::{run, Env, Progress};
use crate::strategy::Strategy;
use crate::trajectory::Trajectory;

fn show(p: Progress) {
    match p {
        Progress::Turn {
            index,
            of,
            call,
            checkpoint,
        } => {
            let bar_len = 20;
            let done = (index + 1) * bar_len / of.max(1);
            let bar = format!("{}{}", "#".repeat(done), ".".repeat(bar_len - done));
            let ckpt = match checkpoint {
                Some((kind, _)) if kind == "skip" => format!("{kind:<12}        "),
                Some((kind, ms)) => format!("{kind:<12} {ms:>4} ms"),
                None => String::new(),
            };
            println!("  [{bar}] turn {:>3}/{of}  {ckpt}  {call}", index + 1);
        }
        Progress::Crashed { after } => println!(
            "\n  !! crash after turn {}: SIGKILL of the sandbox's processes and its shim\n",
            after + 1
        ),
        Progress::Recovered { resume, took } => println!(
            "  >> restored by `crabctl restore` in {} ms; the agent goes on from turn {}\n",
            took.as_millis(),
            resume + 1
        ),
    }
}

/// Runs the story for trajectory `t`.
pub async fn story(env: &Env, t: Trajectory) -> Result<()> {
    let t = Arc::new(t);
    let k = t.turns.len() / 2;
    println!(
        "{}: {} ({} turns, think times / {})\n  {:<33}  {:<20}  the tool call\n",
        t.name,
        t.title,
        t.turns.len(),
        env.speedup,
        "",
        "then checkpointed as"
    );
    let started = Instant::now();
    let quiet = Env {
        progress: None,
        ..env.clone()
    };
    let reference = tokio::spawn({
        let t = t.clone();
        async move { run(&quiet, t, Strategy::Plain, None).await }
    });
    let shown = Env {
        progress: Some(Arc::new(show)),
        ..env.clone()
    };
    let crab = run(&shown, t.clone(), Strategy::Crab, Some(k)).await;
    let plain = reference.await.context("the reference run")?;
    let ending = crab.ending.clone().map_err(anyhow::Error::msg)?;
    let k = crab.kinds;
    let turns = (k.skip + k.fs_only + k.process_only + k.full).max(1) as f64;
    println!(
        "\n  the task's own check: {}",
        if ending.verified { "passed" } else { "FAILED" }
    );
    println!(
        "  final state (files + live processes) equal to a fault-free run's: {}",
        if correct(&crab, &plain) { "yes" } else { "NO" }
    );
    println!(
        "  checkpoints: {:.0}% skipped, {:.0}% files only, {:.0}% processes only, {:.0}% full; \
         {} bytes of process images",
        100.0 * k.skip as f64 / turns,
        100.0 * k.fs_only as f64 / turns,
        100.0 * k.process_only as f64 / turns,
        100.0 * k.full as f64 / turns,
        crab.bytes
    );
    if let Some((p50, p99)) = crab.gating_ms {
        println!("  answers held for a checkpoint: p50 {p50:.1} ms, p99 {p99:.1} ms");
    }
    println!(
        "  time: {:.1} s with the crash, {:.1} s fault-free without Crab ({:.1} s in all)",
        crab.elapsed.as_secs_f64(),
        plain.elapsed.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    anyhow::ensure!(
        ending.verified && correct(&crab, &plain),
        "the recovered sandbox did not end as the fault-free one"
    );
    Ok(())
}
