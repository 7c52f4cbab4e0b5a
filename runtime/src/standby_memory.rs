//! The memory budget of standby replicas.
//!
//! A replica holds as much memory as its checkpoint's process image, for a
//! rollback that may never come: it is the first thing to give up when the host
//! runs short. A replica is made only when the host's available memory (the
//! kernel's `MemAvailable`) exceeds `[standby] min_available_mib` by its image,
//! and a shim drops the replica it holds once availability falls below that
//! floor ([`pressure`]), before the kernel has to reclaim or kill anything else.
//! `[standby] max_image_mib` bounds the image of any one container's replica.

use crate::config::Config;

const MIB: u64 = 1 << 20;

/// The host's available memory in bytes (`MemAvailable` in `/proc/meminfo`);
/// `None` when the kernel does not say.
pub fn available() -> Option<u64> {
    parse_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

fn parse_available(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024)
}

/// Why no replica of a process image of `image_bytes` may be made with
/// `available` bytes of host memory free, if none may. An unknown availability
/// bounds nothing.
pub fn refusal(config: &Config, image_bytes: u64, available: Option<u64>) -> Option<String> {
    let budget = &config.standby;
    if budget.max_image_mib > 0 && image_bytes > budget.max_image_mib * MIB {
        return Some(format!(
            "its process image ({} MiB) exceeds standby.max_image_mib ({} MiB)",
            image_bytes / MIB,
            budget.max_image_mib
        ));
    }
    let available = available?;
    let needed = (budget.min_available_mib * MIB).saturating_add(image_bytes);
    (available < needed).then(|| {
        format!(
            "the host has {} MiB of memory available, not standby.min_available_mib ({} MiB) plus the image ({} MiB)",
            available / MIB,
            budget.min_available_mib,
            image_bytes / MIB
        )
    })
}

/// Why a replica held now must be dropped, if it must: the host's available
/// memory is below `[standby] min_available_mib`.
pub fn pressure(config: &Config, available: Option<u64>) -> Option<String> {
    let floor = config.standby.min_available_mib;
    let available = available?;
    (available < floor * MIB).then(|| {
        format!(
            "the host has {} MiB of memory available, under standby.min_available_mib ({floor} MiB)",
            available / MIB
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(min_available_mib: u64, max_image_mib: u64) -> Config {
        let mut c = Config::default();
        c.standby.min_available_mib = min_available_mib;
        c.standby.max_image_mib = max_image_mib;
        c
    }

    #[test]
    fn available_memory_is_read_from_the_kernels_meminfo() {
        let meminfo = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(parse_available(meminfo), Some(2 * MIB));
        assert_eq!(parse_available("MemTotal: 1 kB\n"), None);
        assert!(available().is_some_and(|b| b > 0), "this kernel says");
    }

    #[test]
    fn a_replica_is_made_only_when_its_image_fits_above_the_floor() {
        let c = config(1024, 0);
        assert_eq!(refusal(&c, 100 * MIB, Some(1124 * MIB)), None);
        let why = refusal(&c, 100 * MIB, Some(1123 * MIB)).unwrap();
        assert!(
            why.contains("1123 MiB") && why.contains("min_available_mib"),
            "{why}"
        );
        assert_eq!(refusal(&c, 100 * MIB, None), None, "unknown: no bound");
    }

    #[test]
    fn a_replica_larger_than_the_per_sandbox_bound_is_refused_whatever_is_free() {
        let c = config(0, 64);
        assert_eq!(refusal(&c, 64 * MIB, Some(u64::MAX)), None);
        let why = refusal(&c, 65 * MIB, Some(u64::MAX)).unwrap();
        assert!(why.contains("max_image_mib"), "{why}");
    }

    #[test]
    fn a_held_replica_is_dropped_once_the_host_falls_below_the_floor() {
        let c = config(1024, 0);
        assert_eq!(pressure(&c, Some(1024 * MIB)), None);
        assert!(pressure(&c, Some(1023 * MIB)).is_some());
        assert_eq!(pressure(&c, None), None);
    }
}
