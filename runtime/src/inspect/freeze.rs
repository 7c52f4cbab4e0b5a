//! A checkpoint's frozen section: the container held still while its files are
//! snapshotted and its processes dumped, and, after the thaw, the freeze's own
//! cost taken out of what the inspector counts.

use std::time::Instant;

use super::{load_baseline, procs, save_baseline};
use crate::container::Container;
use crate::Result;

/// The most CPU time a task may use between the thaw and [`settle`] and still
/// count as having only restarted its system call.
const SETTLE_MAX_NS: u64 = 500_000;
/// How long [`settle`] waits for a task that ran since the thaw to block again.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_millis(50);
/// How long it waits for one that has not run since the thaw.
const SETTLE_WAIT_UNRUN: std::time::Duration = std::time::Duration::from_millis(500);

/// Where a task was blocked in user space before a freeze, and the CPU time
/// from which [`settle`] counts the freeze's cost.
#[derive(Debug, Clone)]
pub struct Position {
    tid: i32,
    sp: String,
    pc: String,
    from_ns: Option<u64>,
}

/// [`Position`]s of a container's tasks blocked in a system call.
pub type Positions = Vec<Position>;

/// Reads [`Positions`] of the container's tasks (before it is frozen).
fn positions(c: &Container) -> Positions {
    let mut out = Vec::new();
    for t in procs::tasks(c.tracking().path()) {
        if let Some((sp, pc)) = procs::blocked_at(t.tid) {
            out.push(Position {
                tid: t.tid,
                sp,
                pc,
                from_ns: Some(t.runtime_ns),
            });
        }
    }
    out
}

/// After a dump, just before the thaw: the baseline was written while frozen
/// (the dump's parasite ran in the tasks, and counts), so only the thaw's cost
/// is left to settle; it is counted from the CPU times read now.
fn note_frozen(positions: &mut Positions) {
    for p in positions.iter_mut() {
        p.from_ns = procs::task(p.tid).map(|t| t.runtime_ns);
    }
}

/// After a checkpoint's thaw: freezing and thawing make every task run a
/// little (it leaves its system call for the freezer and restarts it), which
/// would read as "ran" at the next classification. A task that is blocked
/// again at the same user stack pointer and instruction as before the freeze
/// made no progress in user space: the CPU time it used since its position
/// was read (just before the freeze; after a dump, just before the thaw, see
/// [`note_frozen`]) is added to its baseline, when it is microseconds. Only
/// that: work done before stays visible, so this is sound after a
/// file-system-only checkpoint too, whose baseline is older.
fn settle(c: &Container, before: &Positions) {
    let Some(mut base) = load_baseline(c) else {
        return;
    };
    let started = Instant::now();
    let mut pending: Vec<&Position> = before.iter().filter(|p| p.from_ns.is_some()).collect();
    // A task that ran since the thaw and is not blocked again is working: it
    // gets SETTLE_WAIT. One that has not run yet waits for a CPU (a loaded host
    // after a large dump), which says nothing of its work: it gets longer.
    let waiting = |p: &Position| {
        let not_run = procs::task(p.tid).map(|t| t.runtime_ns) == p.from_ns;
        started.elapsed()
            < if not_run {
                SETTLE_WAIT_UNRUN
            } else {
                SETTLE_WAIT
            }
    };
    while !pending.is_empty() {
        pending.retain(|p| match procs::blocked_at(p.tid) {
            Some((sp, pc)) if sp == p.sp && pc == p.pc => {
                if let (Some(b), Some(now), Some(from)) = (
                    base.tasks.iter_mut().find(|t| t.tid == p.tid),
                    procs::task(p.tid),
                    p.from_ns,
                ) {
                    // Leaving and restarting a system call costs microseconds;
                    // more than that is work, which must stay visible.
                    let thaw = now.runtime_ns.saturating_sub(from);
                    if b.start == now.start && thaw < SETTLE_MAX_NS {
                        b.runtime_ns += thaw;
                    } else {
                        tracing::debug!(tid = p.tid, thaw_ns = thaw, "freeze cost not settled: it ran");
                    }
                }
                false
            }
            Some((sp, pc)) => {
                tracing::debug!(tid = p.tid, %sp, %pc, was_sp = %p.sp, was_pc = %p.pc, "freeze cost not settled: blocked elsewhere");
                false
            }
            None if waiting(p) => true,
            None => {
                tracing::debug!(
                    tid = p.tid,
                    waited_ms = started.elapsed().as_millis() as u64,
                    "freeze cost not settled: not blocked again"
                );
                false
            }
        });
        if !pending.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    if let Err(e) = save_baseline(c, &base) {
        tracing::warn!(id = %c.state.id, error = %e, "write settled baseline");
    }
}

/// A checkpoint's frozen section, shared by every path that freezes a
/// container to capture it: positions are read before the freeze (for
/// [`settle`]), and the thaw is followed by the settle of the freeze's cost.
pub struct Freeze {
    positions: Positions,
    froze: bool,
}

impl Freeze {
    /// Freezes `c` when `freeze` (a paused container stays as it is). With
    /// `track`, the inspector's baseline is settled after the thaw: false when
    /// the tasks will not keep running (a dump with exit).
    pub fn begin(c: &Container, freeze: bool, track: bool) -> Result<Freeze> {
        let positions = if freeze && track {
            positions(c)
        } else {
            Vec::new()
        };
        if freeze {
            c.pause()?;
        }
        Ok(Freeze {
            positions,
            froze: freeze,
        })
    }

    /// Thaws `c` (if [`Freeze::begin`] froze it). `dumped`: a CRIU dump ran in
    /// the section (see [`note_frozen`]); `ok`: the section succeeded, so its
    /// baseline is the one to settle.
    pub fn end(mut self, c: &Container, dumped: bool, ok: bool) {
        if !self.froze {
            return;
        }
        if dumped {
            note_frozen(&mut self.positions);
        }
        if let Err(e) = c.resume() {
            tracing::warn!(id = %c.state.id, error = %e, "thaw after checkpoint");
        }
        if ok {
            // After a snapshot only as well: its freeze made the tasks run a
            // little too.
            settle(c, &self.positions);
        }
    }
}
