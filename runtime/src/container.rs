//! One container, driven through libcontainer.
//!
//! Calls that fork (create, exec) go through the [`crate::helper`]; everything else
//! (start, kill, pause, resume, delete, stats) runs in the caller, because those calls
//! only write to cgroup files, send signals or talk to the notify socket.

use std::path::{Path, PathBuf};

use libcgroups::common::{CgroupConfig, CgroupManager, ControllerOpt};
use libcontainer::container::{Container as LcContainer, ContainerStatus};
use nix::sys::signal::Signal;
use oci_spec::runtime::{LinuxResources, Spec};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::helper::{self, ChildStdio, Create, Exec};
use crate::tracking::TrackingCgroup;
use crate::{Error, Result};

/// Name of Crab's own state file inside libcontainer's container directory.
const STATE_FILE: &str = "crab.json";

/// What Crab records about a container, beside libcontainer's own state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrabState {
    /// containerd namespace.
    pub namespace: String,
    /// Container id.
    pub id: String,
    /// The OCI bundle.
    pub bundle: PathBuf,
    /// The tracking cgroup2 directory.
    pub tracking_cgroup: PathBuf,
    /// Its cgroup id (inode number): what `bpf_get_current_cgroup_id()` returns for the
    /// container's tasks.
    pub cgroup_id: u64,
    /// Where the eBPF inspector watching it is pinned (none: not watched).
    #[serde(default)]
    pub bpf_pin_root: Option<PathBuf>,
}

/// Where a new container's pieces go.
#[derive(Debug, Clone)]
pub struct CreateOpts {
    /// containerd namespace.
    pub namespace: String,
    /// Container id.
    pub id: String,
    /// The OCI bundle (holding `config.json`).
    pub bundle: PathBuf,
    /// Where the helper sends the pty master (terminal containers only).
    pub console_socket: Option<PathBuf>,
}

/// A created container.
#[derive(Debug, Clone)]
pub struct Container {
    pub(crate) root: PathBuf,
    pub(crate) state: CrabState,
}

impl Container {
    /// Validates the bundle and creates the container (its init waits to be started).
    /// Returns the container and its init's pid. On failure nothing is left behind.
    pub fn create(config: &Config, opts: CreateOpts, stdio: ChildStdio) -> Result<(Self, i32)> {
        let spec = load_spec(&opts.bundle)?;
        check_rootfs(&opts.bundle, &spec)?;
        let maps = crate::userns::check_bundle(&opts.bundle, &spec)?;
        let joined_maps = maps.filter(|_| crate::userns::joined::path(&spec).is_some());
        let terminal = spec
            .process()
            .as_ref()
            .and_then(|p| p.terminal())
            .unwrap_or(false);
        if terminal != opts.console_socket.is_some() {
            return Err(Error::InvalidSpec {
                bundle: opts.bundle.clone(),
                message: format!(
                    "process.terminal is {terminal} but the client {} a terminal",
                    if terminal {
                        "did not ask for"
                    } else {
                        "asked for"
                    }
                ),
            });
        }
        let (container, tracking) = Container::new_unsaved(config, &opts, None)?;
        let make = |stdio| Create {
            id: opts.id.clone(),
            root: container.root.clone(),
            bundle: opts.bundle.clone(),
            stdio,
            console_socket: opts.console_socket.clone(),
            tracking: tracking.path().to_path_buf(),
        };
        let pid = match helper::run(make, stdio).and_then(|pid| {
            if let Some(maps) = &joined_maps {
                crate::userns::joined::verify_created(&opts.bundle, pid, maps)?;
            }
            container.save_state()?;
            Ok(pid)
        }) {
            Ok(pid) => pid,
            Err(e) => {
                container.cleanup_after_failed_create();
                return Err(e);
            }
        };
        Ok((container, pid))
    }

    /// A container not made yet: its state dir is free, its tracking cgroup made.
    /// `dumped_id`: for a restore, the id of the container the images are of (a copy
    /// under another id gets a cgroup of its own).
    pub(crate) fn new_unsaved(
        config: &Config,
        opts: &CreateOpts,
        dumped_id: Option<&str>,
    ) -> Result<(Container, TrackingCgroup)> {
        // Root-only: the containers' state, control sockets and proxy logs.
        let root = config.namespace_dir(&opts.namespace);
        crate::checkpoint::history::create_private_dir(&root)?;
        if root.join(&opts.id).join(STATE_FILE).exists() {
            return Err(Error::AlreadyExists(opts.id.clone()));
        }
        Container::discard_unrecorded(config, &opts.namespace, &opts.id)?;
        let tracking = tracking_cgroup(config, opts, dumped_id)?;
        let cgroup_id = tracking.create()?;
        crate::inspect::watch(config, cgroup_id, &opts.id);
        let state = CrabState {
            namespace: opts.namespace.clone(),
            id: opts.id.clone(),
            bundle: opts.bundle.clone(),
            tracking_cgroup: tracking.path().to_path_buf(),
            cgroup_id,
            bpf_pin_root: (config.policy.mode == crate::config::PolicyMode::Adaptive)
                .then(|| config.policy.bpf_pin_root.clone()),
        };
        Ok((Container { root, state }, tracking))
    }

    /// Removes the state directory of container `id` if it holds no record: a create
    /// or restore whose shim died before it recorded the container (containerd runs
    /// one create of an id at a time). What it started is killed and its tracking
    /// cgroup removed first. Answers whether there was one.
    pub fn discard_unrecorded(config: &Config, namespace: &str, id: &str) -> Result<bool> {
        let dir = config.namespace_dir(namespace).join(id);
        if !dir.exists() || dir.join(STATE_FILE).exists() {
            return Ok(false);
        }
        tracing::warn!(id, "removing an unrecorded container a dead shim left");
        if crate::cgroup2::unified() {
            // The tracking cgroup is the container's own: libcontainer's state names
            // it once the helper got that far (before, the helper's own failure
            // removed it).
            let recorded = LcContainer::load(dir.clone())
                .ok()
                .and_then(|c| c.spec().ok())
                .map(|s| crate::cgroup2::dir_of(&s.cgroup_path));
            if let Some(path) = recorded {
                TrackingCgroup::at(path).destroy()?;
            }
        } else {
            TrackingCgroup::new(&config.tracking_cgroup, namespace, id).destroy()?;
        }
        std::fs::remove_dir_all(&dir).map_err(Error::io(format!("remove {}", dir.display())))?;
        Ok(true)
    }

    /// Removes what a dead shim left of container `id`, recorded or not: its
    /// processes, cgroups and state. containerd runs this once as the dead shim's
    /// `delete`, and `crabctl restore` again where that one failed or was cut off
    /// (containerd gives it 5 s): a leftover record fails the next create ("already
    /// exists"). Answers whether anything was left.
    pub fn remove_left(config: &Config, namespace: &str, id: &str) -> Result<bool> {
        match Container::load(config, namespace, id) {
            Ok(c) => c.delete().map(|()| true),
            // Died in a create or restore before recording the container.
            Err(Error::NotFound(_)) => Container::discard_unrecorded(config, namespace, id),
            Err(e) => Err(e),
        }
    }

    /// Loads a container that [`Container::create`] made earlier (e.g. by another
    /// shim process, for `delete`).
    pub fn load(config: &Config, namespace: &str, id: &str) -> Result<Self> {
        let root = config.namespace_dir(namespace);
        let file = root.join(id).join(STATE_FILE);
        let text = match std::fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NotFound(id.to_string()))
            }
            Err(e) => return Err(Error::io(format!("read {}", file.display()))(e)),
        };
        let state: CrabState = serde_json::from_str(&text).map_err(|e| Error::Io {
            context: format!("parse {}", file.display()),
            source: e.into(),
        })?;
        Ok(Container { root, state })
    }

    /// Crab's state of this container.
    pub fn state(&self) -> &CrabState {
        &self.state
    }

    /// The container id.
    pub fn id(&self) -> &str {
        &self.state.id
    }

    /// The container's key in the stores and checkpoint histories.
    pub fn key(&self) -> Result<crate::storage::ContainerKey> {
        crate::storage::ContainerKey::new(&self.state.namespace, &self.state.id)
    }

    /// The init's pid on the host, while it runs.
    pub fn init_pid(&self) -> Result<i32> {
        self.lc()?
            .pid()
            .map(|p| p.as_raw())
            .ok_or_else(|| Error::WrongState {
                id: self.state.id.clone(),
                state: "without a process".into(),
                operation: "find its init",
            })
    }

    /// The tracking cgroup.
    pub fn tracking(&self) -> TrackingCgroup {
        TrackingCgroup::at(self.state.tracking_cgroup.clone())
    }

    /// This container with `to` as its tracking cgroup: a replica's, whose
    /// processes became the container's (cgroup2 cannot rename a directory, so
    /// the container's identity follows the processes instead of the processes
    /// moving, [`crate::standby`]). Recorded in its state, then the inspector
    /// follows it ([`crate::inspect::rewatch`]: tainted, the next turn takes
    /// everything). The old directory, and the inspector's records of it, are
    /// the caller's to remove. On an error nothing changed.
    pub(crate) fn with_tracking(&self, config: &Config, to: &TrackingCgroup) -> Result<Retracked> {
        let mut next = self.clone();
        next.state.tracking_cgroup = to.path().to_path_buf();
        next.state.cgroup_id = to.id()?;
        next.save_state()?;
        let old_records = crate::inspect::rewatch(
            config,
            &next.state.id,
            (&self.tracking(), self.state.cgroup_id),
            next.state.cgroup_id,
        );
        Ok(Retracked {
            container: next,
            old_records,
        })
    }

    /// Where this container's tracking cgroups are named from: on a hybrid host
    /// `<tracking_cgroup>/<namespace>/<id>` (an adopted replica's tracking cgroup
    /// keeps its own name), on a cgroup v2-only host its own cgroup.
    pub(crate) fn tracking_base(&self, config: &Config) -> PathBuf {
        if crate::cgroup2::unified() {
            return self.state.tracking_cgroup.clone();
        }
        TrackingCgroup::new(
            &config.tracking_cgroup,
            &self.state.namespace,
            &self.state.id,
        )
        .path()
        .to_path_buf()
    }

    pub(crate) fn dir(&self) -> PathBuf {
        self.root.join(&self.state.id)
    }

    pub(crate) fn save_state(&self) -> Result<()> {
        let file = self.dir().join(STATE_FILE);
        let json = serde_json::to_vec_pretty(&self.state).expect("state serializes");
        std::fs::write(&file, json).map_err(Error::io(format!("write {}", file.display())))
    }

    pub(crate) fn lc(&self) -> Result<LcContainer> {
        let dir = self.dir();
        if !dir.join("state.json").exists() {
            return Err(Error::NotFound(self.state.id.clone()));
        }
        // libcontainer checks that the init's /proc entry exists, then reads its
        // stat: an init reaped in between fails the load (seen right after a
        // rollback's kill). A new read finds it gone, and says so. Any other
        // failure is not retried.
        let mut tries = 0;
        loop {
            match LcContainer::load(dir.clone()) {
                Ok(c) => return Ok(c),
                Err(_) if tries < 3 && !recorded_init_alive(&dir) => tries += 1,
                Err(e) => return Err(Error::libcontainer("load state")(e)),
            }
        }
    }

    /// libcontainer's view of the container's status (refreshed from /proc).
    pub fn status(&self) -> Result<ContainerStatus> {
        let mut c = self.lc()?;
        c.refresh_status()
            .map_err(Error::libcontainer("refresh status"))?;
        Ok(c.status())
    }

    /// Whether the container's init is running (so there are processes to freeze).
    pub fn is_running(&self) -> bool {
        matches!(self.status(), Ok(ContainerStatus::Running))
    }

    /// Runs `f` with the container's processes frozen if they run (a paused container
    /// stays as it is), so that a change to its files lands between two instants of
    /// its processes. The container is thawed again even when `f` fails.
    pub fn frozen<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if !self.is_running() {
            return f();
        }
        self.pause()?;
        let result = f();
        self.resume()?;
        result
    }

    /// Runs `roll_back`, a rollback of the files, like [`Container::frozen`]. If it
    /// fails once it may have changed the tree (an I/O error, a full pool, a killed
    /// helper: not a missing snapshot or a bad name, found before any change), the
    /// processes are killed while frozen, so none runs on a partly rolled-back tree.
    pub fn rolled_back_frozen<T>(&self, roll_back: impl FnOnce() -> Result<T>) -> Result<T> {
        let running = self.is_running();
        if running {
            self.pause()?;
        }
        let result = roll_back();
        let result = match result {
            Err(e) if may_have_changed(&e) => {
                tracing::error!(id = %self.state.id, error = %e, "rollback failed part of the way: killing the processes");
                // Delivered when thawed, before any of them returns to user space.
                if let Err(k) = self.kill(Signal::SIGKILL, true) {
                    tracing::error!(id = %self.state.id, error = %k, "kill after a failed rollback");
                }
                Err(Error::HalfRolledBack {
                    id: self.state.id.clone(),
                    source: Box::new(e),
                })
            }
            other => other,
        };
        if running {
            self.resume()?;
        }
        result
    }

    /// Lets the created init run the container's process.
    pub fn start(&self) -> Result<()> {
        let mut c = self.lc()?;
        c.start().map_err(Error::libcontainer("start"))
    }

    /// Sends `signal` to the init, or to every process of the container with `all`.
    pub fn kill(&self, signal: Signal, all: bool) -> Result<()> {
        if all {
            for pid in self.tracking().pids()? {
                // A process that exits meanwhile is not an error.
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
            }
            return Ok(());
        }
        let mut c = self.lc()?;
        c.kill(signal, false).map_err(Error::libcontainer("kill"))
    }

    /// Freezes every process of the container (the v1 freezer, or cgroup.freeze).
    pub fn pause(&self) -> Result<()> {
        let mut c = self.lc()?;
        c.pause().map_err(Error::libcontainer("pause"))
    }

    /// Thaws the container.
    pub fn resume(&self) -> Result<()> {
        let mut c = self.lc()?;
        c.resume().map_err(Error::libcontainer("resume"))
    }

    /// Starts an additional process described by an OCI `process` JSON file.
    pub fn exec(
        &self,
        process: &Path,
        console_socket: Option<PathBuf>,
        stdio: ChildStdio,
    ) -> Result<i32> {
        let make = |stdio| Exec {
            id: self.state.id.clone(),
            root: self.root.clone(),
            process: process.to_path_buf(),
            stdio,
            console_socket,
            tracking: self.state.tracking_cgroup.clone(),
        };
        helper::run(make, stdio)
    }

    fn cgroup_manager(&self) -> Result<libcgroups::common::AnyCgroupManager> {
        let c = self.lc()?;
        let spec = c.spec().map_err(Error::libcontainer("load config"))?;
        cgroup_manager_at(&self.state.id, &spec.cgroup_path)
    }

    /// The container's cgroup path (relative to each hierarchy's root).
    pub fn cgroup_path(&self) -> Result<PathBuf> {
        let c = self.lc()?;
        Ok(c.spec()
            .map_err(Error::libcontainer("load config"))?
            .cgroup_path)
    }

    /// cgroup statistics (cpu, memory, pids, ...): v2's on a cgroup v2-only host,
    /// read from the container's cgroup, else v1's through libcgroups.
    pub fn metrics(&self) -> Result<crate::metrics::Metrics> {
        if crate::cgroup2::unified() {
            let dir = crate::cgroup2::dir_of(&self.cgroup_path()?);
            return crate::cgroup2::read_metrics(&dir).map(crate::metrics::Metrics::V2);
        }
        let stats = self.cgroup_manager()?.stats().map_err(|e| Error::Cgroup {
            operation: "read stats",
            message: e.to_string(),
        })?;
        Ok(crate::metrics::Metrics::V1(stats.into()))
    }

    /// Applies new resource limits.
    pub fn update(&self, resources: &LinuxResources) -> Result<()> {
        let opt = controller_opt(resources);
        self.cgroup_manager()?
            .apply(&opt)
            .map_err(|e| Error::Cgroup {
                operation: "apply resources",
                message: e.to_string(),
            })
    }

    /// Removes the container: kills what is left, removes its cgroups and state.
    /// Deleting a container that is already gone is not an error.
    pub fn delete(&self) -> Result<()> {
        // A frozen process cannot die: a shim killed while the container was
        // paused, or frozen by a checkpoint's dump (Crab's freeze or CRIU's, which
        // libcontainer's status does not show), leaves it so. Thaw it first.
        if let Ok(manager) = self.cgroup_manager() {
            if let Err(e) = manager.freeze(libcgroups::common::FreezerState::Thawed) {
                tracing::warn!(id = %self.state.id, error = %e, "thaw before delete");
            }
        }
        // Kill through the tracking cgroup first: it holds every process, including
        // execs that libcontainer does not know about.
        self.tracking().destroy()?;
        if let Some(pins) = &self.state.bpf_pin_root {
            crate::inspect::unwatch(pins, self.state.cgroup_id);
        }
        match self.lc() {
            Ok(mut c) => {
                let cgroup_path = c.spec().ok().map(|s| s.cgroup_path);
                c.delete(true).map_err(Error::libcontainer("delete"))?;
                if let Some(path) = cgroup_path {
                    crate::cgroup_view::leave_systemd(&path);
                }
            }
            Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        let dir = self.dir();
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(Error::io(format!("remove {}", dir.display())))?;
        }
        crate::userns::staged_binds::release(&self.root, &self.state.id)
    }

    pub(crate) fn cleanup_after_failed_create(&self) {
        if let Err(e) = self.delete() {
            tracing::warn!(id = %self.state.id, error = %e, "cleanup after failed create");
        }
    }
}

/// The tracking cgroup of a new container. On a hybrid host, a directory of its own in
/// the (controller-less) unified hierarchy below `tracking_cgroup`. On a cgroup v2-only
/// host the container's tasks end in its own cgroup (its spec's cgroupsPath, which
/// libcontainer's v2 manager makes if it is missing and joins), and a cgroup of
/// Crab's beside it would lose them: the container's own cgroup is made first and
/// the helper joins it, so no task of the container is ever outside it. A restored
/// copy's is its own, as the restore's helper makes it (`own_cgroup_path`).
fn tracking_cgroup(
    config: &Config,
    opts: &CreateOpts,
    dumped_id: Option<&str>,
) -> Result<TrackingCgroup> {
    if !crate::cgroup2::unified() {
        return Ok(TrackingCgroup::new(
            &config.tracking_cgroup,
            &opts.namespace,
            &opts.id,
        ));
    }
    let spec = load_spec(&opts.bundle)?;
    let cgroups_path = spec.linux().as_ref().and_then(|l| l.cgroups_path().clone());
    let mut path = libcontainer::utils::get_cgroup_path(&cgroups_path, &opts.id);
    if let Some(dumped) = dumped_id {
        path = crate::checkpoint::restore_helper::own_cgroup_path(&path, dumped, &opts.id);
    }
    let dir = crate::cgroup2::dir_of(&path);
    crate::cgroup2::make_dir(&dir)?;
    Ok(TrackingCgroup::at(dir))
}

/// What libcgroups applies for `resources`.
/// Applies `spec`'s resources (the defaults when it has none) to the cgroups
/// `manager` manages.
pub(crate) fn apply_resources(
    manager: &libcgroups::common::AnyCgroupManager,
    spec: &Spec,
) -> Result<()> {
    let resources = resources_of(spec);
    manager
        .apply(&controller_opt(resources))
        .map_err(|e| Error::Cgroup {
            operation: "apply resources",
            message: e.to_string(),
        })
}

/// The resources `spec` asks for (none: the defaults).
pub(crate) fn resources_of(spec: &Spec) -> &LinuxResources {
    static NONE: std::sync::OnceLock<LinuxResources> = std::sync::OnceLock::new();
    spec.linux()
        .as_ref()
        .and_then(|l| l.resources().as_ref())
        .unwrap_or_else(|| NONE.get_or_init(LinuxResources::default))
}

pub(crate) fn controller_opt(resources: &LinuxResources) -> ControllerOpt<'_> {
    ControllerOpt {
        resources,
        disable_oom_killer: resources
            .memory()
            .as_ref()
            .and_then(|m| m.disable_oom_killer())
            .unwrap_or(false),
        oom_score_adj: None,
        freezer_state: None,
    }
}

/// Whether the spec gives the container a new namespace of type `typ` (listed,
/// without a path to join).
pub fn owns_namespace(spec: &Spec, typ: oci_spec::runtime::LinuxNamespaceType) -> bool {
    spec.linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .is_some_and(|nss| nss.iter().any(|n| n.typ() == typ && n.path().is_none()))
}

/// libcgroups' manager of the cgroup `path` (relative to each hierarchy's root)
/// of container `id`.
pub(crate) fn cgroup_manager_at(
    id: &str,
    path: &Path,
) -> Result<libcgroups::common::AnyCgroupManager> {
    libcgroups::common::create_cgroup_manager(CgroupConfig {
        cgroup_path: path.to_path_buf(),
        systemd_cgroup: false,
        container_name: id.to_string(),
    })
    .map_err(|e| Error::Cgroup {
        operation: "open manager",
        message: e.to_string(),
    })
}

/// Reads and checks `config.json`.
pub fn load_spec(bundle: &Path) -> Result<Spec> {
    let file = bundle.join("config.json");
    Spec::load(&file).map_err(|e| Error::InvalidSpec {
        bundle: bundle.to_path_buf(),
        message: e.to_string(),
    })
}

fn check_rootfs(bundle: &Path, spec: &Spec) -> Result<()> {
    let root = spec.root().as_ref().ok_or_else(|| Error::InvalidSpec {
        bundle: bundle.to_path_buf(),
        message: "spec has no root".into(),
    })?;
    let path = if root.path().is_absolute() {
        root.path().clone()
    } else {
        bundle.join(root.path())
    };
    if !path.is_dir() {
        return Err(Error::MissingRootfs(path));
    }
    let invalid = |message: &str| Error::InvalidSpec {
        bundle: bundle.to_path_buf(),
        message: message.into(),
    };
    let process = spec
        .process()
        .as_ref()
        .ok_or_else(|| invalid("spec has no process"))?;
    match process.args() {
        Some(args) if !args.is_empty() && !args[0].is_empty() => Ok(()),
        _ => Err(invalid("process.args must not be empty")),
    }
}

/// Whether a failed rollback may have changed the tree: not when it failed on what
/// is checked before any change (the snapshot's name or presence, the state).
fn may_have_changed(e: &Error) -> bool {
    !matches!(
        e.kind(),
        crate::error::ErrorKind::InvalidArgument
            | crate::error::ErrorKind::NotFound
            | crate::error::ErrorKind::FailedPrecondition
    )
}

/// Whether the init libcontainer's state in `dir` records still has a /proc
/// entry (an unreadable state counts as alive: nothing to wait out).
fn recorded_init_alive(dir: &Path) -> bool {
    let pid = std::fs::read(dir.join("state.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v.get("pid")?.as_i64());
    match pid {
        Some(pid) => Path::new(&format!("/proc/{pid}")).exists(),
        None => true,
    }
}

/// A container as an adoption left it ([`Container::with_tracking`]).
#[derive(Debug)]
pub(crate) struct Retracked {
    /// The container, with the tracking cgroup it has now.
    pub container: Container,
    /// Whether the inspector may still hold records of a tracking cgroup the
    /// container left, which the adoption's leftovers drop
    /// ([`crate::standby::Leftovers`]).
    pub old_records: bool,
}

impl Retracked {
    /// `container` kept its tracking cgroup.
    pub fn kept(container: Container) -> Retracked {
        Retracked {
            container,
            old_records: false,
        }
    }
}
