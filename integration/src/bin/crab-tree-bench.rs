//! A tree search over one sandbox, modelled on DeltaBox's SWE-bench search (issue
//! 19): at each node a checkpoint, then K children, each starting from the node's
//! state (a rollback to the node's checkpoint before every child but the first) and
//! running one tool call of about a second (think time 0); the search goes on from
//! the last child, D levels deep. The state-management overhead is the share of the
//! wall time not spent in tool calls.
//!
//! Crab (`crabctl checkpoint`, `crabctl rollback`: processes and files, in place)
//! next to runc's shim with containerd's own checkpoints (`ctr container checkpoint
//! --task --rw`; a rollback is the task and container removed and `ctr container
//! restore --live --rw`), on the same sandbox: python holding `--heap-mb` of
//! written heap. Each tool call prints the path of children the sandbox's files
//! hold before it appends its own, so a rollback that brought back the wrong files
//! is counted (`wrong states`).
//!
//! `crab-tree-bench [--depth 10] [--children 4] [--heap-mb 100] [--tool-ms 1000]`;
//! needs the private containerd of `hack/containerd.sh` (see `hack/bench.sh`).

use std::time::{Duration, Instant};

use clap::Parser;
use crab_integration::bench::*;
use crab_integration::*;

/// A tree search's state management, crab beside runc.
#[derive(Parser)]
struct Cli {
    /// Levels of the tree.
    #[arg(long, default_value_t = 10)]
    depth: usize,
    /// Children tried at each node.
    #[arg(long, default_value_t = 4)]
    children: usize,
    /// Heap the sandbox's python process holds (MiB, every page written).
    #[arg(long, default_value_t = 100)]
    heap_mb: usize,
    /// How long a tool call runs (ms).
    #[arg(long, default_value_t = 1000)]
    tool_ms: u64,
}

/// The sandbox: python holding its heap, counting in memory.
fn sandbox_script(heap_mb: usize) -> String {
    format!(
        "import time\nheap = bytearray({heap_mb} << 20)\nfor i in range(0, len(heap), 4096):\n    \
         heap[i] = 1\nn = 0\nwhile True:\n    n += 1\n    time.sleep(0.1)\n"
    )
}

/// How one system takes a checkpoint of the node and rolls back to it.
trait Search {
    fn name(&self) -> &'static str;
    fn checkpoint(&mut self, g: &Guard, node: usize);
    fn rollback(&mut self, g: &Guard, node: usize);
    /// Flags of `ctr run` for the sandbox.
    fn flags(&self) -> &'static [&'static str] {
        &[]
    }
    /// Reads what it reports about the sandbox, before it is removed.
    fn at_end(&mut self, _g: &Guard) {}
    /// A line under the table.
    fn note(&self) -> Option<String> {
        None
    }
    /// Removes what the search left outside the container.
    fn finish(&mut self) {}
}

/// Crab, with or without a standby replica (`io.crab.standby=true`), its
/// process images synced before each checkpoint is reported or after
/// (`io.crab.checkpoint.durability=shim`).
struct Crab {
    standby: bool,
    shim_durable: bool,
    /// Rollbacks that adopted a replica.
    adopted: usize,
    /// The replica's memory at the end (`crabctl stats`).
    standby_bytes: u64,
}

impl Search for Crab {
    fn name(&self) -> &'static str {
        match (self.standby, self.shim_durable) {
            (true, true) => {
                "crab with a standby, images synced after (`io.crab.checkpoint.durability=shim`)"
            }
            (true, false) => "crab with a standby (`io.crab.standby=true`)",
            (false, true) => "crab, images synced after (`io.crab.checkpoint.durability=shim`)",
            (false, false) => "crab (`crabctl checkpoint` / `rollback`)",
        }
    }
    fn checkpoint(&mut self, g: &Guard, node: usize) {
        crabctl_ok(&["checkpoint", &g.id, "--name", &format!("n{node}")]);
    }
    fn rollback(&mut self, g: &Guard, node: usize) {
        let out = crabctl_ok(&["rollback", &g.id, &format!("n{node}")]);
        if out.contains("standby adopted") {
            self.adopted += 1;
        }
    }
    fn flags(&self) -> &'static [&'static str] {
        const STANDBY: &str = "io.crab.standby=true";
        const SHIM: &str = "io.crab.checkpoint.durability=shim";
        match (self.standby, self.shim_durable) {
            (true, true) => &["--annotation", STANDBY, "--annotation", SHIM],
            (true, false) => &["--annotation", STANDBY],
            (false, true) => &["--annotation", SHIM],
            (false, false) => &[],
        }
    }
    fn at_end(&mut self, g: &Guard) {
        let out = crabctl_ok(&["stats", &g.id, "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        self.standby_bytes = v["standby"]["memory_bytes"].as_u64().unwrap_or(0);
    }
    fn note(&self) -> Option<String> {
        self.standby.then(|| {
            format!(
                "{} rollbacks adopted a standby; the standby held {:.1} MiB at the end",
                self.adopted,
                self.standby_bytes as f64 / (1 << 20) as f64
            )
        })
    }
}

/// runc's shim: containerd 1.7 holds one restorable checkpoint image per
/// container (see the evaluation's runc baseline), so a node's image replaces its
/// parent's.
struct Runc {
    image: Option<String>,
}

impl Search for Runc {
    fn name(&self) -> &'static str {
        "runc (`ctr container checkpoint --task --rw` / `restore --live --rw`)"
    }
    fn checkpoint(&mut self, g: &Guard, node: usize) {
        if let Some(old) = self.image.take() {
            ctr_ok(&["images", "rm", "--sync", &old]);
        }
        let image = format!("crab.bench/{}:n{node}", g.id);
        ctr_ok(&["container", "checkpoint", "--task", "--rw", &g.id, &image]);
        self.image = Some(image);
    }
    fn rollback(&mut self, g: &Guard, _node: usize) {
        let image = self.image.as_deref().expect("a node's image");
        g.remove();
        ctr_ok(&["container", "restore", "--live", "--rw", &g.id, image]);
    }
    fn finish(&mut self) {
        if let Some(image) = self.image.take() {
            let _ = ctr_run(
                &["images", "rm", "--sync", &image],
                None,
                Duration::from_secs(30),
            );
        }
    }
}

/// What one search measured.
struct Run {
    wall: Duration,
    tools: Duration,
    checkpoints: Vec<Duration>,
    rollbacks: Vec<Duration>,
    wrong: usize,
    calls: usize,
}

fn search(system: &mut dyn Search, g: &Guard, cli: &Cli) -> Run {
    let tool = format!(
        "cat /work/path 2>/dev/null; echo; echo \"$0\" >> /work/path; sleep {}",
        cli.tool_ms as f64 / 1000.0
    );
    g.exec_ok(&["mkdir", "-p", "/work"]);
    let (mut checkpoints, mut rollbacks) = (Vec::new(), Vec::new());
    let (mut tools, mut wrong, mut calls) = (Duration::ZERO, 0, 0);
    // The children the node's files hold, as the tool prints them.
    let mut path = String::new();
    let start = Instant::now();
    for node in 0..cli.depth {
        let t = Instant::now();
        system.checkpoint(g, node);
        checkpoints.push(t.elapsed());
        for child in 0..cli.children {
            if child > 0 {
                let t = Instant::now();
                system.rollback(g, node);
                rollbacks.push(t.elapsed());
            }
            let name = format!("{node}.{child}");
            let t = Instant::now();
            let seen = g.exec_ok(&["sh", "-c", &tool, &name]);
            tools += t.elapsed();
            calls += 1;
            if seen.trim_end() != path.trim_end() {
                wrong += 1;
                eprintln!(
                    "{}: child {name} found {seen:?}, not {path:?}",
                    system.name()
                );
            }
            if child + 1 == cli.children {
                path.push_str(&name);
                path.push('\n');
            }
        }
    }
    Run {
        wall: start.elapsed(),
        tools,
        checkpoints,
        rollbacks,
        wrong,
        calls,
    }
}

fn main() {
    let cli = Cli::parse();
    let script = sandbox_script(cli.heap_mb);
    let unpacked = unpacked_checkpoints();
    let mut runs = Vec::new();
    let crab = |standby, shim_durable| Crab {
        standby,
        shim_durable,
        adopted: 0,
        standby_bytes: 0,
    };
    let systems: [(&str, Box<dyn Search>); 4] = [
        (CRAB, Box::new(crab(true, true))),
        (CRAB, Box::new(crab(true, false))),
        (CRAB, Box::new(crab(false, false))),
        (RUNC, Box::new(Runc { image: None })),
    ];
    let mut notes = Vec::new();
    for (runtime, mut system) in systems {
        let g = Guard::run_detached(runtime, PYTHON, system.flags(), &["python3", "-c", &script]);
        // The heap written before the first node.
        std::thread::sleep(Duration::from_secs(2));
        let run = search(system.as_mut(), &g, &cli);
        system.at_end(&g);
        runs.push((system.name(), run));
        notes.extend(system.note());
        drop(g);
        system.finish();
    }
    remove_unpacked_since(&unpacked);

    println!(
        "| system | wall | in tool calls | state management | share of wall | checkpoint median | rollback median | wrong states |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, r) in &runs {
        let managed = r.wall.saturating_sub(r.tools);
        println!(
            "| {name} | {:.1} s | {:.1} s | {:.1} s | {:.1}% | {} | {} | {} of {} |",
            r.wall.as_secs_f64(),
            r.tools.as_secs_f64(),
            managed.as_secs_f64(),
            100.0 * ratio(managed, r.wall),
            ms(stats(r.checkpoints.clone()).median),
            ms(stats(r.rollbacks.clone()).median),
            r.wrong,
            r.calls
        );
    }
    println!(
        "\nDepth {}, {} children per node ({} rollbacks), tool calls of {} ms plus the \
         `ctr task exec` that runs each (counted as tool time for both), python holding \
         {} MiB; {} cores; cgroup2 {} favordynmods; adoptions {}.",
        cli.depth,
        cli.children,
        cli.depth * (cli.children.saturating_sub(1)),
        cli.tool_ms,
        cli.heap_mb,
        cores(),
        if crab_runtime::cgroup2::favors_dynamic_moves() {
            "with"
        } else {
            "without"
        },
        if !crab_runtime::standby::rollback_renames() {
            "move the replica's processes"
        } else {
            "rename the replica's cgroups"
        }
    );
    for n in notes {
        println!("{n}.");
    }
}
