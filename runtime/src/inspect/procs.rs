//! The process side of a turn, read from /proc: which tasks exist, how much
//! CPU each has used, and how much input waits in their pipes and sockets.
//!
//! Without soft-dirty bits (not on every kernel) nothing says which pages a
//! process wrote. What is sound is weaker and cheap: a task that did not run
//! since the last dump cannot have changed its own memory or registers. Input
//! queued for it by someone else (a pipe, a socket) is kernel state CRIU saves,
//! so it counts too. docs/inspector.md lists what this does not cover.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// One task (thread) of the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Thread id.
    pub tid: i32,
    /// Start time (clock ticks after boot): tells a reused tid apart.
    pub start: u64,
    /// CPU time used so far (ns, from schedstat).
    pub runtime_ns: u64,
    /// Its command name.
    pub comm: String,
    /// The process it is a thread of (0 in baselines written before it was kept).
    #[serde(default)]
    pub tgid: i32,
}

/// Bytes waiting to be read on one descriptor of a process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queue {
    /// Process id.
    pub pid: i32,
    /// Descriptor.
    pub fd: i32,
    /// Bytes queued (FIONREAD).
    pub bytes: u64,
}

/// The tasks in cgroup directory `cgroup` (all threads of its processes).
pub fn tasks(cgroup: &Path) -> Vec<Task> {
    let mut out = Vec::new();
    for pid in processes(cgroup) {
        let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        let mut of_pid: Vec<Task> = threads
            .flatten()
            .filter_map(|t| t.file_name().to_str()?.parse().ok())
            .filter_map(|tid| thread(pid, tid))
            .collect();
        of_pid.sort_by_key(|t| t.tid);
        out.extend(of_pid);
    }
    out
}

/// One task, by tid (None once it is gone).
pub fn task(tid: i32) -> Option<Task> {
    thread(tid, tid).map(|mut t| {
        t.tgid = 0;
        t
    })
}

/// Thread `tid` of process `tgid`.
fn thread(tgid: i32, tid: i32) -> Option<Task> {
    let stat = std::fs::read_to_string(format!("/proc/{tgid}/task/{tid}/stat")).ok()?;
    let (comm, mut fields) = split_stat(&stat)?;
    let comm = comm.to_string();
    let start = fields.nth(19)?.parse().ok()?;
    let sched = std::fs::read_to_string(format!("/proc/{tgid}/task/{tid}/schedstat")).ok()?;
    let runtime_ns = sched.split_whitespace().next()?.parse().ok()?;
    Some(Task {
        tid,
        start,
        runtime_ns,
        comm,
        tgid,
    })
}

/// Where task `tid` is blocked: the user stack pointer and instruction of the
/// system call it sleeps in (`/proc/<tid>/syscall`); None while it runs.
pub fn blocked_at(tid: i32) -> Option<(String, String)> {
    let text = std::fs::read_to_string(format!("/proc/{tid}/syscall")).ok()?;
    let f: Vec<&str> = text.split_whitespace().collect();
    // "nr a0 a1 a2 a3 a4 a5 sp pc" when blocked; "running" or "-1 sp pc" otherwise.
    if f.len() != 9 {
        return None;
    }
    Some((f[7].to_string(), f[8].to_string()))
}

/// The parent of process `pid` (None once it is gone; 0 for a process whose
/// parent is outside its pid namespace).
pub fn parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    split_stat(&stat)?.1.nth(1)?.parse().ok()
}

/// The state letter of process `pid` (`R`, `S`, `T` for stopped, `Z`...; None once
/// it is gone).
pub fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    split_stat(&stat)?.1.next()?.chars().next()
}

/// A `stat` file's command and the fields after it (the state first). The
/// command may hold spaces and parentheses: the fields start after the last ')'.
fn split_stat(stat: &str) -> Option<(&str, std::str::SplitWhitespace<'_>)> {
    let (head, rest) = stat.rsplit_once(')')?;
    Some((head.split_once('(')?.1, rest.split_whitespace()))
}

/// The processes (thread-group leaders) in `cgroup`.
pub fn processes(cgroup: &Path) -> Vec<i32> {
    let text = std::fs::read_to_string(cgroup.join("cgroup.procs")).unwrap_or_default();
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// Input queued on the pipes and sockets of `pids`.
pub fn queues(pids: &[i32]) -> Vec<Queue> {
    let mut out = Vec::new();
    for &pid in pids {
        let Some(s) = streams(pid) else {
            continue;
        };
        for &(fd, _) in &s.fds {
            if let Some(bytes) = queued(&s.pidfd, fd) {
                if bytes > 0 {
                    out.push(Queue { pid, fd, bytes });
                }
            }
        }
    }
    out.sort_by_key(|q| (q.pid, q.fd));
    out
}

/// The pipes, FIFOs and sockets one process holds, and a pidfd to duplicate
/// them through ([`duplicate`]).
pub(super) struct Streams {
    pub(super) pidfd: OwnedFd,
    /// (descriptor, whether it is a socket)
    pub(super) fds: Vec<(i32, bool)>,
}

/// Process `pid`'s [`Streams`] (None once it is gone).
pub(super) fn streams(pid: i32) -> Option<Streams> {
    let entries = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    let pidfd = pidfd_open(pid)?;
    let fds = entries
        .flatten()
        .filter_map(|e| {
            // Pipes, sockets and FIFOs (a FIFO's link is its path, not "pipe:").
            let ft = std::fs::metadata(e.path()).ok()?.file_type();
            if !(ft.is_fifo() || ft.is_socket()) {
                return None;
            }
            let fd = e.file_name().to_str()?.parse::<i32>().ok()?;
            Some((fd, ft.is_socket()))
        })
        .collect();
    Some(Streams { pidfd, fds })
}

/// A pidfd of `pid` (None once it is gone).
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a non-negative result is a descriptor this process now owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A duplicate of descriptor `fd` of the process behind `pidfd` (pidfd_getfd).
pub(super) fn duplicate(pidfd: &OwnedFd, fd: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_getfd takes a pidfd, a target descriptor number and flags,
    // and returns a new descriptor or -1.
    let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    // SAFETY: a non-negative result is a descriptor this process now owns.
    (dup >= 0).then(|| unsafe { OwnedFd::from_raw_fd(dup as i32) })
}

/// FIONREAD on a duplicate of another process's descriptor.
fn queued(pidfd: &OwnedFd, fd: i32) -> Option<u64> {
    let dup = duplicate(pidfd, fd)?;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer, which is valid.
    let r = unsafe { libc::ioctl(dup.as_raw_fd(), libc::FIONREAD, &mut n) };
    if r == 0 {
        return Some(n.max(0) as u64);
    }
    // A listening TCP socket has no FIONREAD; its accept queue is in TCP_INFO
    // (tcpi_unacked holds the backlog in the LISTEN state). /proc/net/tcp would
    // say it too, but reading it walks the host's whole connection table.
    // SAFETY: tcp_info is plain integers; all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, which is that big.
    let r = unsafe {
        libc::getsockopt(
            dup.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    const TCP_LISTEN: u8 = 10;
    (r == 0 && info.tcpi_state == TCP_LISTEN).then_some(u64::from(info.tcpi_unacked))
}

/// Whether any of `pids` holds a deleted (or never linked) file open.
pub fn holds_deleted_files(pids: &[i32]) -> bool {
    pids.iter().any(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|entries| {
                entries.flatten().any(|e| {
                    std::fs::read_link(e.path())
                        .map(|t| t.to_string_lossy().ends_with(" (deleted)"))
                        .unwrap_or(false)
                })
            })
            .unwrap_or(false)
    })
}

/// Whether process `pid` maps a file shared and writable: its stores through
/// the mapping change the file without a syscall the inspector would see.
pub fn maps_file_shared_writable(pid: i32) -> bool {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    text.lines().any(|l| {
        let mut f = l.split_whitespace();
        let perms = f.nth(1).unwrap_or("");
        let path = f.nth(3).unwrap_or("");
        perms.as_bytes().get(1) == Some(&b'w')
            && perms.as_bytes().get(3) == Some(&b's')
            && path.starts_with('/')
            && !path.starts_with("/dev/zero")
            && !path.starts_with("/SYSV")
            && !path.starts_with("/memfd:")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_start_time_and_cpu_time() {
        let me = task(std::process::id() as i32).expect("read own stat");
        assert!(me.start > 0 && me.runtime_ns > 0, "{me:?}");
    }

    #[test]
    fn a_connection_waiting_to_be_accepted_is_seen_as_queued() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let me = std::process::id() as i32;
        let before = queues(&[me]);
        assert!(!before.iter().any(|q| q.fd == l.as_raw_fd()), "{before:?}");
        let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let q = queues(&[me]);
        assert!(
            q.iter().any(|q| q.fd == l.as_raw_fd() && q.bytes == 1),
            "{q:?}"
        );
    }

    #[test]
    fn bytes_written_to_a_pipe_are_seen_as_queued() {
        let (r, w) = nix::unistd::pipe().unwrap();
        nix::unistd::write(&w, b"hello").unwrap();
        let me = std::process::id() as i32;
        let q = queues(&[me]);
        assert!(
            q.iter().any(|q| q.fd == r.as_raw_fd() && q.bytes == 5),
            "{q:?}"
        );
    }
}
