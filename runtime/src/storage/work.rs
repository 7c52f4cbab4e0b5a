//! What every store shares about in-flight work and tree ownership.
//!
//! In-flight work is named `<pid>.<n>.<what>` so that `reconcile` can tell the work of a
//! live process from the leftovers of a dead one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static NONCE: AtomicU64 = AtomicU64::new(0);

/// A fresh name for work of this process: `<pid>.<n>.<what>`.
pub fn tmp_name(what: &str) -> String {
    let n = NONCE.fetch_add(1, Ordering::Relaxed);
    format!("{}.{n}.{what}", std::process::id())
}

/// Whether a work name (from [`tmp_name`]) belongs to a process that still runs.
pub fn owner_alive(name: &str) -> bool {
    name.split('.')
        .next()
        .and_then(|p| p.parse::<i32>().ok())
        .is_some_and(pid_alive)
}

/// Whether process `pid` exists.
pub fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// What `prepare` does with a container that already has a tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// The same containerd container: hand the tree back, writes and all.
    Reuse,
    /// Its containerd container is gone: destroy the tree and make a new one.
    Replace,
    /// Another container owns it: refuse.
    Conflict,
}

/// Decides from the owner the tree recorded and the owner of the new request.
pub fn existing_tree(recorded: Option<&Path>, requested: Option<&Path>) -> Existing {
    match (recorded, requested) {
        (Some(r), Some(o)) if r == o => Existing::Reuse,
        (Some(r), _) if !r.exists() => Existing::Replace,
        _ => Existing::Conflict,
    }
}

/// The recorded owner file's content as a path, if there is one.
pub fn read_owner(file: &Path) -> Option<PathBuf> {
    std::fs::read_to_string(file)
        .ok()
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_work_of_this_process_is_alive_and_of_a_dead_one_is_not() {
        assert!(owner_alive(&tmp_name("x")));
        assert!(!owner_alive("999999999.0.x"));
        assert!(!owner_alive("garbage"));
    }

    #[test]
    fn test_existing_tree_decisions() {
        let here = Path::new("/");
        let gone = Path::new("/nonexistent/owner");
        assert_eq!(existing_tree(Some(here), Some(here)), Existing::Reuse);
        assert_eq!(existing_tree(Some(gone), Some(here)), Existing::Replace);
        assert_eq!(existing_tree(Some(here), Some(gone)), Existing::Conflict);
        assert_eq!(existing_tree(None, Some(here)), Existing::Conflict);
    }
}
