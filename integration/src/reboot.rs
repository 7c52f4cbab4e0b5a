//! A host restart, as far as one containerd and its sandboxes see it, without
//! restarting the host: every process of theirs dies at once, and what lives in
//! `/run` and in the kernel goes. Used on a [`SecondContainerd`], never on the
//! test containerd the other tests share.
//!
//! What goes, in order:
//! 1. containerd, with SIGKILL first, so that it never sees a shim die (and runs
//!    no shim's `delete`, the clean-up after a crash), then at once every shim it
//!    started, their children (turn proxies, helpers) and every process of its
//!    containers (their cgroups' members), all with SIGKILL;
//! 2. the mounts under its state directories (the containers' root file
//!    systems), then the directories themselves: containerd's state directory
//!    (task bundles), the shims' crab `state_dir` (containers' state, control
//!    sockets, proxy logs) and the shims' ttrpc sockets under
//!    `/run/containerd/s/`;
//! 3. its containers' cgroups (empty by then);
//!
//! then containerd starts again on the same root, which keeps its metadata,
//! images and snapshots, as `/var/lib` does across a restart; so do Crab's store
//! and checkpoint histories. What this machine shares between containerds stays:
//! CRIU's kernel-probe cache (`/run/criu`), `/run/crab/restore-requests` (a
//! restore's request lives only while that restore runs) and the btrfs pool's
//! mount (after a real restart it must be mounted before containerd starts).

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::host::{processes, unmount_under};
use crate::second_containerd::SecondContainerd;

/// How long the steps of a restart took.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// containerd, its shims and its containers' processes killed, until all
    /// were gone.
    pub killed: Duration,
    /// The mounts, state directories, shim sockets and cgroups removed.
    pub emptied: Duration,
    /// containerd started again, until it answered on its socket.
    pub started: Duration,
}

/// How long killed processes may take to go.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

/// Restarts `host` as a host restart would (see the module docs); how long each
/// step took.
pub fn restart(host: &mut SecondContainerd) -> Result<Timings> {
    restart_with(host, true)
}

/// [`restart`], but the shims' ttrpc sockets are left where they were, dead: a
/// host whose `/run/containerd` outlived the restart (or a containerd that never
/// saw its shims die). The next shim of a container binds the same path.
pub fn restart_keeping_shim_sockets(host: &mut SecondContainerd) -> Result<Timings> {
    restart_with(host, false)
}

fn restart_with(host: &mut SecondContainerd, remove_sockets: bool) -> Result<Timings> {
    let containers = host.containers().context("list the containers")?;
    let sockets = host.shim_sockets();
    let cgroups: Vec<PathBuf> = containers
        .iter()
        .flat_map(|id| crate::cgroup_dirs_named(id))
        .collect();
    let started = Instant::now();
    host.kill()?;
    let mut victims: BTreeSet<i32> = BTreeSet::new();
    // Until nothing of theirs is left: a process may fork while the others die.
    loop {
        let now = alive(&targets(host, &containers, &cgroups));
        if now.is_empty() {
            break;
        }
        if started.elapsed() > KILL_TIMEOUT {
            bail!("processes outlived the restart's SIGKILL: {now:?}");
        }
        for pid in &now {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        victims.extend(now);
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = started.elapsed();
    eprintln!(
        "restart: containerd and {} processes of its shims and containers killed",
        victims.len()
    );

    let emptied_at = Instant::now();
    for dir in [&host.state, &host.crab_state] {
        unmount_under(dir)?;
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("remove {}", dir.display()))
            }
            _ => {}
        }
    }
    for socket in sockets.iter().filter(|_| remove_sockets) {
        match std::fs::remove_file(socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("remove {}", socket.display()))
            }
            _ => {}
        }
    }
    remove_cgroups(&cgroups)?;
    let emptied = emptied_at.elapsed();

    let started = host.spawn().context("start containerd again")?;
    Ok(Timings {
        killed,
        emptied,
        started,
    })
}

/// The processes a restart kills: `host`'s shims, the turn proxies of its
/// `containers`, their descendants, and the members of the containers' `cgroups`.
fn targets(host: &SecondContainerd, containers: &[String], cgroups: &[PathBuf]) -> BTreeSet<i32> {
    let mut out: BTreeSet<i32> = host.shim_pids().into_iter().collect();
    for id in containers {
        out.extend(crate::proxy_pids(id));
    }
    let children = children();
    let mut stack: Vec<i32> = out.iter().copied().collect();
    while let Some(pid) = stack.pop() {
        for child in children.get(&pid).into_iter().flatten() {
            if out.insert(*child) {
                stack.push(*child);
            }
        }
    }
    for dir in cgroups {
        out.extend(members(dir));
    }
    out
}

/// Those of `pids` that still run (a zombie is dead: only its parent's wait is
/// missing).
fn alive(pids: &BTreeSet<i32>) -> Vec<i32> {
    pids.iter()
        .copied()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let state = s[s.rfind(')')? + 1..]
                        .split_whitespace()
                        .next()?
                        .to_string();
                    Some(state != "Z" && state != "X")
                })
                .unwrap_or(false)
        })
        .collect()
}

/// Each process's children, from `/proc/<pid>/stat`.
fn children() -> HashMap<i32, Vec<i32>> {
    let mut map: HashMap<i32, Vec<i32>> = HashMap::new();
    for (pid, _) in processes() {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            map.entry(ppid).or_default().push(pid);
        }
    }
    map
}

/// The processes in cgroup `dir` and its descendants.
fn members(dir: &std::path::Path) -> Vec<i32> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
        out.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    out
}

/// Removes the containers' `cgroups` (in every hierarchy) with the cgroups
/// under them, deepest first. The kernel may take a moment to let go of the
/// processes just killed.
fn remove_cgroups(cgroups: &[PathBuf]) -> Result<()> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for top in cgroups {
        let mut stack = vec![top.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
            dirs.push(d);
        }
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for d in dirs {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match std::fs::remove_dir(&d) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) if Instant::now() < deadline && e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e).with_context(|| format!("remove cgroup {}", d.display())),
            }
        }
    }
    Ok(())
}
