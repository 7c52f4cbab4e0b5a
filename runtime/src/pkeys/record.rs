//! The dump's side: the tagged mappings of every process in a frozen cgroup.

use std::path::Path;

use super::{Process, Range, Record, FILE};
use crate::Result;

/// Records, in the image directory `images`, the mappings tagged with a key by
/// processes `pids` (those of the dumped cgroup and its descendants, which must be
/// frozen: [`crate::criu::pids_in`]). Writes nothing when none has one, or when
/// this host has no keys; a process that is gone is skipped (it is not in the dump
/// either).
pub fn record(pids: &[i32], images: &Path) -> Result<()> {
    let _ = std::fs::remove_file(images.join(FILE));
    if !super::supported() {
        return Ok(());
    }
    let mut processes = Vec::new();
    for &pid in pids {
        let Ok(smaps) = std::fs::read_to_string(format!("/proc/{pid}/smaps")) else {
            continue;
        };
        let ranges = tagged(&smaps);
        if ranges.is_empty() {
            continue;
        }
        let Some(ns_pid) = namespace_pid(pid) else {
            continue;
        };
        processes.push(Process {
            pid: ns_pid,
            ranges,
        });
    }
    if processes.is_empty() {
        return Ok(());
    }
    processes.sort_by_key(|p| p.pid);
    tracing::debug!(
        processes = processes.len(),
        "mappings tagged with protection keys recorded"
    );
    Record { processes }.write(images)
}

/// The pid of host process `pid` in its own (innermost) pid namespace.
pub(crate) fn namespace_pid(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// The mappings of an `smaps` text whose `ProtectionKey` is not 0.
pub(super) fn tagged(smaps: &str) -> Vec<Range> {
    let mut ranges = Vec::new();
    let mut current: Option<(u64, u64, u32)> = None;
    for line in smaps.lines() {
        if let Some(header) = mapping_header(line) {
            current = Some(header);
        } else if let Some(key) = line.strip_prefix("ProtectionKey:") {
            let key: u32 = key.trim().parse().unwrap_or(0);
            if let (Some((start, end, prot)), true) = (current, key != 0) {
                ranges.push(Range {
                    start,
                    end,
                    prot,
                    key,
                });
            }
        }
    }
    ranges
}

/// (start, end, protection) of a mapping's first line in `maps` or `smaps`
/// (`7f00-7f10 r-xp 00000000 08:01 42 /lib/x`); None for any other line.
pub(super) fn mapping_header(line: &str) -> Option<(u64, u64, u32)> {
    let mut fields = line.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?.as_bytes();
    if perms.len() != 4 {
        return None;
    }
    let mut prot = 0;
    for (i, bit) in [libc::PROT_READ, libc::PROT_WRITE, libc::PROT_EXEC]
        .into_iter()
        .enumerate()
    {
        match perms[i] {
            b'-' => {}
            b'r' | b'w' | b'x' => prot |= bit as u32,
            _ => return None,
        }
    }
    Some((start, end, prot))
}
