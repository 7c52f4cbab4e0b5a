//! The calls that fork through libcontainer: create a container's init, start an exec
//! process. The helper joins the container's tracking cgroup (and its own `systemd`
//! cgroup) first, so that the new process is born in them; `as_sibling(true)` makes it
//! the shim's child. Both answer the new process's host pid.

use std::path::PathBuf;

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;
use serde::{Deserialize, Serialize};

use super::{inherited_or_null, Call, Request, StdioFds};
use crate::tracking::TrackingCgroup;
use crate::{Error, Result};

/// Create (not start) a container from an OCI bundle; answers its init's pid.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Create {
    /// Container id.
    pub id: String,
    /// libcontainer's state root.
    pub root: PathBuf,
    /// The OCI bundle.
    pub bundle: PathBuf,
    /// Stdio for the container's init.
    pub stdio: StdioFds,
    /// Where to send the pty master, for terminal containers.
    pub console_socket: Option<PathBuf>,
    /// The tracking cgroup to join first.
    pub tracking: PathBuf,
}

/// Start an additional process in a running container; answers its pid.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Exec {
    /// Container id.
    pub id: String,
    /// libcontainer's state root.
    pub root: PathBuf,
    /// A file holding the OCI `process` JSON.
    pub process: PathBuf,
    /// Stdio for the new process.
    pub stdio: StdioFds,
    /// Where to send the pty master, for terminal processes.
    pub console_socket: Option<PathBuf>,
    /// The tracking cgroup to join first.
    pub tracking: PathBuf,
}

super::travels_as!(Request: Create => Create, Exec => Exec);

impl Call for Create {
    type Reply = i32;
    const OPERATION: &'static str = "create container";

    fn stdio(&self) -> StdioFds {
        self.stdio
    }

    fn serve(self) -> Result<i32> {
        let builder = builder(
            &self.id,
            self.root.clone(),
            self.console_socket,
            self.stdio,
            self.tracking,
        )?;
        let bundle = self.bundle;
        let spec = crate::container::load_spec(&bundle)?;
        let cgroup_path = libcontainer::config::YoukiConfig::from_spec(&spec, &self.id)
            .map_err(|e| Error::InvalidSpec {
                bundle: bundle.clone(),
                message: e.to_string(),
            })?
            .cgroup_path;
        crate::cgroup_view::join_systemd(&cgroup_path)?;
        // Binds libcontainer cannot make from inside a user namespace, or at all
        // (idmapped), take copies the host's root staged; Crab's bundle then
        // records the spec exec checks (`crate::userns::staged_binds`).
        use crate::userns::staged_binds;
        staged_binds::release(&self.root, &self.id)?;
        let staged = staged_binds::Staged::make(&self.root, &self.id, &bundle, &spec)?;
        let run_from = match &staged {
            Some(s) => staged_binds::write_bundle(&self.root, &self.id, &bundle, s.spec())?,
            None => bundle.clone(),
        };
        let container = builder
            .as_init(run_from)
            .with_systemd(false)
            .with_detach(true)
            .as_sibling(true)
            .build()
            .map_err(Error::libcontainer("create"));
        let staged = staged.is_some();
        let container = container?;
        if staged {
            // libcontainer recorded Crab's bundle: the spec exec checks from now
            // on names the sources, not the points that are gone.
            staged_binds::write_bundle(&self.root, &self.id, &bundle, &staged_binds::plain(&spec))?;
        }
        let pid = container
            .pid()
            .map(|p| p.as_raw())
            .ok_or_else(|| Error::Helper {
                operation: Self::OPERATION,
                message: "libcontainer returned a container without a pid".into(),
            })?;
        if crate::netns::owns_network_namespace(&spec) {
            crate::netns::loopback_up(pid)?;
        }
        // Last: the helper stays in the container's mount namespace.
        crate::cgroup_view::seal(pid, &spec)?;
        Ok(pid)
    }
}

impl Call for Exec {
    type Reply = i32;
    const OPERATION: &'static str = "exec process";

    fn stdio(&self) -> StdioFds {
        self.stdio
    }

    fn serve(self) -> Result<i32> {
        let init_dir = self.root.join(&self.id);
        let init = libcontainer::container::Container::load(init_dir)
            .map_err(Error::libcontainer("load container for exec"))?;
        let init_pid = init.pid().map(|p| p.as_raw());
        // A container with a user namespace: libcontainer's exec runs against a
        // view of it, from inside that namespace (see `crate::userns::exec_view`).
        let view = match init_pid {
            Some(pid) if other_user_namespace(pid)? => Some(
                crate::userns::exec_view::ExecView::make(&self.root, &self.id, init.bundle())?,
            ),
            _ => None,
        };
        let root = view
            .as_ref()
            .map_or(self.root.clone(), |v| v.root().to_path_buf());
        let builder = builder(
            &self.id,
            root,
            self.console_socket,
            self.stdio,
            self.tracking,
        )?;
        if let Some(pid) = init_pid {
            join_time_namespace_of(pid)?;
        }
        let config = init
            .spec()
            .map_err(Error::libcontainer("load config for exec"))?;
        crate::cgroup_view::join_systemd(&config.cgroup_path)?;
        if let (Some(pid), Some(_)) = (init_pid, &view) {
            join_user_namespace_of(pid)?;
        }
        let pid = builder
            .as_tenant()
            .with_process(Some(self.process))
            .with_detach(true)
            .as_sibling(true)
            .build()
            .map_err(Error::libcontainer("exec"))?;
        drop(view);
        Ok(pid.as_raw())
    }
}

/// Joins the tracking cgroup, then starts libcontainer's builder for container `id`
/// with the process's stdio (or its console socket). On a cgroup v2-only host the
/// tracking cgroup is the container's own, which libcontainer's intermediate process
/// joins before the container's process exists: the helper stays out of it, as
/// libcontainer's clean-up of a failed create kills everything in it.
fn builder(
    id: &str,
    root: PathBuf,
    console_socket: Option<PathBuf>,
    stdio: StdioFds,
    tracking: PathBuf,
) -> Result<ContainerBuilder> {
    if !crate::cgroup2::unified() {
        TrackingCgroup::at(tracking).add(std::process::id() as i32)?;
    }
    let mut builder = ContainerBuilder::new(id.to_string(), SyscallType::Linux)
        .with_root_path(root)
        .map_err(Error::libcontainer("set root path"))?
        .with_console_socket(console_socket.clone());
    if console_socket.is_none() {
        // Without a terminal the process gets exactly these fds; anything not given is
        // /dev/null, never the helper's own stdout (the reply pipe).
        builder = builder
            .with_stdin(inherited_or_null(stdio.stdin)?)
            .with_stdout(inherited_or_null(stdio.stdout)?)
            .with_stderr(inherited_or_null(stdio.stderr)?);
    }
    Ok(builder)
}

/// Whether `pid` is in a user namespace other than the helper's.
fn other_user_namespace(pid: i32) -> Result<bool> {
    let theirs = format!("/proc/{pid}/ns/user");
    let theirs = std::fs::read_link(&theirs).map_err(Error::io(format!("read {theirs}")))?;
    let ours =
        std::fs::read_link("/proc/self/ns/user").map_err(Error::io("read /proc/self/ns/user"))?;
    Ok(theirs != ours)
}

/// libcontainer's exec joins the init's namespaces except its user namespace: in
/// a container with one, the exec'd process would run as host root, with every
/// capability over the host, inside the container's other namespaces. The helper
/// (single-threaded, short-lived) joins the init's user namespace first, so the
/// process libcontainer forks is born in it, holding capabilities there only; the
/// container's other namespaces are owned by it, so libcontainer can still join
/// them. Last of the helper's steps that need the host's privileges.
fn join_user_namespace_of(pid: i32) -> Result<()> {
    let theirs = format!("/proc/{pid}/ns/user");
    let ns = std::fs::File::open(&theirs).map_err(Error::io(format!("open {theirs}")))?;
    // SAFETY: setns takes a namespace descriptor, valid for the call, and a type;
    // the helper is single-threaded, as joining a user namespace requires.
    let r = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWUSER) };
    if r != 0 {
        return Err(Error::io(format!("join the user namespace of pid {pid}"))(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// A restored container's tasks live in a time namespace CRIU made (it carries
/// the clocks' offsets); libcontainer joins only the namespaces the spec lists,
/// so an exec'd process would stay in the host's. CRIU cannot restore a tree
/// that spans two time namespaces: the helper joins the init's first (its
/// children, the exec'd process among them, are born there).
fn join_time_namespace_of(pid: i32) -> Result<()> {
    let theirs = format!("/proc/{pid}/ns/time");
    let same = std::fs::read_link(&theirs).ok() == std::fs::read_link("/proc/self/ns/time").ok();
    if same {
        return Ok(());
    }
    let ns = std::fs::File::open(&theirs).map_err(Error::io(format!("open {theirs}")))?;
    // SAFETY: setns takes a namespace descriptor, valid for the call, and a type.
    let r = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWTIME) };
    if r != 0 {
        return Err(Error::io(format!("join the time namespace of pid {pid}"))(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}
