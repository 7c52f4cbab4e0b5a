//! What the bench binaries share: argument parsing ([`args`]), timing, percentiles,
//! formatting.

use std::time::{Duration, Instant};

use crate::{ctr_run, text};

pub mod args;

pub use args::{Iterations, List, Quick};

/// Times `ctr ARGS`, which must succeed.
pub fn time_ctr(args: &[&str], timeout: Duration) -> Duration {
    let t = Instant::now();
    let out = ctr_run(args, None, timeout);
    let elapsed = t.elapsed();
    assert!(out.status.success(), "ctr {args:?}: {:?}", text(&out));
    elapsed
}

/// Median and 95th percentile.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    /// Median.
    pub median: Duration,
    /// 95th percentile (nearest rank).
    pub p95: Duration,
}

/// The statistics of `v` (which must not be empty).
pub fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    Stats {
        median: nearest_rank(&v, 0.5),
        p95: nearest_rank(&v, 0.95),
    }
}

/// Where the `p` quantile (0 to 1) of `len` sorted values is, by nearest rank.
pub fn percentile_index(len: usize, p: f64) -> usize {
    ((len as f64 - 1.0) * p).round() as usize
}

/// The `p` quantile (0 to 1) of `sorted` (which must not be empty), by nearest rank.
pub fn nearest_rank<T: Copy>(sorted: &[T], p: f64) -> T {
    sorted[percentile_index(sorted.len(), p)]
}

/// `v` sorted, in the total order of floats.
pub fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// The `p` quantile (0 to 1) of `sorted` by nearest rank; 0 when it is empty.
pub fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    nearest_rank(sorted, p)
}

/// Milliseconds with one decimal.
pub fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// `a / b`.
pub fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

/// Cores of this machine, for the table's footnote.
pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0)
}

/// The checkpoints containerd has unpacked for restores (`ctrd-checkpoint*`
/// in its temporary directory, /tmp here). containerd 1.7 never removes one,
/// and runc's shim leaves it too: 500 MB a restore at the largest size, enough
/// to fill a disk over a run. Crab's shim removes its own.
pub fn unpacked_checkpoints() -> std::collections::BTreeSet<std::path::PathBuf> {
    let dir = std::env::var_os("TMPDIR").unwrap_or_else(|| "/tmp".into());
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(crab_runtime::checkpoint::CONTAINERD_UNPACKED_PREFIX)
                })
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Removes the unpacked checkpoints that are not in `before` (a sequential
/// bench's: no other restore is under way).
pub fn remove_unpacked_since(before: &std::collections::BTreeSet<std::path::PathBuf>) {
    for dir in unpacked_checkpoints().difference(before) {
        let _ = std::fs::remove_dir_all(dir);
    }
}
