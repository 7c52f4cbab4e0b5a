//! File-system snapshot figures of the crab runtime's store next to what containerd and
//! runc offer for the same data, measured in the same run. Prints Markdown tables:
//! figures, not timed assertions.
//!
//! Each workload is written once into a fresh crab container (one per backend) and a
//! fresh runc container, by `ctr task exec`, and then reused by every iteration:
//! - crab: `Store::snapshot`, `Store::rollback` (after changing one small file) and
//!   `Store::clone_snapshot`, each the store call alone, the store opened the way
//!   `crabctl fs` opens it;
//! - runc: `ctr container checkpoint --rw` (containerd's diff of the rw layer, stored as
//!   an image) and `tar -cf` of the container's overlay upper dir.
//!
//! `crab-fs-bench [--iterations N] [--quick] [--backend NAME[,NAME...]] [--tmp-dir DIR]`;
//! needs the private containerd of `hack/containerd.sh` (see `hack/fs-bench.sh`) and
//! root. Everything it makes (containers, store trees, snapshots, checkpoint images,
//! archives) is removed when it ends, also on failure or on SIGINT/SIGTERM.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use crab_integration::bench::{cores, percentile_index, stats, Iterations, Quick};
use crab_integration::*;
use crab_runtime::config::{Backend, Config};
use crab_runtime::storage::{self, ContainerKey, Store, BACKEND_ANNOTATION};

/// Backends measured when `--backend` is not given.
const DEFAULT_BACKENDS: &str = "btrfs";

/// The targets the figures are reported against (set for btrfs; not asserted).
const TARGET_SNAPSHOT_MS: f64 = 10.0;
const TARGET_ROLLBACK_MS: f64 = 50.0;
const TARGET_CLONE_MS: f64 = 30.0;

/// Writing 1 GB or 10 000 files, or checkpointing them, takes a while on 2 cores.
const SLOW: Duration = Duration::from_secs(1800);

/// File-system snapshot figures of crab's store next to containerd's and runc's.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    iterations: Iterations<5>,
    // --quick skips the 1 GB and 10 000-file workloads.
    #[command(flatten)]
    quick: Quick,
    /// Storage backends to measure (comma-separated, or the flag again).
    #[arg(
        long = "backend",
        value_name = "NAME,...",
        value_delimiter = ',',
        default_value = DEFAULT_BACKENDS,
        value_parser = parse_backend
    )]
    backends: Vec<Backend>,
    /// Where the tar archives go [default: the temporary directory].
    #[arg(long, value_name = "DIR")]
    tmp_dir: Option<PathBuf>,
}

/// What the command line asks for.
struct Args {
    iterations: usize,
    quick: bool,
    backends: Vec<Backend>,
    tmp_dir: PathBuf,
}

fn parse_backend(name: &str) -> Result<Backend> {
    serde_json::from_str::<Backend>(&format!("\"{}\"", name.trim()))
        .with_context(|| format!("unknown storage backend {name:?}"))
}

fn backend_name(b: Backend) -> String {
    serde_json::to_string(&b)
        .unwrap_or_default()
        .trim_matches('"')
        .to_string()
}

fn parse_args() -> Args {
    let cli = Cli::parse();
    let mut backends: Vec<Backend> = Vec::new();
    for b in cli.backends {
        if !backends.contains(&b) {
            backends.push(b);
        }
    }
    Args {
        iterations: cli.iterations.iterations,
        quick: cli.quick.quick,
        backends,
        tmp_dir: cli.tmp_dir.unwrap_or_else(std::env::temp_dir),
    }
}

// ---------------------------------------------------------------------------------
// Interruption: SIGINT/SIGTERM set a flag the loops check, so that the guards below
// still run.

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn catch_signals() -> Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(sig, &action) }.context("install signal handler")?;
    }
    Ok(())
}

fn check_interrupted() -> Result<()> {
    ensure!(!INTERRUPTED.load(Ordering::SeqCst), "interrupted");
    Ok(())
}

// ---------------------------------------------------------------------------------
// Guards: each removes what it stands for when dropped.

/// `ctr ARGS` bounded by `timeout`; an error (not a panic) when it fails.
fn ctr_check(args: &[&str], timeout: Duration) -> Result<String> {
    let out = ctr_run(args, None, timeout);
    let (o, e) = text(&out);
    ensure!(
        out.status.success(),
        "ctr {args:?} failed ({:?}): {o}{e}",
        out.status.code()
    );
    Ok(o)
}

/// A container's tree (and its snapshots) in the store, destroyed when dropped.
struct TreeGuard<'s> {
    store: &'s dyn Store,
    key: ContainerKey,
    armed: bool,
}

impl<'s> TreeGuard<'s> {
    fn new(store: &'s dyn Store, key: ContainerKey) -> TreeGuard<'s> {
        TreeGuard {
            store,
            key,
            armed: true,
        }
    }

    /// Destroys the tree now, reporting failure.
    fn destroy(mut self) -> Result<()> {
        self.armed = false;
        self.store
            .destroy(&self.key)
            .with_context(|| format!("destroy {} in the store", self.key))
    }
}

impl Drop for TreeGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = self.store.destroy(&self.key) {
                eprintln!("crab-fs-bench: cleanup: destroy {}: {e}", self.key);
            }
        }
    }
}

/// A checkpoint image, removed (with its content, synchronously) when dropped.
struct ImageGuard {
    name: String,
    armed: bool,
}

impl ImageGuard {
    fn new(name: String) -> ImageGuard {
        ImageGuard { name, armed: true }
    }

    fn remove(mut self) -> Result<()> {
        self.armed = false;
        ctr_check(
            &["images", "rm", "--sync", &self.name],
            Duration::from_secs(120),
        )
        .map(drop)
    }
}

impl Drop for ImageGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = ctr_run(
                &["images", "rm", "--sync", &self.name],
                None,
                Duration::from_secs(120),
            );
        }
    }
}

/// A file or directory tree removed when dropped.
struct PathGuard(PathBuf);

impl Drop for PathGuard {
    fn drop(&mut self) {
        let r = match std::fs::symlink_metadata(&self.0) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&self.0),
            Ok(_) => std::fs::remove_file(&self.0),
            Err(_) => Ok(()),
        };
        if let Err(e) = r {
            eprintln!("crab-fs-bench: cleanup: remove {}: {e}", self.0.display());
        }
    }
}

// ---------------------------------------------------------------------------------
// Workloads.

#[derive(Debug, Clone, Copy)]
enum Workload {
    /// One file of this many MiB of non-compressible data.
    Written(u64),
    /// This many new small files.
    Files(u64),
}

/// Groups thousands with a space: `10 000`.
fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

impl Workload {
    fn all(quick: bool) -> Vec<Workload> {
        let mut w = vec![
            Workload::Written(10),
            Workload::Written(100),
            Workload::Written(1024),
            Workload::Files(10),
            Workload::Files(1000),
            Workload::Files(10_000),
        ];
        if quick {
            w.retain(|w| !matches!(w, Workload::Written(1024) | Workload::Files(10_000)));
        }
        w
    }

    fn label(self) -> String {
        match self {
            Workload::Written(mb) if mb >= 1024 => format!("{} GB written", mb / 1024),
            Workload::Written(mb) => format!("{mb} MB written"),
            Workload::Files(n) => format!("{} files changed", grouped(n)),
        }
    }

    /// The shell script that applies it inside the container (busybox sh), ending with
    /// the small file the rollback iterations change.
    fn script(self) -> String {
        let body = match self {
            Workload::Written(mb) => format!(
                "mkdir -p /bench && \
                 dd if=/dev/urandom of=/bench/data bs=1M count={mb} 2>/dev/null"
            ),
            Workload::Files(n) => format!(
                "mkdir -p /bench/files && cd /bench/files && i=0 && \
                 while [ $i -lt {n} ]; do echo \"file $i\" > f$i; i=$((i+1)); done"
            ),
        };
        format!("{body} && echo base > /bench/marker")
    }

    /// Checks that the tree at `root` holds the workload.
    fn check(self, root: &Path) -> Result<()> {
        match self {
            Workload::Written(mb) => {
                let p = root.join("bench/data");
                let len = std::fs::metadata(&p)
                    .with_context(|| format!("stat {}", p.display()))?
                    .len();
                ensure!(len == mb << 20, "{} holds {len} bytes", p.display());
            }
            Workload::Files(n) => {
                let p = root.join("bench/files");
                let count = std::fs::read_dir(&p)
                    .with_context(|| format!("read {}", p.display()))?
                    .count() as u64;
                ensure!(count == n, "{} holds {count} files", p.display());
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------
// Containers.

fn start(runtime: &str, id: &str, flags: &[&str]) -> Result<()> {
    let mut args: Vec<&str> = vec!["run", "-d", "--runtime", runtime];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[BUSYBOX, id, "sleep", "100000"]);
    ctr_check(&args, Duration::from_secs(120)).map(drop)
}

fn apply(g: &Guard, w: Workload) -> Result<()> {
    let exec_id = unique_id("fsbench-x");
    let script = w.script();
    ctr_check(
        &[
            "task",
            "exec",
            "--exec-id",
            &exec_id,
            &g.id,
            "sh",
            "-c",
            &script,
        ],
        SLOW,
    )
    .with_context(|| format!("write workload {} in {}", w.label(), g.id))
    .map(drop)
}

/// A crab container whose tree comes from `store`.
struct Crab<'s> {
    // Fields drop in this order: the containerd container (task and all) goes first,
    // then its tree, which the task no longer has mounted.
    ctr: Guard,
    tree: TreeGuard<'s>,
    root: PathBuf,
}

impl<'s> Crab<'s> {
    fn start(store: &'s dyn Store, backend: Backend, w: Workload) -> Result<Crab<'s>> {
        let id = unique_id("fsbench-crab");
        let key = ContainerKey::new(&namespace(), &id)?;
        let tree = TreeGuard::new(store, key.clone());
        let ctr = Guard::new(&id);
        let annotation = format!("{BACKEND_ANNOTATION}={}", backend_name(backend));
        start(CRAB, &id, &["--annotation", &annotation])?;
        let root = store.rootfs(&key).with_context(|| {
            format!(
                "container {id} has no tree in the {} store (was the annotation honoured?)",
                backend_name(backend)
            )
        })?;
        apply(&ctr, w)?;
        w.check(&root)?;
        Ok(Crab { ctr, tree, root })
    }

    fn store(&self) -> &'s dyn Store {
        self.tree.store
    }

    fn key(&self) -> &ContainerKey {
        &self.tree.key
    }
}

/// A runc container on containerd's overlayfs snapshotter.
struct Runc {
    ctr: Guard,
    /// Its overlay upper dir: the container's writes.
    upper: PathBuf,
}

impl Runc {
    fn start(w: Workload) -> Result<Runc> {
        let id = unique_id("fsbench-runc");
        let ctr = Guard::new(&id);
        start(RUNC, &id, &[])?;
        let upper = upper_dir(ctr.pid())?;
        apply(&ctr, w)?;
        w.check(&upper)?;
        Ok(Runc { ctr, upper })
    }
}

/// The `upperdir` of the overlay mounted at `/` for process `pid`.
fn upper_dir(pid: i32) -> Result<PathBuf> {
    let path = format!("/proc/{pid}/mountinfo");
    let info = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    for line in info.lines() {
        let mut fields = line.split_whitespace();
        if fields.nth(4) != Some("/") {
            continue;
        }
        let Some((_, rest)) = line.split_once(" - ") else {
            continue;
        };
        let mut rest = rest.split_whitespace();
        if rest.next() != Some("overlay") {
            continue;
        }
        let options = rest.nth(1).unwrap_or_default();
        if let Some(upper) = options.split(',').find_map(|o| o.strip_prefix("upperdir=")) {
            return Ok(PathBuf::from(upper));
        }
    }
    bail!("no overlay root mount with an upperdir in {path}")
}

// ---------------------------------------------------------------------------------
// Measurements.

fn ms_f(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn fmt(d: Duration) -> String {
    let ms = ms_f(d);
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1e3)
    } else if ms >= 100.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

fn ratio(base: Duration, crab: Duration) -> String {
    let r = base.as_secs_f64() / crab.as_secs_f64().max(1e-9);
    if r >= 10.0 {
        format!("{r:.0}x")
    } else {
        format!("{r:.1}x")
    }
}

#[derive(Default)]
struct CrabSamples {
    /// One snapshot taken right after the workload was written, before any sync.
    first: Option<Duration>,
    snapshot: Vec<Duration>,
    rollback: Vec<Duration>,
    clone: Vec<Duration>,
}

#[derive(Default)]
struct BaseSamples {
    checkpoint: Vec<Duration>,
    tar: Vec<Duration>,
}

fn sync_all() {
    nix::unistd::sync();
}

fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, Duration)> {
    let t = Instant::now();
    let v = f()?;
    Ok((v, t.elapsed()))
}

const MARKER: &str = "bench/marker";

/// One iteration on crab: snapshot, change one small file, roll back, clone.
fn crab_iteration(c: &Crab, i: usize, s: &mut CrabSamples) -> Result<()> {
    let (store, key) = (c.store(), c.key());
    let name = format!("bench-{i}");
    let (_, t) = timed(|| Ok(store.snapshot(key, &name)?))?;
    s.snapshot.push(t);

    let marker = c.root.join(MARKER);
    std::fs::write(&marker, format!("changed {i}\n"))
        .with_context(|| format!("write {}", marker.display()))?;
    let (_, t) = timed(|| Ok(store.rollback(key, &name)?))?;
    s.rollback.push(t);
    let now = std::fs::read_to_string(&marker).unwrap_or_default();
    ensure!(
        now == "base\n",
        "after the rollback {} holds {now:?}",
        marker.display()
    );

    let clone_key = ContainerKey::new(key.namespace(), &format!("{}-clone-{i}", key.id()))?;
    let clone = TreeGuard::new(store, clone_key.clone());
    let (path, t) = timed(|| Ok(store.clone_snapshot(key, &name, &clone_key)?))?;
    s.clone.push(t);
    ensure!(
        std::fs::read_to_string(path.join(MARKER)).unwrap_or_default() == "base\n",
        "the clone {} lacks the snapshot's content",
        path.display()
    );
    clone.destroy()?;
    store.delete_snapshot(key, &name)?;
    Ok(())
}

/// One iteration on runc: containerd's rw checkpoint, then a tar of the upper dir.
fn runc_iteration(r: &Runc, i: usize, tmp: &Path, s: &mut BaseSamples) -> Result<()> {
    let image = ImageGuard::new(format!("crab-fs-bench/checkpoint:{}-{i}", r.ctr.id));
    sync_all();
    let (_, t) = timed(|| {
        ctr_check(
            &["container", "checkpoint", "--rw", &r.ctr.id, &image.name],
            SLOW,
        )
    })?;
    s.checkpoint.push(t);
    image.remove()?;

    let file = PathGuard(tmp.join(format!("{}-{i}.tar", r.ctr.id)));
    sync_all();
    let (status, t) = timed(|| {
        Command::new("tar")
            .arg("-cf")
            .arg(&file.0)
            .arg("-C")
            .arg(&r.upper)
            .arg(".")
            .status()
            .context("run tar")
    })?;
    ensure!(
        status.success(),
        "tar of {} failed: {status}",
        r.upper.display()
    );
    s.tar.push(t);
    drop(file);
    Ok(())
}

struct Row {
    workload: Workload,
    crab: Vec<(Backend, CrabSamples)>,
    base: BaseSamples,
    /// Whether the archives went to the file system of the runc container's upper dir.
    tar_same_fs: bool,
}

fn progress(msg: &str) {
    eprintln!("[fs-bench] {msg}");
}

/// Measures one workload on every backend and on runc.
fn measure(
    w: Workload,
    stores: &[(Backend, Box<dyn Store>)],
    iterations: usize,
    tmp: &Path,
) -> Result<Row> {
    progress(&format!("{}: writing it in fresh containers", w.label()));
    let mut crabs = Vec::new();
    let mut crab_samples = Vec::new();
    for (backend, store) in stores {
        check_interrupted()?;
        let c = Crab::start(store.as_ref(), *backend, w)?;
        // The first snapshot after a write also writes out the data still in the
        // page cache; measured once, apart.
        let (_, first) = timed(|| Ok(c.store().snapshot(c.key(), "first")?))?;
        c.store().delete_snapshot(c.key(), "first")?;
        crabs.push(c);
        crab_samples.push((
            *backend,
            CrabSamples {
                first: Some(first),
                ..CrabSamples::default()
            },
        ));
    }
    check_interrupted()?;
    let runc = Runc::start(w)?;
    let tar_same_fs = std::fs::metadata(&runc.upper)?.dev() == std::fs::metadata(tmp)?.dev();
    if !tar_same_fs {
        progress(&format!(
            "the archives go to {}, not on the file system of {} (see --tmp-dir)",
            tmp.display(),
            runc.upper.display()
        ));
    }
    let mut base = BaseSamples::default();
    for i in 0..iterations {
        progress(&format!("{}: iteration {}/{iterations}", w.label(), i + 1));
        for (c, (_, s)) in crabs.iter().zip(crab_samples.iter_mut()) {
            check_interrupted()?;
            sync_all();
            crab_iteration(c, i, s)
                .with_context(|| format!("iteration {i} on crab container {}", c.ctr.id))?;
        }
        check_interrupted()?;
        runc_iteration(&runc, i, tmp, &mut base)
            .with_context(|| format!("iteration {i} on runc container {}", runc.ctr.id))?;
    }
    Ok(Row {
        workload: w,
        crab: crab_samples,
        base,
        tar_same_fs,
    })
}

// ---------------------------------------------------------------------------------
// Report.

fn machine() -> String {
    let cores = cores();
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map(|kib| kib / (1024.0 * 1024.0))
        .unwrap_or(0.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} cores, {mem_gib:.0} GiB, kernel {}", kernel.trim())
}

/// The file-system type and source of the mount holding `p` (e.g. `btrfs on /dev/loop0`).
fn mount_of(p: &Path) -> String {
    let Ok(p) = std::fs::canonicalize(p) else {
        return "not found".into();
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut best: Option<(usize, String)> = None;
    for line in info.lines() {
        let Some(point) = line.split_whitespace().nth(4) else {
            continue;
        };
        let Some((_, rest)) = line.split_once(" - ") else {
            continue;
        };
        let mut rest = rest.split_whitespace();
        let (Some(kind), Some(source)) = (rest.next(), rest.next()) else {
            continue;
        };
        if p.starts_with(point) && best.as_ref().is_none_or(|(len, _)| point.len() >= *len) {
            best = Some((point.len(), format!("{kind} on {source}")));
        }
    }
    best.map(|(_, m)| m).unwrap_or_else(|| "?".into())
}

/// Where the backend keeps its trees, as the configuration says.
fn pool_of(config: &Config, backend: Backend) -> String {
    match backend {
        Backend::Btrfs => {
            let pool = &config.storage.pool;
            format!("pool `{pool}`, {}", mount_of(Path::new(pool)))
        }
        Backend::Zfs => format!("dataset `{}`", config.storage.zfs_dataset),
        Backend::Overlay => {
            let dir = &config.storage.overlay_dir;
            format!("directory `{}`, {}", dir.display(), mount_of(dir))
        }
        Backend::Passthrough => "no store".into(),
    }
}

fn report_backend(backend: Backend, pool: &str, rows: &[Row]) {
    let name = backend_name(backend);
    println!("### crab on {name} ({pool})\n");
    println!(
        "| workload | crab operation | crab median | crab p95 \
         | `checkpoint --rw` median | `checkpoint --rw` p95 | `tar` median | `tar` p95 \
         | checkpoint / crab | tar / crab |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut medians: Vec<(&str, Workload, Duration)> = Vec::new();
    let mut firsts = Vec::new();
    for row in rows {
        let Some((_, s)) = row.crab.iter().find(|(b, _)| *b == backend) else {
            continue;
        };
        let cp = stats(row.base.checkpoint.clone());
        let tar = stats(row.base.tar.clone());
        for (op, v) in [
            ("snapshot", &s.snapshot),
            ("rollback", &s.rollback),
            ("clone", &s.clone),
        ] {
            let c = stats(v.clone());
            medians.push((op, row.workload, c.median));
            println!(
                "| {} | {op} | {} | {} | {} | {} | {} | {} | {} | {} |",
                row.workload.label(),
                fmt(c.median),
                fmt(c.p95),
                fmt(cp.median),
                fmt(cp.p95),
                fmt(tar.median),
                fmt(tar.p95),
                ratio(cp.median, c.median),
                ratio(tar.median, c.median),
            );
        }
        if let Some(f) = s.first {
            firsts.push((row.workload, f));
        }
    }

    println!(
        "\nFirst snapshot, taken right after the workload was written and before anything \
         synced it (one sample; the snapshot also writes out whatever of the workload is \
         still dirty in the page cache):\n"
    );
    println!("| workload | snapshot |");
    println!("|---|---|");
    for (w, f) in &firsts {
        println!("| {} | {} |", w.label(), fmt(*f));
    }

    println!("\nTargets (set for btrfs; reported, not asserted), against the medians above:\n");
    for (op, target) in [
        ("snapshot", TARGET_SNAPSHOT_MS),
        ("rollback", TARGET_ROLLBACK_MS),
        ("clone", TARGET_CLONE_MS),
    ] {
        let of_op: Vec<&(&str, Workload, Duration)> =
            medians.iter().filter(|(o, _, _)| *o == op).collect();
        let (Some(lo), Some(hi)) = (
            of_op.iter().map(|(_, _, d)| *d).min(),
            of_op.iter().map(|(_, _, d)| *d).max(),
        ) else {
            continue;
        };
        let over: Vec<String> = of_op
            .iter()
            .filter(|(_, _, d)| ms_f(*d) > target)
            .map(|(_, w, d)| format!("{} {}", w.label(), fmt(*d)))
            .collect();
        let verdict = if over.is_empty() {
            "met".to_string()
        } else {
            format!("over for {}", over.join(", "))
        };
        let mut line = format!(
            "- {op} median ≤ {target:.0} ms{}: {} to {}, {verdict}",
            if op == "snapshot" {
                " and flat in data size"
            } else {
                ""
            },
            fmt(lo),
            fmt(hi),
        );
        if op == "snapshot" {
            let written: Vec<(Workload, Duration)> = of_op
                .iter()
                .filter(|(_, w, _)| matches!(w, Workload::Written(_)))
                .map(|(_, w, d)| (*w, *d))
                .collect();
            if let (Some(small), Some(big)) = (written.first(), written.last()) {
                if written.len() > 1 {
                    line.push_str(&format!(
                        "; {} → {}: {} → {} ({:.1}x)",
                        small.0.label().trim_end_matches(" written"),
                        big.0.label().trim_end_matches(" written"),
                        fmt(small.1),
                        fmt(big.1),
                        big.1.as_secs_f64() / small.1.as_secs_f64().max(1e-9)
                    ));
                }
            }
        }
        println!("{line}");
    }
    println!();
}

fn main() -> Result<()> {
    let a = parse_args();
    catch_signals()?;
    ensure!(
        nix::unistd::geteuid().is_root(),
        "crab-fs-bench must run as root"
    );
    let (config, source) = Config::load_with_env(None, None).context("load crab config")?;
    let mut stores: Vec<(Backend, Box<dyn Store>)> = Vec::new();
    for &b in &a.backends {
        let store = storage::open(&config, b)
            .with_context(|| format!("open the {} store", backend_name(b)))?
            .with_context(|| format!("backend {} has no store", backend_name(b)))?;
        stores.push((b, store));
    }
    std::fs::create_dir_all(&a.tmp_dir)
        .with_context(|| format!("create {}", a.tmp_dir.display()))?;
    let tmp = PathGuard(
        a.tmp_dir
            .join(format!("crab-fs-bench.{}", std::process::id())),
    );
    std::fs::create_dir(&tmp.0).with_context(|| format!("create {}", tmp.0.display()))?;
    progress(&format!(
        "config {source:?}; backends {}; {} iterations{}",
        a.backends
            .iter()
            .map(|b| backend_name(*b))
            .collect::<Vec<_>>()
            .join(", "),
        a.iterations,
        if a.quick { "; quick" } else { "" }
    ));

    let t0 = Instant::now();
    let mut rows = Vec::new();
    for w in Workload::all(a.quick) {
        check_interrupted()?;
        rows.push(measure(w, &stores, a.iterations, &tmp.0)?);
    }

    for (b, _) in &stores {
        report_backend(*b, &pool_of(&config, *b), &rows);
    }
    let same = if rows.iter().all(|r| r.tar_same_fs) {
        "on the upper dir's file system"
    } else {
        "NOT on the upper dir's file system (see --tmp-dir)"
    };
    let p95 = if percentile_index(a.iterations, 0.95) + 1 == a.iterations {
        " (p95 is the slowest run)"
    } else {
        ""
    };
    println!(
        "{} iterations per figure{p95}. Each workload is written once per container, \
         synced, and reused by every iteration.\n\
         crab: the `Store` call alone (the container is not frozen; `crabctl fs` adds the \
         freeze); the rollback undoes one changed small file.\n\
         Baselines, on a runc container holding the same workload: `ctr container checkpoint \
         --rw` (containerd's gzip diff of the rw layer into its content store, `ctr` start-up \
         and the pause it makes included; the image is removed after each) and `tar -cf` of \
         the overlay upper dir (the archive is {same}, not synced, deleted after each).\n\
         Ratios are baseline / crab, of medians. Machine: {}. The run took {:.0} s.",
        a.iterations,
        machine(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
