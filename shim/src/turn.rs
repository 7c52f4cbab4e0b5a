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
    /// The turn whose checkpoint runs, with its token.
    pending: Option<(Option<u64>, Priority)>,
    /// A promotion that named a turn not yet pending: the proxy sends the
    /// turn and its promotion on separate connections, and when the LLM
    /// answers at once the promotion may come first. Kept for that turn (a
    /// late one, for a turn already done, matches no later token).
    early: Option<u64>,
    recorder: Recorder,
}

impl Turns {
    fn with<T>(&self, id: &str, f: impl FnOnce(&mut TurnsOf) -> T) -> T {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f(all.entry(id.to_string()).or_default())
    }

    /// Raises the pending turn checkpoint of `id` to high priority: the one
    /// `token` names (any pending one without a token). A token of a turn not
    /// pending is kept for when it comes.
    pub fn promote(&self, id: &str, token: Option<u64>) -> bool {
        self.with(id, |t| match &t.pending {
            Some((pending, p)) if token.is_none() || *pending == token => {
                if p.is_high() {
                    return false;
                }
                p.promote();
                t.recorder.promoted();
                true
            }
            _ => {
                if token.is_some() {
                    t.early = token;
                }
                false
            }
        })
    }

    /// The priority a turn starts at: high when it is not `background`, or
    /// when its promotion came before it (counted as promoted).
    fn start(&self, id: &str, background: bool, token: Option<u64>) -> Priority {
        self.with(id, |t| {
            let promoted = token.is_some() && t.early == token;
            if promoted {
                t.early = None;
                t.recorder.promoted();
            }
            let priority = if background && !promoted {
                Priority::low()
            } else {
                Priority::high()
            };
            t.pending = Some((token, priority.clone()));
            priority
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

/// A turn's classification, its checkpoint (and the wait for a slot) unless it
/// was a dry run, and whether the container asks for standby replicas.
type TurnTaken = (Classification, Option<crab_runtime::sandbox::Taken>, bool);

impl TaskService {
    /// Classifies the container's turn and, unless `dry_run`, takes the
    /// checkpoint it needs: nothing but a manifest entry for a skip, a snapshot
    /// for fs-only, a dump for process-only, both for full. A `background` turn
    /// (one hidden in the LLM's think time) queues at low priority until
    /// promoted (`token` names it in the promotion). `agent`: the connection of the turn's LLM request, which names
    /// a fast-forwarded agent inside the sandbox.
    pub async fn crab_turn(
        &self,
        id: &str,
        dry_run: bool,
        background: bool,
        agent: Option<AgentConn>,
        token: Option<u64>,
    ) -> ShimResult<(Classification, Option<Entry>)> {
        let started = Instant::now();
        let priority = self.turns.start(id, background, token);
        let result = self.turn_locked(id, dry_run, priority, agent).await;
        let total_ms = started.elapsed().as_secs_f64() * 1000.0;
        self.turns.with(id, |t| {
            t.pending = None;
            match &result {
                Ok((_, Some((entry, waited)), _)) => t.recorder.turn(
                    entry.kind,
                    total_ms,
                    waited.as_secs_f64() * 1000.0,
                    entry.process_bytes,
                    &entry.timings,
                ),
                Ok((_, None, _)) => {}
                Err(_) => t.recorder.failed(),
            }
        });
        let (class, entry, wants_standby) = result?;
        tracing::info!(%id, kind = ?class.kind, reasons = ?class.reasons,
            classify_us = class.elapsed_us, total_ms, "turn");
        tracing::debug!(%id, tasks = ?class.tasks, "turn's tasks");
        if let Some((e, _)) = &entry {
            self.standby_after(id, wants_standby, e);
        }
        Ok((class, entry.map(|(e, _)| e)))
    }

    async fn turn_locked(
        &self,
        id: &str,
        dry_run: bool,
        priority: Priority,
        agent: Option<AgentConn>,
    ) -> ShimResult<TurnTaken> {
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
        let wants_standby = sandbox.config().standby.wants_replicas();
        if !execs {
            let (class, taken) = blocking(move || sandbox.turn(dry_run, &priority, agent)).await?;
            return Ok((class, taken, wants_standby));
        }
        // An exec runs: a turn that dumps no process does not wait for it;
        // one that does waits (then classifies again: the exec may have changed
        // files meanwhile), but not for the exec its own agent runs in (an agent
        // started with `docker exec`): that one waits for this turn's answer.
        let mut class = {
            let sandbox = sandbox.clone();
            blocking(move || sandbox.classify(agent)).await?
        };
        if class.kind.dumps_processes() && !dry_run {
            drop(lock_dumpable(&slot, id, agent).await?);
            let sandbox = sandbox.clone();
            class = blocking(move || sandbox.classify(agent)).await?;
        }
        if dry_run {
            return Ok((class, None, wants_standby));
        }
        let taken =
            blocking(move || sandbox.take_turn(&class, &priority).map(|t| (class, t))).await?;
        Ok((taken.0, Some(taken.1), wants_standby))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_promotion_that_comes_before_its_turn_starts_the_turn_at_high_priority() {
        let turns = Turns::default();
        assert!(!turns.promote("c", Some(7)), "nothing was pending");
        assert!(turns.start("c", true, Some(7)).is_high());
        assert_eq!(turns.stats("c").promoted, 1);
        // Kept once: the next turn starts low again.
        assert!(!turns.start("c", true, Some(8)).is_high());
    }

    #[test]
    fn a_promotion_of_another_turn_leaves_the_pending_one_low() {
        let turns = Turns::default();
        let p = turns.start("c", true, Some(3));
        assert!(
            !turns.promote("c", Some(2)),
            "a late promotion of a turn done"
        );
        assert!(!p.is_high());
        assert!(turns.promote("c", Some(3)));
        assert!(p.is_high());
        assert_eq!(turns.stats("c").promoted, 1);
        // A late promotion left behind matches no later turn.
        assert!(!turns.start("c", true, Some(4)).is_high());
    }

    #[test]
    fn a_promotion_without_a_token_raises_whichever_turn_is_pending() {
        let turns = Turns::default();
        let p = turns.start("c", true, None);
        assert!(turns.promote("c", None));
        assert!(p.is_high());
    }
}
