//! `crabctl turn`: close an agent's turn through the semantic policy.

use anyhow::{bail, Result};
use crab_runtime::config::Config;
use crab_runtime::control::{Request, Response};
use crab_runtime::inspect::Classification;

use crate::ckpt::call;

/// Classifies the turn and (unless `dry_run`) takes the checkpoint it needs.
pub fn run(config: &Config, namespace: &str, id: &str, dry_run: bool, json: bool) -> Result<()> {
    let r = call(
        config,
        Request::Turn {
            namespace: namespace.into(),
            id: id.into(),
            dry_run,
            background: false,
            agent: None,
            token: None,
        },
    )?;
    let Response::Turn {
        classification,
        entry,
    } = r
    else {
        bail!("turn {id}: unexpected answer {r:?}");
    };
    if json {
        let v = serde_json::json!({ "classification": classification, "entry": entry });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print_classification(id, &classification);
    if let Some(e) = entry {
        println!(
            "  recorded: checkpoint {} (seq {}) in {} ms: fs {} ms, dump {} ms",
            e.name, e.seq, e.timings.total_ms, e.timings.fs_ms, e.timings.dump_ms
        );
    }
    Ok(())
}

/// `crabctl stats ID`: the container's turn metrics.
pub fn stats(config: &Config, namespace: &str, id: &str, json: bool) -> Result<()> {
    let r = call(
        config,
        Request::Stats {
            namespace: namespace.into(),
            id: id.into(),
        },
    )?;
    let Response::Stats { stats: s } = r else {
        bail!("stats {id}: unexpected answer {r:?}");
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    println!(
        "{id}: {} turns: {} skip, {} fs-only, {} process-only, {} full, {} failed; \
         {} promoted; {} bytes of images written",
        s.turns, s.skip, s.fs_only, s.process_only, s.full, s.failed, s.promoted, s.bytes_written
    );
    for (what, d) in [
        ("checkpoint", &s.checkpoint_ms),
        ("slot wait", &s.queue_ms),
        ("answer held", &s.gating_ms),
        ("freeze", &s.freeze_ms),
        ("sync", &s.sync_ms),
    ] {
        println!(
            "  {what:<11} ms: p50 {:.1}  p95 {:.1}  p99 {:.1}  max {:.1}  ({} samples)",
            d.p50, d.p95, d.p99, d.max, d.count
        );
    }
    if let Some(sb) = &s.standby {
        println!(
            "  standby: checkpoint seq {}, init pid {}, {} bytes of memory, made in {} ms",
            sb.seq, sb.pid, sb.memory_bytes, sb.made_ms
        );
        if !crab_runtime::standby::rollback_renames()
            && !crab_runtime::cgroup2::favors_dynamic_moves()
        {
            println!(
                "  standby: adopting it waits for a kernel grace period (cgroup2 is \
                 mounted without favordynmods; see docs/standby.md)"
            );
        }
    } else if let Some(why) = &s.standby_missing {
        println!("  standby: none ({why})");
    }
    if !s.fork_replicas.is_empty() {
        let pids: Vec<String> = s.fork_replicas.iter().map(|r| r.pid.to_string()).collect();
        println!(
            "  replicas for forks: {} of checkpoint seq {}, init pids {}",
            s.fork_replicas.len(),
            s.fork_replicas[0].seq,
            pids.join(" ")
        );
    }
    if let Some(why) = &s.fork_replicas_missing {
        println!("  replicas for forks: fewer than asked ({why})");
    }
    if s.standby_dropped > 0 {
        println!(
            "  standby: {} dropped for memory pressure",
            s.standby_dropped
        );
    }
    Ok(())
}

fn print_classification(id: &str, c: &Classification) {
    println!(
        "{id}: {} (classified in {} µs)",
        c.kind.name(),
        c.elapsed_us
    );
    for r in &c.reasons {
        println!("  because {r}");
    }
    for p in &c.paths {
        println!("  path {} ({}, {:?})", p.path, p.what, p.place);
    }
    for t in &c.tasks {
        println!("  task {} {} ({})", t.tid, t.comm, t.what);
    }
    for p in &c.external {
        println!("  external (not checkpointed) {p}");
    }
}
