//! The shim's standby replica of each container ([`crab_runtime::standby`]), for
//! containers that ask for one (`[standby] enabled`, or the annotation
//! `io.crab.standby=true`).
//!
//! One per container: the state a rollback most likely goes back to. It is made in
//! the background after each checkpoint with a process image (while the agent
//! waits for its LLM, or a search runs its next child) and after each rollback (a
//! tree search goes back to the same node once per child). A rollback to that
//! checkpoint adopts it; to any other, it runs the slow way. A slot's generation
//! makes a replica finished after a newer one was asked for discard itself.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crab_runtime::checkpoint::history::Entry;
use crab_runtime::config::STANDBY_ANNOTATION;
use crab_runtime::sandbox::Adoption;
use crab_runtime::sandbox::Sandbox;
use crab_runtime::standby::{Standby, Use};

use crate::instance::Instance;
use crate::io::{PipeIo, ProcessIo, StdioPaths};
use crate::task::{blocking, TaskService};

/// A replica, and the pipes of its init's stdio, whose copying starts at adoption.
pub struct Ready {
    /// The stopped processes.
    pub standby: Standby,
    /// Their stdio, not yet copied to the task's fifos.
    pub pipes: PipeIo,
}

impl std::fmt::Debug for Ready {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ready")
            .field("seq", &self.standby.seq)
            .field("pid", &self.standby.pid)
            .finish()
    }
}

#[derive(Default)]
struct State {
    /// Bumped by every request for a new replica: one made for an older request
    /// is discarded when it is done.
    generation: u64,
    /// The checkpoint a replica is being made of.
    making: Option<u64>,
    ready: Option<Ready>,
    /// Why there is no replica: the newest one could not be made, or was dropped.
    missing: Option<String>,
    /// Replicas dropped because the host ran short of memory.
    dropped: u64,
}

/// A container's standby replica, shared by the operations and the task making it.
#[derive(Clone, Default)]
pub struct Slot(Arc<Shared>);

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Woken when a replica is kept or given up: a rollback waiting for one
    /// looks again.
    changed: tokio::sync::Notify,
}

/// How long a rollback waits for a replica of its checkpoint that is being made
/// before it restores the slow way (a restore takes about as long).
const WAIT_FOR_MAKING: Duration = Duration::from_millis(500);

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state();
        f.debug_struct("Slot")
            .field("making", &s.making)
            .field("ready", &s.ready.as_ref().map(|r| r.standby.seq))
            .finish()
    }
}

impl Slot {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while the lock was held leaves nothing half-written here.
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the replica of checkpoint `seq`, waiting a moment for one being made.
    pub async fn take(&self, seq: u64) -> Option<Ready> {
        let deadline = tokio::time::Instant::now() + WAIT_FOR_MAKING;
        loop {
            // Registered before the state is read: a change between the read and
            // the wait still wakes it.
            let changed = self.0.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut s = self.state();
                if s.ready.as_ref().is_some_and(|r| r.standby.seq == seq) {
                    return s.ready.take();
                }
                if s.making != Some(seq) {
                    return None;
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return None;
            }
        }
    }

    /// Starts a new generation for a replica of `seq`; answers it and the replica
    /// it replaces.
    fn begin(&self, seq: u64) -> (u64, Option<Ready>) {
        let mut s = self.state();
        s.generation += 1;
        s.making = Some(seq);
        let replaced = (s.generation, s.ready.take());
        drop(s);
        self.0.changed.notify_waiters();
        replaced
    }

    /// Keeps `ready` if it is of the newest generation; else hands it back.
    fn fill(&self, generation: u64, ready: Ready) -> Option<Ready> {
        let mut s = self.state();
        if s.generation != generation {
            return Some(ready);
        }
        s.making = None;
        s.missing = None;
        s.ready = Some(ready);
        drop(s);
        self.0.changed.notify_waiters();
        None
    }

    /// What `crabctl stats` shows: the replica ready, if one is; else why there
    /// is none; and how many were dropped for memory.
    pub fn report(&self) -> (Option<crab_runtime::standby::Info>, Option<String>, u64) {
        let s = self.state();
        let info = s.ready.as_ref().map(|r| r.standby.info());
        let missing = if info.is_none() {
            s.missing.clone()
        } else {
            None
        };
        (info, missing, s.dropped)
    }

    /// Ends the making of `generation` without a replica, recording `why`.
    fn give_up(&self, generation: u64, why: String) {
        let mut s = self.state();
        if s.generation != generation {
            return;
        }
        s.making = None;
        s.missing = Some(why);
        drop(s);
        self.0.changed.notify_waiters();
    }

    /// Takes the replica of `generation` out, to drop it for memory `why`.
    fn drop_for_memory(&self, generation: u64, why: String) -> Option<Ready> {
        let mut s = self.state();
        if s.generation != generation || s.ready.is_none() {
            return None;
        }
        s.dropped += 1;
        s.missing = Some(format!("dropped: {why}"));
        s.ready.take()
    }

    /// Whether the replica of `generation` is still the one held.
    fn holds(&self, generation: u64) -> bool {
        let s = self.state();
        s.generation == generation && s.ready.is_some()
    }

    /// Takes whatever replica there is and stops one being made from being kept.
    pub fn clear(&self) -> Option<Ready> {
        let mut s = self.state();
        s.generation += 1;
        s.making = None;
        let ready = s.ready.take();
        drop(s);
        self.0.changed.notify_waiters();
        ready
    }
}

/// How often a shim holding a replica looks at the host's available memory.
const MEMORY_CHECK: Duration = Duration::from_millis(250);

/// Looks at the host's available memory every [`MEMORY_CHECK`] while `held`
/// says replicas are held; answers why they must go once it falls below
/// `[standby] min_available_mib` ([`crab_runtime::standby::memory`]), or `None`
/// once they are no longer held.
pub async fn memory_pressure_while(
    config: &crab_runtime::config::Config,
    held: impl Fn() -> bool,
) -> Option<String> {
    use crab_runtime::standby::memory;
    while held() {
        tokio::time::sleep(MEMORY_CHECK).await;
        if let Some(why) = memory::pressure(config, memory::available()) {
            return Some(why);
        }
    }
    None
}

/// While the replica of `generation` is held, drops it once the host runs short
/// of memory ([`memory_pressure_while`]).
async fn watch_memory(
    slot: Slot,
    generation: u64,
    config: crab_runtime::config::Config,
    id: String,
) {
    let Some(why) = memory_pressure_while(&config, || slot.holds(generation)).await else {
        return;
    };
    if let Some(ready) = slot.drop_for_memory(generation, why.clone()) {
        tracing::warn!(%id, seq = ready.standby.seq, %why, "standby dropped");
        discard(&config, ready).await;
    }
}

/// Kills a replica's processes and removes its cgroups and tree, off the async
/// threads.
pub async fn discard(config: &crab_runtime::config::Config, ready: Ready) {
    let config = config.clone();
    let (seq, id) = (ready.standby.seq, ready.standby.pid);
    let done = blocking(move || ready.standby.discard(&config)).await;
    if let Err(e) = done {
        tracing::warn!(seq, pid = id, error = %e, "discard a standby");
    }
}

/// Applies the container's `io.crab.standby` annotation to `config`.
pub fn configure(
    config: &mut crab_runtime::config::Config,
    spec: &oci_spec::runtime::Spec,
) -> crate::error::ShimResult<()> {
    crate::checkpoint::choose_annotated(spec, STANDBY_ANNOTATION, |v| config.standby.choose(v))
}

impl TaskService {
    /// After a checkpoint with a process image of a container asking for
    /// replicas (`wants`: its configuration's `standby.wants_replicas()`): a
    /// replica of it for its rollbacks and those for forks, in the background
    /// (the container's lock is taken there, not here; a container that does not
    /// ask never takes it).
    pub(crate) fn standby_after(&self, id: &str, wants: bool, entry: &Entry) {
        if !entry.kind.dumps_processes() || !wants {
            return;
        }
        let (service, id, entry) = (self.clone(), id.to_string(), entry.clone());
        tokio::spawn(async move {
            let Ok(slot) = service.containers.get(&id) else {
                return;
            };
            let Ok(inst) = slot.lock().await else {
                return;
            };
            service.refresh_standby(&id, &inst, entry.seq);
            service.fork_replicas_after(&inst, &entry);
        });
    }

    /// Makes a replica of checkpoint `seq` of the container in the background,
    /// in place of the one it has, if the container asks for replicas.
    pub(crate) fn refresh_standby(&self, id: &str, inst: &Instance, seq: u64) {
        if !inst.config().standby.enabled {
            return;
        }
        let (slot, sandbox, stdio) = (
            inst.standby.clone(),
            inst.sandbox.clone(),
            inst.init.stdio.clone(),
        );
        let id = id.to_string();
        tokio::spawn(async move {
            let config = sandbox.config().clone();
            let (generation, old) = slot.begin(seq);
            if let Some(old) = old {
                discard(&config, old).await;
            }
            let made = async {
                let (pipes, child) = PipeIo::new(&stdio)?;
                let standby =
                    blocking(move || sandbox.make_standby(&seq.to_string(), child, Use::Rollback))
                        .await?;
                Ok::<_, crate::error::ShimError>(Ready { standby, pipes })
            }
            .await;
            match made {
                Ok(ready) => {
                    tracing::info!(%id, seq, pid = ready.standby.pid,
                        ms = ready.standby.made_in.as_millis() as u64, "standby ready");
                    warn_slow_moves();
                    if let Some(stale) = slot.fill(generation, ready) {
                        discard(&config, stale).await;
                    } else {
                        watch_memory(slot, generation, config, id).await;
                    }
                }
                Err(e) => {
                    tracing::info!(%id, seq, error = %e,
                        "no standby");
                    slot.give_up(generation, e.to_string());
                }
            }
        });
    }
}

/// Says once per shim, at its first replica, that adoptions here will wait for a
/// grace period of the kernel's ([`crab_runtime::standby::rollback_renames`]):
/// most of a rollback's time on such a host, and a setting of the host's, not ours.
fn warn_slow_moves() {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        if !crab_runtime::standby::rollback_renames()
            && !crab_runtime::cgroup2::favors_dynamic_moves()
        {
            tracing::warn!(
                "cgroup2 is mounted without favordynmods: each standby adoption waits \
                 for an RCU grace period (about 6 ms) to move its processes"
            );
        }
    });
}

/// Adopts `ready` as the container, whose processes `killed` were sent SIGKILL
/// ([`Sandbox::adopt_standby`]); answers the new init's pid and its stdio, and
/// `sandbox` is then the container as it is after the adoption. `None` (logged)
/// when it could not be adopted: nothing of the replica runs then, `sandbox` is
/// unchanged, and the caller restores the slow way. The leftovers are cleaned in
/// the background.
pub async fn adopt(
    sandbox: &mut Sandbox,
    ready: Ready,
    rootfs: PathBuf,
    killed: Vec<i32>,
) -> Option<(i32, ProcessIo)> {
    adopt_with(sandbox, ready, None, move |s, standby| {
        s.adopt_standby(standby, &rootfs, killed)
    })
    .await
}

/// Adopts `ready` by `how` (a rollback's adoption or a fork's), its stdio copied
/// to the fifos it was made for, or to `fifos` (a fork's, unknown when it was
/// made); answers the init's pid and its stdio, and `sandbox` is then the one
/// the adoption answered; or `None` (logged: nothing of the replica runs, and
/// the caller restores from the images). The leftovers are cleaned in the
/// background.
pub async fn adopt_with(
    sandbox: &mut Sandbox,
    ready: Ready,
    fifos: Option<&StdioPaths>,
    how: impl FnOnce(&Sandbox, Standby) -> crab_runtime::Result<Adoption> + Send + 'static,
) -> Option<(i32, ProcessIo)> {
    let Ready { standby, pipes } = ready;
    let (seq, id) = (standby.seq, sandbox.container().id().to_string());
    let usage = standby.usage;
    let s = sandbox.clone();
    let adopted = blocking(move || how(&s, standby)).await;
    let Adoption {
        pid,
        sandbox: adopted,
        leftovers,
    } = match adopted {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(%id, seq, ?usage, error = %e, "replica not adopted: restoring from the images");
            return None;
        }
    };
    *sandbox = adopted;
    let s = sandbox.clone();
    tokio::task::spawn_blocking(move || {
        if let Err(e) = s.clean_after_adoption(leftovers) {
            tracing::warn!(id = %s.container().id(), error = %e, "clean after a replica's adoption");
        }
    });
    let pipes = match fifos {
        Some(paths) => pipes.bind(paths),
        None => pipes,
    };
    match pipes.start() {
        Ok(io) => Some((pid, io)),
        Err(e) => {
            // Without its stdio the replica is no use: it goes, as a failed
            // adoption's does.
            tracing::warn!(%id, seq, error = %e, "replica's stdio: restoring from the images");
            let _ = sandbox.container().tracking().kill_all();
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Paused time: the clock moves only when every task waits, so the instants
    // below are exact.
    #[tokio::test(start_paused = true)]
    async fn test_a_rollback_waiting_for_its_replica_wakes_when_the_making_ends() {
        let slot = Slot::default();
        let (generation, _) = slot.begin(5);
        let started = tokio::time::Instant::now();
        let waiting = tokio::spawn({
            let slot = slot.clone();
            async move { slot.take(5).await.is_some() }
        });
        tokio::time::sleep(Duration::from_millis(40)).await;
        slot.give_up(generation, "refused".into());
        assert!(!waiting.await.unwrap(), "no replica was made");
        assert_eq!(slot.report().1.as_deref(), Some("refused"));
        assert_eq!(started.elapsed(), Duration::from_millis(40));
    }

    #[tokio::test(start_paused = true)]
    async fn test_a_rollback_stops_waiting_when_a_newer_replica_is_asked_for() {
        let slot = Slot::default();
        slot.begin(5);
        let started = tokio::time::Instant::now();
        let waiting = tokio::spawn({
            let slot = slot.clone();
            async move { slot.take(5).await.is_some() }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        slot.begin(6);
        assert!(!waiting.await.unwrap());
        assert_eq!(started.elapsed(), Duration::from_millis(10));
    }

    #[tokio::test(start_paused = true)]
    async fn test_a_rollback_waits_at_most_its_bound_for_a_replica_being_made() {
        let slot = Slot::default();
        slot.begin(5);
        let started = tokio::time::Instant::now();
        assert!(slot.take(5).await.is_none());
        assert_eq!(started.elapsed(), WAIT_FOR_MAKING);
        assert!(
            slot.take(4).await.is_none(),
            "no wait for another checkpoint"
        );
        assert_eq!(started.elapsed(), WAIT_FOR_MAKING);
    }
}
