//! The helper process: where libcontainer forks.
//!
//! libcontainer creates containers with `clone` and runs Rust code in the child before it
//! execs. In a multithreaded process (the tokio shim) that child may inherit a lock held
//! by another thread and hang. So the shim re-executes its own binary as a short-lived,
//! single-threaded helper for each call that forks (create, exec). The helper moves
//! itself into the container's tracking cgroup, builds the container with
//! `as_sibling(true)` so that the container's process becomes a child of the shim (which
//! reaps it and reports its exit), prints the pid as JSON and exits. Calls that exec
//! tools whose exit status the shim's reaper would steal (CRIU, the stores' tools) run
//! there too.
//!
//! Protocol: `<shim binary> __crab_helper '<Request as JSON>'`; the stdio fds named in the
//! request are inherited; stdout carries one answer line, `{"reply": ...}` or
//! `{"failure": ...}` ([`wire`]), stderr the error text. Each request is a [`Call`],
//! which names the type of its reply:
//!
//! | call | served in | reply |
//! |---|---|---|
//! | [`Create`], [`Exec`] | [`spawn`] | the new process's pid |
//! | [`Restore`](crate::checkpoint::restore_helper::Restore) | [`crate::checkpoint::restore_helper`] | the init's pid and the restore's phases |
//! | [`Checkpoint`](crate::checkpoint::calls::Checkpoint), [`ApplyFsDelta`](crate::checkpoint::calls::ApplyFsDelta) | [`crate::checkpoint::calls`] | the manifest; nothing |
//! | [`OnHistory`](crate::checkpoint::calls::OnHistory) of one [`HistoryCall`](crate::checkpoint::calls::HistoryCall) | [`crate::checkpoint::calls`] | that operation's |
//! | [`OnStore`](crate::storage::in_helper::OnStore) of one [`StoreCall`](crate::storage::in_helper::StoreCall) | [`crate::storage::in_helper`] | that operation's |

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio as ProcessStdio};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

pub(crate) mod spawn;
pub(crate) mod wire;

pub use spawn::{Create, Exec};
pub use wire::Request;

/// `From<Call> for Enum` for each call that travels as `Enum::Variant(call)`: the
/// helper's [`Request`], and the operations of the history and of the store.
macro_rules! travels_as {
    ($enum:ident: $($call:ident => $variant:ident),* $(,)?) => {$(
        impl From<$call> for $enum {
            fn from(call: $call) -> $enum {
                $enum::$variant(call)
            }
        }
    )*};
}
pub(crate) use travels_as;

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

/// One kind of request to the helper, and what it answers: the request travels as
/// a [`Request`] (one JSON argument), its [`Call::Reply`] as `{"reply": ...}` on the
/// helper's stdout ([`wire`]).
pub trait Call: Into<Request> {
    /// What the helper answers when the call succeeds.
    type Reply: Serialize + DeserializeOwned;
    /// What the helper is asked to do, for errors ("helper process failed to ...").
    const OPERATION: &'static str;
    /// The stdio fds the helper inherits for the call (none by default).
    fn stdio(&self) -> StdioFds {
        StdioFds::default()
    }
    /// The call itself, in the helper.
    fn serve(self) -> Result<Self::Reply>;
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

/// Runs the helper (blocking) on the call `make` builds with the stdio fds it
/// inherits, and returns its reply. `stdio` is closed in this process afterwards:
/// the container holds the only copies.
pub(crate) fn run<C: Call>(
    make: impl FnOnce(StdioFds) -> C,
    stdio: ChildStdio,
) -> Result<C::Reply> {
    let call = make(stdio.fds());
    let operation = C::OPERATION;
    let fds: Vec<RawFd> = {
        let s = call.stdio();
        [s.stdin, s.stdout, s.stderr]
            .into_iter()
            .flatten()
            .collect()
    };
    let request: Request = call.into();
    // /proc/self/exe, not the path: a shim keeps working after its binary is
    // upgraded (the path then names another file, or none).
    let exe = std::path::PathBuf::from("/proc/self/exe");
    let json = serde_json::to_string(&request).expect("request serializes");
    let mut cmd = Command::new(&exe);
    // Not the caller's directory: a shim's is the bundle it started for, which
    // containerd removes with that container while the shim serves others (a
    // pod's, a fork's), and a helper started there could not read its cwd.
    cmd.arg(HELPER_ARG)
        .arg(json)
        .current_dir("/")
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
    match out.lines().find_map(|line| wire::decode(operation, line)) {
        Some(answer) => answer,
        None => Err(Error::Helper {
            operation,
            message: last_error_line(&err),
        }),
    }
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
        Some(Ok(request)) => {
            let (answer, code) = wire::serve(request);
            println!("{answer}");
            code
        }
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
