//! The helper process: where libcontainer forks.
//!
//! libcontainer creates containers with `clone` and runs Rust code in the child before it
//! execs. In a multithreaded process (the tokio shim) that child may inherit a lock held
//! by another thread and hang. So the shim re-executes its own binary as a short-lived,
//! single-threaded helper for each call that forks (create, exec). The helper moves
//! itself into the container's tracking cgroup, builds the container with
//! `as_sibling(true)` so that the container's process becomes a child of the shim (which
//! reaps it and reports its exit), prints the pid as JSON and exits.
//!
//! Protocol: `<shim binary> __crab_helper '<Request as JSON>'`; the stdio fds named in the
//! request are inherited; stdout carries one [`Reply`] line, stderr the error text.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio as ProcessStdio};

use serde::{Deserialize, Serialize};

use crate::error::Failure;
use crate::tracking::TrackingCgroup;
use crate::{Error, Result};

/// First argument that turns the shim binary into the helper.
pub const HELPER_ARG: &str = "__crab_helper";

/// The container's stdio as fd numbers inherited by the helper (`None`: inherit nothing,
/// libcontainer leaves the helper's own, which is /dev/null).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct StdioFds {
    /// Standard input.
    pub stdin: Option<RawFd>,
    /// Standard output.
    pub stdout: Option<RawFd>,
    /// Standard error.
    pub stderr: Option<RawFd>,
}

/// What the helper is asked to do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// Create (not start) a container from an OCI bundle.
    Create {
        /// Container id.
        id: String,
        /// libcontainer's state root.
        root: PathBuf,
        /// The OCI bundle.
        bundle: PathBuf,
        /// Stdio for the container's init.
        stdio: StdioFds,
        /// Where to send the pty master, for terminal containers.
        console_socket: Option<PathBuf>,
        /// The tracking cgroup to join first.
        tracking: PathBuf,
    },
    /// Start an additional process in a running container.
    Exec {
        /// Container id.
        id: String,
        /// libcontainer's state root.
        root: PathBuf,
        /// A file holding the OCI `process` JSON.
        process: PathBuf,
        /// Stdio for the new process.
        stdio: StdioFds,
        /// Where to send the pty master, for terminal processes.
        console_socket: Option<PathBuf>,
        /// The tracking cgroup to join first.
        tracking: PathBuf,
    },
    /// Checkpoint a container (CRIU dump and file-system delta).
    Checkpoint {
        /// libcontainer's state root.
        root: PathBuf,
        /// Crab's state of the container.
        state: crate::container::CrabState,
        /// What to write where.
        opts: crate::checkpoint::engine::CheckpointOpts,
    },
    /// An operation on the container's checkpoint history.
    History {
        /// The container's configuration (its store, the checkpoint store).
        config: crate::config::Config,
        /// libcontainer's state root.
        root: PathBuf,
        /// Crab's state of the container.
        state: crate::container::CrabState,
        /// What to do.
        op: crate::checkpoint::ops::HistoryOp,
    },
    /// A store operation (the stores exec tools).
    Store {
        /// The configuration (which store).
        config: crate::config::Config,
        /// What to do.
        op: crate::storage::in_helper::StoreOp,
    },
    /// Apply a checkpoint's file-system delta to a rootfs.
    ApplyFsDelta {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The rootfs (a fresh tree of the image).
        rootfs: PathBuf,
    },
    /// Restore a container's processes from CRIU images (see [`crate::checkpoint`]).
    Restore {
        /// Container id.
        id: String,
        /// libcontainer's state root.
        root: PathBuf,
        /// The OCI bundle, its rootfs already holding the checkpointed files.
        bundle: PathBuf,
        /// The CRIU images.
        images: PathBuf,
        /// CRIU.
        criu: crate::criu::Tool,
        /// New stdio for the restored init.
        stdio: StdioFds,
        /// What the restore needs to know about the dumped container.
        dumped: crate::checkpoint::engine::Dumped,
        /// The tracking cgroup to join first.
        tracking: PathBuf,
    },
}

impl Request {
    fn operation(&self) -> &'static str {
        match self {
            Request::Create { .. } => "create container",
            Request::Exec { .. } => "exec process",
            Request::Restore { .. } => "restore container",
            Request::Checkpoint { .. } => "checkpoint container",
            Request::History { .. } => "change the checkpoint history",
            Request::Store { .. } => "operate the store",
            Request::ApplyFsDelta { .. } => "apply a file-system delta",
        }
    }

    fn stdio(&self) -> StdioFds {
        match self {
            Request::Create { stdio, .. }
            | Request::Exec { stdio, .. }
            | Request::Restore { stdio, .. } => *stdio,
            Request::Checkpoint { .. }
            | Request::ApplyFsDelta { .. }
            | Request::History { .. }
            | Request::Store { .. } => StdioFds::default(),
        }
    }
}

/// The helper's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reply {
    /// Pid of the container's init, or of the exec'd process (0 for other requests).
    pub pid: i32,
    /// The result of other requests (a checkpoint's manifest, ...).
    #[serde(default)]
    pub data: serde_json::Value,
}

/// The container-side ends of a process's stdio, handed to the helper.
#[derive(Debug, Default)]
pub struct ChildStdio {
    /// Standard input.
    pub stdin: Option<OwnedFd>,
    /// Standard output.
    pub stdout: Option<OwnedFd>,
    /// Standard error.
    pub stderr: Option<OwnedFd>,
}

impl ChildStdio {
    fn fds(&self) -> StdioFds {
        StdioFds {
            stdin: self.stdin.as_ref().map(|f| f.as_raw_fd()),
            stdout: self.stdout.as_ref().map(|f| f.as_raw_fd()),
            stderr: self.stderr.as_ref().map(|f| f.as_raw_fd()),
        }
    }
}

/// Builds a [`Request`] whose stdio fields are filled in by [`run`].
pub type RequestFn = dyn FnOnce(StdioFds) -> Request;

/// Runs the helper (blocking) and returns the new process's pid. `stdio` is closed in
/// this process afterwards: the container holds the only copies.
pub fn run(make: Box<RequestFn>, stdio: ChildStdio) -> Result<i32> {
    run_reply(make, stdio).map(|r| r.pid)
}

/// [`run`], returning the whole reply.
pub fn run_reply(make: Box<RequestFn>, stdio: ChildStdio) -> Result<Reply> {
    let request = make(stdio.fds());
    let operation = request.operation();
    let fds: Vec<RawFd> = {
        let s = request.stdio();
        [s.stdin, s.stdout, s.stderr]
            .into_iter()
            .flatten()
            .collect()
    };
    // /proc/self/exe, not the path: a shim keeps working after its binary is
    // upgraded (the path then names another file, or none).
    let exe = std::path::PathBuf::from("/proc/self/exe");
    let json = serde_json::to_string(&request).expect("request serializes");
    let mut cmd = Command::new(&exe);
    cmd.arg(HELPER_ARG)
        .arg(json)
        .stdin(ProcessStdio::null())
        .stdout(ProcessStdio::piped())
        .stderr(ProcessStdio::piped());
    // SAFETY: the closure runs in the forked child before exec and only calls fcntl,
    // which is async-signal-safe; it touches no memory shared with other threads.
    unsafe {
        cmd.pre_exec(move || {
            for &fd in &fds {
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    die_with_parent(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(Error::io(format!("spawn helper {}", exe.display())))?;
    drop(stdio);
    // stderr is drained beside stdout: a helper that logs more than a pipe holds
    // before it answers would otherwise block for ever.
    let stderr = child.stderr.take().map(|mut s| {
        std::thread::spawn(move || {
            let mut err = String::new();
            let _ = s.read_to_string(&mut err);
            err
        })
    });
    let mut out = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    let err = stderr
        .map(|t| t.join().unwrap_or_default())
        .unwrap_or_default();
    // The shim's reaper may have collected the helper already (ECHILD): the reply on
    // stdout is what counts, not the exit status.
    let _ = child.wait();
    for line in out.lines() {
        if let Ok(reply) = serde_json::from_str::<Reply>(line) {
            return Ok(reply);
        }
        if let Ok(failed) = serde_json::from_str::<Failed>(line) {
            return Err(Error::InHelper {
                operation,
                failure: failed.failure,
            });
        }
    }
    Err(Error::Helper {
        operation,
        message: last_error_line(&err),
    })
}

/// The helper's answer when its request failed: the error's kind and text, so
/// that the caller answers its own client with the same kind.
#[derive(Debug, Serialize, Deserialize)]
struct Failed {
    failure: Failure,
}

/// Makes the process `cmd` starts die (SIGKILL) when the thread that started it
/// dies. A helper, or a CRIU, whose shim was killed would otherwise run on, holding
/// the container's history lock and the host's checkpoint slot for as long as it
/// takes (a dump of a tree whose processes were killed waits for them for minutes),
/// and the recovery that follows would wait behind it.
pub(crate) fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and makes only the
    // prctl and getppid system calls, which are async-signal-safe; it allocates
    // nothing and touches no memory shared with other threads.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the prctl: it would never be signalled.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

fn last_error_line(stderr: &str) -> String {
    let text = stderr.trim();
    if text.is_empty() {
        "helper exited without an answer".into()
    } else {
        text.to_string()
    }
}

/// The helper's `main`: never returns.
pub fn main(args: &[String]) -> ! {
    let code = match args.first().map(|a| serde_json::from_str::<Request>(a)) {
        Some(Ok(request)) => match serve(request) {
            Ok(reply) => {
                println!("{}", serde_json::to_string(&reply).expect("reply"));
                0
            }
            Err(e) => {
                let failed = Failed {
                    failure: Failure::new(e.kind(), error_chain(&e)),
                };
                println!("{}", serde_json::to_string(&failed).expect("failure"));
                eprintln!("{}", error_chain(&e));
                1
            }
        },
        Some(Err(e)) => {
            eprintln!("bad helper request: {e}");
            2
        }
        None => {
            eprintln!("usage: {HELPER_ARG} '<request json>'");
            2
        }
    };
    std::process::exit(code)
}

/// An error and its sources, one after the other.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

pub(crate) fn inherited_or_null(fd: Option<RawFd>) -> Result<OwnedFd> {
    match fd {
        // SAFETY: the fd was inherited from the shim for this purpose (see `run`) and
        // nothing else in this process owns it.
        Some(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
        None => std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .map(OwnedFd::from)
            .map_err(Error::io("open /dev/null")),
    }
}

fn serve(request: Request) -> Result<Reply> {
    let pid = |pid| Reply {
        pid,
        data: serde_json::Value::Null,
    };
    let data = |value: serde_json::Value| Reply {
        pid: 0,
        data: value,
    };
    if let Request::History { config, .. } | Request::Store { config, .. } = &request {
        crate::storage::fault::choose_from(config.fault_file.as_deref());
    }
    match request {
        Request::Restore { .. } => {
            crate::checkpoint::restore_helper::serve(request).map(|(pid, phases)| Reply {
                pid,
                data: json(&phases),
            })
        }
        Request::Checkpoint { root, state, opts } => {
            let c = crate::container::Container { root, state };
            Ok(data(json(&c.checkpoint_here(&opts)?)))
        }
        Request::Store { config, op } => crate::storage::in_helper::serve(&config, op).map(data),
        Request::History {
            config,
            root,
            state,
            op,
        } => {
            let c = crate::container::Container { root, state };
            c.history_here(&config, op).map(data)
        }
        Request::ApplyFsDelta { dir, rootfs } => {
            crate::checkpoint::engine::apply_fs_delta_here(&dir, &rootfs).map(|()| pid(0))
        }
        Request::Create { .. } | Request::Exec { .. } => serve_libcontainer(request).map(pid),
    }
}

fn json<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).expect("reply serializes")
}

fn serve_libcontainer(request: Request) -> Result<i32> {
    use libcontainer::container::builder::ContainerBuilder;
    use libcontainer::syscall::syscall::SyscallType;

    let stdio = request.stdio();
    let (id, root, console_socket, tracking) = match &request {
        Request::Create {
            id,
            root,
            console_socket,
            tracking,
            ..
        }
        | Request::Exec {
            id,
            root,
            console_socket,
            tracking,
            ..
        } => (
            id.clone(),
            root.clone(),
            console_socket.clone(),
            tracking.clone(),
        ),
        _ => unreachable!("served by serve()"),
    };
    TrackingCgroup::at(tracking).add(std::process::id() as i32)?;
    let (root_of_exec, id_of_exec) = (root.clone(), id.clone());

    let mut builder = ContainerBuilder::new(id, SyscallType::Linux)
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
    match request {
        Request::Create { bundle, .. } => {
            let spec = crate::container::load_spec(&bundle)?;
            let cgroup_path = libcontainer::config::YoukiConfig::from_spec(&spec, &id_of_exec)
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
                    operation: "create container",
                    message: "libcontainer returned a container without a pid".into(),
                })?;
            if crate::netns::owns_network_namespace(&spec) {
                crate::netns::loopback_up(pid)?;
            }
            // Last: the helper stays in the container's mount namespace.
            crate::cgroup_view::seal(pid, &spec)?;
            Ok(pid)
        }
        Request::Exec { process, .. } => {
            let init = libcontainer::container::Container::load(root_of_exec.join(&id_of_exec))
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
                .with_process(Some(process))
                .with_detach(true)
                .as_sibling(true)
                .build()
                .map_err(Error::libcontainer("exec"))?;
            Ok(pid.as_raw())
        }
        _ => unreachable!("served by serve()"),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn test_a_child_dies_with_the_thread_that_started_it() {
        // The thread starts the child and ends without waiting for it, as a
        // shim's thread does when the shim is killed.
        let mut child = std::thread::spawn(|| {
            let mut cmd = Command::new("sleep");
            cmd.arg("1000");
            die_with_parent(&mut cmd);
            cmd.spawn().expect("spawn sleep")
        })
        .join()
        .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().expect("poll the child") {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("the child outlived the thread that started it");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    }
}
