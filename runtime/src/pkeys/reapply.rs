//! The restore's side: the recorded keys allocated again, and their mappings tagged,
//! in the restored processes while they are stopped.

use std::collections::{BTreeSet, HashMap};

use super::inject::Injector;
use super::record::{mapping_header, namespace_pid};
use super::{Process, Range, Record, MAX_KEY};
use crate::{Error, Result};

fn failed(message: String) -> Error {
    Error::Helper {
        operation: "restore protection keys",
        message,
    }
}

/// Applies `record` to the tree restored under `init` (host pid), whose tasks are
/// stopped and stay so. Answers the tree's host pids. Only the tree's own processes
/// are touched, and only mappings they have with the recorded protection: a record
/// that names anything else is refused before any process is.
pub fn reapply(record: &Record, init: i32) -> Result<Vec<i32>> {
    let tree = tree_under(init);
    let by_namespace_pid: HashMap<i32, i32> = tree
        .iter()
        .filter_map(|&host| Some((namespace_pid(host)?, host)))
        .collect();
    let mut plan = Vec::new();
    for p in &record.processes {
        let host = *by_namespace_pid.get(&p.pid).ok_or_else(|| {
            failed(format!(
                "the key record names process {}, which the restore did not make",
                p.pid
            ))
        })?;
        check_mappings(host, p)?;
        plan.push((host, p));
    }
    for (host, p) in plan {
        apply(host, p)?;
    }
    Ok(tree)
}

/// `init` and every process below it, from each thread's `children` list (exact
/// here: the tree is stopped). Only the tree is read, not all of /proc.
fn tree_under(init: i32) -> Vec<i32> {
    let mut tree = vec![init];
    let mut i = 0;
    while i < tree.len() {
        let pid = tree[i];
        let threads = std::fs::read_dir(format!("/proc/{pid}/task"));
        for t in threads.into_iter().flatten().flatten() {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            tree.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
        i += 1;
    }
    tree
}

/// Every recorded range must lie in mappings the restored process has, with the
/// recorded protection: re-tagging then changes nothing else.
fn check_mappings(host: i32, p: &Process) -> Result<()> {
    let maps = std::fs::read_to_string(format!("/proc/{host}/maps"))
        .map_err(Error::io(format!("read the maps of {host}")))?;
    let mappings: Vec<(u64, u64, u32)> = maps.lines().filter_map(mapping_header).collect();
    for r in &p.ranges {
        if !covered(&mappings, r) {
            return Err(failed(format!(
                "process {}: the key record's range {:#x}-{:#x} ({:#x}) is not a mapping the \
                 restored process has with that protection",
                p.pid, r.start, r.end, r.prot
            )));
        }
    }
    Ok(())
}

/// Whether `mappings` (sorted, as the kernel lists them) cover `r` without a gap,
/// each with `r`'s protection.
pub(super) fn covered(mappings: &[(u64, u64, u32)], r: &Range) -> bool {
    let mut at = r.start;
    for &(start, end, prot) in mappings {
        if end <= at || start >= r.end {
            continue;
        }
        if start > at || prot != r.prot {
            return false;
        }
        at = end;
        if at >= r.end {
            return true;
        }
    }
    false
}

fn apply(host: i32, p: &Process) -> Result<()> {
    let injector = Injector::seize(host)?;
    let applied = (|| {
        allocate(&injector, p)?;
        for r in &p.ranges {
            let rc = injector.call(
                libc::SYS_pkey_mprotect,
                [r.start, r.end - r.start, r.prot as u64, r.key as u64],
            )?;
            if rc != 0 {
                return Err(failed(format!(
                    "process {}: pkey_mprotect({:#x}-{:#x}, key {}): {}",
                    p.pid,
                    r.start,
                    r.end,
                    r.key,
                    std::io::Error::from_raw_os_error(-rc as i32)
                )));
            }
        }
        Ok(())
    })();
    let released = injector.release();
    applied.and(released)
}

/// Allocates the process's recorded keys (the kernel hands out the lowest free one:
/// keys in between are allocated and freed again).
fn allocate(injector: &Injector, p: &Process) -> Result<()> {
    let wanted: BTreeSet<u64> = p.ranges.iter().map(|r| r.key as u64).collect();
    let mut got = BTreeSet::new();
    let mut spare = Vec::new();
    while got != wanted {
        let rc = injector.call(libc::SYS_pkey_alloc, [0, 0, 0, 0])?;
        if rc < 0 {
            let why = std::io::Error::from_raw_os_error(-rc as i32);
            return Err(failed(format!(
                "process {}: pkey_alloc: {why} (the checkpoint's processes use memory \
                 protection keys; this host may have none, or fewer)",
                p.pid
            )));
        }
        let key = rc as u64;
        if wanted.contains(&key) {
            got.insert(key);
        } else if key > MAX_KEY as u64 || wanted.iter().all(|&w| w < key) {
            return Err(failed(format!(
                "process {}: keys {:?} are not free in the restored process",
                p.pid,
                wanted.difference(&got).collect::<Vec<_>>()
            )));
        } else {
            spare.push(key);
        }
    }
    for key in spare {
        injector.call(libc::SYS_pkey_free, [key, 0, 0, 0])?;
    }
    Ok(())
}
