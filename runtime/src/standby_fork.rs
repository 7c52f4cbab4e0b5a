//! A fork that adopts a replica: a new container, forked from a checkpoint of
//! another one in the same shim, takes a replica of that checkpoint made ahead of
//! time ([`Use::Fork`]) instead of restoring it with CRIU.
//!
//! Nothing is replaced, unlike a rollback's adoption: the fork has no processes
//! yet. Its tree (a clone of the same snapshot, made at its `Create`) is exchanged
//! for the replica's, and the replica's cgroups become the fork's own:
//!
//! - in every cgroup v1 hierarchy by a rename in place (the fork's cgroup is a
//!   sibling of the source's, `/<namespace>/<fork id>`, as a restore gives it):
//!   no process moves, and the replica's cgroup view, bound to those very
//!   directories, is the fork's;
//! - in cgroup2 (the tracking cgroup, and a v2-only host's cgroups), which
//!   cannot rename, the processes move, as in a rollback's adoption. A v2-only
//!   host's replica for a spec with a cgroup view is refused when it is made.

use std::path::{Path, PathBuf};

use libcgroups::common::CgroupManager;
use libcontainer::config::YoukiConfig;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::{hierarchies, rebind, refused, Leftovers, Standby, Use};
use crate::checkpoint::restore_helper::{own_cgroup_path, save_state};
use crate::config::Config;
use crate::container::Container;
use crate::{Error, Result};

/// Refuses a replica for forks that could not become a fork's (at its making).
pub(super) fn check_makeable(spec: &oci_spec::runtime::Spec) -> Result<()> {
    if crate::cgroup2::unified() && crate::cgroup_view::spec_mount(spec).is_some() {
        return Err(refused(
            "on a cgroup v2-only host a fork's cgroup view could not follow its replica \
             (cgroup2 cannot rename a cgroup)",
        ));
    }
    Ok(())
}

impl Container {
    /// Makes `standby`, a replica for forks of the checkpoint this new container
    /// is forked from (`dumped_id`: the checkpointed container), this container's
    /// processes. `rootfs`: where its tree is bound (`bundle/rootfs`). Answers the
    /// init's pid and what is left to clean. On an error nothing of the replica
    /// runs and the container has no processes: the caller restores the slow way.
    pub fn adopt_fork_replica(
        &self,
        config: &Config,
        standby: Standby,
        rootfs: &Path,
        dumped_id: &str,
    ) -> Result<(i32, Leftovers)> {
        let started = std::time::Instant::now();
        let id = self.state.id.clone();
        let leftovers = Leftovers {
            id: id.clone(),
            killed: Vec::new(),
            standby,
        };
        let fail = |leftovers: Leftovers, pids: &[i32], e: Error| {
            for &pid in pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = leftovers.standby.tracking.kill_all();
            let mut leftovers = leftovers;
            leftovers.killed.extend_from_slice(pids);
            let _ = leftovers.clean(config);
            Err(e)
        };
        if leftovers.standby.usage != Use::Fork {
            let e = Error::WrongState {
                id,
                state: "offered a rollback's replica".into(),
                operation: "adopt a replica for forks",
            };
            return fail(leftovers, &[], e);
        }
        let pids = match leftovers.standby.pids() {
            Ok(p) if p.contains(&leftovers.standby.pid) => p,
            Ok(_) => {
                let e = Error::WrongState {
                    id,
                    state: "offered a replica whose init is gone".into(),
                    operation: "adopt a replica for forks",
                };
                return fail(leftovers, &[], e);
            }
            Err(e) => return fail(leftovers, &[], e),
        };
        let spec = match crate::container::load_spec(&self.state.bundle) {
            Ok(s) => s,
            Err(e) => return fail(leftovers, &pids, e),
        };
        let mut youki = match YoukiConfig::from_spec(&spec, &id) {
            Ok(y) => y,
            Err(e) => {
                let e = Error::InvalidSpec {
                    bundle: self.state.bundle.clone(),
                    message: e.to_string(),
                };
                return fail(leftovers, &pids, e);
            }
        };
        youki.cgroup_path = own_cgroup_path(&youki.cgroup_path, dumped_id, &id);
        let taken = (|| {
            let store = Container::open_store(config)?;
            let key = self.key()?;
            // A replica whose tree the fork's Create took is in place already.
            if !leftovers.standby.tree_given {
                store.exchange_tree(&key, &leftovers.standby.tree)?;
                rebind(&store.rootfs(&key)?, rootfs)?;
            }
            let t = std::time::Instant::now();
            take_cgroups(&id, &leftovers.standby, &pids, &youki.cgroup_path, &spec)?;
            let tracking = self.tracking();
            tracking.create()?;
            for &pid in &pids {
                tracking.add(pid)?;
            }
            let cgroups_us = t.elapsed().as_micros() as u64;
            let lc_bundle = crate::userns::staged_binds::libcontainer_bundle(
                &self.root,
                &id,
                &self.state.bundle,
                &spec,
            )?;
            save_state(&id, leftovers.standby.pid, &lc_bundle, &self.dir(), &youki)?;
            self.save_state()?;
            Ok::<_, Error>(cgroups_us)
        })();
        let cgroups_us = match taken {
            Ok(us) => us,
            Err(e) => return fail(leftovers, &pids, e),
        };
        for &pid in &pids {
            // A process that ended meanwhile is not an error.
            let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
        }
        tracing::debug!(%id, cgroups_us, adopted_us = started.elapsed().as_micros() as u64,
            "replica for forks adopted");
        Ok((leftovers.standby.pid, leftovers))
    }
}

/// Makes the replica's cgroups the fork's (`to`): renamed in every v1 hierarchy
/// that has them; in a v2-only host's tree, made and the processes `pids` moved.
/// The fork's resources are applied where its spec asks other than the
/// replica's cgroups hold (an agent's fork template), and always on v2.
fn take_cgroups(
    id: &str,
    standby: &Standby,
    pids: &[i32],
    to: &Path,
    spec: &oci_spec::runtime::Spec,
) -> Result<()> {
    let cgroup_err = |operation: &'static str| {
        move |e: libcgroups::common::AnyManagerError| Error::Cgroup {
            operation,
            message: e.to_string(),
        }
    };
    if !crate::cgroup2::unified() {
        rename_v1(&standby.cgroup_path, to)?;
        // The replica's cgroups already hold what the source's spec asked; a
        // fork from an agent's template may ask otherwise.
        if crate::container::resources_of(spec) == &standby.resources {
            return Ok(());
        }
        let manager = crate::container::cgroup_manager_at(id, to)?;
        return crate::container::apply_resources(&manager, spec);
    }
    let manager = crate::container::cgroup_manager_at(id, to)?;
    manager
        .add_task(Pid::from_raw(standby.pid))
        .map_err(cgroup_err("make the fork's cgroup"))?;
    for file in hierarchies(&standby.cgroup_path, to) {
        for &pid in pids {
            std::fs::write(&file, pid.to_string())
                .map_err(Error::io(format!("move pid {pid} into {}", file.display())))?;
        }
    }
    crate::container::apply_resources(&manager, spec)
}

/// Renames the cgroup `from` to its sibling `to` in every v1 hierarchy that has
/// it; on a failure, renames back what it renamed.
fn rename_v1(from: &Path, to: &Path) -> Result<()> {
    let (from, to) = (
        from.strip_prefix("/").unwrap_or(from),
        to.strip_prefix("/").unwrap_or(to),
    );
    if from.parent() != to.parent() {
        return Err(Error::Cgroup {
            operation: "rename a replica's cgroups",
            message: format!(
                "{} is not a sibling of {}: the fork's cgroup is elsewhere",
                to.display(),
                from.display()
            ),
        });
    }
    let mut done: Vec<(PathBuf, PathBuf)> = Vec::new();
    for base in crate::cgroup2::v1_hierarchies() {
        let (old, new) = (base.join(from), base.join(to));
        if !old.is_dir() {
            continue;
        }
        if let Err(e) = std::fs::rename(&old, &new) {
            for (o, n) in done.iter().rev() {
                let _ = std::fs::rename(n, o);
            }
            return Err(Error::io(format!(
                "rename cgroup {} to {}",
                old.display(),
                new.display()
            ))(e));
        }
        done.push((old, new));
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
    }
}
