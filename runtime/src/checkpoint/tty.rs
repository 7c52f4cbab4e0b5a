//! A container's terminal across a checkpoint (`ctr run -t`, a task with `terminal`).
//!
//! The init's stdio is the slave of a pty whose master is the shim's, outside the
//! dumped tree. CRIU dumps it as an unpaired slave (`--shell-job`; runc asks CRIU's RPC
//! for the same with `orphan_pts_master`), with its termios and window size.
//! `--external tty[rdev:dev]` is not enough: an interactive shell holds `/dev/tty` open,
//! and CRIU dumps that only with the pty itself. At restore a new slave made by the
//! shim takes the old one's place by its key (`--inherit-fd fd[N]:tty[rdev:dev]`): CRIU
//! puts the dumped settings on it and makes it the session's controlling terminal
//! again; its master goes to the task's stdio as at create. libcontainer binds the
//! slave onto `/dev/console`: that mount is external, bound to the new slave at restore.

use std::os::unix::fs::MetadataExt;

/// The mount point libcontainer binds the init's terminal on.
pub const CONSOLE: &str = "/dev/console";

/// CRIU's key (`tty[rdev:dev]`) of the pty slave on `pid`'s fd 0, 1 or 2, if any.
pub fn of_process(pid: i32) -> Option<String> {
    (0..3).find_map(|fd| {
        let link = format!("/proc/{pid}/fd/{fd}");
        let target = std::fs::read_link(&link).ok()?;
        if !target.starts_with("/dev/pts/") {
            return None;
        }
        // Through the magic link: the device as the container sees it, whatever its
        // devpts instance.
        let meta = std::fs::metadata(&link).ok()?;
        Some(key(meta.rdev(), meta.dev()))
    })
}

/// CRIU's key of a tty (`tty[rdev:dev]`, in hex as CRIU writes it).
pub fn key(rdev: u64, dev: u64) -> String {
    format!("tty[{rdev:x}:{dev:x}]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_written_as_criu_reads_it() {
        assert_eq!(key(0x8800, 0x1a), "tty[8800:1a]");
    }

    #[test]
    fn a_process_on_a_pty_has_the_key_of_its_slave() {
        use std::os::fd::AsFd;
        let pty = nix::pty::openpty(None, None).expect("openpty");
        let slave = std::fs::File::from(pty.slave.as_fd().try_clone_to_owned().unwrap());
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .stdin(slave)
            .spawn()
            .expect("spawn sleep");
        let meta = std::fs::metadata(format!("/proc/self/fd/{}", {
            use std::os::fd::AsRawFd;
            pty.slave.as_raw_fd()
        }))
        .unwrap();
        let found = of_process(child.id() as i32);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found, Some(key(meta.rdev(), meta.dev())));
        assert_eq!(of_process(std::process::id() as i32 + 0x40000000), None);
    }
}
