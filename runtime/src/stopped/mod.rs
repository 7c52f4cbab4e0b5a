//! Processes stopped by a signal (SIGSTOP, a shell's job control), and those
//! about to stop.
//!
//! CRIU dumps a stopped process and restores it stopped, but its ptrace seize of
//! a task that is both stopped and frozen by the v1 freezer waits forever (a
//! kernel limit, CRIU#1905: the seize re-traps a stopped task only while its state
//! says stopped, and a v1-frozen one says frozen). The cgroup v2 freezer leaves a
//! stopped task in its stop, and there CRIU seizes it. So a dump on a host with
//! the v1 freezer that finds a stopped process in the frozen container hands the
//! freeze to the container's v2 tracking cgroup for the dump ([`Handover`]).
//!
//! The v1 freezer hides the stop from the state letter (a frozen task shows `D`,
//! stopped or not), but not from the place the task sleeps: a stopped task sleeps
//! in `do_signal_stop`, frozen or not (read from `/proc/<tid>/wchan`). A stopping
//! signal still pending when the cgroup froze is taken at the thaw CRIU does once
//! it has seized the tasks, so it counts too: SIGSTOP always, SIGTSTP, SIGTTIN and
//! SIGTTOU when the task neither catches, ignores nor blocks them (their default
//! action is to stop).
//!
//! The dump records which processes were stopped ([`record`]): a restore that
//! leaves every task stopped for a step of its own (a standby, protection keys)
//! continues only the others.

mod handover;
mod record;

pub use handover::{hand_back_if_cut, Handover};
pub use record::{record, Record};

use std::path::Path;

/// Where a task in a group stop sleeps.
const STOP_SITE: &str = "do_signal_stop";
/// SIGSTOP's bit in a signal mask (signal n is bit n-1).
const SIGSTOP_BIT: u64 = 1 << (19 - 1);
/// SIGTSTP, SIGTTIN and SIGTTOU: they stop unless handled.
const JOB_CONTROL_BITS: u64 = (1 << (20 - 1)) | (1 << (21 - 1)) | (1 << (22 - 1));

/// Whether task `tid` (a process or one of its threads) is stopped by a signal or
/// will stop as soon as it runs. A task that is gone is not.
pub fn is_stopped(tid: i32) -> bool {
    let proc = Path::new("/proc").join(tid.to_string());
    let Ok(status) = std::fs::read_to_string(proc.join("status")) else {
        return false;
    };
    if field(&status, "State").starts_with('T') || stop_pending(&status) {
        return true;
    }
    let wchan = std::fs::read_to_string(proc.join("wchan")).unwrap_or_default();
    wchan.trim() == STOP_SITE
}

/// Whether process `pid` has a task (itself or a thread) that [`is_stopped`].
pub fn process_stopped(pid: i32) -> bool {
    tasks(pid).into_iter().any(is_stopped)
}

/// Those of processes `pids` that [`process_stopped`].
pub fn stopped_among(pids: &[i32]) -> Vec<i32> {
    pids.iter()
        .copied()
        .filter(|&p| process_stopped(p))
        .collect()
}

/// Whether `cgroup` is in the v1 freezer hierarchy, whose frozen tasks CRIU
/// cannot take when they are stopped too.
pub fn v1_freezer(cgroup: &Path) -> bool {
    cgroup.join("freezer.state").exists()
}

/// The value of `name` in a `/proc/<tid>/status` text ("" when absent).
fn field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map_or("", str::trim)
}

/// The tasks (threads) of process `pid`, itself included.
pub fn tasks(pid: i32) -> Vec<i32> {
    let dir = Path::new("/proc").join(pid.to_string()).join("task");
    let mut tids: Vec<i32> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    if tids.is_empty() {
        tids.push(pid);
    }
    tids
}

/// Whether a `/proc/<tid>/status` text shows a stopping signal pending (for the
/// thread or its whole process) that will stop the task when it is delivered.
fn stop_pending(status: &str) -> bool {
    let mask = |name: &str| u64::from_str_radix(field(status, name), 16).unwrap_or(0);
    let pending = mask("SigPnd") | mask("ShdPnd");
    let handled = mask("SigBlk") | mask("SigIgn") | mask("SigCgt");
    pending & SIGSTOP_BIT != 0 || pending & JOB_CONTROL_BITS & !handled != 0
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A `sleep 100` child.
    pub(in crate::stopped) fn sleeper() -> std::process::Child {
        std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap()
    }

    fn status(pnd: u64, shd: u64, blk: u64, ign: u64, cgt: u64) -> String {
        format!(
            "Name:\tsh\nState:\tS (sleeping)\nSigQ:\t0/95000\nSigPnd:\t{pnd:016x}\n\
             ShdPnd:\t{shd:016x}\nSigBlk:\t{blk:016x}\nSigIgn:\t{ign:016x}\n\
             SigCgt:\t{cgt:016x}\nCapInh:\t0000000000000000\n"
        )
    }

    #[test]
    fn a_pending_sigstop_stops_whatever_the_handlers() {
        assert!(stop_pending(&status(0, SIGSTOP_BIT, !0, !0, !0)));
        assert!(stop_pending(&status(SIGSTOP_BIT, 0, 0, 0, 0)));
    }

    #[test]
    fn a_pending_sigtstp_stops_only_when_not_handled() {
        let tstp = 1 << (20 - 1);
        assert!(stop_pending(&status(0, tstp, 0, 0, 0)));
        assert!(!stop_pending(&status(0, tstp, 0, 0, tstp)), "caught");
        assert!(!stop_pending(&status(0, tstp, 0, tstp, 0)), "ignored");
        assert!(!stop_pending(&status(0, tstp, tstp, 0, 0)), "blocked");
    }

    #[test]
    fn other_pending_signals_do_not_stop() {
        let term_and_cont = (1 << (15 - 1)) | (1 << (18 - 1));
        assert!(!stop_pending(&status(
            term_and_cont,
            term_and_cont,
            0,
            0,
            0
        )));
        assert!(!stop_pending(""));
    }

    /// A child that stops itself is seen stopped, and so is a thread of this
    /// process that is not: the process itself runs.
    #[test]
    fn a_stopped_child_is_seen_and_a_running_one_is_not() {
        let mut child = sleeper();
        let pid = child.id() as i32;
        assert!(!is_stopped(pid));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !is_stopped(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(is_stopped(pid), "a stopped sleep");
        assert_eq!(tasks(pid), vec![pid]);
        child.kill().unwrap();
        child.wait().unwrap();
        let me = std::process::id() as i32;
        assert!(tasks(me).contains(&me));
        assert!(!is_stopped(me));
    }

    /// The case the state letter misses: a stopped task in a frozen v1 freezer
    /// cgroup shows `D`, and is still seen stopped; its running sibling is not.
    #[cfg(feature = "host-tests")]
    #[test]
    fn a_stopped_task_is_seen_in_a_frozen_cgroup() {
        let freezer = Path::new("/sys/fs/cgroup/freezer");
        assert!(freezer.is_dir(), "this test needs the v1 freezer hierarchy");
        let cg = freezer.join(format!("crab-stopped-test-{}", std::process::id()));
        std::fs::create_dir(&cg).unwrap();
        let (mut stopped, mut running) = (sleeper(), sleeper());
        let (s, r) = (stopped.id() as i32, running.id() as i32);
        for pid in [s, r] {
            std::fs::write(cg.join("cgroup.procs"), pid.to_string()).unwrap();
        }
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(s),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
        while crate::inspect::procs::state(s) != Some('T') {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::fs::write(cg.join("freezer.state"), "FROZEN").unwrap();
        while std::fs::read_to_string(cg.join("freezer.state"))
            .unwrap()
            .trim()
            != "FROZEN"
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let seen = (
            crate::inspect::procs::state(s),
            is_stopped(s),
            is_stopped(r),
        );
        std::fs::write(cg.join("freezer.state"), "THAWED").unwrap();
        for c in [&mut stopped, &mut running] {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        std::fs::remove_dir(&cg).unwrap();
        assert_eq!(seen, (Some('D'), true, false));
    }
}
