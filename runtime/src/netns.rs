//! The container's network namespace.
//!
//! libcontainer creates a new network namespace with its loopback interface down (runc
//! brings it up). Agents' sandboxes run local servers, so Crab brings `lo` up after
//! every create and restore: a restored server must accept connections on 127.0.0.1.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sched::CloneFlags;
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
use oci_spec::runtime::{LinuxNamespaceType, Spec};

use crate::{Error, Result};

/// Whether the spec gives the container a network namespace of its own (one without a
/// path: the runtime makes it, so the runtime sets it up).
pub fn owns_network_namespace(spec: &Spec) -> bool {
    crate::container::owns_namespace(spec, LinuxNamespaceType::Network)
}

/// The namespaces a container joins by path that CRIU must leave alone, as
/// (CRIU's name for the type, the key the dump records it by), with the path to
/// hand the restore: a pod's containers join its sandbox's network namespace,
/// which holds the pod's interface (CRIU cannot make that again) and must stay
/// shared. runc declares the same one.
pub fn joined(spec: &Spec) -> Vec<(&'static str, String)> {
    joined_paths(spec)
        .into_iter()
        .map(|(kind, key, _)| (kind, key))
        .collect()
}

/// [`joined`], with the path of each namespace.
pub fn joined_paths(spec: &Spec) -> Vec<(&'static str, String, std::path::PathBuf)> {
    spec.linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .into_iter()
        .flatten()
        .filter(|n| n.typ() == LinuxNamespaceType::Network)
        .filter_map(|n| Some(("net", EXTERNAL_NET_KEY.to_string(), n.path().clone()?)))
        .collect()
}

/// Binds a TCP listener at `addr` inside the network namespace at `path` (a
/// `/proc/<pid>/ns/net` or a bound namespace file). A socket belongs to the
/// namespace it was created in, whatever thread later uses it: a short-lived
/// thread joins the namespace, binds, and ends. The listener is non-blocking.
pub fn bind_in(
    path: &std::path::Path,
    addr: std::net::SocketAddr,
) -> std::io::Result<std::net::TcpListener> {
    let ns = File::open(path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("open {}: {e}", path.display())))?;
    let shown = path.display().to_string();
    std::thread::spawn(move || -> std::io::Result<std::net::TcpListener> {
        // SAFETY: setns takes a namespace descriptor (valid for the call) and a
        // type; it changes only this thread, which ends right after binding.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(std::io::Error::new(
                e.kind(),
                format!("join the network namespace {shown}: {e}"),
            ));
        }
        let l = std::net::TcpListener::bind(addr)
            .map_err(|e| std::io::Error::new(e.kind(), format!("bind {addr} in {shown}: {e}")))?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .join()
    .map_err(|_| std::io::Error::other("the bind thread panicked"))?
}

/// The key under which a dump records a joined network namespace.
pub const EXTERNAL_NET_KEY: &str = "extRootNetNS";

/// The inode of `pid`'s namespace of CRIU type `kind` (`net`), which CRIU's
/// `--external net[INODE]` names.
pub fn inode(pid: i32, kind: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/{kind}"))
        .ok()
        .map(|m| m.ino())
}

/// Where a network namespace with inode `inode` is bind-mounted on this host (an
/// engine's hold on it: Docker 28 keeps each container's at `<exec-root>/netns/<id>`),
/// from `/proc/self/mountinfo`.
pub fn bound_at(inode: u64) -> Option<std::path::PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    nsfs_mount(&table, inode)
}

/// The mount point of the first `nsfs` mount of `net:[inode]` in a mountinfo table.
fn nsfs_mount(mountinfo: &str, inode: u64) -> Option<std::path::PathBuf> {
    let root = format!("net:[{inode}]");
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fields: Vec<&str> = left.split(' ').collect();
        let fstype = right.split(' ').next()?;
        let point = fields.get(4)?;
        (fstype == "nsfs" && fields.get(3) == Some(&root.as_str()))
            .then(|| std::path::PathBuf::from(unescape(point)))
    })
}

/// A mountinfo path with its octal escapes (`\040` for a space) undone.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `pid`'s network namespace has no interface but `lo` (false when that
/// cannot be read).
pub fn only_loopback(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/net/dev"))
        .map(|text| interfaces(&text).all(|name| name == "lo"))
        .unwrap_or(false)
}

/// The interface names of a `/proc/<pid>/net/dev` table.
fn interfaces(table: &str) -> impl Iterator<Item = &str> {
    // Two header lines, then `name: counters...` per interface.
    table
        .lines()
        .skip(2)
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim()))
}

/// Moves the calling thread into `pid`'s network namespace and brings `lo` up there.
/// Call it from a single-threaded helper: the thread stays in that namespace.
pub fn loopback_up(pid: i32) -> Result<()> {
    let ns = format!("/proc/{pid}/ns/net");
    let file = File::open(&ns).map_err(Error::io(format!("open {ns}")))?;
    nix::sched::setns(&file, CloneFlags::CLONE_NEWNET)
        .map_err(Error::sys(format!("setns {ns}")))?;
    let sock: OwnedFd = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(Error::sys("socket for interface flags"))?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the name and writes the flags member of `req`, which
    // lives for the whole call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(Error::sys("get flags of lo")(nix::Error::last()));
    }
    // SAFETY: after SIOCGIFFLAGS the union holds the flags.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(Error::sys("bring lo up")(nix::Error::last()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_network_namespace_bound_by_an_engine_is_found_by_its_inode() {
        let table = "\
22 1 0:21 / /proc rw,nosuid shared:13 - proc proc rw
612 30 0:4 net:[4026532600] /run/crab/docker2/exec/netns/abc rw shared:300 - nsfs nsfs rw
613 30 0:4 net:[4026532601] /run/a\\040b rw - nsfs nsfs rw
614 30 0:4 mnt:[4026532600] /run/other rw - nsfs nsfs rw
";
        assert_eq!(
            nsfs_mount(table, 4026532600),
            Some(std::path::PathBuf::from("/run/crab/docker2/exec/netns/abc"))
        );
        assert_eq!(
            nsfs_mount(table, 4026532601),
            Some(std::path::PathBuf::from("/run/a b"))
        );
        assert_eq!(nsfs_mount(table, 4026532602), None);
    }

    #[test]
    fn the_interfaces_of_a_net_dev_table_are_read_by_name() {
        let table = "Inter-|   Receive                            |  Transmit\n \
             face |bytes    packets errs drop fifo frame compressed multicast|bytes\n    \
             lo:       0       0    0    0    0     0          0         0        0\n  \
             eth0: 1296      16    0    0    0     0          0         0     1296\n";
        assert_eq!(interfaces(table).collect::<Vec<_>>(), ["lo", "eth0"]);
    }

    // Needs root (it unshares a network namespace).
    #[cfg(feature = "host-tests")]
    #[test]
    fn a_new_namespace_has_only_lo_and_a_gone_process_has_none() {
        let mut child = std::process::Command::new("unshare")
            .args(["--net", "sleep", "30"])
            .spawn()
            .expect("unshare runs (the tests run as root)");
        let pid = child.id() as i32;
        let ours = std::fs::read_link("/proc/self/ns/net").unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read_link(format!("/proc/{pid}/ns/net")).ok() == Some(ours.clone()) {
            assert!(
                std::time::Instant::now() < deadline,
                "unshare did not unshare"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let only_lo = only_loopback(pid);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(only_lo);
        assert!(
            !only_loopback(pid),
            "a reaped process has no namespace to read"
        );
    }
}
