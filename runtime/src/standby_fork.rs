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
//! - the replica's tracking cgroup (cgroup2, which cannot rename) becomes the
//!   fork's, as in a rollback's adoption: its state names it, and the inspector
//!   follows ([`Container::with_tracking`]);
//! - on a cgroup v2-only host, the processes move into the fork's cgroup (its
//!   tracking cgroup too). Such a host's replica for a spec with a cgroup view
//!   is refused when it is made.

use std::path::Path;

use libcgroups::common::CgroupManager;
use libcontainer::config::YoukiConfig;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::{hierarchies, rebind, refused, Adopted, Leftovers, Standby, Use};
use crate::checkpoint::restore_helper::{own_cgroup_path, save_state};
use crate::config::Config;
use crate::container::{Container, Retracked};
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
    /// init's pid, the container as it is then (on a host with cgroup v1
    /// hierarchies it takes the replica's tracking cgroup, as a rollback's
    /// adoption does) and what is left to clean. On an error nothing of the
    /// replica runs and the container, unchanged, has no processes: the caller
    /// restores the slow way.
    pub fn adopt_fork_replica(
        &self,
        config: &Config,
        standby: Standby,
        rootfs: &Path,
        dumped_id: &str,
    ) -> Result<Adopted> {
        let started = std::time::Instant::now();
        let id = self.state.id.clone();
        let mut leftovers = Leftovers {
            id: id.clone(),
            killed: Vec::new(),
            standby,
            forget: None,
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
            let lc_bundle = crate::userns::staged_binds::libcontainer_bundle(
                &self.root,
                &id,
                &self.state.bundle,
                &spec,
            )?;
            save_state(&id, leftovers.standby.pid, &lc_bundle, &self.dir(), &youki)?;
            // The last step that can fail: the container stays as it was until
            // it succeeds.
            let container = self.take_tracking(config, &leftovers.standby, &pids)?;
            Ok::<_, Error>((container, t.elapsed().as_micros() as u64))
        })();
        let (container, cgroups_us) = match taken {
            Ok(v) => v,
            Err(e) => return fail(leftovers, &pids, e),
        };
        // What the fork's Create made, when it took the replica's.
        let container = leftovers.after(self, container);
        crate::resume::continue_processes(&pids, &leftovers.standby.stopped);
        tracing::debug!(%id, cgroups_us, adopted_us = started.elapsed().as_micros() as u64,
            "replica for forks adopted");
        Ok(Adopted {
            pid: leftovers.standby.pid,
            container,
            leftovers,
        })
    }

    /// Makes the replica's processes `pids` those of this fork's tracking
    /// cgroup: on a host with cgroup v1 hierarchies by taking the replica's
    /// ([`Container::with_tracking`]: no process moves, so no kernel grace
    /// period), else (a cgroup v2-only host, whose tracking cgroup is the fork's
    /// own, [`take_cgroups`] moved them there) by moving them. Answers the
    /// container as it is then.
    fn take_tracking(&self, config: &Config, standby: &Standby, pids: &[i32]) -> Result<Retracked> {
        if super::cgroups::rollback_renames() {
            return self.with_tracking(config, &standby.tracking);
        }
        let tracking = self.tracking();
        tracking.create()?;
        for &pid in pids {
            tracking.add(pid)?;
        }
        self.save_state()?;
        Ok(Retracked::kept(self.clone()))
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
        super::cgroups::rename_v1(&standby.cgroup_path, to)?;
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
