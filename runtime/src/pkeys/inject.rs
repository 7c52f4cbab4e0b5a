//! System calls run inside a stopped process, under ptrace: the thread's registers
//! and extended state are saved, each call is made by single-stepping a `syscall`
//! instruction found in the process's vDSO, and everything is put back before the
//! process is let go (stopped, as it was found).

use std::os::unix::fs::FileExt;

use nix::sys::ptrace;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::{Error, Result};

/// `NT_X86_XSTATE`: the thread's XSAVE area, which holds the protection-key rights
/// register (`PKRU`) that `pkey_alloc` changes.
const NT_X86_XSTATE: libc::c_int = 0x202;
/// Larger than any XSAVE area (AMX's is about 11 KiB).
const XSTATE_MAX: usize = 16 * 1024;

/// A thread of a stopped process, seized, its state saved.
pub(super) struct Injector {
    tid: Pid,
    regs: libc::user_regs_struct,
    xstate: Vec<u8>,
    sigmask: u64,
    syscall_at: u64,
}

impl Injector {
    /// Seizes `pid` (a process in group-stop) and saves its main thread's state.
    pub(super) fn seize(pid: i32) -> Result<Injector> {
        let tid = Pid::from_raw(pid);
        ptrace::seize(tid, ptrace::Options::empty()).map_err(Error::sys(format!("seize {pid}")))?;
        let saved = (|| {
            ptrace::interrupt(tid).map_err(Error::sys(format!("interrupt {pid}")))?;
            wait_stop(tid)?;
            let regs = ptrace::getregs(tid).map_err(Error::sys(format!("registers of {pid}")))?;
            let xstate = get_xstate(tid)?;
            let syscall_at = syscall_instruction(pid)?;
            // The process's pending signals (CRIU restores them) wait: none may be
            // delivered in the middle of an injected call.
            let mask = sigmask(tid, libc::PTRACE_GETSIGMASK, 0)?;
            sigmask(tid, libc::PTRACE_SETSIGMASK, u64::MAX)?;
            Ok((regs, xstate, mask, syscall_at))
        })();
        match saved {
            Ok((regs, xstate, mask, syscall_at)) => Ok(Injector {
                tid,
                regs,
                xstate,
                sigmask: mask,
                syscall_at,
            }),
            Err(e) => {
                let _ = kill(tid, Signal::SIGSTOP);
                let _ = ptrace::detach(tid, None);
                Err(e)
            }
        }
    }

    /// Runs system call `nr` with `args` in the process; answers its return value
    /// (a negative errno on failure).
    pub(super) fn call(&self, nr: libc::c_long, args: [u64; 4]) -> Result<i64> {
        let mut regs = self.regs;
        regs.rax = nr as u64;
        regs.rdi = args[0];
        regs.rsi = args[1];
        regs.rdx = args[2];
        regs.r10 = args[3];
        regs.rip = self.syscall_at;
        // No system-call restart may apply to the injected instruction.
        regs.orig_rax = u64::MAX;
        ptrace::setregs(self.tid, regs)
            .map_err(Error::sys(format!("set registers of {}", self.tid)))?;
        // A stop can come before the instruction ran: the SIGSTOP that stopped the
        // process (it is sent again at the release), or its group-stop reported
        // again. The step is then repeated; any other stop is an error.
        let mut stops = Vec::new();
        for _ in 0..4 {
            ptrace::step(self.tid, None).map_err(Error::sys(format!("step {}", self.tid)))?;
            stops.push(wait_stop(self.tid)?);
            let after = ptrace::getregs(self.tid)
                .map_err(Error::sys(format!("registers of {}", self.tid)))?;
            if after.rip == self.syscall_at + 2 {
                return Ok(after.rax as i64);
            }
            if after.rip != self.syscall_at {
                break;
            }
        }
        Err(Error::Helper {
            operation: "restore protection keys",
            message: format!(
                "process {}: the injected call at {:#x} did not run (stops: {stops:?})",
                self.tid, self.syscall_at
            ),
        })
    }

    /// Puts the saved state back and lets the process go, stopped.
    pub(super) fn release(self) -> Result<()> {
        let restored = set_xstate(self.tid, &self.xstate)
            .and_then(|()| {
                ptrace::setregs(self.tid, self.regs)
                    .map_err(Error::sys(format!("restore registers of {}", self.tid)))
            })
            .and_then(|()| sigmask(self.tid, libc::PTRACE_SETSIGMASK, self.sigmask).map(drop));
        // Queued now, taken at the detach: the process stops again whatever ptrace
        // did to its group-stop.
        let _ = kill(self.tid, Signal::SIGSTOP);
        let detached = ptrace::detach(self.tid, None)
            .map_err(Error::sys(format!("detach {}", self.tid)))
            .and_then(|()| stopped_again(self.tid));
        restored.and(detached)
    }
}

/// Waits until the detached process has taken the SIGSTOP queued at the release:
/// the detach wakes it, and until it takes the signal it shows as running. Callers
/// (a standby kept stopped, a test reading its state) see it stopped.
fn stopped_again(tid: Pid) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let state = crate::inspect::procs::state(tid.as_raw());
        if matches!(state, Some('T' | 't')) {
            return Ok(());
        }
        if state.is_none() || std::time::Instant::now() > deadline {
            return Err(Error::Helper {
                operation: "restore protection keys",
                message: format!("process {tid} did not stop again after the release ({state:?})"),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn wait_stop(tid: Pid) -> Result<WaitStatus> {
    loop {
        match waitpid(tid, Some(WaitPidFlag::__WALL))
            .map_err(Error::sys(format!("wait for {tid}")))?
        {
            s @ (WaitStatus::PtraceEvent(..) | WaitStatus::Stopped(..)) => return Ok(s),
            WaitStatus::Exited(..) | WaitStatus::Signaled(..) => {
                return Err(Error::Helper {
                    operation: "restore protection keys",
                    message: format!("process {tid} ended under ptrace"),
                })
            }
            _ => continue,
        }
    }
}

/// `PTRACE_GETSIGMASK` (answers the mask) or `PTRACE_SETSIGMASK` (sets `mask`).
fn sigmask(tid: Pid, request: libc::c_uint, mask: u64) -> Result<u64> {
    let mut mask = mask;
    // SAFETY: both requests read or write exactly size_of::<u64>() bytes (the kernel's
    // sigset_t) at the pointer, which lives until the call returns.
    let rc = unsafe {
        libc::ptrace(
            request,
            tid.as_raw(),
            std::mem::size_of::<u64>(),
            &mut mask as *mut u64,
        )
    };
    if rc < 0 {
        return Err(Error::sys(format!("signal mask of {tid}"))(
            nix::Error::last(),
        ));
    }
    Ok(mask)
}

fn get_xstate(tid: Pid) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; XSTATE_MAX];
    let len = xstate(tid, libc::PTRACE_GETREGSET, &mut buf)
        .map_err(Error::sys(format!("extended state of {tid}")))?;
    buf.truncate(len);
    Ok(buf)
}

fn set_xstate(tid: Pid, saved: &[u8]) -> Result<()> {
    let mut copy = saved.to_vec();
    xstate(tid, libc::PTRACE_SETREGSET, &mut copy)
        .map(drop)
        .map_err(Error::sys(format!("restore extended state of {tid}")))
}

/// `PTRACE_GETREGSET` (fills `buf`) or `PTRACE_SETREGSET` (reads it) of the thread's
/// XSAVE area; answers the length the kernel used.
fn xstate(tid: Pid, request: libc::c_uint, buf: &mut [u8]) -> nix::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: both requests access at most iov_len bytes of the buffer iov points at,
    // which lives until the call returns; GETREGSET shortens iov_len to what it wrote.
    let rc = unsafe {
        libc::ptrace(
            request,
            tid.as_raw(),
            NT_X86_XSTATE as usize as *mut libc::c_void,
            &mut iov as *mut libc::iovec,
        )
    };
    if rc < 0 {
        return Err(nix::Error::last());
    }
    Ok(iov.iov_len)
}

/// The address of a `syscall` instruction (`0f 05`) in the process's vDSO, which
/// every process has (CRIU restores it) and which no one writes.
fn syscall_instruction(pid: i32) -> Result<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(Error::io(format!("read the maps of {pid}")))?;
    let vdso = maps
        .lines()
        .filter(|l| l.ends_with("[vdso]"))
        .find_map(super::record::mapping_header)
        .filter(|&(_, _, prot)| prot & libc::PROT_EXEC as u32 != 0);
    let missing = || Error::Helper {
        operation: "restore protection keys",
        message: format!("process {pid} has no vDSO with a syscall instruction"),
    };
    let (start, end, _) = vdso.ok_or_else(missing)?;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem"))
        .map_err(Error::io(format!("open the memory of {pid}")))?;
    let mut code = vec![0u8; (end - start).min(64 * 1024) as usize];
    mem.read_exact_at(&mut code, start)
        .map_err(Error::io(format!("read the vDSO of {pid}")))?;
    let at = code
        .windows(2)
        .position(|w| w == [0x0f, 0x05])
        .ok_or_else(missing)?;
    Ok(start + at as u64)
}
