//! Checkpoint and restore through containerd's API, the crab runtime next to runc's
//! shim in the same run: `ctr container checkpoint --task`, then
//! `ctr container restore --live` into a new container, for a python process that holds
//! N MB of written memory. Prints a Markdown table.
//!
//! `crab-cr-bench [--iterations N] [--sizes 10,100,500]`; needs the private containerd
//! of `hack/containerd.sh` (see `hack/bench.sh`).

use std::time::Duration;

use clap::Parser;
use crab_integration::bench::*;
use crab_integration::*;

/// Checkpoint and restore through containerd, crab next to runc.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    iterations: Iterations<5>,
    /// Written memory of the workload, MB (comma-separated).
    #[arg(long, value_name = "MB,...", default_value = "10,100,500")]
    sizes: List<usize>,
}

const TIMEOUT: Duration = Duration::from_secs(300);

/// A process that writes every page of `mb` MB, says so, and sleeps.
fn workload(mb: usize) -> String {
    format!(
        "import time\nb = bytearray({mb} << 20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\n\
         open('/tmp/ready', 'w').write('1')\nwhile True:\n    time.sleep(1)\n"
    )
}

/// Bytes of a checkpoint image: the sizes its index lists.
fn image_bytes(reference: &str) -> u64 {
    let images = ctr_ok(&["images", "ls"]);
    match crab_eval::runc::image_digest(&images, reference) {
        Some(digest) => crab_eval::runc::checkpoint_parts(&ctr_ok(&["content", "get", digest])).0,
        None => 0,
    }
}

struct Sample {
    checkpoint: Duration,
    restore: Duration,
    bytes: u64,
}

fn one(runtime: &str, mb: usize) -> Sample {
    let script = workload(mb);
    let g = Guard::run_detached(runtime, PYTHON, &[], &["python3", "-c", &script]);
    let ready = wait_until(TIMEOUT, || g.exec(&["cat", "/tmp/ready"]).status.success());
    assert!(ready, "{runtime}: workload of {mb} MB not ready");
    let reference = format!("crab.bench/{}:1", unique_id("cr"));
    let checkpoint = time_ctr(
        &["container", "checkpoint", "--task", &g.id, &reference],
        TIMEOUT,
    );
    let bytes = image_bytes(&reference);
    g.remove();
    let r = Guard::new(&unique_id("cr-restored"));
    let unpacked = unpacked_checkpoints();
    let restore = time_ctr(
        &["container", "restore", "--live", &r.id, &reference],
        TIMEOUT,
    );
    remove_unpacked_since(&unpacked);
    assert_eq!(
        r.status().as_deref(),
        Some("RUNNING"),
        "{runtime}: restored task"
    );
    r.remove();
    let _ = ctr_run(&["images", "rm", &reference], None, TIMEOUT);
    Sample {
        checkpoint,
        restore,
        bytes,
    }
}

fn main() {
    let cli = Cli::parse();
    let (iterations, sizes) = (cli.iterations.iterations, cli.sizes);
    let _ = one(CRAB, 1);
    let _ = one(RUNC, 1);
    println!("| written memory | measure | crab | runc | crab / runc |");
    println!("|---|---|---|---|---|");
    for &mb in sizes.iter() {
        let (mut crab, mut runc) = (Vec::new(), Vec::new());
        for _ in 0..iterations {
            crab.push(one(CRAB, mb));
            runc.push(one(RUNC, mb));
        }
        let pick = |v: &[Sample], f: fn(&Sample) -> Duration| stats(v.iter().map(f).collect());
        for (name, f) in [
            (
                "checkpoint",
                (|s: &Sample| s.checkpoint) as fn(&Sample) -> Duration,
            ),
            ("restore", |s: &Sample| s.restore),
        ] {
            let (c, r) = (pick(&crab, f), pick(&runc, f));
            println!(
                "| {mb} MB | {name} median | {} | {} | {:.2} |",
                ms(c.median),
                ms(r.median),
                ratio(c.median, r.median)
            );
            println!(
                "| {mb} MB | {name} p95 | {} | {} | {:.2} |",
                ms(c.p95),
                ms(r.p95),
                ratio(c.p95, r.p95)
            );
        }
        let mib = |v: &[Sample]| v.iter().map(|s| s.bytes).max().unwrap_or(0) as f64 / 1048576.0;
        println!(
            "| {mb} MB | checkpoint image | {:.1} MiB | {:.1} MiB | {:.2} |",
            mib(&crab),
            mib(&runc),
            mib(&crab) / mib(&runc).max(f64::MIN_POSITIVE)
        );
    }
    println!(
        "\n{iterations} iterations per figure, runtimes alternated, a new container each \
         time (containerd 1.7 stores no second checkpoint of one container: the spec \
         blob already exists); times are of the whole `ctr` command; {} cores.",
        cores()
    );
}
