//! Byte quotas on process images (`quota.sandbox_checkpoint_bytes` and
//! `quota.host_checkpoint_bytes`). Retention counts checkpoints (`keep_last`) and
//! bytes: when a sandbox's images pass its quota, its oldest unmarked checkpoints go
//! first; a new checkpoint that cannot fit even then (its own images, with the marked
//! ones) is refused before it is recorded, as is one that would pass the host's
//! quota. The file-system side is bounded by the pool quota (see
//! `storage::btrfs_quota`).

use std::collections::BTreeMap;
use std::path::Path;

use super::history::{self, Entry, History, HISTORY};
use crate::config::Config;
use crate::storage::ContainerKey;
use crate::{Error, Result};

/// Bytes of the process images the history's entries use, each image once. An image
/// whose own entry is gone (a later skip still uses it) is measured by `measure`.
pub fn image_bytes(h: &History, measure: &dyn Fn(u64) -> u64) -> u64 {
    let own: BTreeMap<u64, u64> = h
        .entries
        .iter()
        .chain(&h.uncollected)
        .filter(|e| e.process_image == Some(e.seq))
        .map(|e| (e.seq, e.process_bytes))
        .collect();
    let (images, _) = h.referenced();
    images
        .into_iter()
        .map(|seq| own.get(&seq).copied().unwrap_or_else(|| measure(seq)))
        .sum()
}

/// Drops the oldest unmarked entries (never the newest) until the images the rest
/// use fit in `limit` bytes; like [`History::retain_last`], the dropped entries are
/// returned and kept as uncollected.
pub fn retain_bytes(h: &mut History, limit: u64, measure: &dyn Fn(u64) -> u64) -> Vec<Entry> {
    let mut dropped = Vec::new();
    while image_bytes(h, measure) > limit {
        let newest = h.entries.len().saturating_sub(1);
        let Some(i) = h.entries[..newest].iter().position(|e| !e.marked) else {
            break;
        };
        let e = h.entries.remove(i);
        h.uncollected.push(e.clone());
        dropped.push(e);
    }
    dropped
}

/// Applies both retentions to a history that just recorded its newest entry.
pub fn retain(h: &mut History, config: &Config, dir: &Path) -> Vec<Entry> {
    let mut dropped = h.retain_last(config.checkpoint.keep_last as usize);
    if let Some(limit) = config.quota.sandbox_checkpoint_limit() {
        dropped.extend(retain_bytes(h, limit, &measure_in(dir)));
    }
    dropped
}

/// Refuses a checkpoint of `new_bytes` of images (a `marked` one or not) that would
/// not fit the sandbox's quota once retention ran, or that would pass the host's.
pub fn admit(
    h: &History,
    config: &Config,
    key: &ContainerKey,
    dir: &Path,
    new_bytes: u64,
    marked: bool,
) -> Result<()> {
    let quota = &config.quota;
    let (sandbox, host) = (
        quota.sandbox_checkpoint_limit(),
        quota.host_checkpoint_limit(),
    );
    if sandbox.is_none() && host.is_none() {
        return Ok(());
    }
    let mut after = h.clone();
    after.uncollected.clear();
    let seq = after.next_seq;
    after.entries.push(Entry {
        seq,
        name: seq.to_string(),
        parent: None,
        kind: super::Kind::Full,
        fs_snapshot: None,
        process_image: Some(seq),
        created_ms: 0,
        process_bytes: new_bytes,
        timings: Default::default(),
        marked,
    });
    let measure = measure_in(dir);
    after.retain_last(config.checkpoint.keep_last as usize);
    if let Some(limit) = sandbox {
        retain_bytes(&mut after, limit, &measure);
    }
    let kept = image_bytes(&after, &measure);
    if let Some(limit) = sandbox {
        if kept > limit {
            return Err(Error::QuotaExceeded {
                what: format!("checkpoint of {key}"),
                quota: "quota.sandbox_checkpoint_bytes",
                message: format!(
                    "its process images take {new_bytes} bytes and, with the marked \
                     checkpoints it keeps, {kept} bytes of {limit}"
                ),
            });
        }
    }
    if let Some(limit) = host {
        let others = host_bytes(&config.checkpoint.store, key);
        if others + kept > limit {
            return Err(Error::QuotaExceeded {
                what: format!("checkpoint of {key}"),
                quota: "quota.host_checkpoint_bytes",
                message: format!(
                    "the host's other checkpoints hold {others} bytes of process images \
                     and this sandbox's would hold {kept}, of {limit}"
                ),
            });
        }
    }
    Ok(())
}

fn measure_in(dir: &Path) -> impl Fn(u64) -> u64 + '_ {
    move |seq| super::dir_bytes(&history::image_dir(dir, seq))
}

/// Bytes of process images every other container's history on the host uses, from
/// the histories themselves (an image whose entry is gone counts nothing here).
fn host_bytes(store: &Path, except: &ContainerKey) -> u64 {
    let mut total = 0;
    for ns in read_dirs(store) {
        for container in read_dirs(&ns) {
            if ns
                .file_name()
                .map(|n| n == except.namespace())
                .unwrap_or(false)
                && container
                    .file_name()
                    .map(|n| n == except.id())
                    .unwrap_or(false)
            {
                continue;
            }
            let Ok(text) = std::fs::read(container.join(HISTORY)) else {
                continue;
            };
            if let Ok(h) = serde_json::from_slice::<History>(&text) {
                total += image_bytes(&h, &|_| 0);
            }
        }
    }
    total
}

/// The directories in `dir`, leaving out hidden ones (locks, temporary work).
fn read_dirs(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| !e.file_name().as_encoded_bytes().starts_with(b"."))
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| e.path())
        .collect()
}

#[cfg(test)]
#[path = "byte_quota_tests.rs"]
mod tests;
