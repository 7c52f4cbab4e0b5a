//! Standby replicas: a checkpoint restored ahead of time, its processes stopped,
//! so that a rollback to it takes milliseconds instead of a CRIU restore.
//!
//! A standby of container `c` at checkpoint `n` is:
//! - a writable clone of `n`'s file-system snapshot, in the pool's in-flight area
//!   ([`crate::storage::Store::standby_tree`]);
//! - `n`'s processes restored by CRIU into it, left stopped (SIGSTOP), in new
//!   namespaces of their own, and in cgroups beside the container's
//!   (`<path>@standby` in every hierarchy, and a tracking cgroup of their own), so
//!   that nothing done to the live container (a kill of all its processes, its
//!   limits, its statistics) reaches them.
//!
//! [`Container::adopt_standby`] makes it the container: the live processes are
//! already gone (the caller killed them), the trees are exchanged in one step,
//! `bundle/rootfs` is bound to the tree again, the stopped processes move into the
//! container's cgroups, libcontainer's state names the new init, and they are
//! continued. The replica is used once; the caller makes the next.
//!
//! What the figures do not cover: the pages CRIU restored stay charged to the
//! standby's memory cgroup (v1 does not move charges unless asked, v2 never), so
//! after an adoption the container's memory limit counts only what it touches
//! anew; the standby's cgroup was given the same limits.

#[path = "standby_memory.rs"]
pub mod memory;

#[path = "standby_fork.rs"]
mod fork;

#[path = "standby_cgroups.rs"]
pub(crate) mod cgroups;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libcgroups::common::CgroupManager;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use oci_spec::runtime::{LinuxNamespaceType, LinuxResources};

use crate::checkpoint::engine::Dumped;
use crate::checkpoint::restore_helper::Restore;
use crate::config::Config;
use crate::container::{Container, Retracked};
use crate::helper::{self, ChildStdio};
use crate::tracking::TrackingCgroup;
use crate::{criu, Error, Result};

/// What the cgroups of a standby add to the container's path, before the
/// standby's own name (`@standby-<shim pid>-<n>`: two standbys of a container, one
/// still being cleaned and one being made, never share a cgroup). A container id
/// cannot hold `@` (containerd's ids are letters, digits and `._-`), so no
/// container's cgroup is ever named so.
pub const CGROUP_SUFFIX: &str = "@standby";

pub use cgroups::rollback_renames;

/// Standbys made by this process so far (for their names).
static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What a replica is for, which decides the cgroups its view shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Use {
    /// The container's own rollback. Its cgroups become the container's at
    /// adoption: on a host with cgroup v1 hierarchies by exchanging names, and
    /// its view shows its own cgroups, as a fork's does; on a cgroup v2-only
    /// host its processes move into the container's cgroup, and its view shows
    /// that one from the start ([`cgroups::rollback_renames`]).
    Rollback,
    /// A fork's processes ([`Container::adopt_fork_replica`]): its cgroups become
    /// the fork's by a rename, and its view shows them.
    Fork,
}

/// Where a standby is restored (the restore's helper reads it).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Target {
    /// Its root file system.
    pub rootfs: PathBuf,
    /// What its cgroups and work directory add to the container's names.
    pub suffix: String,
    /// What it is for.
    pub usage: Use,
}

impl Target {
    /// What the restored processes' cgroup view is to strip from the cgroups the
    /// restore joined ([`crate::cgroup_view::restored`]).
    pub fn view_strips(&self) -> Option<&str> {
        (self.usage == Use::Rollback && !cgroups::rollback_renames())
            .then_some(self.suffix.as_str())
    }
}

/// The checkpoint a standby is made of.
#[derive(Clone, Copy)]
pub struct Of<'a> {
    /// Its number in the container's history.
    pub seq: u64,
    /// Its process image's directory and what CRIU wrote there.
    pub images: &'a Path,
    pub dumped: &'a Dumped,
    /// Its file-system snapshot.
    pub snapshot: &'a str,
    /// Its process image's size: what the replica will hold in memory.
    pub image_bytes: u64,
}

/// A new standby's suffix, unique on the host while this process lives.
fn next_suffix() -> String {
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{CGROUP_SUFFIX}-{}-{n}", std::process::id())
}

/// How long a discard waits for the standby's processes to be gone.
const GONE_WITHIN: Duration = Duration::from_secs(5);

/// The cgroup of the standby `suffix` of the container whose cgroup is `path`.
pub fn cgroup_path(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_os_string();
    p.push(suffix);
    PathBuf::from(p)
}

/// CRIU's work directory for a standby's restore (its log and pid file), inside
/// the container's state directory so that a delete removes it.
pub fn work_dir(root: &Path, id: &str, suffix: &str) -> PathBuf {
    root.join(id).join(suffix.trim_start_matches('@'))
}

/// A checkpoint restored and stopped, ready to become the container.
#[derive(Debug)]
pub struct Standby {
    /// The history entry it is the state of.
    pub seq: u64,
    /// The restored init's host pid.
    pub pid: i32,
    /// How long making it took.
    pub made_in: Duration,
    /// What it is for.
    pub usage: Use,
    id: String,
    tree: PathBuf,
    tracking: TrackingCgroup,
    cgroup_path: PathBuf,
    /// Its CRIU work directory.
    work: PathBuf,
    /// Where its tree is bound as CRIU's root.
    root: PathBuf,
    /// The `cgroup.procs` files of the container's cgroups its processes move to
    /// ([`hierarchies`]), found when it was made.
    moves: Vec<PathBuf>,
    /// The resources its cgroups were given (the container's spec when it was
    /// made): a fork whose spec asks the same needs no cgroup manager to apply
    /// them again (opening one costs about 4 ms on a cgroup v1 host).
    resources: LinuxResources,
    /// Its tree became a fork's own ([`Standby::tree_given`]): the fork keeps
    /// it whatever becomes of the processes.
    tree_given: bool,
    /// Its place in the host's budget ([`reserve`]), given back when it goes.
    place: PathBuf,
    /// Its processes that were stopped when they were dumped: an adoption
    /// leaves them so.
    stopped: crate::stopped::Record,
}

/// What `crabctl stats` shows of a standby.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Info {
    /// The checkpoint it is the state of.
    pub seq: u64,
    /// Its init's host pid.
    pub pid: i32,
    /// The memory its processes hold.
    pub memory_bytes: u64,
    /// How long making it took.
    pub made_ms: u64,
}

impl Standby {
    /// Its tree (in the pool's in-flight area until given away).
    pub fn tree(&self) -> &Path {
        &self.tree
    }

    /// Records that its tree was made a fork's own
    /// ([`crate::storage::in_helper::take_tree`]): the fork's adoption has no
    /// tree to exchange, and discarding the standby leaves the tree alone.
    pub fn tree_given(&mut self) {
        self.tree_given = true;
    }

    /// What `crabctl stats` shows of it.
    pub fn info(&self) -> Info {
        Info {
            seq: self.seq,
            pid: self.pid,
            memory_bytes: self.memory_bytes(),
            made_ms: self.made_in.as_millis() as u64,
        }
    }

    /// Its processes' host pids.
    pub fn pids(&self) -> Result<Vec<i32>> {
        self.tracking.pids()
    }

    /// The memory its processes hold, as its memory cgroup counts it (0 when the
    /// host does not say).
    pub fn memory_bytes(&self) -> u64 {
        memory_usage(&self.cgroup_path).unwrap_or(0)
    }

    /// Kills its processes and removes its cgroups and tree.
    pub fn discard(self, config: &Config) -> Result<()> {
        let started = Instant::now();
        self.tracking.kill_all()?;
        if !self.tracking.wait_empty(GONE_WITHIN)? {
            return Err(Error::WrongState {
                id: self.id.clone(),
                state: "with standby processes that outlive SIGKILL".into(),
                operation: "discard the standby",
            });
        }
        remove_cgroups(&self.id, &self.cgroup_path, &self.tracking);
        unmount(&self.root);
        if !self.tree_given {
            Container::open_store(config)?.discard_tree(&self.tree)?;
        }
        let _ = std::fs::remove_dir_all(&self.work);
        let _ = std::fs::remove_file(&self.place);
        tracing::debug!(id = %self.id, seq = self.seq, ms = started.elapsed().as_millis() as u64,
            "standby discarded");
        Ok(())
    }
}

impl Container {
    /// Makes a standby of checkpoint `of` beside the running container, if the
    /// host's budgets admit it ([`reserve`]). The init's stdio are `stdio` (pipes
    /// the caller starts copying at adoption). Takes no slot: the caller bounds
    /// it. On failure nothing of it is left.
    pub fn make_standby(
        &self,
        config: &Config,
        of: &Of,
        stdio: ChildStdio,
        usage: Use,
    ) -> Result<Standby> {
        let Of {
            seq,
            images,
            dumped,
            snapshot,
            image_bytes,
        } = *of;
        let started = Instant::now();
        if dumped.stdio.tty.is_some() {
            return Err(refused("its processes have a terminal"));
        }
        let spec = crate::container::load_spec(&self.state.bundle)?;
        let stopped = crate::stopped::Record::load(images)?;
        let resources = crate::container::resources_of(&spec).clone();
        let pid_ns = crate::container::owns_namespace(&spec, LinuxNamespaceType::Pid);
        if !crate::netns::owns_network_namespace(&spec) || !pid_ns {
            return Err(refused(
                "it shares a network or pid namespace (the replica would meet the live processes there)",
            ));
        }
        if usage == Use::Fork {
            fork::check_makeable(&spec)?;
        }
        let key = self.key()?;
        let suffix = next_suffix();
        let tracking = TrackingCgroup::at(cgroup_path(&self.tracking_base(config), &suffix));
        let own_cgroup = self.cgroup_path()?;
        let cgroup_path = cgroup_path(&own_cgroup, &suffix);
        let name = format!("{key}{suffix}").replace('/', ".");
        // CRIU's root: the tree bound as the container's own is (the pool is
        // nosuid,nodev; a container's view of its tree is not). Outside the
        // container's state directory, which a restore after a crash removes.
        let root = config.state_dir.join(ROOTS).join(&name);
        let record = Record {
            holder: std::process::id() as i32,
            id: self.state.id.clone(),
            tracking: tracking.path().to_path_buf(),
            cgroup: cgroup_path.clone(),
            root: root.clone(),
        };
        let place = reserve(config, &name, &record, image_bytes)?;
        let store = Container::open_store(config)?;
        let tree = match store.standby_tree(&key, snapshot) {
            Ok(t) => t,
            Err(e) => {
                let _ = std::fs::remove_file(&place);
                return Err(e);
            }
        };
        let work = work_dir(&self.root, &self.state.id, &suffix);
        let made = (|| {
            tracking.create()?;
            crate::storage::in_helper::bind_at(&tree, &root)?;
            let make = |stdio| Restore {
                id: self.state.id.clone(),
                root: self.root.clone(),
                bundle: self.state.bundle.clone(),
                images: images.to_path_buf(),
                criu: criu::Tool::from_config(config),
                stdio,
                dumped: dumped.clone(),
                tracking: tracking.path().to_path_buf(),
                standby: Some(Target {
                    rootfs: root.clone(),
                    suffix: suffix.clone(),
                    usage,
                }),
                in_place: false,
                cgroup_path: Some(own_cgroup.clone()),
            };
            helper::run(make, stdio)
        })();
        match made {
            Ok(restored) => Ok(Standby {
                seq,
                pid: restored.pid,
                made_in: started.elapsed(),
                usage,
                id: self.state.id.clone(),
                tree,
                tracking,
                moves: hierarchies(&cgroup_path, &own_cgroup),
                resources,
                tree_given: false,
                cgroup_path,
                work,
                root,
                place,
                stopped,
            }),
            Err(e) => {
                let _ = tracking.kill_all();
                let _ = tracking.wait_empty(GONE_WITHIN);
                remove_cgroups(&self.state.id, &cgroup_path, &tracking);
                unmount(&root);
                let _ = store.discard_tree(&tree);
                let _ = std::fs::remove_dir_all(&work);
                let _ = std::fs::remove_file(&place);
                Err(e)
            }
        }
    }

    /// Makes `standby` the container. Its own processes `killed` were sent
    /// SIGKILL by the caller and may still be ending: they are in the old tree,
    /// namespaces and network, which nothing of the replica shares. `rootfs`:
    /// where the container's tree is bound (`bundle/rootfs`). Answers the new
    /// init's pid and what is left to clean ([`Leftovers::clean`], off the
    /// caller's path). On an error the replica's processes are killed and nothing
    /// of it runs: the caller restores the slow way into a container without
    /// processes, never into a mix.
    pub fn adopt_standby(
        &self,
        config: &Config,
        standby: Standby,
        rootfs: &Path,
        killed: Vec<i32>,
    ) -> Result<Adopted> {
        let started = Instant::now();
        if standby.usage != Use::Rollback {
            let _ = standby.discard(config);
            return Err(Error::WrongState {
                id: self.state.id.clone(),
                state: "offered a replica made for forks".into(),
                operation: "adopt the standby",
            });
        }
        let pids = standby.pids()?;
        let mut leftovers = Leftovers {
            id: self.state.id.clone(),
            killed,
            standby,
            forget: None,
        };
        if !pids.contains(&leftovers.standby.pid) {
            let seq = leftovers.standby.seq;
            let _ = leftovers.clean(config);
            return Err(Error::WrongState {
                id: self.state.id.clone(),
                state: format!("with a standby of checkpoint {seq} whose init is gone"),
                operation: "adopt the standby",
            });
        }
        let store = Container::open_store(config)?;
        let key = self.key()?;
        if let Err(e) = store.exchange_tree(&key, &leftovers.standby.tree) {
            let _ = leftovers.clean(config);
            return Err(e);
        }
        let exchanged_us = started.elapsed().as_micros() as u64;
        crate::storage::fault::shim_point("standby.exchanged", config.fault_file.as_deref());
        // The replica's files are the container's now (and the old ones at the
        // standby's path, deleted with the leftovers).
        let taken = self.take_over(
            config,
            &leftovers.standby,
            &pids,
            &store.rootfs(&key)?,
            rootfs,
        );
        let retracked = match taken {
            Ok(c) => c,
            Err(e) => {
                let _ = leftovers.standby.tracking.kill_all();
                for &pid in &pids {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
                leftovers.killed.extend(pids);
                let _ = leftovers.clean(config);
                return Err(e);
            }
        };
        let container = leftovers.after(self, retracked);
        tracing::debug!(id = %self.state.id, exchanged_us,
            adopted_us = started.elapsed().as_micros() as u64, "standby adopted");
        Ok(Adopted {
            pid: leftovers.standby.pid,
            container,
            leftovers,
        })
    }

    /// The steps of an adoption after the trees were exchanged: `tree` (the
    /// container's tree) bound on `rootfs` again, libcontainer's state naming the
    /// replica's init, the replica's processes `pids` made the container's
    /// ([`Container::take_cgroups`], the last step that can fail: a failed
    /// adoption restores from the images, which records its own init), then the
    /// processes continued. Answers the container as it is then.
    fn take_over(
        &self,
        config: &Config,
        standby: &Standby,
        pids: &[i32],
        tree: &Path,
        rootfs: &Path,
    ) -> Result<Retracked> {
        let t = Instant::now();
        rebind(tree, rootfs)?;
        let rebound_us = t.elapsed().as_micros() as u64;
        // The container's libcontainer configuration (its cgroup path) stays; the
        // init is the replica's.
        let mut lc = self.lc()?;
        lc.state.pid = Some(standby.pid);
        lc.state.status = libcontainer::container::ContainerStatus::Running;
        lc.save()
            .map_err(Error::libcontainer("record the adopted init"))?;
        let recorded_us = t.elapsed().as_micros() as u64;
        let retracked = self.take_cgroups(config, standby, pids)?;
        let renamed = retracked.container.state.cgroup_id != self.state.cgroup_id;
        tracing::debug!(id = %self.state.id, rebound_us, recorded_us, renamed,
            moved_us = t.elapsed().as_micros() as u64, "standby taken over");
        crate::storage::fault::shim_point("standby.moved", config.fault_file.as_deref());
        crate::resume::continue_processes(pids, &standby.stopped);
        Ok(retracked)
    }

    /// Makes the replica's processes `pids` the container's, in its cgroups and
    /// its tracking cgroup. Where the host allows ([`cgroups::rollback_renames`]),
    /// by renames that move no process: the v1 cgroups exchange names with the
    /// replica's, and the replica's tracking cgroup becomes the container's
    /// ([`Container::with_tracking`]; [`Leftovers::after`] then removes what the
    /// container held: its old tracking cgroup and, at the replica's name, its
    /// old v1 cgroups). Else by moving each process. Answers the container as it
    /// is then.
    fn take_cgroups(&self, config: &Config, standby: &Standby, pids: &[i32]) -> Result<Retracked> {
        if !cgroups::rollback_renames() {
            for &pid in pids {
                self.tracking().add(pid)?;
                for file in &standby.moves {
                    std::fs::write(file, pid.to_string())
                        .map_err(Error::io(format!("move pid {pid} into {}", file.display())))?;
                }
            }
            return Ok(Retracked::kept(self.clone()));
        }
        let own = self.cgroup_path()?;
        cgroups::swap_v1(&standby.cgroup_path, &own)?;
        self.with_tracking(config, &standby.tracking)
            .inspect_err(|_| {
                let _ = cgroups::swap_v1(&standby.cgroup_path, &own);
            })
    }
}

/// A replica made the container: its init, the container as it is now (an
/// adoption by renames gives it another tracking cgroup: whoever holds the
/// container takes this one), and what is left to clean.
#[derive(Debug)]
pub struct Adopted {
    /// The adopted init's host pid.
    pub pid: i32,
    /// The container after the adoption.
    pub container: Container,
    /// What the adoption left ([`Leftovers::clean`], off the caller's path).
    pub leftovers: Leftovers,
}

/// What an adoption leaves: the replaced processes (killed, perhaps not gone
/// yet), and the standby's emptied cgroups, its place in the budget, and the old
/// tree (at the standby's path since the exchange).
#[derive(Debug)]
pub struct Leftovers {
    id: String,
    killed: Vec<i32>,
    standby: Standby,
    /// The container's tracking cgroup id before an adoption by renames gave
    /// it the replica's, and where the inspector is pinned: its records are
    /// dropped with the rest ([`crate::inspect::rewatch`] stopped them).
    forget: Option<(PathBuf, u64)>,
}

impl Leftovers {
    /// Records what the adoption that made `before` into `after` left, and
    /// answers the container as it is now: when the container took the
    /// replica's tracking cgroup ([`Container::with_tracking`]), its old one is
    /// removed in the replica's place, and the inspector's records of it
    /// dropped, if it may hold any (a fork's own, which no task joined, holds
    /// none: no walk of the host's tables then). The replica's record in the
    /// host's budget still names the replica's tracking cgroup, the container's
    /// now: after a crash of this shim, whose container goes with it, the
    /// reconciliation kills what is in it, and leaves alone the container's old
    /// name, which a restore makes again.
    fn after(&mut self, before: &Container, after: Retracked) -> Container {
        let Retracked {
            container,
            old_records,
        } = after;
        if container.state.cgroup_id == before.state.cgroup_id {
            return container;
        }
        self.standby.tracking = before.tracking();
        self.forget = before
            .state
            .bpf_pin_root
            .clone()
            .filter(|_| old_records)
            .map(|pins| (pins, before.state.cgroup_id));
        container
    }

    /// Waits (bounded) for the killed processes to be gone, then removes the rest.
    pub fn clean(self, config: &Config) -> Result<()> {
        let deadline = Instant::now() + GONE_WITHIN;
        while self
            .killed
            .iter()
            .any(|p| Path::new(&format!("/proc/{p}")).exists())
        {
            if Instant::now() > deadline {
                tracing::warn!(id = %self.id, "processes a standby replaced outlive SIGKILL");
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if let Some((pins, cgroup_id)) = &self.forget {
            crate::inspect::unwatch(pins, *cgroup_id);
        }
        self.standby.discard(config)
    }
}

/// The `cgroup.procs` files of the container's cgroup `to`, in every hierarchy
/// in which the standby's cgroup `from` exists (the v1 controllers and named
/// hierarchies the restore joined, or the one v2 hierarchy): writing a pid there
/// moves it as the kernel sees it, without a cgroup manager's probing.
fn hierarchies(from: &Path, to: &Path) -> Vec<PathBuf> {
    let root = Path::new(CGROUP_ROOT);
    let (from, to) = (
        from.strip_prefix("/").unwrap_or(from),
        to.strip_prefix("/").unwrap_or(to),
    );
    let mut bases = vec![root.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(root) {
        // Mount points only: `cpu,cpuacct`-style symlinks name one twice.
        bases.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    bases
        .into_iter()
        .filter(|b| b.join(from).join("cgroup.procs").is_file() && b.join(to).is_dir())
        .map(|b| b.join(to).join("cgroup.procs"))
        .collect()
}

/// Where the cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// What the host's budget records of a standby: enough to remove it when its
/// maker is gone (a shim that crashed leaves its standbys' processes stopped).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Record {
    /// The process that made it (its shim).
    holder: i32,
    /// The container's id.
    id: String,
    /// Its tracking cgroup.
    tracking: PathBuf,
    /// Its cgroup path (relative to each hierarchy's root).
    cgroup: PathBuf,
    /// Where its tree is bound.
    root: PathBuf,
}

/// Admits a standby of a process image of `image_bytes` and takes a place named
/// `name` for it: one step, under the host's lock, so two shims cannot both take
/// the last of a budget. The budgets are the host's memory ([`memory::refusal`])
/// and its count ([`crate::config::Standby::max_per_host`]): a file per standby
/// under the state directory, recording it. The standbys of processes that are
/// gone (a crashed shim) are killed and their places freed first.
fn reserve(config: &Config, name: &str, record: &Record, image_bytes: u64) -> Result<PathBuf> {
    let dir = config.state_dir.join("standbys");
    let _lock = crate::checkpoint::history_store::lock(&dir.join(".lock"))?;
    if let Some(why) = memory::refusal(config, image_bytes, memory::available()) {
        return Err(refused(&why));
    }
    let held = reconcile_in(&dir);
    if held >= config.standby.max_per_host as usize {
        return Err(refused(&format!(
            "the host keeps {held} standbys already (standby.max_per_host)"
        )));
    }
    let mine = dir.join(name.replace('/', "."));
    let json = serde_json::to_vec(record).expect("a record serializes");
    std::fs::write(&mine, json).map_err(Error::io(format!("write {}", mine.display())))?;
    Ok(mine)
}

/// Kills and removes the standbys whose maker is gone, as recorded in the
/// budget directory `dir` (the caller holds its lock); answers how many standbys
/// live ones hold. Their trees are the store's in-flight work, which its own
/// reconciliation removes.
fn reconcile_in(dir: &Path) -> usize {
    let mut held = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = e.path();
        let record: Option<Record> = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        match record {
            // A killed shim stays a zombie until its parent reaps it: gone.
            Some(r) if crate::storage::work::pid_alive(r.holder) => held += 1,
            Some(r) => {
                let tracking = TrackingCgroup::at(r.tracking);
                let _ = tracking.kill_all();
                let _ = tracking.wait_empty(GONE_WITHIN);
                remove_cgroups(&r.id, &r.cgroup, &tracking);
                unmount(&r.root);
                tracing::info!(id = %r.id, holder = r.holder, "standby of a process that is gone: removed");
                let _ = std::fs::remove_file(&path);
            }
            None => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    held
}

/// Removes the standbys of shims that are gone (see [`reserve`]).
pub fn reconcile(config: &Config) {
    let dir = config.state_dir.join("standbys");
    if !dir.exists() {
        return; // the host never made one
    }
    match crate::checkpoint::history_store::lock(&dir.join(".lock")) {
        Ok(_lock) => {
            reconcile_in(&dir);
        }
        Err(e) => tracing::warn!(error = %e, "lock the standby budget"),
    }
}

pub(crate) fn refused(why: &str) -> Error {
    Error::Storage {
        operation: "make a standby",
        message: format!("no standby for this container: {why}"),
    }
}

/// Removes a standby's (empty) cgroups; a failure is logged, as a leftover
/// empty cgroup costs nothing but a name.
fn remove_cgroups(id: &str, path: &Path, tracking: &TrackingCgroup) {
    // A fork that adopted the standby renamed its cgroups into its own: nothing
    // is left to remove there, and a manager would cost more than looking.
    if !hierarchies(path, path).is_empty() {
        match crate::container::cgroup_manager_at(id, path) {
            Ok(m) => {
                if let Err(e) = m.remove() {
                    tracing::warn!(%id, error = %e, "remove a standby's cgroups");
                }
            }
            Err(e) => tracing::warn!(%id, error = %e, "remove a standby's cgroups"),
        }
    }
    crate::cgroup_view::leave_systemd(path);
    if let Err(e) = tracking.destroy() {
        tracing::warn!(%id, error = %e, "remove a standby's tracking cgroup");
    }
}

/// Binds `tree` on `target` again, in place of what was bound there (the tree
/// the exchange moved away, which is then deleted), as the store binds it.
fn rebind(tree: &Path, target: &Path) -> Result<()> {
    use nix::mount::{umount2, MntFlags};
    umount2(target, MntFlags::MNT_DETACH)
        .map_err(Error::sys(format!("unmount {}", target.display())))?;
    crate::storage::in_helper::bind_at(tree, target)
}

/// Where standbys' trees are bound, under the state directory.
const ROOTS: &str = "standby-roots";

/// Detaches whatever is mounted at `target` (a standby's root: its processes'
/// own mount namespace keeps its copy) and removes the mount point; nothing
/// mounted is not an error.
fn unmount(target: &Path) {
    let _ = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir(target);
}

/// `memory.usage_in_bytes` (v1) or `memory.current` (v2) of the cgroup `path`.
fn memory_usage(path: &Path) -> Option<u64> {
    let file = if crate::cgroup2::unified() {
        crate::cgroup2::dir_of(path).join("memory.current")
    } else {
        let rel = path.strip_prefix("/").unwrap_or(path);
        Path::new(CGROUP_ROOT)
            .join("memory")
            .join(rel)
            .join("memory.usage_in_bytes")
    };
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standbys_cgroup_sits_beside_the_containers_and_no_container_can_be_named_so() {
        assert_eq!(
            cgroup_path(Path::new("/default/web"), "@standby-7-1"),
            Path::new("/default/web@standby-7-1")
        );
        assert!(next_suffix().starts_with("@standby-"));
        assert_ne!(next_suffix(), next_suffix());
        // containerd's identifiers: letters, digits and . _ - only.
        assert!(crate::storage::ContainerKey::new("default", "web@standby").is_err());
    }

    fn record(holder: i32) -> Record {
        Record {
            holder,
            id: "web".into(),
            tracking: PathBuf::from("/nonexistent/crab-test/tracking"),
            cgroup: PathBuf::from("/crab-test-nonexistent/web@standby-1-1"),
            root: PathBuf::from("/nonexistent/crab-test/root"),
        }
    }

    #[test]
    fn the_host_budget_counts_live_makers_and_frees_the_places_of_dead_ones() {
        let dir = std::env::temp_dir().join(format!("crab-standby-{}", std::process::id()));
        let mut config = Config {
            state_dir: dir.clone(),
            ..Config::default()
        };
        config.standby.max_per_host = 2;
        config.standby.min_available_mib = 0;
        let me = std::process::id() as i32;
        let a = reserve(&config, "ns/a@standby-1-1", &record(me), 0).unwrap();
        // A place whose maker is gone (no such pid) counts for nothing.
        let dead = config
            .state_dir
            .join("standbys")
            .join("ns.gone@standby-9-9");
        std::fs::write(&dead, serde_json::to_vec(&record(i32::MAX)).unwrap()).unwrap();
        reserve(&config, "ns/b@standby-1-2", &record(me), 0).unwrap();
        assert!(!dead.exists(), "the dead maker's place was not freed");
        let refused = reserve(&config, "ns/c@standby-1-3", &record(me), 0).unwrap_err();
        assert!(refused.to_string().contains("max_per_host"), "{refused}");
        std::fs::remove_file(a).unwrap();
        reserve(&config, "ns/c@standby-1-3", &record(me), 0).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_replica_over_the_memory_budget_takes_no_place_in_the_count() {
        let dir = std::env::temp_dir().join(format!("crab-standby-mem-{}", std::process::id()));
        let mut config = Config {
            state_dir: dir.clone(),
            ..Config::default()
        };
        config.standby.max_per_host = 1;
        config.standby.max_image_mib = 1;
        config.standby.min_available_mib = 0;
        let me = std::process::id() as i32;
        let refused = reserve(&config, "ns/a@standby-1-1", &record(me), 2 << 20).unwrap_err();
        assert!(refused.to_string().contains("max_image_mib"), "{refused}");
        // The only place is still free.
        reserve(&config, "ns/b@standby-1-2", &record(me), 1 << 20).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }
}
