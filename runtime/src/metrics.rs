//! Container metrics, in the shape containerd's cgroup v1 metrics take.
//!
//! The shim turns these into `io.containerd.cgroups.v1.Metrics`; keeping the numbers
//! here as plain structs keeps protobuf out of the runtime crate.

/// What `ctr task metrics` shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metrics {
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

impl From<libcgroups::stats::Stats> for Metrics {
    fn from(s: libcgroups::stats::Stats) -> Self {
        let stat = |k: &str| {
            s.memory
                .stats
                .get(&format!("total_{k}"))
                .or_else(|| s.memory.stats.get(k))
                .copied()
                .unwrap_or(0)
        };
        Metrics {
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
