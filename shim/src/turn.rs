//! `crabctl turn`: the end of an agent's turn, through the semantic policy, and
//! the turn metrics of each container.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use crab_runtime::checkpoint::history::Entry;
use crab_runtime::checkpoint::sched::Priority;
use crab_runtime::checkpoint::stats::{Recorder, TurnStats};
use crab_runtime::control::AgentConn;
use crab_runtime::inspect::Classification;

use crate::containers::Operation;
use crate::error::ShimResult;
use crate::exec_wait::{check_checkpointable, execs_run, lock_dumpable};
use crate::task::{blocking, TaskService, OPERATION_WAIT};

/// Each container's pending turn (to promote) and metrics. Kept apart from the
/// task state: a promotion must get through while the turn holds that lock.
#[derive(Debug, Default)]
pub struct Turns(Mutex<HashMap<String, TurnsOf>>);

#[derive(Debug, Default)]
struct TurnsOf {
    pending: Option<Priority>,
    recorder: Recorder,
}

impl Turns {
    fn with<T>(&self, id: &str, f: impl FnOnce(&mut TurnsOf) -> T) -> T {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(all.entry(id.to_string()).or_default())
    }

    /// Raises the pending turn checkpoint of `id`, if any, to high priority.
    pub fn promote(&self, id: &str) -> bool {
        self.with(id, |t| match &t.pending {
            Some(p) if !p.is_high() => {
                p.promote();
                t.recorder.promoted();
                true
            }
            _ => false,
        })
    }

    /// Records how long an answer was held for `id`'s turn.
    pub fn gated(&self, id: &str, us: u64) {
        self.with(id, |t| t.recorder.gated(us as f64 / 1000.0));
    }

    /// `id`'s metrics.
    pub fn stats(&self, id: &str) -> TurnStats {
        self.with(id, |t| t.recorder.stats())
    }

    /// Forgets a deleted container.
    pub fn forget(&self, id: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }
}

impl TaskService {
    /// Classifies the container's turn and, unless `dry_run`, takes the
    /// checkpoint it needs: nothing but a manifest entry for a skip, a snapshot
    /// for fs-only, a dump for process-only, both for full. A `background` turn
    /// (one hidden in the LLM's think time) queues at low priority until
    /// promoted. `agent`: the connection of the turn's LLM request, which names
    /// a fast-forwarded agent inside the sandbox.
    pub async fn crab_turn(
        &self,
        id: &str,
        dry_run: bool,
        background: bool,
        agent: Option<AgentConn>,
    ) -> ShimResult<(Classification, Option<Entry>)> {
        let started = Instant::now();
        let priority = if background {
            Priority::low()
        } else {
            Priority::high()
        };
        self.turns.with(id, |t| t.pending = Some(priority.clone()));
        let result = self.turn_locked(id, dry_run, priority, agent).await;
        let total_ms = started.elapsed().as_secs_f64() * 1000.0;
        self.turns.with(id, |t| {
            t.pending = None;
            match &result {
                Ok((_, Some((entry, waited)))) => t.recorder.turn(
                    entry.kind,
                    total_ms,
                    waited.as_secs_f64() * 1000.0,
                    entry.process_bytes,
                ),
                Ok((_, None)) => {}
                Err(_) => t.recorder.failed(),
            }
        });
        let (class, entry) = result?;
        tracing::info!(%id, kind = ?class.kind, reasons = ?class.reasons,
            classify_us = class.elapsed_us, total_ms, "turn");
        if let Some((e, _)) = &entry {
            self.standby_after(id, e);
        }
        Ok((class, entry.map(|(e, _)| e)))
    }

    async fn turn_locked(
        &self,
        id: &str,
        dry_run: bool,
        priority: Priority,
        agent: Option<AgentConn>,
    ) -> ShimResult<(Classification, Option<(Entry, std::time::Duration)>)> {
        let slot = self.containers.get(id)?;
        // A turn queues behind a running checkpoint or rollback of its container.
        let _claim = slot
            .begin_after(Operation::TakingTurn, OPERATION_WAIT)
            .await?;
        let (sandbox, execs) = {
            let inst = slot.lock().await?;
            check_checkpointable(&inst, id)?;
            (inst.sandbox.clone(), execs_run(&inst))
        };
        if !execs {
            return blocking(move || sandbox.turn(dry_run, &priority, agent)).await;
        }
        // An exec runs: a turn that dumps no process does not wait for it;
        // one that does waits (then classifies again: the exec may have changed
        // files meanwhile).
        let mut class = {
            let sandbox = sandbox.clone();
            blocking(move || sandbox.classify(agent)).await?
        };
        if class.kind.dumps_processes() && !dry_run {
            drop(lock_dumpable(&slot, id).await?);
            let sandbox = sandbox.clone();
            class = blocking(move || sandbox.classify(agent)).await?;
        }
        if dry_run {
            return Ok((class, None));
        }
        blocking(move || {
            let taken = sandbox.take_turn(&class, &priority)?;
            Ok((class, Some(taken)))
        })
        .await
    }
}
