//! Replicas for forks ([`crab_runtime::standby::Use::Fork`]), for containers that
//! ask for them (`[standby] forks = N`, or the annotation `io.crab.standby.forks`).
//!
//! Such a container keeps N replicas of its newest checkpoint with a process
//! image, made one after the other in the background after that checkpoint (while
//! the agent or the search thinks). A fork of that checkpoint is created in this
//! same shim (`crabctl fork` lands there: [`crate::service`] groups a fork with the
//! container it is forked from when it asks for replicas): its `Create` takes a
//! replica and its `Start` adopts it, with no CRIU restore. What was taken is made
//! again in the background. A newer checkpoint replaces them all.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crab_runtime::checkpoint::history::Entry;
use crab_runtime::config::FORK_REPLICAS_ANNOTATION;
use crab_runtime::sandbox::Sandbox;
use crab_runtime::standby::{Info, Use};
use crab_runtime::storage::ContainerKey;

use crate::instance::Instance;
use crate::io::{PipeIo, ProcessIo, StdioPaths};
use crate::standby::{discard, Ready};
use crate::task::{blocking, TaskService};

#[derive(Default)]
struct State {
    /// Bumped by every new checkpoint: a replica made for an older one is
    /// discarded when it is done.
    generation: u64,
    /// The checkpoint the replicas are of.
    seq: Option<u64>,
    ready: Vec<Ready>,
    /// Whether a task is making replicas of the current generation.
    making: bool,
    /// Why there are fewer than asked: the last replica that could not be made.
    missing: Option<String>,
    /// When a fork last took one.
    last_take: Option<Instant>,
}

/// How long after the last fork took a replica the missing ones are made again:
/// the forks of one `crabctl fork --count N` come within milliseconds of each
/// other, and a replica's CRIU restore would take CPU from their adoptions.
const REFILL_AFTER: Duration = Duration::from_millis(200);

/// A container's replicas for forks, shared by its operations, the forks' creates
/// and the task making them.
#[derive(Clone, Default)]
pub struct Pool(Arc<Mutex<State>>);

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state();
        f.debug_struct("Pool")
            .field("seq", &s.seq)
            .field("ready", &s.ready.len())
            .finish()
    }
}

impl Pool {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while the lock was held leaves nothing half-written here.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a ready replica of checkpoint `seq`, if there is one.
    pub fn take(&self, seq: u64) -> Option<Ready> {
        let mut s = self.state();
        if s.seq != Some(seq) {
            return None;
        }
        let taken = s.ready.pop();
        if taken.is_some() {
            s.last_take = Some(Instant::now());
        }
        taken
    }

    /// How long until no fork has taken a replica for [`REFILL_AFTER`] (zero: now).
    fn quiet_in(&self) -> Duration {
        let s = self.state();
        s.last_take
            .map(|t| REFILL_AFTER.saturating_sub(t.elapsed()))
            .unwrap_or_default()
    }

    /// Starts a new generation for checkpoint `seq`; answers it and the replicas
    /// of the old one.
    fn begin(&self, seq: u64) -> (u64, Vec<Ready>) {
        let mut s = self.state();
        s.generation += 1;
        s.seq = Some(seq);
        s.missing = None;
        s.making = false;
        (s.generation, std::mem::take(&mut s.ready))
    }

    /// Claims the making of `generation`'s missing replicas (`want` in all); false
    /// when another task makes them, or none is missing.
    fn claim(&self, generation: u64, want: usize) -> bool {
        let mut s = self.state();
        if s.generation != generation || s.seq.is_none() || s.making || s.ready.len() >= want {
            return false;
        }
        s.making = true;
        true
    }

    /// Keeps `ready` if it is of the current generation and one is still
    /// missing; else hands it back. Answers whether more are to be made.
    fn keep(&self, generation: u64, want: usize, ready: Ready) -> (Option<Ready>, bool) {
        let mut s = self.state();
        if s.generation != generation {
            // The current generation's maker, if any, owns `making`.
            return (Some(ready), false);
        }
        if s.ready.len() >= want {
            s.making = false;
            return (Some(ready), false);
        }
        s.ready.push(ready);
        let more = s.ready.len() < want;
        if !more {
            s.making = false;
        }
        (None, more)
    }

    /// Ends the making of `generation`, recording `why` a replica failed.
    fn give_up(&self, generation: u64, why: String) {
        let mut s = self.state();
        if s.generation != generation {
            return;
        }
        s.making = false;
        s.missing = Some(why);
    }

    /// Takes `generation`'s replicas out for memory (`why`): none is taken by a
    /// fork or made again until the next checkpoint.
    fn drop_for_memory(&self, generation: u64, why: String) -> Vec<Ready> {
        let mut s = self.state();
        if s.generation != generation {
            return Vec::new();
        }
        s.seq = None;
        s.making = false;
        s.missing = Some(format!("dropped: {why}"));
        std::mem::take(&mut s.ready)
    }

    /// Whether replicas of `generation` are held or being made.
    fn active(&self, generation: u64) -> bool {
        let s = self.state();
        s.generation == generation && s.seq.is_some()
    }

    /// Takes every replica, and stops one being made from being kept.
    pub fn clear(&self) -> Vec<Ready> {
        let mut s = self.state();
        s.generation += 1;
        s.seq = None;
        s.making = false;
        std::mem::take(&mut s.ready)
    }

    /// What `crabctl stats` shows: the replicas ready, and why there are fewer
    /// than asked.
    pub fn report(&self) -> (Vec<Info>, Option<String>) {
        let s = self.state();
        let ready = s.ready.iter().map(|r| r.standby.info()).collect();
        (ready, s.missing.clone())
    }
}

/// Applies the container's `io.crab.standby.forks` annotation to `config`.
pub fn configure(
    config: &mut crab_runtime::config::Config,
    spec: &oci_spec::runtime::Spec,
) -> crate::error::ShimResult<()> {
    crate::checkpoint::choose_annotated(spec, FORK_REPLICAS_ANNOTATION, |v| {
        config.standby.choose_forks(v)
    })
}

impl TaskService {
    /// After a checkpoint with a process image of a container asking for replicas
    /// for forks: replicas of it, in the background, in place of the old ones.
    pub(crate) fn fork_replicas_after(&self, inst: &Instance, entry: &Entry) {
        if !entry.kind.dumps_processes() || inst.config().standby.forks == 0 {
            return;
        }
        let (pool, config) = (inst.fork_replicas.clone(), inst.config().clone());
        let (generation, old) = pool.begin(entry.seq);
        let (watched, id) = (pool.clone(), inst.container().id().to_string());
        tokio::spawn(async move {
            for r in old {
                discard(&config, r).await;
            }
            watch_memory(watched, generation, config, id).await;
        });
        refill(inst, generation);
    }

    /// After a fork took one of the container's replicas: the missing ones again,
    /// once forks have stopped taking them for a moment ([`REFILL_AFTER`]).
    pub(crate) fn refill_after_fork(&self, inst: &Instance) {
        let generation = inst.fork_replicas.state().generation;
        let (pool, inst) = (inst.fork_replicas.clone(), Refill::of(inst));
        tokio::spawn(async move {
            loop {
                let wait = pool.quiet_in();
                if wait.is_zero() {
                    break;
                }
                tokio::time::sleep(wait).await;
            }
            inst.start(generation);
        });
    }
}

/// What making a container's replicas needs of it.
struct Refill {
    pool: Pool,
    sandbox: Sandbox,
    want: usize,
}

impl Refill {
    fn of(inst: &Instance) -> Refill {
        Refill {
            pool: inst.fork_replicas.clone(),
            sandbox: inst.sandbox.clone(),
            want: inst.config().standby.forks as usize,
        }
    }

    /// Makes `generation`'s missing replicas, one after the other, in the
    /// background (each a CRIU restore in a low-priority slot of the host's).
    fn start(self, generation: u64) {
        let Refill {
            pool,
            sandbox,
            want,
        } = self;
        let Some(seq) = pool.state().seq else {
            return;
        };
        if !pool.claim(generation, want) {
            return;
        }
        let id = sandbox.container().id().to_string();
        tokio::spawn(async move {
            let config = sandbox.config().clone();
            loop {
                let s = sandbox.clone();
                let made = async {
                    let (pipes, child) = PipeIo::unbound()?;
                    let standby =
                        blocking(move || s.make_standby(&seq.to_string(), child, Use::Fork))
                            .await?;
                    Ok::<_, crate::error::ShimError>(Ready { standby, pipes })
                }
                .await;
                let ready = match made {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::info!(%id, seq, error = %e, "no replica for forks");
                        pool.give_up(generation, e.to_string());
                        return;
                    }
                };
                tracing::info!(%id, seq, pid = ready.standby.pid,
                    ms = ready.standby.made_in.as_millis() as u64, "replica for forks ready");
                match pool.keep(generation, want, ready) {
                    (Some(stale), _) => {
                        discard(&config, stale).await;
                        return;
                    }
                    (None, true) => continue,
                    (None, false) => return,
                }
            }
        });
    }
}

/// While `generation`'s replicas are held or made, drops them all once the host
/// runs short of memory, as a rollback's replica is
/// ([`crate::standby::memory_pressure_while`]): replicas go first.
async fn watch_memory(
    pool: Pool,
    generation: u64,
    config: crab_runtime::config::Config,
    id: String,
) {
    let active = || pool.active(generation);
    let Some(why) = crate::standby::memory_pressure_while(&config, active).await else {
        return;
    };
    let dropped = pool.drop_for_memory(generation, why.clone());
    tracing::warn!(%id, replicas = dropped.len(), %why, "replicas for forks dropped");
    for r in dropped {
        discard(&config, r).await;
    }
}

/// Makes `generation`'s missing replicas of `inst` now.
fn refill(inst: &Instance, generation: u64) {
    Refill::of(inst).start(generation);
}

impl TaskService {
    /// A ready replica of checkpoint `seq` of `src`, if this shim serves `src` and
    /// holds one (a fork of it is being created); the one taken is made again.
    pub(crate) async fn take_fork_replica(&self, src: &ContainerKey, seq: u64) -> Option<Ready> {
        if src.namespace() != self.namespace {
            return None;
        }
        let slot = self.containers.get(src.id()).ok()?;
        let inst = slot.lock().await.ok()?;
        let ready = inst.fork_replicas.take(seq)?;
        self.refill_after_fork(&inst);
        Some(ready)
    }
}

/// Adopts `ready` as the processes of the new fork `sandbox`, forked from a
/// checkpoint of `dumped_id` ([`Sandbox::adopt_fork_replica`]); answers the init's
/// pid and its stdio, copied to the fork's fifos `stdio`. `None` (logged) when it
/// could not be adopted: nothing of the replica runs then, and the caller
/// restores from the images. The leftovers are cleaned in the background.
pub async fn adopt(
    sandbox: &mut Sandbox,
    ready: Ready,
    rootfs: PathBuf,
    dumped_id: String,
    stdio: &StdioPaths,
) -> Option<(i32, ProcessIo)> {
    crate::standby::adopt_with(sandbox, ready, Some(stdio), move |s, standby| {
        s.adopt_fork_replica(standby, &rootfs, &dumped_id)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_checkpoint_starts_a_generation_that_a_fork_of_the_old_one_cannot_take_from() {
        let pool = Pool::default();
        let (g1, old) = pool.begin(3);
        assert!(old.is_empty());
        assert!(pool.claim(g1, 2), "nothing is made yet");
        assert!(!pool.claim(g1, 2), "a second maker of the same generation");
        let (g2, _) = pool.begin(4);
        assert_ne!(g1, g2);
        assert!(pool.take(3).is_none(), "replicas of an older checkpoint");
        assert!(pool.claim(g2, 2), "the new generation is made anew");
        assert!(!pool.claim(g1, 2), "the old generation's maker stops");
    }

    #[test]
    fn replicas_dropped_for_memory_are_neither_taken_nor_made_again_until_the_next_checkpoint() {
        let pool = Pool::default();
        let (g, _) = pool.begin(7);
        assert!(pool.active(g));
        assert!(pool.drop_for_memory(g, "short".into()).is_empty());
        assert!(!pool.active(g));
        assert!(pool.take(7).is_none());
        assert!(!pool.claim(g, 2), "made again after a drop");
        assert_eq!(pool.report().1.as_deref(), Some("dropped: short"));
        let (g2, _) = pool.begin(8);
        assert!(pool.active(g2));
        assert_eq!(pool.report().1, None);
    }

    #[test]
    fn a_cleared_pool_makes_nothing_more_and_reports_nothing() {
        let pool = Pool::default();
        let (g, _) = pool.begin(1);
        assert!(pool.clear().is_empty());
        assert!(!pool.claim(g, 2));
        pool.give_up(g, "late".into());
        assert_eq!(pool.report(), (Vec::new(), None));
    }
}
