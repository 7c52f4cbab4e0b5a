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
            self.root,
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
        let container = builder
            .as_init(bundle)
            .with_systemd(false)
            .with_detach(true)
            .as_sibling(true)
            .build()
            .map_err(Error::libcontainer("create"))?;
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
        let builder = builder(
            &self.id,
            self.root,
            self.console_socket,
            self.stdio,
            self.tracking,
        )?;
        let init = libcontainer::container::Container::load(init_dir)
            .map_err(Error::libcontainer("load container for exec"))?;
        if let Some(pid) = init.pid() {
            join_time_namespace_of(pid.as_raw())?;
        }
        let config = init
            .spec()
            .map_err(Error::libcontainer("load config for exec"))?;
        crate::cgroup_view::join_systemd(&config.cgroup_path)?;
        let pid = builder
            .as_tenant()
            .with_process(Some(self.process))
            .with_detach(true)
            .as_sibling(true)
            .build()
            .map_err(Error::libcontainer("exec"))?;
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
