//! Letting a restored tree go: CRIU leaves the tasks stopped when something must
//! happen before they run (a standby waiting to be adopted, protection keys to put
//! back), and whoever finishes that step continues them, except the processes that
//! were stopped when they were dumped ([`crate::stopped::Record`]): those stay in
//! their stop, as they were.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::stopped::Record;

/// Sends SIGCONT to each of `pids` but those `stopped` names. A process that ended
/// meanwhile is not an error: whoever waits for the tree sees its end.
pub fn continue_processes(pids: &[i32], stopped: &Record) {
    let keep = stopped.among(pids);
    if !keep.is_empty() {
        tracing::debug!(?keep, "restored processes left in their stop");
    }
    for &pid in pids.iter().filter(|p| !keep.contains(p)) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
    }
}
