//! Who may use a container's host-side sockets (its control socket, its proxy's
//! host endpoint): root, or a member of the configuration's `control_group`. The
//! sockets' modes are the first fence; the caller's credentials (`SO_PEERCRED`) are
//! the one that holds when a mode is loosened by mistake.

/// Whether the peer with `uid`, `gid` and `pid` may use the sockets: root, or a
/// member (primary or supplementary) of `group`. The refusal says why.
pub fn allowed(uid: u32, gid: u32, pid: Option<i32>, group: Option<u32>) -> Result<(), String> {
    if uid == 0 {
        return Ok(());
    }
    let refused = || {
        format!(
            "uid {uid} gid {gid} is not root{}",
            if group.is_some() {
                " nor in the control group"
            } else {
                ""
            }
        )
    };
    let Some(group) = group else {
        return Err(refused());
    };
    if gid == group {
        return Ok(());
    }
    // Supplementary groups: only /proc has them.
    let member = pid.is_some_and(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Groups:"))
                    .map(|g| g.split_whitespace().any(|g| g.parse() == Ok(group)))
            })
            .unwrap_or(false)
    });
    if member {
        Ok(())
    } else {
        Err(refused())
    }
}

/// Whether the peer of the connected unix socket `conn` may use the sockets
/// ([`allowed`], from its `SO_PEERCRED`).
pub fn socket_allowed(conn: std::os::fd::BorrowedFd<'_>, group: Option<u32>) -> Result<(), String> {
    let cred = nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| format!("no peer credentials: {e}"))?;
    let pid = (cred.pid() > 0).then_some(cred.pid());
    allowed(cred.uid(), cred.gid(), pid, group)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_the_group_are_allowed_others_are_told_why_not() {
        assert!(allowed(0, 0, None, None).is_ok());
        assert!(allowed(1000, 50, None, Some(50)).is_ok());
        let e = allowed(65534, 65534, None, None).unwrap_err();
        assert!(e.contains("uid 65534") && e.contains("not root"), "{e}");
        let e = allowed(65534, 65534, None, Some(50)).unwrap_err();
        assert!(e.contains("control group"), "{e}");
    }

    #[test]
    fn a_socket_peer_is_checked_by_its_credentials() {
        use std::os::fd::AsFd;
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        // This test runs as whoever runs it: root passes, others need the group.
        let me = nix::unistd::getegid().as_raw();
        assert!(socket_allowed(a.as_fd(), Some(me)).is_ok());
    }
}
