//! Per-container turn metrics: how many turns, of which kind, and where their
//! time went (queueing for a slot, checkpointing, and how long the agent's
//! answer was held back).
//!
//! Kept by the shim in memory for the life of its task; `crabctl stats` reads
//! them through the control API.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::{Kind, Timings};

/// How many recent samples each distribution keeps.
const SAMPLES: usize = 4096;

/// A distribution's summary, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Samples summarised (the most recent ones, at most 4096).
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// What `crabctl stats` shows for one container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnStats {
    /// Turns closed (through the proxy, exec exits or `crabctl turn`).
    pub turns: u64,
    /// Turns that needed nothing.
    pub skip: u64,
    /// Turns that took a file-system snapshot only.
    pub fs_only: u64,
    /// Turns that took a process dump only.
    pub process_only: u64,
    /// Turns that took both.
    pub full: u64,
    /// Turns whose checkpoint failed.
    pub failed: u64,
    /// Turns whose checkpoint was promoted because the LLM answered first.
    pub promoted: u64,
    /// Bytes of process images the turns wrote.
    pub bytes_written: u64,
    /// A turn's checkpoint, from the request to the durable manifest.
    pub checkpoint_ms: Summary,
    /// Of that, the wait for a host-wide checkpoint slot.
    pub queue_ms: Summary,
    /// How long agents' answers were held for their turn's checkpoint.
    pub gating_ms: Summary,
    /// Of a turn's checkpoint, freezing the container (turns that froze it:
    /// all but skips). Defaults keep a newer `crabctl` reading an older shim.
    #[serde(default)]
    pub freeze_ms: Summary,
    /// Of a turn's checkpoint, from the dump to its process image on disk (the
    /// thaw, the byte quota, the sync with host durability): turns that dumped
    /// processes.
    #[serde(default)]
    pub sync_ms: Summary,
    /// The container's standby replica, when it has one ready.
    #[serde(default)]
    pub standby: Option<crate::standby::Info>,
    /// Why the container, asking for replicas, has none: the last one that could
    /// not be made, or was dropped (memory pressure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby_missing: Option<String>,
    /// Replicas dropped because the host ran short of memory.
    #[serde(default)]
    pub standby_dropped: u64,
    /// The container's replicas for forks that are ready (`io.crab.standby.forks`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fork_replicas: Vec<crate::standby::Info>,
    /// Why the container has fewer replicas for forks than it asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_replicas_missing: Option<String>,
}

/// Recent samples of one quantity.
#[derive(Debug, Default)]
struct Samples(VecDeque<f64>);

impl Samples {
    fn push(&mut self, v: f64) {
        if self.0.len() == SAMPLES {
            self.0.pop_front();
        }
        self.0.push_back(v);
    }

    fn summary(&self) -> Summary {
        let mut v: Vec<f64> = self.0.iter().copied().collect();
        if v.is_empty() {
            return Summary::default();
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Summary {
            count: v.len() as u64,
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
            max: v[v.len() - 1],
        }
    }
}

/// The running record behind [`TurnStats`].
#[derive(Debug, Default)]
pub struct Recorder {
    counts: TurnStats,
    checkpoint: Samples,
    queue: Samples,
    gating: Samples,
    freeze: Samples,
    sync: Samples,
}

impl Recorder {
    /// A turn that recorded a checkpoint of `kind`, whose steps took `timings`.
    pub fn turn(
        &mut self,
        kind: Kind,
        total_ms: f64,
        queue_ms: f64,
        bytes: u64,
        timings: &Timings,
    ) {
        let c = &mut self.counts;
        c.turns += 1;
        match kind {
            Kind::Skip => c.skip += 1,
            Kind::FsOnly => c.fs_only += 1,
            Kind::ProcessOnly => c.process_only += 1,
            Kind::Full => c.full += 1,
        }
        c.bytes_written += bytes;
        self.checkpoint.push(total_ms);
        self.queue.push(queue_ms);
        // A skip neither freezes nor dumps, and an fs-only turn writes no process
        // image: their zeros would only drag the percentiles down.
        if kind != Kind::Skip {
            self.freeze.push(timings.freeze_ms as f64);
        }
        if kind.dumps_processes() {
            self.sync.push(timings.sync_ms as f64);
        }
    }

    /// A turn whose checkpoint failed.
    pub fn failed(&mut self) {
        self.counts.turns += 1;
        self.counts.failed += 1;
    }

    /// A turn's checkpoint was promoted.
    pub fn promoted(&mut self) {
        self.counts.promoted += 1;
    }

    /// An answer was held `ms` for its turn's checkpoint.
    pub fn gated(&mut self, ms: f64) {
        self.gating.push(ms);
    }

    /// The figures now.
    pub fn stats(&self) -> TurnStats {
        TurnStats {
            checkpoint_ms: self.checkpoint.summary(),
            queue_ms: self.queue.summary(),
            gating_ms: self.gating.summary(),
            freeze_ms: self.freeze.summary(),
            sync_ms: self.sync.summary(),
            ..self.counts.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_are_counted_by_kind_and_summarised() {
        let mut r = Recorder::default();
        for i in 1..=100 {
            r.turn(Kind::Skip, i as f64, 0.0, 0, &Timings::default());
        }
        let full = Timings {
            freeze_ms: 4,
            fs_ms: 100,
            dump_ms: 300,
            sync_ms: 90,
            total_ms: 500,
        };
        r.turn(Kind::Full, 500.0, 3.0, 1 << 20, &full);
        let fs_only = Timings {
            freeze_ms: 2,
            fs_ms: 50,
            total_ms: 60,
            ..Timings::default()
        };
        r.turn(Kind::FsOnly, 60.0, 0.0, 0, &fs_only);
        r.failed();
        r.promoted();
        r.gated(7.5);
        let s = r.stats();
        assert_eq!((s.turns, s.skip, s.full, s.failed), (103, 100, 1, 1));
        assert_eq!((s.promoted, s.bytes_written), (1, 1 << 20));
        assert_eq!(s.checkpoint_ms.count, 102);
        assert_eq!(s.checkpoint_ms.p50, 52.0);
        assert_eq!(s.checkpoint_ms.max, 500.0);
        assert_eq!(s.gating_ms.p99, 7.5);
        assert_eq!(s.queue_ms.max, 3.0);
        // The skips froze nothing; the fs-only turn wrote no process image.
        assert_eq!((s.freeze_ms.count, s.freeze_ms.max), (2, 4.0));
        assert_eq!((s.sync_ms.count, s.sync_ms.max), (1, 90.0));
    }

    #[test]
    fn only_the_most_recent_samples_are_kept() {
        let mut r = Recorder::default();
        for _ in 0..SAMPLES {
            r.gated(1000.0);
        }
        for _ in 0..SAMPLES {
            r.gated(1.0);
        }
        assert_eq!(r.stats().gating_ms.max, 1.0);
    }
}
