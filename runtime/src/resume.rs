//! Letting a restored tree go: CRIU leaves the tasks stopped when something must
//! happen before they run (a standby waiting to be adopted, protection keys to put
//! back), and whoever finishes that step continues them. No dump holds a process
//! that was itself stopped: such a checkpoint is refused ([`crate::criu::refuse_stopped`]).

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Sends SIGCONT to each of `pids`. A process that ended meanwhile is not an error:
/// whoever waits for the tree sees its end.
pub fn continue_processes(pids: impl IntoIterator<Item = i32>) {
    for pid in pids {
        let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
    }
}
