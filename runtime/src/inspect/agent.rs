//! The agent inside the sandbox, as a turn's classification sees it
//! (`[agent] fast_forward`, docs/agents.md).
//!
//! The agent is the process that holds the connection the turn's LLM request
//! came on: the proxy saw the connection from its end and names it, and the
//! socket of the container's process whose own and peer addresses are that
//! connection's, seen from the other end, is the agent's. Its threads, its
//! queued input and the paths of its own bookkeeping (`state_paths`) do not
//! make a checkpoint by themselves: after a restore the agent is fast-forwarded
//! from the proxy's journal, which makes them again. Its children (the tools it
//! runs) are tracked like every other process.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use super::procs;
use crate::control::AgentConn;

/// What the policy leaves out for the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentView {
    /// The agent's processes (thread-group ids).
    pub pids: Vec<i32>,
    /// Paths (and what is below them) only the agent's bookkeeping writes.
    pub state_paths: Vec<String>,
}

impl AgentView {
    /// Whether `path` is one of the agent's state paths or below one.
    pub fn owns_path(&self, path: &str) -> bool {
        self.state_paths.iter().any(|p| {
            path.strip_prefix(p.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
    }
}

/// The processes among `pids` holding a TCP socket bound to `conn.local` and
/// connected to `conn.remote`.
pub fn holders(pids: &[i32], conn: AgentConn) -> Vec<i32> {
    pids.iter()
        .copied()
        .filter(|&pid| holds(pid, conn))
        .collect()
}

/// Of `roots`, the one a process among `pids` holding `conn` runs under: that
/// process itself or its nearest ancestor in `roots` (such as the exec it was
/// started in). None when no holder is below any of them.
pub fn holder_under(pids: &[i32], conn: AgentConn, roots: &[i32]) -> Option<i32> {
    holders(pids, conn)
        .into_iter()
        .find_map(|pid| under(pid, roots, procs::parent))
}

/// The first of `pid` and its ancestors (`parent` of each) that is in `roots`.
fn under(pid: i32, roots: &[i32], parent: impl Fn(i32) -> Option<i32>) -> Option<i32> {
    let mut p = pid;
    // Bounded: a pid reused while it is walked must not make a loop.
    for _ in 0..4096 {
        if roots.contains(&p) {
            return Some(p);
        }
        p = parent(p).filter(|&pp| pp > 1 && pp != p)?;
    }
    None
}

fn holds(pid: i32, conn: AgentConn) -> bool {
    procs::streams(pid).is_some_and(|s| {
        s.fds
            .iter()
            .filter(|(_, socket)| *socket)
            .any(|&(fd, _)| procs::duplicate(&s.pidfd, fd).is_some_and(|dup| is_conn(&dup, conn)))
    })
}

/// Whether socket `s` is the connection `conn`, from its side.
fn is_conn(s: &OwnedFd, conn: AgentConn) -> bool {
    let fd = s.as_raw_fd();
    address(fd, libc::getsockname) == Some(conn.local)
        && address(fd, libc::getpeername) == Some(conn.remote)
}

type NameFn = unsafe extern "C" fn(libc::c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> i32;

/// The socket's own or peer address (by `which`), for IPv4 and IPv6.
fn address(fd: i32, which: NameFn) -> Option<SocketAddr> {
    // SAFETY: sockaddr_storage is plain bytes; all zeroes is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: getsockname/getpeername write at most `len` bytes into `ss`, which
    // is that big, and set `len`.
    let r = unsafe {
        which(
            fd,
            (&mut ss as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return None;
    }
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a: libc::sockaddr_in =
                unsafe { std::ptr::read((&ss as *const libc::sockaddr_storage).cast()) };
            let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::from((ip, u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a: libc::sockaddr_in6 =
                unsafe { std::ptr::read((&ss as *const libc::sockaddr_storage).cast()) };
            let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::from((ip, u16::from_be(a.sin6_port))))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// A connection held by this process at both ends, as its client's side
    /// sees it; the sockets are kept open as long as the answer lives.
    fn connection() -> (AgentConn, [TcpStream; 2]) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, peer) = l.accept().unwrap();
        let conn = AgentConn {
            local: peer,
            remote: l.local_addr().unwrap(),
        };
        (conn, [c, server])
    }

    #[test]
    fn the_process_holding_a_connection_is_found_from_the_other_end() {
        let (conn, _sockets) = connection();
        let me = std::process::id() as i32;
        assert_eq!(holders(&[me], conn), [me]);
        // The same addresses the other way round are the proxy's end, not the agent's.
        let other = AgentConn {
            local: conn.remote,
            remote: conn.local,
        };
        let mut wrong = conn;
        wrong.local.set_port(conn.local.port().wrapping_add(1));
        assert!(holders(&[me], wrong).is_empty());
        // Our own accepted socket is that reversed connection, and it is here too.
        assert_eq!(holders(&[me], other), [me]);
    }

    #[test]
    fn a_holder_is_found_under_itself_or_its_nearest_listed_ancestor() {
        // 40 -> 30 -> 20 -> 10 -> 1
        let parent = |p: i32| Some(if p > 10 { p - 10 } else { 1 });
        assert_eq!(under(40, &[20, 30], parent), Some(30));
        assert_eq!(under(20, &[20], parent), Some(20));
        assert_eq!(under(40, &[50], parent), None);
        // A process that is gone, or whose parent is outside the namespace.
        assert_eq!(under(40, &[20], |_| None), None);
        assert_eq!(under(40, &[20], |_| Some(0)), None);
    }

    #[test]
    fn a_connection_held_by_this_process_is_under_its_parent() {
        let (conn, _sockets) = connection();
        let me = std::process::id() as i32;
        let parent = procs::parent(me).expect("this process has a parent");
        // The walk stops below pid 1.
        if parent > 1 {
            assert_eq!(holder_under(&[me], conn, &[parent]), Some(parent));
        }
        assert_eq!(holder_under(&[me], conn, &[me, parent]), Some(me));
        assert_eq!(holder_under(&[], conn, &[parent]), None);
    }

    #[test]
    fn state_paths_own_what_is_below_them_and_nothing_beside() {
        let v = AgentView {
            pids: vec![],
            state_paths: vec!["/root/.claude".into()],
        };
        assert!(v.owns_path("/root/.claude"));
        assert!(v.owns_path("/root/.claude/projects/x.jsonl"));
        assert!(!v.owns_path("/root/.claude.json"));
        assert!(!v.owns_path("/root"));
    }
}
