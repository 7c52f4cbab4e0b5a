//! The inspector as its users see it: watch a container, read what changed,
//! forget what a checkpoint captured.

use std::path::Path;

use libbpf_rs::{MapCore, MapFlags, MapHandle};

use crate::abi::{bytes_of, from_bytes, Counters, FsChange, ProcChange};
use crate::pin::{open_or_load, Pinned};
use crate::skel::types;
use crate::{Error, Result};

/// A handle on the host's inspector (its pinned maps).
pub struct Inspector {
    maps: Pinned,
}

impl std::fmt::Debug for Inspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Inspector")
    }
}

impl Inspector {
    /// Opens the host's inspector pinned below `pin_root`, loading it first if
    /// this is the first user since boot.
    pub fn open(pin_root: &Path) -> Result<Inspector> {
        Ok(Inspector {
            maps: open_or_load(pin_root)?,
        })
    }

    /// Opens the host's inspector if it is loaded; None when it is not (nothing
    /// to undo then).
    pub fn open_existing(pin_root: &Path) -> Option<Inspector> {
        crate::pin::open_pinned(pin_root).map(|maps| Inspector { maps })
    }

    /// Starts recording for the tasks of cgroup `cgid`. Watching a cgroup that
    /// is watched already keeps its records.
    pub fn watch(&self, cgid: u64) -> Result<()> {
        let key = types::cg_key { cgid };
        // Nothing before this moment was recorded: until a full checkpoint,
        // every classification must take everything.
        let state = types::cg_state {
            opaque: crate::opaque::UNTRACKED,
            // A generation this cgroup id never had: entries of the `seen`
            // cache left by an earlier watch of it must not hit. An earlier
            // watch started at an earlier boot-time ns and moved by one per
            // checkpoint, so it stayed below this one.
            gen: boot_time_ns(),
            ..Default::default()
        };
        match self
            .maps
            .cgroups
            .update(bytes_of(&key), bytes_of(&state), MapFlags::NO_EXIST)
        {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::AlreadyExists => Ok(()),
            Err(_) if self.watched_count() as u64 >= crate::budget::MAX_CGROUPS => {
                Err(Error::TableFull {
                    cgid,
                    max: crate::budget::MAX_CGROUPS,
                })
            }
            Err(e) => Err(Error::bpf(format!("watch cgroup {cgid}"))(e)),
        }
    }

    /// How many containers the host's inspector watches (at most
    /// [`crate::budget::MAX_CGROUPS`]).
    pub fn watched_count(&self) -> usize {
        keys_of::<types::cg_key>(&self.maps.cgroups).len()
    }

    /// Whether `cgid` is watched.
    pub fn is_watched(&self, cgid: u64) -> Result<bool> {
        Ok(self.state(cgid)?.is_some())
    }

    /// Stops recording for `cgid` and drops everything recorded for it.
    pub fn unwatch(&self, cgid: u64) -> Result<()> {
        let _ = self.stop_recording(cgid);
        self.delete_fs(cgid, |_| true);
        self.delete_procs(cgid);
        Ok(())
    }

    /// Stops recording for `cgid` (a lookup and a delete, where
    /// [`Inspector::unwatch`] also walks the records): its place in the table is
    /// free at once, and what was recorded stays until an `unwatch`. Answers
    /// whether anything may have been recorded: a name, a birth or a death
    /// counted, or no counters to read. A task of the cgroup still running may
    /// add a record after the answer; only the caller knows there is none.
    pub fn stop_recording(&self, cgid: u64) -> bool {
        let recorded = match self.state(cgid) {
            Ok(Some(st)) => {
                st.fs_entries != 0 || st.births != 0 || st.deaths != 0 || st.transient != 0
            }
            Ok(None) | Err(_) => true,
        };
        let key = types::cg_key { cgid };
        let _ = self.maps.cgroups.delete(bytes_of(&key));
        recorded
    }

    fn state(&self, cgid: u64) -> Result<Option<types::cg_state>> {
        let key = types::cg_key { cgid };
        let v = self
            .maps
            .cgroups
            .lookup(bytes_of(&key), MapFlags::ANY)
            .map_err(Error::bpf(format!("read cgroup {cgid}")))?;
        Ok(v.and_then(|b| from_bytes(&b)))
    }

    /// `cgid`'s counters: one map lookup. None when the cgroup is not watched.
    pub fn counters(&self, cgid: u64) -> Result<Option<Counters>> {
        Ok(self.state(cgid)?.map(|s| Counters::from_state(&s)))
    }

    /// Up to `limit` changed names of `cgid`.
    pub fn fs_changes(&self, cgid: u64, limit: usize) -> Result<Vec<FsChange>> {
        Ok(
            entries_of::<types::fs_key, types::fs_val>(&self.maps.fs_entries, |k| k.cgid == cgid)
                .into_iter()
                .take(limit)
                .map(|(_, v)| FsChange::from_raw(&v))
                .collect(),
        )
    }

    /// Up to `limit` tasks of `cgid` born or gone.
    pub fn proc_changes(&self, cgid: u64, limit: usize) -> Result<Vec<ProcChange>> {
        Ok(
            entries_of::<types::proc_key, types::proc_val>(&self.maps.proc_entries, |k| {
                k.cgid == cgid
            })
            .into_iter()
            .take(limit)
            .map(|(k, v)| ProcChange::from_raw(&k, &v))
            .collect(),
        )
    }

    /// Forgets what a checkpoint captured: the changed names for which
    /// `captured` says yes, and with `procs` the process records too; with
    /// `all`, also the overflow and opaque marks (only a full checkpoint may).
    ///
    /// Call it while the container's cgroup is frozen: the counters are
    /// rewritten from what remains, and a running task's concurrent count
    /// would be lost.
    pub fn forget(
        &self,
        cgid: u64,
        captured: impl Fn(&FsChange) -> bool,
        procs: bool,
        all: bool,
    ) -> Result<()> {
        let Some(mut st) = self.state(cgid)? else {
            return Ok(());
        };
        st.fs_entries = self.delete_fs(cgid, captured);
        if procs {
            self.delete_procs(cgid);
            st.births = 0;
            st.deaths = 0;
            st.transient = 0;
        }
        if all {
            st.overflow = 0;
            st.opaque = 0;
        }
        // Writes cached as recorded must be recorded again.
        st.gen = st.gen.wrapping_add(1);
        let key = types::cg_key { cgid };
        self.maps
            .cgroups
            .update(bytes_of(&key), bytes_of(&st), MapFlags::EXIST)
            .map_err(Error::bpf(format!("reset counters of cgroup {cgid}")))
    }

    /// Marks `cgid`'s records as incomplete ([`crate::opaque::UNTRACKED`]), so
    /// that classifications take everything until the next full checkpoint:
    /// after a rollback, or a checkpoint that failed after [`Inspector::forget`].
    /// Safe while the container runs: a count lost to a concurrent update still
    /// leaves the mark set.
    pub fn taint(&self, cgid: u64) -> Result<()> {
        let Some(mut st) = self.state(cgid)? else {
            return Ok(());
        };
        st.opaque |= crate::opaque::UNTRACKED;
        let key = types::cg_key { cgid };
        self.maps
            .cgroups
            .update(bytes_of(&key), bytes_of(&st), MapFlags::EXIST)
            .map_err(Error::bpf(format!("taint cgroup {cgid}")))
    }

    /// Deletes `cgid`'s entries that `which` selects; returns how many remain.
    fn delete_fs(&self, cgid: u64, which: impl Fn(&FsChange) -> bool) -> u64 {
        let map = &self.maps.fs_entries;
        let mut left = 0;
        for (k, v) in entries_of::<types::fs_key, types::fs_val>(map, |k| k.cgid == cgid) {
            if which(&FsChange::from_raw(&v)) {
                let _ = map.delete(bytes_of(&k));
            } else {
                left += 1;
            }
        }
        left
    }

    fn delete_procs(&self, cgid: u64) {
        let map = &self.maps.proc_entries;
        for k in keys_of::<types::proc_key>(map) {
            if k.cgid == cgid {
                let _ = map.delete(bytes_of(&k));
            }
        }
    }
}

fn keys_of<T: Copy>(map: &MapHandle) -> Vec<T> {
    // Collected first: deleting while walking a hash map restarts the walk.
    map.keys().filter_map(|k| from_bytes::<T>(&k)).collect()
}

/// The (key, value) pairs of `map` whose key `keep` selects. Keys are walked
/// one by one and only the selected ones are looked up. (Batched lookups were
/// measured slower here: the kernel walks every bucket of the map for each
/// batch, 10 to 17 ms for a 65536-entry map whatever it holds.)
fn entries_of<K: Copy, V: Copy>(map: &MapHandle, keep: impl Fn(&K) -> bool) -> Vec<(K, V)> {
    keys_of::<K>(map)
        .into_iter()
        .filter(|k| keep(k))
        .filter_map(|k| Some((k, lookup::<V>(map, bytes_of(&k))?)))
        .collect()
}

fn lookup<T: Copy>(map: &MapHandle, key: &[u8]) -> Option<T> {
    map.lookup(key, MapFlags::ANY)
        .ok()
        .flatten()
        .and_then(|b| from_bytes(&b))
}

/// Nanoseconds since boot (CLOCK_BOOTTIME: never goes back).
fn boot_time_ns() -> u64 {
    use nix::time::{clock_gettime, ClockId};
    // Fails only for an unknown clock id; BOOTTIME exists since Linux 2.6.39.
    let t = clock_gettime(ClockId::CLOCK_BOOTTIME).expect("CLOCK_BOOTTIME");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}
