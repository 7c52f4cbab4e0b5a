//! The shim's own cgroup, when containerd's client names one (`WithShimCgroup`, or
//! runc's `ShimCgroup` option in a runtime's configuration): containerd writes the
//! task's options to the shim's `start` on stdin, `start` joins that cgroup and the
//! shim it spawns is born there. The containers' processes are not: the helper
//! moves each into the container's own cgroups.

use std::path::{Component, Path, PathBuf};

/// Where the host mounts its cgroup hierarchies.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Moves the calling process into `path` in every hierarchy where that cgroup
/// exists (the v1 controllers and the unified tree of a hybrid host, or the
/// unified tree alone). A path found in none of them is an error.
pub fn join(path: &str) -> Result<(), String> {
    let rel = Path::new(path);
    if rel.components().any(|c| c == Component::ParentDir) {
        return Err(format!("shim cgroup {path}: climbs with .."));
    }
    let rel = rel.strip_prefix("/").unwrap_or(rel);
    let pid = std::process::id().to_string();
    let mut joined = Vec::new();
    for dir in hierarchies() {
        let procs = dir.join(rel).join("cgroup.procs");
        if procs.exists() {
            std::fs::write(&procs, &pid).map_err(|e| format!("join {}: {e}", procs.display()))?;
            joined.push(dir);
        }
    }
    // No log line: `start`'s stdout is the address containerd reads.
    if joined.is_empty() {
        return Err(format!("shim cgroup {path}: no hierarchy has it"));
    }
    Ok(())
}

/// The roots of this host's hierarchies: /sys/fs/cgroup itself when it is the
/// unified tree, else each directory below it that is a hierarchy's root.
fn hierarchies() -> Vec<PathBuf> {
    let root = Path::new(CGROUP_ROOT);
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_path_buf()];
    }
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| !p.is_symlink() && p.join("cgroup.procs").exists())
        .collect()
}
