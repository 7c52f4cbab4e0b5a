//! CRIU, driven through its command line.
//!
//! The CLI (rather than CRIU's RPC) keeps each dump and restore a plain child process
//! with a log file: the restore runs inside the single-threaded helper, which has
//! joined the container's cgroups first, so that the restored tasks start there
//! (`--manage-cgroups=ignore` leaves them in CRIU's own cgroups).
//!
//! Options common to both sides: TCP connections, external unix sockets and file locks
//! are dumped rather than refused (an agent's sandbox holds all of them); the network is
//! locked with nftables (iptables may be absent); deleted-but-open files up to
//! [`GHOST_LIMIT`] are carried in the image.

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::{Error, Result};

/// The CRIU binary and how long one run of it may take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tool {
    /// Path, or a name looked up in `PATH`.
    pub path: PathBuf,
    /// Seconds after which a run is killed (CRIU can spin on a damaged image).
    pub timeout_s: u64,
}

impl Tool {
    /// The configured one (`checkpoint.criu`, `checkpoint.criu_timeout_s`).
    pub fn from_config(config: &Config) -> Tool {
        Tool {
            path: config.checkpoint.criu.clone(),
            timeout_s: config.checkpoint.criu_timeout_s,
        }
    }
}

/// Largest deleted-but-open file carried inside the image.
pub const GHOST_LIMIT: &str = "256M";

const COMMON: &[&str] = &[
    "--manage-cgroups=ignore",
    "--file-locks",
    "--tcp-established",
    "--ext-unix-sk",
];

/// What to dump.
#[derive(Debug, Clone)]
pub struct Dump {
    /// CRIU.
    pub criu: Tool,
    /// The root of the process tree (the container's init).
    pub pid: i32,
    /// Where the images go (it must exist).
    pub images: PathBuf,
    /// Keep the processes running afterwards (else CRIU kills them).
    pub leave_running: bool,
    /// The container's freezer cgroup: CRIU freezes through it, and checks that every
    /// task in it belongs to the dumped tree. A cgroup frozen before stays frozen.
    pub freeze_cgroup: Option<PathBuf>,
    /// The container's cgroup v2 tracking directory, which holds every one of
    /// its processes: a dump whose `freeze_cgroup` is the v1 freezer's and holds
    /// a process stopped by a signal freezes through it instead
    /// ([`crate::stopped::Handover`]). Without it such a dump is refused.
    pub tracking_cgroup: Option<PathBuf>,
    /// Mount points (inside the container) of bind mounts from the host: recorded by
    /// name, and bound again from their source at restore.
    pub external_mounts: Vec<String>,
    /// (mount point, key) of external mounts recorded under a key other than their
    /// mount point: the host device nodes bound into a container with a user
    /// namespace ([`crate::userns::dev_binds`]).
    pub external_keyed: Vec<(String, String)>,
    /// Namespaces the container joined rather than owns (a pod's network namespace,
    /// its sandbox's): (type as CRIU names it, inode, key). CRIU records them by key
    /// instead of dumping them; the restore hands it the same namespace by that key.
    pub external_namespaces: Vec<(&'static str, u64, String)>,
    /// The init's stdio is a pty slave whose master is outside the tree (the shim's):
    /// CRIU dumps it as an unpaired slave (`--shell-job`); at restore a new slave takes
    /// its place by its key (see [`crate::checkpoint::tty`]).
    pub terminal: bool,
    /// The tree's network namespace is the container's own (made by the runtime,
    /// which brings its `lo` up after every restore).
    pub own_network: bool,
    /// Dump that namespace empty (`--empty-ns net`): hooks make it at the restore.
    pub empty_network: bool,
    /// It is, and it has no interface but `lo`: nothing outside can send to it, so
    /// the dump does not lock it (CRIU's lock is a firewall table, set and removed
    /// with libnftables at each end).
    pub loopback_only: bool,
    /// The inode of the container's own network namespace when an engine holds and
    /// filled it (Docker 28): it is in `external_namespaces`, and a restore joins it
    /// where the engine keeps it.
    pub held_network: Option<u64>,
}

/// What to restore.
#[derive(Debug, Clone)]
pub struct Restore {
    /// CRIU.
    pub criu: Tool,
    /// The images written by [`dump`] (only read: several restores may share them).
    pub images: PathBuf,
    /// Where CRIU writes its log.
    pub work: PathBuf,
    /// The container's root file system, already in the dumped state.
    pub root: PathBuf,
    /// Where CRIU writes the restored init's pid.
    pub pidfile: PathBuf,
    /// Open fds (without CLOEXEC) that replace files the dumped processes had open with
    /// the peers outside the tree, by CRIU's key (such as `pipe:[1234]`, or
    /// `tty[rdev:dev]` for an external terminal).
    pub inherit: Vec<(RawFd, String)>,
    /// (mount point inside the container, source on this host) of each bind mount.
    pub external_mounts: Vec<(String, PathBuf)>,
    /// The network namespace was dumped empty: CRIU makes a new, empty one and runs
    /// this action script (command, environment), which makes it as the spec's
    /// hooks do.
    pub network_by_hooks: Option<(String, Vec<(String, String)>)>,
    /// Restore the mounts with CRIU's older engine, which does not rebuild their
    /// sharing ([`crate::checkpoint::engine::Dumped::foreign_mounts`]).
    pub mount_compat: bool,
    /// Leave every restored task stopped (SIGSTOP) instead of running: a standby
    /// replica, continued when it is adopted (`crate::standby`).
    pub leave_stopped: bool,
}

/// Dumps the process tree.
pub fn dump(d: &Dump) -> Result<()> {
    let mut cmd = Command::new(&d.criu.path);
    cmd.arg("dump")
        .arg("--tree")
        .arg(d.pid.to_string())
        .arg("--images-dir")
        .arg(&d.images)
        .args(["--log-file", "dump.log", "-v4"])
        .args(COMMON)
        .arg("--network-lock")
        .arg(if d.loopback_only { "skip" } else { "nftables" })
        .args(["--ghost-limit", GHOST_LIMIT]);
    if d.leave_running {
        cmd.arg("--leave-running");
    }
    for m in &d.external_mounts {
        cmd.arg("--external").arg(format!("mnt[{m}]:{m}"));
    }
    for (point, key) in &d.external_keyed {
        cmd.arg("--external").arg(format!("mnt[{point}]:{key}"));
    }
    for (kind, inode, key) in &d.external_namespaces {
        cmd.arg("--external").arg(format!("{kind}[{inode}]:{key}"));
    }
    if d.terminal {
        cmd.arg("--shell-job");
    }
    if d.empty_network {
        cmd.args(["--empty-ns", "net"]);
    }
    // The cgroup is frozen already (`crate::inspect::Freeze`), or its client
    // paused it: its processes stay as they are.
    let handover = match &d.freeze_cgroup {
        Some(cg) => {
            let pids = pids_in(cg)?;
            let stopped = crate::stopped::stopped_among(&pids);
            let handover = match stopped.first() {
                Some(&pid) if crate::stopped::v1_freezer(cg) => match &d.tracking_cgroup {
                    Some(v2) => Some(crate::stopped::Handover::begin(cg, v2)?),
                    None => return Err(Error::StoppedProcess { pid }),
                },
                _ => None,
            };
            if handover.is_some() {
                crate::storage::fault::point("checkpoint.handed_over");
            }
            let through = handover.as_ref().map_or(cg.as_path(), |h| h.cgroup());
            cmd.arg("--freeze-cgroup").arg(through);
            crate::stopped::record(&stopped, &d.images)?;
            // CRIU drops the processes' memory protection keys: they are recorded
            // beside its images.
            crate::pkeys::record(&pids, &d.images)?;
            handover
        }
        None => None,
    };
    let dumped = run(cmd, "dump", &d.criu, &d.images.join("dump.log"));
    let handed_back = handover.map(crate::stopped::Handover::end);
    dumped?;
    handed_back.transpose()?;
    let pruned = crate::checkpoint::net_images::prune(&d.images, d.own_network)?;
    tracing::debug!(?pruned, "network images that restore nothing, dropped");
    Ok(())
}

/// The processes of `cgroup` and of the cgroups below it: those a dump that
/// freezes it takes.
pub(crate) fn pids_in(cgroup: &Path) -> Result<Vec<i32>> {
    let mut pids = Vec::new();
    let mut dirs = vec![cgroup.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let procs = dir.join("cgroup.procs");
        let text = std::fs::read_to_string(&procs)
            .map_err(Error::io(format!("read {}", procs.display())))?;
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(e.path());
            }
        }
    }
    Ok(pids)
}

/// Restores the tree as a sibling of the caller (so a child of the caller's parent),
/// detached, and returns the host pid of its root.
pub fn restore(r: &Restore) -> Result<i32> {
    let mut cmd = Command::new(&r.criu.path);
    cmd.arg("restore")
        .arg("--images-dir")
        .arg(&r.images)
        .arg("--work-dir")
        .arg(&r.work)
        .args(["--log-file", "restore.log", "-v4"])
        .arg("--root")
        .arg(&r.root)
        .args(["--restore-detached", "--restore-sibling"])
        .arg("--pidfile")
        .arg(&r.pidfile)
        .args(COMMON);
    for (fd, key) in &r.inherit {
        cmd.arg("--inherit-fd").arg(format!("fd[{fd}]:{key}"));
    }
    for (dst, src) in &r.external_mounts {
        cmd.arg("--external")
            .arg(format!("mnt[{dst}]:{}", src.display()));
    }
    if r.mount_compat {
        cmd.arg("--mntns-compat-mode");
    }
    if r.leave_stopped {
        cmd.arg("--leave-stopped");
    }
    if let Some((script, env)) = &r.network_by_hooks {
        cmd.args(["--empty-ns", "net", "--action-script", script]);
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
    }
    let _ = std::fs::remove_file(&r.pidfile);
    run(cmd, "restore", &r.criu, &r.work.join("restore.log"))?;
    let text = std::fs::read_to_string(&r.pidfile).map_err(Error::io(format!(
        "read CRIU's pid file {}",
        r.pidfile.display()
    )))?;
    text.trim().parse().map_err(|_| Error::Criu {
        operation: "restore",
        message: format!("pid file holds {text:?}"),
        log: r.work.join("restore.log"),
    })
}

/// CRIU's version line, or why it cannot run.
pub fn version(criu: &Path) -> Result<String> {
    let out = Command::new(criu)
        .arg("--version")
        .output()
        .map_err(|e| missing(criu, e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .find(|l| l.starts_with("Version"))
        .unwrap_or("")
        .trim()
        .to_string())
}

fn missing(criu: &Path, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        Error::CriuMissing(criu.to_path_buf())
    } else {
        Error::io(format!("run {}", criu.display()))(e)
    }
}

/// Runs CRIU to its end, or kills it at its deadline. Its output goes to a file beside
/// its log, never to a pipe: restored tasks could inherit a pipe and keep it open.
fn run(mut cmd: Command, operation: &'static str, criu: &Tool, log: &Path) -> Result<()> {
    let err_file = log.with_extension("stderr");
    let stderr = std::fs::File::create(&err_file)
        .map_err(Error::io(format!("create {}", err_file.display())))?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    // CRIU ends with the helper that runs it (killed with its shim).
    crate::helper::die_with_parent(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| missing(&criu.path, e))?;
    let deadline = Instant::now() + Duration::from_secs(criu.timeout_s.max(1));
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Criu {
                    operation,
                    message: format!(
                        "no end after {} s (checkpoint.criu_timeout_s): killed",
                        criu.timeout_s
                    ),
                    log: log.to_path_buf(),
                });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => return Err(Error::io("wait for CRIU")(e)),
        }
    };
    if status.success() {
        return Ok(());
    }
    let mut message = log_errors(log);
    if message.is_empty() {
        message = std::fs::read_to_string(&err_file)
            .unwrap_or_default()
            .trim()
            .to_string();
    }
    if message.is_empty() {
        message = format!("exited with {status}");
    }
    Err(Error::Criu {
        operation,
        message,
        log: log.to_path_buf(),
    })
}

/// The error lines of a CRIU log worth showing: its last few `Error` lines, without the
/// ones about tools CRIU merely probes for.
pub fn log_errors(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Error") && !l.contains("execvp") && !l.contains("-V failed"))
        .filter(|l| !l.contains("RLIMIT_NOFILE"))
        .collect();
    let start = lines.len().saturating_sub(4);
    lines[start..].join("; ")
}
