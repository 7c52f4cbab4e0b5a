//! Container metrics, in the shapes containerd's cgroup v1 and v2 metrics take.
//!
//! The shim turns these into `io.containerd.cgroups.v1.Metrics` or
//! `io.containerd.cgroups.v2.Metrics`; keeping the numbers here as plain structs
//! keeps protobuf out of the runtime crate.

use std::collections::BTreeMap;

/// What `ctr task metrics` shows: the host's cgroup version decides the shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Metrics {
    /// A host with v1 controllers (hybrid or legacy).
    V1(V1Metrics),
    /// A cgroup v2-only host.
    V2(V2Metrics),
}

/// A container's v1 statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct V1Metrics {
    /// Total CPU time, nanoseconds.
    pub cpu_total_ns: u64,
    /// CPU time in user mode, nanoseconds.
    pub cpu_user_ns: u64,
    /// CPU time in kernel mode, nanoseconds.
    pub cpu_kernel_ns: u64,
    /// Throttled periods and time.
    pub throttled_periods: u64,
    /// Total periods.
    pub periods: u64,
    /// Throttled time, nanoseconds.
    pub throttled_ns: u64,
    /// Memory usage, bytes.
    pub memory_usage: u64,
    /// Peak memory usage, bytes.
    pub memory_max_usage: u64,
    /// Memory limit, bytes.
    pub memory_limit: u64,
    /// Times the limit was hit.
    pub memory_failcnt: u64,
    /// Page cache, bytes.
    pub memory_cache: u64,
    /// RSS, bytes.
    pub memory_rss: u64,
    /// Number of tasks.
    pub pids_current: u64,
    /// Task limit (0: none).
    pub pids_limit: u64,
}

impl From<libcgroups::stats::Stats> for V1Metrics {
    fn from(s: libcgroups::stats::Stats) -> Self {
        let stat = |k: &str| {
            s.memory
                .stats
                .get(&format!("total_{k}"))
                .or_else(|| s.memory.stats.get(k))
                .copied()
                .unwrap_or(0)
        };
        V1Metrics {
            cpu_total_ns: s.cpu.usage.usage_total,
            cpu_user_ns: s.cpu.usage.usage_user,
            cpu_kernel_ns: s.cpu.usage.usage_kernel,
            throttled_periods: s.cpu.throttling.throttled_periods,
            periods: s.cpu.throttling.periods,
            throttled_ns: s.cpu.throttling.throttled_time,
            memory_usage: s.memory.memory.usage,
            memory_max_usage: s.memory.memory.max_usage,
            memory_limit: s.memory.memory.limit,
            memory_failcnt: s.memory.memory.fail_count,
            memory_cache: stat("cache"),
            memory_rss: stat("rss"),
            pids_current: s.pids.current,
            pids_limit: s.pids.limit,
        }
    }
}

/// A container's v2 statistics, read from its cgroup's interface files
/// (`crate::cgroup2`). Limits that are `max` read as `u64::MAX`, as containerd's
/// own cgroup2 statistics give them (the pids limit as 0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct V2Metrics {
    /// `pids.current`.
    pub pids_current: u64,
    /// `pids.max` (0: none).
    pub pids_limit: u64,
    /// `cpu.stat` `usage_usec`.
    pub cpu_usage_usec: u64,
    /// `cpu.stat` `user_usec`.
    pub cpu_user_usec: u64,
    /// `cpu.stat` `system_usec`.
    pub cpu_system_usec: u64,
    /// `cpu.stat` `nr_periods`.
    pub cpu_nr_periods: u64,
    /// `cpu.stat` `nr_throttled`.
    pub cpu_nr_throttled: u64,
    /// `cpu.stat` `throttled_usec`.
    pub cpu_throttled_usec: u64,
    /// `memory.current`, bytes.
    pub memory_usage: u64,
    /// `memory.max`, bytes.
    pub memory_limit: u64,
    /// `memory.peak`, bytes (0 on kernels before 5.19).
    pub memory_max_usage: u64,
    /// `memory.swap.current`, bytes.
    pub swap_usage: u64,
    /// `memory.swap.max`, bytes.
    pub swap_limit: u64,
    /// `memory.stat`, every key.
    pub memory_stat: BTreeMap<String, u64>,
    /// `memory.events` `low`.
    pub oom_low: u64,
    /// `memory.events` `high`.
    pub oom_high: u64,
    /// `memory.events` `max`: times usage was about to go over the limit.
    pub oom_max: u64,
    /// `memory.events` `oom`: times the limit was hit with nothing left to reclaim.
    pub oom: u64,
    /// `memory.events` `oom_kill`: tasks the OOM killer killed.
    pub oom_kill: u64,
    /// `memory.events` `oom_group_kill`.
    pub oom_group_kill: u64,
    /// `io.stat`, per device.
    pub io: Vec<IoEntry>,
}

/// One device's line of `io.stat`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IoEntry {
    /// Device major number.
    pub major: u64,
    /// Device minor number.
    pub minor: u64,
    /// Bytes read.
    pub rbytes: u64,
    /// Bytes written.
    pub wbytes: u64,
    /// Read operations.
    pub rios: u64,
    /// Write operations.
    pub wios: u64,
}
