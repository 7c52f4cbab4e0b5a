//! Crash injection for tests: `CRAB_FAULT=<point>` makes the process kill itself with
//! SIGKILL when it reaches that point, the way a crash or an OOM kill would stop it.
//! The points sit between the steps of multi-step operations; tests then check that
//! `Store::reconcile` repairs what the dead process left.

use std::sync::OnceLock;

/// Environment variable naming the point to die at.
pub const FAULT_ENV: &str = "CRAB_FAULT";

/// Dies here if `CRAB_FAULT` names this point.
pub fn point(name: &str) {
    static CHOSEN: OnceLock<Option<String>> = OnceLock::new();
    let chosen = CHOSEN.get_or_init(|| std::env::var(FAULT_ENV).ok());
    if chosen.as_deref() == Some(name) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::SIGKILL);
        // SIGKILL to ourselves is delivered before kill returns; never continue.
        std::process::abort();
    }
}
