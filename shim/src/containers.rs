//! The containers a shim serves, each behind a lock of its own.
//!
//! containerd puts every container of a Kubernetes pod in one shim, so one
//! container's work must never stall another's. The map's lock is held for a
//! lookup only. Each container ([`Slot`]) has:
//!
//! - an async lock over its [`Instance`], held by an RPC from start to end
//!   (including the publication of its event, so that the exit of a process
//!   can never be reported before the start it follows);
//! - an [`Operation`] that a long operation (a checkpoint, a turn, a rollback)
//!   claims first. A checkpoint lets go of the instance lock while it waits in
//!   the host's checkpoint queue and while CRIU dumps, so that `State`, `Kill`,
//!   `Pids` and the exits of the container still get through; the operation
//!   keeps out what would conflict with it (pause, resume, an exec's start,
//!   delete, a second checkpoint or rollback), which fails at once with
//!   [`ShimError::Busy`] instead of waiting.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{MappedMutexGuard, MutexGuard, Notify};

use crate::error::{ShimError, ShimResult};
use crate::instance::Instance;

/// A long operation on one container; at most one runs at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// A checkpoint (containerd's or Crab's).
    Checkpointing,
    /// A turn's classification and checkpoint.
    TakingTurn,
    /// A rollback in place.
    RollingBack,
    /// A checkpoint being removed from the history.
    RemovingCheckpoint,
    /// A snapshot of the files being taken (`crabctl fs snapshot`).
    Snapshotting,
}

impl Operation {
    /// What the busy error says.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Checkpointing => "checkpointing",
            Operation::TakingTurn => "taking a turn",
            Operation::RollingBack => "rolling back",
            Operation::RemovingCheckpoint => "removing a checkpoint",
            Operation::Snapshotting => "taking a snapshot",
        }
    }
}

/// One container: its instance (absent while it is being created) and the long
/// operation running on it.
#[derive(Debug)]
pub struct Slot {
    id: String,
    instance: tokio::sync::Mutex<Option<Instance>>,
    operation: Mutex<Option<Operation>>,
    /// Woken when an operation ends.
    idle: Notify,
}

/// The instance of a locked [`Slot`].
pub type InstanceGuard<'a> = MappedMutexGuard<'a, Instance>;

impl Slot {
    fn new(id: &str) -> Slot {
        Slot {
            id: id.to_string(),
            instance: tokio::sync::Mutex::new(None),
            operation: Mutex::new(None),
            idle: Notify::new(),
        }
    }

    /// The container's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Waits for the container's lock.
    pub async fn lock(&self) -> ShimResult<InstanceGuard<'_>> {
        let guard = self.instance.lock().await;
        MutexGuard::try_map(guard, Option::as_mut).map_err(|_| not_found(&self.id))
    }

    /// The container's lock if nobody holds it.
    pub fn try_lock(&self) -> TryLock<'_> {
        match self.instance.try_lock() {
            Err(_) => TryLock::Held,
            Ok(guard) => match MutexGuard::try_map(guard, Option::as_mut) {
                Ok(instance) => TryLock::Locked(instance),
                Err(_) => TryLock::Gone,
            },
        }
    }

    /// Claims the container for `op`, or fails with [`ShimError::Busy`] naming the
    /// operation that runs. The claim ends when the guard is dropped.
    pub fn begin(&self, op: Operation) -> ShimResult<OperationGuard<'_>> {
        let mut current = self.operation.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(running) = *current {
            return Err(busy(&self.id, running));
        }
        *current = Some(op);
        Ok(OperationGuard { slot: self })
    }

    /// Claims the container for `op` once the running operation (if any) ends;
    /// fails with [`ShimError::Busy`] if it has not ended within `bound`. For
    /// what queues behind a user's operation rather than failing (an agent's turn).
    pub async fn begin_after(
        &self,
        op: Operation,
        bound: Duration,
    ) -> ShimResult<OperationGuard<'_>> {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let ended = self.idle.notified();
            tokio::pin!(ended);
            // Registered before the check: an end between the two is not missed.
            ended.as_mut().enable();
            match self.begin(op) {
                Ok(claim) => return Ok(claim),
                Err(busy) => {
                    if tokio::time::timeout_at(deadline, ended).await.is_err() {
                        return Err(busy);
                    }
                }
            }
        }
    }

    /// The container's lock, once no operation runs (waiting up to `bound` for
    /// the running one to end). An operation claimed later waits for the lock
    /// and so sees what the holder did (an exec being started, say).
    pub async fn lock_idle(&self, bound: Duration) -> ShimResult<InstanceGuard<'_>> {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let ended = self.idle.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let running = *self.operation.lock().unwrap_or_else(|e| e.into_inner());
            match running {
                None => {
                    let guard = self.lock().await?;
                    if self.require_idle().is_ok() {
                        return Ok(guard);
                    }
                }
                Some(op) => {
                    if tokio::time::timeout_at(deadline, ended).await.is_err() {
                        return Err(busy(&self.id, op));
                    }
                }
            }
        }
    }

    /// Fails with [`ShimError::Busy`] while a long operation runs.
    pub fn require_idle(&self) -> ShimResult<()> {
        match *self.operation.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(running) => Err(busy(&self.id, running)),
            None => Ok(()),
        }
    }
}

/// What [`Slot::try_lock`] found.
pub enum TryLock<'a> {
    /// The lock, now held.
    Locked(InstanceGuard<'a>),
    /// Somebody holds it.
    Held,
    /// The container is gone (or its creation failed).
    Gone,
}

/// A claim on a container for one [`Operation`]; released on drop.
#[derive(Debug)]
pub struct OperationGuard<'a> {
    slot: &'a Slot,
}

impl Drop for OperationGuard<'_> {
    fn drop(&mut self) {
        *self
            .slot
            .operation
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
        self.slot.idle.notify_waiters();
    }
}

/// The shim's containers by id.
#[derive(Debug, Default)]
pub struct Containers {
    map: Mutex<HashMap<String, Arc<Slot>>>,
}

impl Containers {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The container `id`.
    pub fn get(&self, id: &str) -> ShimResult<Arc<Slot>> {
        self.map().get(id).cloned().ok_or_else(|| not_found(id))
    }

    /// Every container, in no order.
    pub fn all(&self) -> Vec<Arc<Slot>> {
        self.map().values().cloned().collect()
    }

    /// Whether the shim serves no container.
    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }

    /// Reserves `id` for a container being created, and holds its lock: an exit
    /// of a process the creation starts waits for the lock, so it is seen once
    /// the instance is in place. Fails if the id is taken.
    pub fn reserve(&self, id: &str) -> ShimResult<Arc<Slot>> {
        let mut map = self.map();
        if map.contains_key(id) {
            return Err(ShimError::AlreadyExists(format!(
                "container {id} already exists"
            )));
        }
        let slot = Arc::new(Slot::new(id));
        map.insert(id.to_string(), slot.clone());
        Ok(slot)
    }

    /// Forgets `id` (after a failed create, or its delete).
    pub fn remove(&self, id: &str) {
        self.map().remove(id);
    }
}

/// A reserved slot whose instance is being made: holds the slot's lock, and
/// removes the reservation if dropped before [`Creating::fill`].
pub struct Creating<'a> {
    containers: &'a Containers,
    slot: &'a Slot,
    guard: Option<MutexGuard<'a, Option<Instance>>>,
}

impl<'a> Creating<'a> {
    /// Locks a slot just reserved with [`Containers::reserve`].
    pub async fn new(containers: &'a Containers, slot: &'a Slot) -> Creating<'a> {
        let guard = slot.instance.lock().await;
        Creating {
            containers,
            slot,
            guard: Some(guard),
        }
    }

    /// Puts the created instance in place; the lock is held until the returned
    /// guard is dropped (so that the create event goes out first).
    pub fn fill(mut self, instance: Instance) -> InstanceGuard<'a> {
        let mut guard = self.guard.take().expect("filled once");
        *guard = Some(instance);
        MutexGuard::map(guard, |i| i.as_mut().expect("just set"))
    }
}

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        if self.guard.is_some() {
            self.containers.remove(&self.slot.id);
        }
    }
}

fn not_found(id: &str) -> ShimError {
    ShimError::NotFound(format!("container {id} not found"))
}

fn busy(id: &str, op: Operation) -> ShimError {
    ShimError::Busy(format!("container {id} is busy: {}", op.name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_second_operation_is_refused_as_busy() {
        let containers = Containers::default();
        let slot = containers.reserve("a").unwrap();
        let claim = slot.begin(Operation::Checkpointing).unwrap();
        let err = slot.begin(Operation::RollingBack).unwrap_err();
        assert!(matches!(err, ShimError::Busy(_)), "{err:?}");
        assert_eq!(err.to_string(), "container a is busy: checkpointing");
        assert!(slot.require_idle().is_err());
        drop(claim);
        slot.require_idle().unwrap();
        slot.begin(Operation::RollingBack).unwrap();
    }

    #[test]
    fn test_operation_on_one_container_leaves_another_idle() {
        let containers = Containers::default();
        let a = containers.reserve("a").unwrap();
        let b = containers.reserve("b").unwrap();
        let _claim = a.begin(Operation::Checkpointing).unwrap();
        b.require_idle().unwrap();
        b.begin(Operation::TakingTurn).unwrap();
    }

    #[test]
    fn test_reserving_a_taken_id_fails() {
        let containers = Containers::default();
        containers.reserve("a").unwrap();
        let err = containers.reserve("a").unwrap_err();
        assert!(matches!(err, ShimError::AlreadyExists(_)), "{err:?}");
    }

    #[tokio::test]
    async fn test_queued_operation_starts_when_the_running_one_ends() {
        let containers = Containers::default();
        let slot = containers.reserve("a").unwrap();
        let claim = slot.begin(Operation::Checkpointing).unwrap();
        let waiter = {
            let slot = slot.clone();
            tokio::spawn(async move {
                slot.begin_after(Operation::TakingTurn, Duration::from_secs(10))
                    .await
                    .map(|_| ())
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "must wait for the checkpoint");
        drop(claim);
        waiter.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn test_queued_operation_gives_up_as_busy_after_its_bound() {
        let containers = Containers::default();
        let slot = containers.reserve("a").unwrap();
        let _claim = slot.begin(Operation::RollingBack).unwrap();
        let err = slot
            .begin_after(Operation::TakingTurn, Duration::from_millis(20))
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "container a is busy: rolling back");
        let err = slot.lock_idle(Duration::from_millis(20)).await.unwrap_err();
        assert!(matches!(err, ShimError::Busy(_)), "{err:?}");
    }

    #[tokio::test]
    async fn test_abandoned_creation_frees_the_id() {
        let containers = Containers::default();
        let slot = containers.reserve("a").unwrap();
        {
            let creating = Creating::new(&containers, &slot).await;
            assert!(
                matches!(slot.try_lock(), TryLock::Held),
                "held while creating"
            );
            drop(creating);
        }
        assert!(containers.get("a").is_err());
        containers.reserve("a").unwrap();
    }

    #[tokio::test]
    async fn test_slot_without_instance_is_not_found() {
        let containers = Containers::default();
        let slot = containers.reserve("a").unwrap();
        assert!(matches!(slot.lock().await, Err(ShimError::NotFound(_))));
        assert!(matches!(slot.try_lock(), TryLock::Gone));
    }
}
