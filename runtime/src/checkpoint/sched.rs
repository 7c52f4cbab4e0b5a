//! The host-wide checkpoint scheduler: a bound on dumps, snapshots and restores
//! running at once, two priority classes, promotion, and first-come order.
//!
//! Every shim is its own process, and no daemon is needed to share the bound:
//! - **Slots.** A running checkpoint holds an exclusive `flock` on one of
//!   `checkpoint.max_parallel` files. The kernel drops the lock when its holder
//!   dies, so a killed shim or helper never leaks a slot.
//! - **The queue.** A waiter is a file in `queue/` named
//!   `<class>-<arrival>-<pid>-<tid>`: class `0` is high priority (an LLM answer
//!   is waiting on this checkpoint, or a person asked for it), `1` is low (a turn
//!   checkpoint hidden in the LLM's think time). Names sort into service order:
//!   high before low, then first come (arrival is CLOCK_MONOTONIC, the same clock
//!   for every process). Only the head of the queue may take a free slot.
//! - **Promotion** renames a waiter's file from class 1 to class 0, keeping its
//!   arrival, so it overtakes every low-priority waiter.
//! - **Fairness across containers** follows: one container has at most one
//!   checkpoint waiting (its shim serialises them), and service is first come
//!   within a class, so no container can starve another.
//! - **Liveness.** A waiter whose process is gone (a killed shim) is removed by
//!   whoever sees it. The work-conserving rule holds: a low-priority waiter takes
//!   a free slot when nobody is ahead of it.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// How often a waiter looks at the queue. Slots are held for tens of
/// milliseconds at least, so this adds little to a wait.
const POLL: Duration = Duration::from_millis(2);

/// A held slot; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    _lock: File,
    /// How long the holder waited for it.
    pub waited: Duration,
}

/// The priority of one queued checkpoint, shared with whoever may promote it.
#[derive(Debug, Clone, Default)]
pub struct Priority(Arc<AtomicBool>);

impl Priority {
    /// High priority from the start (a person, or an agent waiting on it).
    pub fn high() -> Priority {
        Priority(Arc::new(AtomicBool::new(true)))
    }

    /// Low priority until promoted (a turn's checkpoint, in the LLM's think time).
    pub fn low() -> Priority {
        Priority::default()
    }

    /// Raises it to high priority; a waiter sees this within one poll.
    pub fn promote(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether it is high priority now.
    pub fn is_high(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// A waiter's place in the queue; removed when dropped.
struct Place {
    dir: PathBuf,
    name: String,
}

impl Place {
    fn class(high: bool) -> char {
        if high {
            '0'
        } else {
            '1'
        }
    }

    fn enqueue(dir: &Path, high: bool) -> Result<Place> {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec, which lives for the call.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
        let nanos = now.tv_sec as u128 * 1_000_000_000 + now.tv_nsec as u128;
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::gettid() };
        let name = format!(
            "{}-{nanos:024}-{}-{tid}",
            Place::class(high),
            std::process::id()
        );
        let path = dir.join(&name);
        File::create(&path).map_err(Error::io(format!("create {}", path.display())))?;
        Ok(Place {
            dir: dir.to_path_buf(),
            name,
        })
    }

    /// Moves this waiter to the high class, keeping its arrival.
    fn promote(&mut self) -> Result<()> {
        if self.name.starts_with('0') {
            return Ok(());
        }
        let name = format!("0{}", &self.name[1..]);
        std::fs::rename(self.dir.join(&self.name), self.dir.join(&name))
            .map_err(Error::io(format!("promote {}", self.name)))?;
        self.name = name;
        Ok(())
    }

    /// Whether this waiter is first among the live ones.
    fn is_head(&self) -> Result<bool> {
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .map_err(Error::io(format!("read {}", self.dir.display())))?
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        for n in names {
            if n == self.name {
                return Ok(true);
            }
            if waiter_alive(&n) {
                return Ok(false);
            }
            // A killed shim's entry: nobody else will remove it.
            let _ = std::fs::remove_file(self.dir.join(&n));
        }
        // Our own entry vanished (someone removed the directory): go ahead.
        Ok(true)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.dir.join(&self.name));
    }
}

/// Whether the process named in a queue entry still runs.
fn waiter_alive(name: &str) -> bool {
    let Some(pid) = name.split('-').nth(2).and_then(|p| p.parse::<i32>().ok()) else {
        return false;
    };
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(e) => e != nix::errno::Errno::ESRCH,
    }
}

fn open_slots(dir: &Path, max: u32) -> Result<Vec<File>> {
    (0..max)
        .map(|i| {
            let p = dir.join(format!("slot-{i}"));
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&p)
                .map_err(Error::io(format!("open {}", p.display())))
        })
        .collect()
}

fn try_any(files: &[File]) -> Result<Option<File>> {
    for f in files {
        // SAFETY: flock on an fd this function's caller owns; no memory is passed.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Some(f.try_clone().map_err(Error::io("dup a slot file"))?));
        }
    }
    Ok(None)
}

/// Takes one of `max` slots under `dir`, queued at `priority` (which may be
/// promoted while it waits). `max == 0` means no bound.
pub fn acquire(dir: &Path, max: u32, priority: &Priority) -> Result<Option<Slot>> {
    if max == 0 {
        return Ok(None);
    }
    let started = Instant::now();
    let queue = dir.join("queue");
    std::fs::create_dir_all(&queue).map_err(Error::io(format!("create {}", queue.display())))?;
    let files = open_slots(dir, max)?;
    let mut place = Place::enqueue(&queue, priority.is_high())?;
    loop {
        if priority.is_high() {
            place.promote()?;
        }
        if place.is_head()? {
            if let Some(lock) = try_any(&files)? {
                drop(place);
                return Ok(Some(Slot {
                    _lock: lock,
                    waited: started.elapsed(),
                }));
            }
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn waiter(
        dir: &Path,
        prio: Priority,
        label: &'static str,
        order: mpsc::Sender<&'static str>,
    ) -> std::thread::JoinHandle<()> {
        let dir = dir.to_path_buf();
        std::thread::spawn(move || {
            let s = acquire(&dir, 1, &prio).unwrap();
            order.send(label).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            drop(s);
        })
    }

    /// Waits until `n` waiters are queued.
    fn queued(dir: &Path, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_dir(dir.join("queue")).unwrap().count() < n {
            assert!(Instant::now() < deadline, "waiters never queued");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn slots_bound_holders_and_free_on_drop() {
        let t = tempfile::tempdir().unwrap();
        let a = acquire(t.path(), 2, &Priority::high()).unwrap().unwrap();
        let b = acquire(t.path(), 2, &Priority::low()).unwrap().unwrap();
        let (tx, rx) = mpsc::channel();
        let dir = t.path().to_path_buf();
        let w = std::thread::spawn(move || {
            let c = acquire(&dir, 2, &Priority::low()).unwrap();
            tx.send(()).unwrap();
            drop(c);
        });
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        drop(a);
        rx.recv_timeout(Duration::from_secs(5)).expect("freed slot");
        w.join().unwrap();
        drop(b);
        assert!(acquire(t.path(), 0, &Priority::low()).unwrap().is_none());
        assert_eq!(
            std::fs::read_dir(t.path().join("queue")).unwrap().count(),
            0
        );
    }

    #[test]
    fn high_priority_overtakes_low_and_low_is_first_come() {
        let t = tempfile::tempdir().unwrap();
        let held = acquire(t.path(), 1, &Priority::high()).unwrap();
        let (tx, rx) = mpsc::channel();
        let l1 = waiter(t.path(), Priority::low(), "low-1", tx.clone());
        queued(t.path(), 1);
        let l2 = waiter(t.path(), Priority::low(), "low-2", tx.clone());
        queued(t.path(), 2);
        let h = waiter(t.path(), Priority::high(), "high", tx.clone());
        queued(t.path(), 3);
        drop(held);
        let order: Vec<_> = (0..3).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(order, ["high", "low-1", "low-2"]);
        for j in [l1, l2, h] {
            j.join().unwrap();
        }
    }

    #[test]
    fn a_promoted_waiter_overtakes_earlier_low_ones() {
        let t = tempfile::tempdir().unwrap();
        let held = acquire(t.path(), 1, &Priority::high()).unwrap();
        let (tx, rx) = mpsc::channel();
        let l1 = waiter(t.path(), Priority::low(), "low-1", tx.clone());
        queued(t.path(), 1);
        let late = Priority::low();
        let l2 = waiter(t.path(), late.clone(), "promoted", tx.clone());
        queued(t.path(), 2);
        late.promote();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !std::fs::read_dir(t.path().join("queue"))
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with('0'))
        {
            assert!(Instant::now() < deadline, "never promoted");
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(held);
        let order: Vec<_> = (0..2).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(order, ["promoted", "low-1"]);
        l1.join().unwrap();
        l2.join().unwrap();
    }

    #[test]
    fn entries_of_dead_waiters_do_not_block_the_queue() {
        let t = tempfile::tempdir().unwrap();
        let queue = t.path().join("queue");
        std::fs::create_dir_all(&queue).unwrap();
        // A killed shim's entry: high class, earliest arrival, a pid that is gone.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        std::fs::write(queue.join(format!("0-{:024}-{dead}-{dead}", 0)), "").unwrap();
        let s = acquire(t.path(), 1, &Priority::low()).unwrap();
        assert!(s.is_some());
        assert_eq!(std::fs::read_dir(&queue).unwrap().count(), 0);
    }
}
