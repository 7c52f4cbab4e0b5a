//! A client on a terminal: a command (`ctr run -t`, `ctr container restore --live`)
//! run under a pty that the test drives, as a person at a terminal would.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{address, namespace, wait_until};

/// A command on a terminal; killed when dropped.
pub struct Pty {
    child: Child,
    input: File,
    output: Arc<Mutex<Vec<u8>>>,
}

impl Pty {
    /// Runs `ctr ARGS` (address and namespace set) on a new terminal.
    pub fn ctr(args: &[&str]) -> Pty {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address")
            .arg(address())
            .arg("--namespace")
            .arg(namespace())
            .args(args);
        Pty::spawn(cmd)
    }

    /// Runs `cmd` as the session leader of a new pty, the pty its controlling terminal.
    pub fn spawn(mut cmd: Command) -> Pty {
        let pty = nix::pty::openpty(None, None).expect("openpty");
        cloexec(&pty.master);
        let slave = |fd: &OwnedFd| Stdio::from(fd.try_clone().expect("dup slave"));
        cmd.stdin(slave(&pty.slave))
            .stdout(slave(&pty.slave))
            .stderr(slave(&pty.slave));
        // SAFETY: setsid and ioctl are async-signal-safe; no memory is shared.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn on a pty");
        drop(pty.slave);
        let master = File::from(pty.master);
        let input = master.try_clone().expect("dup master");
        let output = Arc::new(Mutex::new(Vec::new()));
        let sink = output.clone();
        std::thread::spawn(move || {
            let mut master = master;
            let mut buf = [0u8; 4096];
            // EIO once the command and all its children have closed the terminal.
            while let Ok(n) = master.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Pty {
            child,
            input,
            output,
        }
    }

    /// Types `text`.
    pub fn send(&mut self, text: &str) {
        self.input
            .write_all(text.as_bytes())
            .expect("write to the pty");
    }

    /// How much output there is so far (for [`Pty::wait_for_after`]).
    pub fn mark(&self) -> usize {
        self.output.lock().unwrap().len()
    }

    /// All output so far, as text.
    pub fn output(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    /// Waits until the output after `mark` holds `needle`.
    pub fn wait_for_after(&self, mark: usize, needle: &str, timeout: Duration) -> bool {
        wait_until(timeout, || {
            let out = self.output.lock().unwrap();
            String::from_utf8_lossy(&out[mark.min(out.len())..]).contains(needle)
        })
    }

    /// Waits until the output holds `needle`.
    pub fn wait_for(&self, needle: &str, timeout: Duration) -> bool {
        self.wait_for_after(0, needle, timeout)
    }

    /// Whether the command is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cloexec(fd: &OwnedFd) {
    // SAFETY: fcntl on an fd this process owns.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
}
