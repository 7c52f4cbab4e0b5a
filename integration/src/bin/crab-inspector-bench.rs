//! The eBPF inspector's cost: syscall-heavy workloads in a crab container with
//! its cgroup watched by the inspector versus not watched (the programs stay
//! attached host-wide; an unwatched cgroup pays one map lookup per syscall),
//! with 1 and with 32 watched containers on the host; the latency of
//! classifying a turn; the memory the inspector's maps and programs use.
//!
//! Workloads (timed inside the container, so exec overhead is left out):
//! - build: untar a small project (600 Python modules) and byte-compile it
//!   (the python image has no C compiler);
//! - writes: 20 000 small writes, each an open + write + close, over 200 files;
//! - syscalls: 200 000 write(2) calls of 100 B to one open file (dd), the
//!   inspector's cost per write with little else around it;
//! - find: a read-only `find / -xdev`, ten times.
//!
//! The slowdown is the median over iterations of the ratio watched / not
//! watched within one iteration (the two runs are back to back, in alternating
//! order), with the middle half of those ratios to show the noise; once for the
//! wall-clock time, once for the CPU time of the container's cgroup.
//!
//! Then the kernel's own accounting (`kernel.bpf_stats_enabled`) of the
//! inspector's programs during each workload, watched and not: the CPU time the
//! inspector adds, without the noise of the workload's wall-clock time.
//!
//! `crab-inspector-bench [--iterations N] [--containers 1,32]
//! [--workloads build,writes,syscalls,find]`; needs the private containerd of
//! `hack/containerd.sh` (see `hack/bench.sh`).

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use clap::Parser;
use crab_integration::bench::*;
use crab_integration::*;
use crab_runtime::config::Config;

/// The eBPF inspector's cost.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    iterations: Iterations<9>,
    /// Watched containers on the host, one table row each (comma-separated).
    #[arg(long, value_name = "K,...", default_value = "1,32")]
    containers: List<usize>,
    /// Workloads to time (comma-separated).
    #[arg(
        long,
        value_name = "NAME,...",
        value_delimiter = ',',
        default_value = "build,writes,syscalls,find",
        value_parser = ["build", "writes", "syscalls", "find"]
    )]
    workloads: Vec<String>,
}

const WORKLOAD: &str = r#"
import compileall, os, shutil, subprocess, sys, time
w = sys.argv[1]
t = time.perf_counter()
if w == 'build':
    shutil.rmtree('/sandbox/b', ignore_errors=True)
    os.makedirs('/sandbox/b')
    subprocess.run(['tar', '-xf', '/sandbox/project.tar', '-C', '/sandbox/b'], check=True)
    compileall.compile_dir('/sandbox/b', quiet=1)
elif w == 'writes':
    os.makedirs('/sandbox/w', exist_ok=True)
    for i in range(20000):
        with open('/sandbox/w/%d' % (i % 200), 'w') as f:
            f.write('x' * 100)
elif w == 'syscalls':
    subprocess.run(['dd', 'if=/dev/zero', 'of=/sandbox/s', 'bs=100', 'count=200000'],
                   stderr=subprocess.DEVNULL, check=True)
elif w == 'find':
    for _ in range(10):
        subprocess.run(['find', '/', '-xdev'], stdout=subprocess.DEVNULL, check=True)
print(time.perf_counter() - t)
"#;

const PREPARE: &str = r#"
import os, random, tarfile
os.makedirs('/sandbox/project', exist_ok=True)
random.seed(1)
for i in range(600):
    with open('/sandbox/project/mod%d.py' % i, 'w') as f:
        for j in range(40):
            f.write('def f%d(x):\n    return x * %d + %d\n' % (j, random.randint(1, 99), j))
with tarfile.open('/sandbox/project.tar', 'w') as t:
    t.add('/sandbox/project', arcname='project')
"#;

fn run_workload(g: &Guard, name: &str) -> Duration {
    let out = g.exec_ok(&["python3", "-c", WORKLOAD, name]);
    Duration::from_secs_f64(out.trim().parse().expect("workload prints seconds"))
}

fn cgroup_dir(id: &str) -> String {
    format!("/sys/fs/cgroup/unified/crab/{}/{id}", namespace())
}

fn cgroup_id(id: &str) -> u64 {
    let p = cgroup_dir(id);
    std::fs::metadata(&p)
        .unwrap_or_else(|e| panic!("{p}: {e}"))
        .ino()
}

/// The CPU time the container's tasks have used (`usage_usec` of its cgroup).
fn cpu_used(id: &str) -> Duration {
    let p = format!("{}/cpu.stat", cgroup_dir(id));
    let stat = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"));
    let usec = stat
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no usage_usec in {p}"));
    Duration::from_micros(usec)
}

/// Percent changes at the 25th, 50th and 75th percentile of the ratios
/// `on[i] / off[i]` (one pair per iteration).
fn paired(on: &[Duration], off: &[Duration]) -> [f64; 3] {
    let r = sorted(on.iter().zip(off).map(|(a, b)| ratio(*a, *b)).collect());
    [0.25, 0.5, 0.75].map(|p| (nearest_rank(&r, p) - 1.0) * 100.0)
}

fn bpftool(args: &[&str]) -> serde_json::Value {
    let out = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .expect("bpftool");
    assert!(out.status.success(), "bpftool {args:?}: {:?}", text(&out));
    serde_json::from_slice(&out.stdout).expect("bpftool prints JSON")
}

const PROGRAMS: [&str; 6] = [
    "sys_enter",
    "sys_exit",
    "process_fork",
    "process_exit",
    "process_exec",
    "cgroup_attach",
];

/// `bpftool prog show` of one program of the set pinned in `dir`.
fn prog_of(dir: &Path, name: &str) -> serde_json::Value {
    let link = dir.join(format!("link-{name}"));
    let link = bpftool(&["link", "show", "pinned", &link.to_string_lossy()]);
    let id = link["prog_id"].as_u64().expect("a link's prog_id");
    bpftool(&["prog", "show", "id", &id.to_string()])
}

/// Bytes of kernel memory the programs of the set pinned in `dir` and the maps
/// they use account for (not another set's, such as the tests').
fn inspector_memory(dir: &Path) -> (u64, u64) {
    let (mut progs, mut map_ids) = (0, std::collections::BTreeSet::new());
    for name in PROGRAMS {
        let p = prog_of(dir, name);
        progs += p["bytes_memlock"].as_u64().unwrap_or(0);
        for id in p["map_ids"].as_array().into_iter().flatten() {
            map_ids.insert(id.as_u64().expect("a map id"));
        }
    }
    let maps = map_ids
        .iter()
        .map(|id| bpftool(&["map", "show", "id", &id.to_string()])["bytes_memlock"].as_u64())
        .map(|b| b.unwrap_or(0))
        .sum();
    (maps, progs)
}

/// Total run time (ns) of the programs of the set pinned in `dir`, as the
/// kernel accounts it while `kernel.bpf_stats_enabled` is 1.
fn programs_ns(dir: &Path) -> u64 {
    PROGRAMS
        .iter()
        .map(|p| prog_of(dir, p)["run_time_ns"].as_u64().unwrap_or(0))
        .sum()
}

/// Runs `f(watched)` `n` times with the container's cgroup watched and `n`
/// times not, alternating the order so that drift on a shared machine hits
/// both; leaves it watched.
fn alternate(insp: &crab_bpf::Inspector, cgid: u64, n: usize, mut f: impl FnMut(bool)) {
    let watch = |watched: bool| {
        if watched {
            insp.watch(cgid).expect("watch");
            // As after the container's first full checkpoint: a new watch
            // records nothing until then.
            insp.forget(cgid, |_| true, true, true).expect("forget");
        } else {
            insp.unwatch(cgid).expect("unwatch");
        }
    };
    for i in 0..n {
        for watched in [i % 2 == 0, i % 2 != 0] {
            watch(watched);
            // What the last run left dirty (the build writes and deletes
            // thousands of files) is written back now, not during the next
            // run: each run starts from a clean file system.
            let synced = Command::new("sync").status().expect("sync");
            assert!(synced.success(), "sync: {synced}");
            f(watched);
        }
    }
    watch(true);
}

/// What the kernel accounts to the inspector's programs during one run of a
/// workload, watched and not (medians over `n` runs each), and the workload's
/// own median time unwatched.
struct KernelCost {
    off: Duration,
    on: Duration,
    workload: Duration,
}

fn kernel_cost(
    insp: &crab_bpf::Inspector,
    (g, cgid): (&Guard, u64),
    dir: &Path,
    w: &str,
    n: usize,
) -> KernelCost {
    const STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";
    let before = std::fs::read_to_string(STATS).expect(STATS);
    std::fs::write(STATS, "1").expect(STATS);
    let (mut on, mut off, mut took) = (Vec::new(), Vec::new(), Vec::new());
    alternate(insp, cgid, n, |watched| {
        let t0 = programs_ns(dir);
        let t = run_workload(g, w);
        let spent = Duration::from_nanos(programs_ns(dir) - t0);
        if watched {
            on.push(spent)
        } else {
            off.push(spent);
            took.push(t);
        }
    });
    std::fs::write(STATS, before.trim()).expect(STATS);
    KernelCost {
        off: stats(off).median,
        on: stats(on).median,
        workload: stats(took).median,
    }
}

fn main() {
    let cli = Cli::parse();
    let (n, densities, workloads) = (cli.iterations.iterations, cli.containers, cli.workloads);
    let config = Config::default();
    let insp = crab_runtime::inspect::inspector(&config).expect("the inspector loads");
    let g = Guard::run_detached(CRAB, PYTHON, &[], &["sleep", "infinity"]);
    g.exec_ok(&["python3", "-c", PREPARE]);
    let cgid = cgroup_id(&g.id);
    let mut others: Vec<Guard> = Vec::new();

    println!(
        "| workload | watched containers | not watched (median) | watched (median) | wall-clock slowdown (middle half) | CPU-time slowdown (middle half) |"
    );
    println!("|---|---|---|---|---|---|");
    for &d in densities.iter() {
        while others.len() + 1 < d {
            let o = Guard::run_detached(CRAB, PYTHON, &[], &["sleep", "infinity"]);
            // Checkpointed once, so that the inspector records for it.
            crabctl_ok(&["checkpoint", &o.id]);
            others.push(o);
        }
        for w in workloads.iter().map(String::as_str) {
            run_workload(&g, w); // warm the page cache
            let (mut on, mut off) = (Vec::new(), Vec::new());
            alternate(&insp, cgid, n, |watched| {
                let cpu = cpu_used(&g.id);
                let t = run_workload(&g, w);
                let sample = (t, cpu_used(&g.id) - cpu);
                if watched {
                    on.push(sample)
                } else {
                    off.push(sample)
                }
            });
            // Each iteration runs the workload watched and not, back to back:
            // the ratio within a pair leaves out the machine's drift over the
            // minutes of the run (other tenants), which a ratio of two medians
            // takes in. The CPU time (the container cgroup's) also leaves out
            // the time its tasks waited for a CPU.
            let wall = |v: &[(Duration, Duration)]| v.iter().map(|s| s.0).collect::<Vec<_>>();
            let cpu = |v: &[(Duration, Duration)]| v.iter().map(|s| s.1).collect::<Vec<_>>();
            let [wq1, wm, wq3] = paired(&wall(&on), &wall(&off));
            let [cq1, cm, cq3] = paired(&cpu(&on), &cpu(&off));
            println!(
                "| {w} | {d} | {} | {} | {wm:+.1}% ({wq1:+.1} to {wq3:+.1}) | {cm:+.1}% ({cq1:+.1} to {cq3:+.1}) |",
                ms(stats(wall(&off)).median),
                ms(stats(wall(&on)).median),
            );
        }
    }

    let dir = config.policy.bpf_pin_root.join(crab_bpf::PIN_VERSION);
    println!();
    println!(
        "| workload | programs' time per run, not watched | watched | added | added / workload time |"
    );
    println!("|---|---|---|---|---|");
    for w in workloads.iter().map(String::as_str) {
        let k = kernel_cost(&insp, (&g, cgid), &dir, w, n);
        let millis = |d: Duration| d.as_secs_f64() * 1e3;
        let added = millis(k.on) - millis(k.off);
        let per_write = if w == "syscalls" {
            format!(" ({:.0} ns per write)", added * 1e6 / 200_000.0)
        } else {
            String::new()
        };
        println!(
            "| {w} | {:.2} ms | {:.2} ms | {added:.2} ms{per_write} | {:.1}% |",
            millis(k.off),
            millis(k.on),
            added / millis(k.workload) * 100.0
        );
    }

    // Classification: the classifier's own time, for a turn with a few changes.
    g.exec_ok(&[
        "sh",
        "-c",
        "echo x > /sandbox/a; echo y > /sandbox/b; rm -f /sandbox/w/1",
    ]);
    let mut us = Vec::new();
    for _ in 0..(10 * n) {
        let out = crabctl_ok(&["turn", &g.id, "--dry-run", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).expect("turn json");
        us.push(Duration::from_micros(
            v["classification"]["elapsed_us"].as_u64().unwrap_or(0),
        ));
    }
    let s = stats(us);
    let (maps, progs) = inspector_memory(&dir);
    println!();
    println!(
        "classify a turn ({} watched containers): median {:.0} µs, p95 {:.0} µs",
        others.len() + 1,
        s.median.as_secs_f64() * 1e6,
        s.p95.as_secs_f64() * 1e6
    );
    println!(
        "inspector kernel memory: maps {} KiB, programs {} KiB ({} cores)",
        maps / 1024,
        progs / 1024,
        cores()
    );
}
