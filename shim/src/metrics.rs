//! Container metrics as containerd's `io.containerd.cgroups.v1.Metrics` (hosts with
//! v1 controllers) or `io.containerd.cgroups.v2.Metrics` (cgroup v2-only hosts), the
//! types runc's shim answers with on each and `ctr task metrics` prints.

use containerd_shim::protos::cgroups::metrics::{
    CPUStat, CPUUsage, MemoryEntry, MemoryStat, Metrics, PidsStat, Throttle,
};
use containerd_shim::protos::cgroups_v2::metrics as v2;
use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::Message;
use crab_runtime::metrics::{Metrics as RuntimeMetrics, V1Metrics, V2Metrics};

/// The type URL containerd's typeurl registry knows the v1 metrics by.
pub const METRICS_V1_TYPE: &str = "io.containerd.cgroups.v1.Metrics";
/// The type URL of the v2 metrics.
pub const METRICS_V2_TYPE: &str = "io.containerd.cgroups.v2.Metrics";

/// Packs runtime metrics for the Stats RPC.
pub fn to_any(m: &RuntimeMetrics) -> Result<Any, String> {
    let (type_url, value) = match m {
        RuntimeMetrics::V1(m) => (METRICS_V1_TYPE, v1_message(m).write_to_bytes()),
        RuntimeMetrics::V2(m) => (METRICS_V2_TYPE, v2_message(m).write_to_bytes()),
    };
    let value = value.map_err(|e| format!("encode metrics: {e}"))?;
    Ok(Any {
        type_url: type_url.to_string(),
        value,
        ..Default::default()
    })
}

fn v1_message(m: &V1Metrics) -> Metrics {
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
    out
}

fn v2_message(m: &V2Metrics) -> v2::Metrics {
    let mut out = v2::Metrics::new();
    let mut pids = v2::PidsStat::new();
    pids.current = m.pids_current;
    pids.limit = m.pids_limit;
    out.pids = Some(pids).into();

    let mut cpu = v2::CPUStat::new();
    cpu.usage_usec = m.cpu_usage_usec;
    cpu.user_usec = m.cpu_user_usec;
    cpu.system_usec = m.cpu_system_usec;
    cpu.nr_periods = m.cpu_nr_periods;
    cpu.nr_throttled = m.cpu_nr_throttled;
    cpu.throttled_usec = m.cpu_throttled_usec;
    out.cpu = Some(cpu).into();

    let stat = |k: &str| m.memory_stat.get(k).copied().unwrap_or(0);
    let mut mem = v2::MemoryStat::new();
    mem.usage = m.memory_usage;
    mem.usage_limit = m.memory_limit;
    mem.max_usage = m.memory_max_usage;
    mem.swap_usage = m.swap_usage;
    mem.swap_limit = m.swap_limit;
    mem.anon = stat("anon");
    mem.file = stat("file");
    mem.kernel_stack = stat("kernel_stack");
    mem.slab = stat("slab");
    mem.sock = stat("sock");
    mem.shmem = stat("shmem");
    mem.file_mapped = stat("file_mapped");
    mem.file_dirty = stat("file_dirty");
    mem.file_writeback = stat("file_writeback");
    mem.anon_thp = stat("anon_thp");
    mem.inactive_anon = stat("inactive_anon");
    mem.active_anon = stat("active_anon");
    mem.inactive_file = stat("inactive_file");
    mem.active_file = stat("active_file");
    mem.unevictable = stat("unevictable");
    mem.slab_reclaimable = stat("slab_reclaimable");
    mem.slab_unreclaimable = stat("slab_unreclaimable");
    mem.pgfault = stat("pgfault");
    mem.pgmajfault = stat("pgmajfault");
    mem.workingset_refault = stat("workingset_refault");
    mem.workingset_activate = stat("workingset_activate");
    mem.workingset_nodereclaim = stat("workingset_nodereclaim");
    mem.pgrefill = stat("pgrefill");
    mem.pgscan = stat("pgscan");
    mem.pgsteal = stat("pgsteal");
    mem.pgactivate = stat("pgactivate");
    mem.pgdeactivate = stat("pgdeactivate");
    mem.pglazyfree = stat("pglazyfree");
    mem.pglazyfreed = stat("pglazyfreed");
    mem.thp_fault_alloc = stat("thp_fault_alloc");
    mem.thp_collapse_alloc = stat("thp_collapse_alloc");
    out.memory = Some(mem).into();

    let mut events = v2::MemoryEvents::new();
    events.low = m.oom_low;
    events.high = m.oom_high;
    events.max = m.oom_max;
    events.oom = m.oom;
    events.oom_kill = m.oom_kill;
    events.oom_group_kill = m.oom_group_kill;
    out.memory_events = Some(events).into();

    let mut io = v2::IOStat::new();
    io.usage =
        m.io.iter()
            .map(|e| {
                let mut entry = v2::IOEntry::new();
                entry.major = e.major;
                entry.minor = e.minor;
                entry.rbytes = e.rbytes;
                entry.wbytes = e.wbytes;
                entry.rios = e.rios;
                entry.wios = e.wios;
                entry
            })
            .collect();
    out.io = Some(io).into();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_metrics_roundtrip_keeps_the_numbers() {
        let m = RuntimeMetrics::V1(V1Metrics {
            cpu_total_ns: 11,
            memory_usage: 4096,
            memory_limit: 1 << 20,
            pids_current: 3,
            ..Default::default()
        });
        let any = to_any(&m).unwrap();
        assert_eq!(any.type_url, METRICS_V1_TYPE);
        let back = Metrics::parse_from_bytes(&any.value).unwrap();
        assert_eq!(back.cpu.usage.total, 11);
        assert_eq!(back.memory.usage.usage, 4096);
        assert_eq!(back.memory.usage.limit, 1 << 20);
        assert_eq!(back.pids.current, 3);
    }

    #[test]
    fn test_v2_metrics_roundtrip_keeps_the_numbers() {
        let m = RuntimeMetrics::V2(V2Metrics {
            pids_current: 2,
            cpu_usage_usec: 18734,
            memory_usage: 1417216,
            memory_limit: 33554432,
            memory_stat: [("anon".to_string(), 1105920), ("slab".to_string(), 203072)].into(),
            oom: 1,
            oom_kill: 1,
            io: vec![crab_runtime::metrics::IoEntry {
                major: 254,
                rbytes: 4096,
                ..Default::default()
            }],
            ..Default::default()
        });
        let any = to_any(&m).unwrap();
        assert_eq!(any.type_url, METRICS_V2_TYPE);
        let back = v2::Metrics::parse_from_bytes(&any.value).unwrap();
        assert_eq!(back.pids.current, 2);
        assert_eq!(back.cpu.usage_usec, 18734);
        assert_eq!(back.memory.usage, 1417216);
        assert_eq!(back.memory.usage_limit, 33554432);
        assert_eq!(back.memory.anon, 1105920);
        assert_eq!(back.memory.slab, 203072);
        assert_eq!(back.memory_events.oom_kill, 1);
        assert_eq!(back.io.usage.len(), 1);
        assert_eq!(back.io.usage[0].major, 254);
        assert_eq!(back.io.usage[0].rbytes, 4096);
    }
}
