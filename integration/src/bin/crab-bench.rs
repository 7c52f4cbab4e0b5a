//! Start-up, exec and memory figures of the crab runtime next to runc's shim, measured
//! in the same run through the same containerd and `ctr` (so client overhead is common
//! to both columns). Prints a Markdown table.
//!
//! `crab-bench [--iterations N] [--containers K]`; needs the private containerd of
//! `hack/containerd.sh` (see `hack/bench.sh`).

use std::time::Duration;

use clap::Parser;
use crab_integration::bench::*;
use crab_integration::*;

/// Start-up, exec and shim memory of crab next to runc.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    iterations: Iterations<30>,
    /// Running containers per runtime for the memory figure.
    #[arg(long, value_name = "K", default_value_t = 10)]
    containers: usize,
}

fn time_ok(args: &[&str]) -> Duration {
    time_ctr(args, Duration::from_secs(60))
}

/// Runs `true` to completion `n` times per runtime, alternating runtimes.
fn start_latency(n: usize) -> (Stats, Stats) {
    let (mut crab, mut runc) = (Vec::new(), Vec::new());
    for _ in 0..n {
        for (rt, acc) in [(CRAB, &mut crab), (RUNC, &mut runc)] {
            let id = unique_id("bench");
            acc.push(time_ok(&[
                "run",
                "--rm",
                "--runtime",
                rt,
                BUSYBOX,
                &id,
                "true",
            ]));
        }
    }
    (stats(crab), stats(runc))
}

/// Execs `true` `n` times into one running container per runtime.
fn exec_latency(n: usize) -> (Stats, Stats) {
    let c = Guard::run_detached(CRAB, BUSYBOX, &[], &["sleep", "100000"]);
    let r = Guard::run_detached(RUNC, BUSYBOX, &[], &["sleep", "100000"]);
    let (mut crab, mut runc) = (Vec::new(), Vec::new());
    for _ in 0..n {
        for (g, acc) in [(&c, &mut crab), (&r, &mut runc)] {
            let x = unique_id("x");
            acc.push(time_ok(&["task", "exec", "--exec-id", &x, &g.id, "true"]));
        }
    }
    (stats(crab), stats(runc))
}

fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn runc_shim_pids(id: &str) -> Vec<i32> {
    shim_pids_of("containerd-shim-runc-v2", id)
}

/// Mean shim RSS per running container, crab and runc.
fn shim_memory(k: usize) -> (f64, f64) {
    let crab: Vec<Guard> = (0..k)
        .map(|_| Guard::run_detached(CRAB, BUSYBOX, &[], &["sleep", "100000"]))
        .collect();
    let runc: Vec<Guard> = (0..k)
        .map(|_| Guard::run_detached(RUNC, BUSYBOX, &[], &["sleep", "100000"]))
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let sum = |gs: &[Guard], pids: fn(&str) -> Vec<i32>| -> f64 {
        let total: u64 = gs.iter().flat_map(|g| pids(&g.id)).map(rss_kib).sum();
        total as f64 / gs.len() as f64 / 1024.0
    };
    (sum(&crab, shim_pids), sum(&runc, runc_shim_pids))
}

fn main() {
    let cli = Cli::parse();
    let (iterations, containers) = (cli.iterations.iterations, cli.containers);
    // Warm up both runtimes (page cache, snapshotter).
    let _ = start_latency(2);
    let (sc, sr) = start_latency(iterations);
    let (ec, er) = exec_latency(iterations);
    let (mc, mr) = shim_memory(containers);
    println!("| measure | crab | runc | crab / runc |");
    println!("|---|---|---|---|");
    for (name, c, r) in [
        ("`ctr run --rm true`, median", sc.median, sr.median),
        ("`ctr run --rm true`, p95", sc.p95, sr.p95),
        ("`ctr task exec true`, median", ec.median, er.median),
        ("`ctr task exec true`, p95", ec.p95, er.p95),
    ] {
        println!("| {name} | {} | {} | {:.2} |", ms(c), ms(r), ratio(c, r));
    }
    println!(
        "| shim RSS per running container ({} containers) | {mc:.1} MiB | {mr:.1} MiB | {:.2} |",
        containers,
        mc / mr
    );
    println!(
        "\n{} iterations per figure, runtimes alternated; {} cores.",
        iterations,
        cores()
    );
}
