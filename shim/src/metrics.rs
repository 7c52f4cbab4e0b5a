//! Container metrics as containerd's `io.containerd.cgroups.v1.Metrics`.

use containerd_shim::protos::cgroups::metrics::{
    CPUStat, CPUUsage, MemoryEntry, MemoryStat, Metrics, PidsStat, Throttle,
};
use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::Message;

/// The type URL containerd's typeurl registry knows the v1 metrics by.
pub const METRICS_V1_TYPE: &str = "io.containerd.cgroups.v1.Metrics";

/// Packs runtime metrics for the Stats RPC.
pub fn to_any(m: &crab_runtime::metrics::Metrics) -> Result<Any, String> {
    let mut out = Metrics::new();
    let mut cpu = CPUStat::new();
    let mut usage = CPUUsage::new();
    usage.total = m.cpu_total_ns;
    usage.user = m.cpu_user_ns;
    usage.kernel = m.cpu_kernel_ns;
    cpu.usage = Some(usage).into();
    let mut thr = Throttle::new();
    thr.periods = m.periods;
    thr.throttled_periods = m.throttled_periods;
    thr.throttled_time = m.throttled_ns;
    cpu.throttling = Some(thr).into();
    out.cpu = Some(cpu).into();

    let mut mem = MemoryStat::new();
    let mut entry = MemoryEntry::new();
    entry.usage = m.memory_usage;
    entry.max = m.memory_max_usage;
    entry.limit = m.memory_limit;
    entry.failcnt = m.memory_failcnt;
    mem.usage = Some(entry).into();
    mem.cache = m.memory_cache;
    mem.total_cache = m.memory_cache;
    mem.rss = m.memory_rss;
    mem.total_rss = m.memory_rss;
    out.memory = Some(mem).into();

    let mut pids = PidsStat::new();
    pids.current = m.pids_current;
    pids.limit = m.pids_limit;
    out.pids = Some(pids).into();

    let value = out
        .write_to_bytes()
        .map_err(|e| format!("encode metrics: {e}"))?;
    Ok(Any {
        type_url: METRICS_V1_TYPE.to_string(),
        value,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_metrics_roundtrip_keeps_the_numbers() {
        let m = crab_runtime::metrics::Metrics {
            cpu_total_ns: 11,
            memory_usage: 4096,
            memory_limit: 1 << 20,
            pids_current: 3,
            ..Default::default()
        };
        let any = to_any(&m).unwrap();
        assert_eq!(any.type_url, METRICS_V1_TYPE);
        let back = Metrics::parse_from_bytes(&any.value).unwrap();
        assert_eq!(back.cpu.usage.total, 11);
        assert_eq!(back.memory.usage.usage, 4096);
        assert_eq!(back.memory.usage.limit, 1 << 20);
        assert_eq!(back.pids.current, 3);
    }
}
