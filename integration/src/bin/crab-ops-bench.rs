//! Crab's own operations on a small running container (a busybox shell counting in
//! memory), through `crabctl`: checkpoint (full and fs-only), rollback in place,
//! fork of 1, 10 and 50 clones (and of 1 and 10 from replicas for forks made
//! beforehand, docs/standby.md), and migration to a second containerd (export +
//! import). Prints a Markdown table; times are of the whole `crabctl` command.
//!
//! `crab-ops-bench [--iterations N] [--forks 1,10,50] [--replica-forks 1,10]`; needs
//! the private containerd of `hack/containerd.sh` (see `hack/bench.sh`).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use clap::Parser;
use crab_integration::bench::*;
use crab_integration::*;

/// Crab's own operations through `crabctl`.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    iterations: Iterations<10>,
    /// Clones per fork (comma-separated).
    #[arg(long, value_name = "K,...", default_value = "1,10,50")]
    forks: List<usize>,
    /// Clones per fork from as many replicas made beforehand (comma-separated).
    #[arg(long, value_name = "K,...", default_value = "1,10")]
    replica_forks: List<usize>,
}

/// Init pids of `id`'s replicas for forks (`crabctl stats`).
fn replica_pids(id: &str) -> Vec<i64> {
    let v: serde_json::Value =
        serde_json::from_str(&crabctl_ok(&["stats", id, "--json"])).unwrap_or_default();
    v["fork_replicas"]
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["pid"].as_i64()).collect())
        .unwrap_or_default()
}

/// `crabctl fork --count k` of a container keeping `k` replicas for forks, each
/// run once they are all ready: (the fork's times, forks that adopted one, forks).
fn forks_from_replicas(k: usize, runs: usize) -> (Vec<Duration>, usize, usize) {
    let annotation = format!("io.crab.standby.forks={k}");
    let config = config_with(&format!("[standby]\nmax_per_host = {}\n", k + 8));
    let config = config.display().to_string();
    let flags = [
        "--annotation",
        &annotation,
        "--runtime-config-path",
        &config,
    ];
    let g = Guard::run_detached(CRAB, BUSYBOX, &flags, &["sh", "-c", COUNTER]);
    std::thread::sleep(Duration::from_secs(1));
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    let (mut times, mut adopted) = (Vec::new(), 0);
    for _ in 0..runs {
        let mut ready = Vec::new();
        let all = wait_until(Duration::from_secs(60), || {
            ready = replica_pids(&g.id);
            ready.len() == k
        });
        assert!(
            all,
            "{} of {k} replicas for forks after a minute",
            ready.len()
        );
        let prefix = unique_id("rf");
        let guards: Vec<Guard> = (1..=k)
            .map(|i| Guard::new(&format!("{prefix}-{i}")))
            .collect();
        let count = k.to_string();
        times.push(timed(&[
            "fork", &g.id, "base", "--count", &count, "--prefix", &prefix,
        ]));
        adopted += guards
            .iter()
            .filter(|f| ready.contains(&(f.pid() as i64)))
            .count();
        drop(guards);
    }
    let _ = std::fs::remove_file(&config);
    (times, adopted, k * runs)
}

const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done";

fn timed(args: &[&str]) -> Duration {
    let t = Instant::now();
    crabctl_ok(args);
    t.elapsed()
}

fn row(name: &str, s: Stats, extra: &str) {
    println!("| {name} | {} | {} | {extra} |", ms(s.median), ms(s.p95));
}

fn second_containerd(action: &str) {
    let out = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/containerd.sh"))
        .arg(action)
        .env("CRAB_CONTAINERD_ROOT", "/var/lib/crab/containerd-b")
        .env("CRAB_CONTAINERD_STATE", "/run/crab/containerd-b")
        .output()
        .expect("containerd.sh");
    assert!(
        out.status.success() || action == "stop",
        "second containerd: {:?}",
        text(&out)
    );
}

fn main() {
    let cli = Cli::parse();
    let (n, forks) = (cli.iterations.iterations, cli.forks);
    let g = Guard::run_detached(CRAB, BUSYBOX, &[], &["sh", "-c", COUNTER]);
    std::thread::sleep(Duration::from_secs(1));
    println!("| operation (small container) | median | p95 | |");
    println!("|---|---|---|---|");

    let full: Vec<Duration> = (0..n).map(|_| timed(&["checkpoint", &g.id])).collect();
    let listing: serde_json::Value =
        serde_json::from_str(&crabctl_ok(&["ls", &g.id, "--json"])).unwrap_or_default();
    let bytes = listing[0]["process_bytes"].as_u64().unwrap_or(0);
    row(
        "`crabctl checkpoint` (full)",
        stats(full),
        &format!("{:.0} KiB of CRIU images each", bytes as f64 / 1024.0),
    );
    let fs: Vec<Duration> = (0..n)
        .map(|_| timed(&["checkpoint", &g.id, "--kind", "fs-only"]))
        .collect();
    row(
        "`crabctl checkpoint --kind fs-only`",
        stats(fs),
        "no process image",
    );
    crabctl_ok(&["checkpoint", &g.id, "--name", "base", "--mark"]);
    let rollback: Vec<Duration> = (0..n)
        .map(|_| timed(&["rollback", &g.id, "base"]))
        .collect();
    row(
        "`crabctl rollback` (processes and files)",
        stats(rollback),
        "same task, new init",
    );

    for &k in forks.iter() {
        let prefix = unique_id("bf");
        let guards: Vec<Guard> = (1..=k)
            .map(|i| Guard::new(&format!("{prefix}-{i}")))
            .collect();
        let t = timed(&[
            "fork",
            &g.id,
            "base",
            "--count",
            &k.to_string(),
            "--prefix",
            &prefix,
        ]);
        row(
            &format!("`crabctl fork --count {k}`"),
            Stats { median: t, p95: t },
            "one run; clones started in parallel",
        );
        drop(guards);
    }

    // What containerd's own creates cost, for scale: k plain containers, each a
    // `ctr run -d` (a process of its own), all at once.
    for &k in cli.replica_forks.iter().filter(|&&k| k > 1) {
        let prefix = unique_id("plain");
        let ids: Vec<String> = (1..=k).map(|i| format!("{prefix}-{i}")).collect();
        let guards: Vec<Guard> = ids.iter().map(|id| Guard::new(id)).collect();
        let t = Instant::now();
        let runs: Vec<_> = ids
            .iter()
            .map(|id| {
                ctr()
                    .args(["run", "-d", "--runtime", CRAB, BUSYBOX, id, "sleep", "600"])
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .expect("spawn ctr")
            })
            .collect();
        for mut r in runs {
            assert!(r.wait().expect("wait ctr").success(), "ctr run -d");
        }
        let took = t.elapsed();
        row(
            &format!("{k} × `ctr run -d` at once"),
            Stats {
                median: took,
                p95: took,
            },
            "one run; plain containers, for scale (containerd's own creates)",
        );
        drop(guards);
    }
    for &k in cli.replica_forks.iter() {
        let (times, adopted, made) = forks_from_replicas(k, n.min(5));
        row(
            &format!("`crabctl fork --count {k}`, {k} replicas ready"),
            stats(times),
            &format!("{adopted} of {made} forks adopted a replica"),
        );
    }

    second_containerd("start");
    let address_b = "/run/crab/containerd-b/containerd.sock";
    let mut moves = Vec::new();
    for _ in 0..n.min(5) {
        let archive = std::env::temp_dir().join(format!("{}.tar", unique_id("mv")));
        let new_id = unique_id("mv");
        let t = Instant::now();
        crabctl_ok(&[
            "export",
            &g.id,
            "base",
            "-o",
            &archive.display().to_string(),
        ]);
        let out = Command::new("crabctl")
            .args(["-a", address_b, "-n", &namespace(), "import"])
            .arg(&archive)
            .args(["--id", &new_id])
            .output()
            .expect("crabctl import");
        moves.push(t.elapsed());
        assert!(out.status.success(), "import: {:?}", text(&out));
        let ctr_b = |args: &[&str]| {
            let _ = Command::new("ctr")
                .args(["-a", address_b, "-n", &namespace()])
                .args(args)
                .output();
        };
        ctr_b(&["task", "kill", "-s", "KILL", &new_id]);
        std::thread::sleep(Duration::from_millis(300));
        ctr_b(&["task", "rm", "-f", &new_id]);
        ctr_b(&["container", "rm", &new_id]);
        let _ = std::fs::remove_file(&archive);
    }
    second_containerd("stop");
    row(
        "migration: `crabctl export` + `crabctl import`",
        stats(moves),
        "to a second containerd",
    );
    println!(
        "\n{n} iterations per figure (migration: at most 5); {} cores.",
        cores()
    );
}
