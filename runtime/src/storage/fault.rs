//! Crash injection for tests: the process kills itself with SIGKILL when it reaches a
//! chosen point, the way a crash or an OOM kill would stop it. The points sit between
//! the steps of multi-step operations (a checkpoint, a rollback, a store's snapshot);
//! tests then check that what the dead process left is repaired or discarded.
//!
//! The point is chosen by `CRAB_FAULT=<point>` in the environment, or by the file the
//! configuration's `fault_file` names (which reaches the helper processes of a shim
//! that containerd started, whose environment a test cannot set). A `shim:` prefix kills
//! the parent process first: a helper at that point takes its shim down with it.
//!
//! The shim's own points ([`shim_point`]) are named with the `shim:` prefix too (the
//! shim dies there); the shim reads its configuration's file at each such point, since
//! it outlives the operations a test arms. `crabctl`'s points ([`point`] in its own
//! process) are chosen by `CRAB_FAULT` alone: a test starts crabctl itself.

use std::sync::OnceLock;

/// Environment variable naming the point to die at.
pub const FAULT_ENV: &str = "CRAB_FAULT";

/// Prefix of a point at which the parent (the shim of a helper) dies too.
const PARENT_PREFIX: &str = "shim:";

static CHOSEN: OnceLock<Option<String>> = OnceLock::new();

/// Chooses the point named in `file` (the configuration's `fault_file`), unless the
/// environment chose one (or a point was reached already). Called once, when a
/// helper starts.
pub fn choose_from(file: Option<&std::path::Path>) {
    let from_file = file
        .and_then(|f| std::fs::read_to_string(f).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    let _ = CHOSEN.set(std::env::var(FAULT_ENV).ok().or(from_file));
}

/// The shim dies here (and nothing else: its parent is containerd or init) if `file`
/// names `shim:<name>`.
pub fn shim_point(name: &str, file: Option<&std::path::Path>) {
    let Some(chosen) = file.and_then(|f| std::fs::read_to_string(f).ok()) else {
        return;
    };
    if chosen.trim().strip_prefix(PARENT_PREFIX) != Some(name) {
        return;
    }
    tracing::warn!(point = name, "fault injection: the shim crashes here");
    let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::SIGKILL);
    // SIGKILL to ourselves is delivered before kill returns; never continue.
    std::process::abort();
}

/// Dies here if this point was chosen.
pub fn point(name: &str) {
    let chosen = CHOSEN.get_or_init(|| std::env::var(FAULT_ENV).ok());
    let Some(chosen) = chosen.as_deref() else {
        return;
    };
    let (parent_too, chosen) = match chosen.strip_prefix(PARENT_PREFIX) {
        Some(rest) => (true, rest),
        None => (false, chosen),
    };
    if chosen != name {
        return;
    }
    tracing::warn!(point = name, parent_too, "fault injection: crashing here");
    if parent_too {
        let _ = nix::sys::signal::kill(nix::unistd::getppid(), nix::sys::signal::SIGKILL);
    }
    let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::SIGKILL);
    // SIGKILL to ourselves is delivered before kill returns; never continue.
    std::process::abort();
}
