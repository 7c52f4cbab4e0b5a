//! Restore after a crash: a server's shim and init are killed with SIGKILL, and the
//! restore starts at once. Two times from the kill: until the restore command has
//! returned, and until the restored server answers an HTTP request (from the
//! host, inside the container's network namespace) and, for `python-proxy`
//! (crab only: runc has no proxy), until the turn proxy answers too. Prints a
//! Markdown table.
//!
//! - crab: `crabctl restore ID`, the newest checkpoint of the container's history,
//!   under the same id.
//! - runc, the nearest equivalent containerd offers: a checkpoint image taken
//!   with `ctr container checkpoint --task --rw` (the files too, as crab's);
//!   after the crash `ctr task delete`, tried again until containerd has let go
//!   of the dead task (ctr cannot delete a task whose shim is dead: it fails to
//!   load it), `ctr container rm`, `ctr container restore --live --rw`
//!   under the same id, and loopback brought
//!   up in the restored namespace (`nsenter ... ip link set lo up`: runc's restore
//!   leaves it down on this machine, and the server listens on it).
//!
//! `crab-crash-bench [--iterations N] [--workloads busybox,python,python-proxy]
//! [--runtimes crab,runc]`;
//! needs the private containerd of `hack/containerd.sh` (see `hack/bench.sh`).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use clap::Parser;
use crab_integration::bench::*;
use crab_integration::llm;
use crab_integration::*;

/// Restore after a crash, to a server that answers.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    iterations: Iterations<20>,
    /// Workloads (busybox: httpd and a shell counter; python: `http.server`;
    /// python-proxy: the same with the shim's turn proxy, crab only).
    #[arg(
        long,
        value_name = "W,...",
        default_value = "busybox,python,python-proxy"
    )]
    workloads: List<String>,
    /// Runtimes (crab, runc).
    #[arg(long, value_name = "R,...", default_value = "crab,runc")]
    runtimes: List<String>,
}

/// The server's port, and the turn proxy's (both on the container's loopback).
const PORT: u16 = 8080;
const PROXY_PORT: u16 = 8787;
const TIMEOUT: Duration = Duration::from_secs(30);
const BUSYBOX_SERVER: &str = "mkdir -p /www && echo served > /www/index.html && \
    httpd -p 127.0.0.1:8080 -h /www && \
    i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done";

/// One GET inside the network namespace of `pid`, to `port`: whether an HTTP
/// answer came.
fn answers(pid: i32, port: u16) -> bool {
    let Ok(ns) = std::fs::File::open(format!("/proc/{pid}/ns/net")) else {
        return false;
    };
    std::thread::spawn(move || {
        // SAFETY: setns takes a namespace fd valid for the call and a type; it
        // moves only this short-lived thread.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return false;
        }
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        if s.write_all(b"GET /v1/models HTTP/1.0\r\n\r\n").is_err() {
            return false;
        }
        let mut head = [0u8; 8];
        s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.")
    })
    .join()
    .unwrap_or(false)
}

/// Waits until the server in `pid`'s namespace answers on each of `ports`.
fn wait_answer(pid: i32, ports: &[u16]) {
    let end = Instant::now() + TIMEOUT;
    while !ports.iter().all(|&p| answers(pid, p)) {
        assert!(
            Instant::now() < end,
            "the server of pid {pid} never answered"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn shim_binary(runtime: &str) -> &'static str {
    if runtime == CRAB {
        "containerd-shim-crab-v2"
    } else {
        "containerd-shim-runc-v2"
    }
}

/// SIGKILL to the shim and the init of `g`.
fn crash(runtime: &str, g: &Guard) {
    let mut victims = shim_pids_of(shim_binary(runtime), &g.id);
    assert_eq!(victims.len(), 1, "one shim serves {}", g.id);
    victims.push(g.pid());
    for pid in victims {
        // SAFETY: kill takes a pid and a signal only.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill {pid}");
    }
}

/// runc's way back: the dead task deleted (once containerd has let go of it), the
/// container removed and restored from its checkpoint image, loopback up.
fn runc_restore(g: &Guard, reference: &str) -> i32 {
    let end = Instant::now() + TIMEOUT;
    // `ctr task delete` loads the task first, and a dead shim's fails to load
    // ("no running task found"): it is gone only once containerd says it has no
    // task of that id.
    let gone = format!("task {} not found", g.id);
    loop {
        let out = ctr_run(&["task", "delete", &g.id], None, TIMEOUT);
        if out.status.success() || text(&out).1.contains(&gone) {
            break;
        }
        assert!(Instant::now() < end, "task delete: {:?}", text(&out));
        std::thread::sleep(Duration::from_millis(5));
    }
    ctr_ok(&["container", "rm", &g.id]);
    ctr_ok(&["container", "restore", "--live", "--rw", &g.id, reference]);
    let pid = g.pid();
    crab_eval::sandbox::loopback_up(pid).expect("loopback up");
    pid
}

/// The init pid `crabctl restore` printed.
fn crab_restore(g: &Guard) -> i32 {
    let out = crabctl_ok(&["restore", &g.id]);
    out.rsplit("init pid ")
        .next()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in {out:?}"))
}

struct Sample {
    command: Duration,
    answer: Duration,
}

/// Runs `iterations` crashes and restores of one server; the first is a warm-up.
fn measure(runtime: &str, workload: &str, iterations: usize) -> Vec<Sample> {
    let python = vec![
        "python3",
        "-m",
        "http.server",
        "8080",
        "--bind",
        "127.0.0.1",
    ];
    let (port, _seen) = llm::stub(Duration::ZERO, Duration::ZERO);
    let upstream = format!("http://127.0.0.1:{port}");
    let config = config_with(&format!("[proxy]\nupstreams = [\"{upstream}\"]"))
        .to_string_lossy()
        .into_owned();
    let annotation = format!("io.crab.proxy.upstream={upstream}");
    let proxied = [
        "--runtime-config-path",
        &config,
        "--annotation",
        &annotation,
    ];
    let (image, args, flags, ports): (&str, Vec<&str>, &[&str], &[u16]) = match workload {
        "busybox" => (BUSYBOX, vec!["sh", "-c", BUSYBOX_SERVER], &[], &[PORT]),
        "python" => (PYTHON, python, &[], &[PORT]),
        "python-proxy" => (PYTHON, python, &proxied, &[PORT, PROXY_PORT]),
        w => panic!("unknown workload {w}"),
    };
    let g = Guard::run_detached(runtime, image, flags, &args);
    wait_answer(g.pid(), ports);
    let reference = format!("crab.bench/{}:1", unique_id("crash"));
    if runtime == CRAB {
        crabctl_ok(&["checkpoint", &g.id, "--name", "safe"]);
    } else {
        ctr_ok(&[
            "container",
            "checkpoint",
            "--task",
            "--rw",
            &g.id,
            &reference,
        ]);
    }
    let unpacked = unpacked_checkpoints();
    let mut samples = Vec::new();
    for i in 0..=iterations {
        let t = Instant::now();
        crash(runtime, &g);
        let pid = if runtime == CRAB {
            crab_restore(&g)
        } else {
            runc_restore(&g, &reference)
        };
        let command = t.elapsed();
        wait_answer(pid, ports);
        let answer = t.elapsed();
        if i > 0 {
            samples.push(Sample { command, answer });
        }
        remove_unpacked_since(&unpacked);
        // Let the machine settle (the killed shim's cleanup, the log lines).
        std::thread::sleep(Duration::from_millis(300));
    }
    g.remove();
    if runtime != CRAB {
        let _ = ctr_run(&["images", "rm", &reference], None, TIMEOUT);
    }
    samples
}

fn main() {
    let cli = Cli::parse();
    let n = cli.iterations.iterations;
    println!(
        "| workload | runtime | kill → restore command returned (median / p95) | \
         kill → server answers (median / p95) |"
    );
    println!("|---|---|---|---|");
    for workload in cli.workloads.iter() {
        for name in cli.runtimes.iter() {
            let runtime = match name.as_str() {
                "crab" => CRAB,
                "runc" if workload == "python-proxy" => continue,
                "runc" => RUNC,
                r => panic!("unknown runtime {r}"),
            };
            let s = measure(runtime, workload, n);
            let command = stats(s.iter().map(|s| s.command).collect());
            let answer = stats(s.iter().map(|s| s.answer).collect());
            println!(
                "| {workload} | {name} | {} / {} | {} / {} |",
                ms(command.median),
                ms(command.p95),
                ms(answer.median),
                ms(answer.p95)
            );
        }
    }
    println!(
        "\n{n} crashes per row after one warm-up, the restore started right after \
         the kill; python-proxy answers once the server and the turn proxy \
         (to a stub LLM on the host) both do; {} cores.",
        cores()
    );
}
