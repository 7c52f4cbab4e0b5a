//! A replica's cgroup v1 directories made a container's by renames, which move
//! no process.
//!
//! Moving a process between cgroups takes the kernel's `cgroup_threadgroup_rwsem`
//! for writing, and the first move after a quiet spell waits for an RCU grace
//! period (about 6.5 ms on this project's hosts, unless cgroup2 is mounted with
//! `favordynmods`: docs/standby.md). A rename takes only the cgroup mutex (about
//! 17 µs per hierarchy). cgroup v1 allows a rename within the same parent, with
//! processes inside; cgroup2 allows none, so a hybrid host's tracking cgroup is
//! switched instead of renamed ([`crate::container::Container::with_tracking`]),
//! and a cgroup v2-only host moves the processes.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// Whether this host adopts a replica for a rollback by renames (cgroup v1
/// hierarchies and a tracking cgroup of Crab's) rather than by moving its
/// processes (a cgroup v2-only host, whose container cgroup is its
/// orchestrator's and cannot be renamed). Decided alike when a replica is
/// made (its cgroup view) and when it is adopted. Where it moves them, each
/// adoption waits for a kernel grace period unless cgroup2 is mounted
/// `favordynmods` ([`crate::cgroup2::favors_dynamic_moves`]).
pub fn rollback_renames() -> bool {
    !crate::cgroup2::unified()
}

/// Both paths relative to each hierarchy's root, refused unless siblings.
fn siblings<'a>(from: &'a Path, to: &'a Path) -> Result<(&'a Path, &'a Path)> {
    let (from, to) = (
        from.strip_prefix("/").unwrap_or(from),
        to.strip_prefix("/").unwrap_or(to),
    );
    if from.parent() != to.parent() {
        return Err(Error::Cgroup {
            operation: "rename a replica's cgroups",
            message: format!(
                "{} is not a sibling of {}: the container's cgroup is elsewhere",
                to.display(),
                from.display()
            ),
        });
    }
    Ok((from, to))
}

/// Renames done so far, undone in reverse order on a failure.
#[derive(Default)]
struct Renames(Vec<(PathBuf, PathBuf)>);

impl Renames {
    fn rename(&mut self, old: PathBuf, new: PathBuf) -> Result<()> {
        std::fs::rename(&old, &new).map_err(Error::io(format!(
            "rename cgroup {} to {}",
            old.display(),
            new.display()
        )))?;
        self.0.push((old, new));
        Ok(())
    }

    fn undo(self) {
        for (old, new) in self.0.into_iter().rev() {
            if let Err(e) = std::fs::rename(&new, &old) {
                tracing::warn!(from = %new.display(), to = %old.display(), error = %e,
                    "rename a cgroup back");
            }
        }
    }
}

/// Renames the cgroup `from` to its sibling `to` in every v1 hierarchy that has
/// it; on a failure, renames back what it renamed.
pub(crate) fn rename_v1(from: &Path, to: &Path) -> Result<()> {
    let (from, to) = siblings(from, to)?;
    let mut done = Renames::default();
    for base in crate::cgroup2::v1_hierarchies() {
        let old = base.join(from);
        if !old.is_dir() {
            continue;
        }
        if let Err(e) = done.rename(old, base.join(to)) {
            done.undo();
            return Err(e);
        }
    }
    Ok(())
}

/// Exchanges the names of the replica's cgroup `replica` and its sibling, the
/// container's cgroup `own`, in every v1 hierarchy: the replica's processes are
/// then in the container's cgroups (its limits, its statistics, its cgroup
/// view, its OOM events), and what the container's held (its killed processes)
/// is at the replica's name, removed with the replica. Three renames per
/// hierarchy (the kernel exchanges no cgroup names in one step), through
/// `<replica>-old`; on a failure every rename is undone. A hierarchy holding
/// only one of the two is refused: its processes would stay outside the
/// container's cgroup there.
pub(crate) fn swap_v1(replica: &Path, own: &Path) -> Result<()> {
    let (replica, own) = siblings(replica, own)?;
    let mut aside = replica.as_os_str().to_os_string();
    aside.push("-old");
    let aside = PathBuf::from(aside);
    let mut done = Renames::default();
    for base in crate::cgroup2::v1_hierarchies() {
        let (r, o) = (base.join(replica), base.join(own));
        let swapped = match (r.is_dir(), o.is_dir()) {
            (false, false) => continue,
            (true, true) => done
                .rename(o.clone(), base.join(&aside))
                .and_then(|()| done.rename(r.clone(), o))
                .and_then(|()| done.rename(base.join(&aside), r)),
            (has_replica, _) => Err(Error::Cgroup {
                operation: "exchange a replica's cgroups for the container's",
                message: format!(
                    "{} has only the {}'s cgroup",
                    base.display(),
                    if has_replica { "replica" } else { "container" }
                ),
            }),
        };
        if let Err(e) = swapped {
            done.undo();
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replicas_cgroup_is_renamed_only_to_a_sibling() {
        let e = rename_v1(
            Path::new("/crab/web@standby-1-1"),
            Path::new("/other/web-fork-1"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("not a sibling"), "{e}");
        let e = swap_v1(Path::new("/crab/web@standby-1-1"), Path::new("/other/web")).unwrap_err();
        assert!(e.to_string().contains("not a sibling"), "{e}");
    }
}
