//! What the bench binaries share: argument parsing, timing, percentiles, formatting.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::{ctr_run, text};

/// `--name value` pairs from the command line, checked against `known` (name, default).
pub struct Args(HashMap<String, String>);

impl Args {
    /// Parses `std::env::args()`; panics with a usage line on an unknown flag.
    pub fn parse(known: &[(&str, &str)]) -> Args {
        let mut map: HashMap<String, String> = known
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let argv: Vec<String> = std::env::args().skip(1).collect();
        for pair in argv.chunks(2) {
            let name = pair[0].trim_start_matches("--");
            if !map.contains_key(name) || pair.len() < 2 {
                let usage: Vec<String> =
                    known.iter().map(|(k, v)| format!("[--{k} {v}]")).collect();
                panic!("bad argument {:?}; usage: {}", pair[0], usage.join(" "));
            }
            map.insert(name.to_string(), pair[1].clone());
        }
        Args(map)
    }

    /// A numeric argument.
    pub fn number(&self, name: &str) -> usize {
        self.0[name]
            .parse()
            .unwrap_or_else(|_| panic!("--{name} needs a number"))
    }

    /// A comma-separated list of words.
    pub fn words(&self, name: &str) -> Vec<String> {
        self.0[name]
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect()
    }

    /// A comma-separated list of numbers.
    pub fn numbers(&self, name: &str) -> Vec<usize> {
        self.0[name]
            .split(',')
            .map(|v| {
                v.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("--{name}: {v:?}"))
            })
            .collect()
    }
}

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
