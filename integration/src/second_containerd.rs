//! A second, private containerd that a test may kill outright, for the tests of
//! recovery after a host restart (`tests/host_restart.rs`, see [`crate::reboot`]).
//!
//! The test containerd (`hack/containerd.sh`) serves every other test, and its
//! shims share one crab `state_dir`: killing it, or emptying that directory, would
//! take the other tests' sandboxes down. This one has everything a restart wipes
//! to itself: its own root (`/var/lib/crab/containerd-NAME`), state directory and
//! socket (`/run/crab/containerd-NAME`), and a crab configuration (`CRAB_CONFIG`,
//! written here: the test configuration with `state_dir = /run/crab/state-NAME`)
//! that it passes its shims. Its config file has the shape `hack/containerd.sh`
//! writes (no CRI plugin, everything under its own root).
//!
//! The test process runs it itself rather than through `hack/containerd.sh`: the
//! integration tests run under an install lock (`flock` on an inherited
//! descriptor), which a daemon started from them would otherwise hold for as long
//! as it lives. Every inherited descriptor is made close-on-exec first.
//!
//! While it lives, [`SecondContainerd::serve_helpers`] points the crate's helpers
//! (`ctr`, `crabctl`, [`crate::Guard`], [`crate::claude`], ...) at it, through the
//! variables they read (`CRAB_CONTAINERD_ADDRESS`, `CRAB_CONFIG`). Dropping it
//! removes its containers (with their trees, snapshots and checkpoint histories in
//! Crab's store), stops it, and removes its directories.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::host::{processes, unmount_under};
use crate::text;

/// How long containerd may take to answer on its socket.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long it may take to exit on SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A private containerd of the test's own (see the module docs).
pub struct SecondContainerd {
    /// Persistent data: containerd's metadata and snapshots, its log, and the crab
    /// configuration its shims use. A restart keeps it.
    pub root: PathBuf,
    /// containerd's state directory (socket, config, task bundles): emptied by a
    /// restart.
    pub state: PathBuf,
    /// The crab `state_dir` of its shims (containers' state, control sockets,
    /// proxy logs): emptied by a restart.
    pub crab_state: PathBuf,
    /// The crab configuration its shims and `crabctl` use.
    pub crab_config: PathBuf,
    /// The namespace its images are imported into (the tests').
    pub namespace: String,
    child: Option<Child>,
    /// The helpers' variables as they were before [`SecondContainerd::serve_helpers`].
    saved_env: Vec<(&'static str, Option<OsString>)>,
}

impl SecondContainerd {
    /// Starts the containerd named `name` (after removing whatever a killed run of
    /// the same test left of it) and imports `images` (the names of
    /// `hack/build-images.sh`'s archives: `busybox`, `agent`, ...) into the test
    /// namespace.
    pub fn start(name: &str, images: &[&str]) -> Result<SecondContainerd> {
        let mut c = SecondContainerd {
            root: PathBuf::from(format!("/var/lib/crab/containerd-{name}")),
            state: PathBuf::from(format!("/run/crab/containerd-{name}")),
            crab_state: PathBuf::from(format!("/run/crab/state-{name}")),
            crab_config: PathBuf::from(format!("/var/lib/crab/containerd-{name}/crab.toml")),
            namespace: crate::namespace(),
            child: None,
            saved_env: Vec::new(),
        };
        c.remove_leftovers()
            .context("remove what an earlier run left")?;
        for dir in [&c.root, &c.state, &c.crab_state] {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        c.write_crab_config()?;
        c.spawn()?;
        for image in images {
            c.import(image)?;
        }
        Ok(c)
    }

    /// Its gRPC socket.
    pub fn address(&self) -> String {
        self.state.join("containerd.sock").display().to_string()
    }

    fn config(&self) -> PathBuf {
        self.state.join("config.toml")
    }

    /// Points the crate's helpers at this containerd until it is dropped: they
    /// (and the `ctr` and `crabctl` they run) read its address and crab
    /// configuration from the environment. The tests run one at a time
    /// (`--test-threads=1`), so no other test sees the change.
    pub fn serve_helpers(&mut self) {
        for (var, value) in [
            ("CRAB_CONTAINERD_ADDRESS", self.address()),
            ("CRAB_CONFIG", self.crab_config.display().to_string()),
        ] {
            if !self.saved_env.iter().any(|(v, _)| *v == var) {
                self.saved_env.push((var, std::env::var_os(var)));
            }
            std::env::set_var(var, value);
        }
    }

    /// The test configuration (`CRAB_CONFIG`, as the test containerd's shims get
    /// it) with this containerd's own `state_dir`.
    fn write_crab_config(&self) -> Result<()> {
        let base = match std::env::var("CRAB_CONFIG") {
            Ok(path) => std::fs::read_to_string(&path)
                .with_context(|| format!("read {path} (CRAB_CONFIG)"))?,
            Err(_) => String::new(),
        };
        let mut config: toml::Table = base.parse().context("CRAB_CONFIG is not TOML")?;
        config.insert(
            "state_dir".into(),
            toml::Value::String(self.crab_state.display().to_string()),
        );
        let text = format!(
            "# Written by crab-integration's second_containerd for a test; removed after it.\n{}",
            toml::to_string(&config).context("serialize the crab configuration")?
        );
        std::fs::write(&self.crab_config, text)
            .with_context(|| format!("write {}", self.crab_config.display()))
    }

    /// containerd's config: the shape `hack/containerd.sh` writes without `--cri`.
    fn write_config(&self) -> Result<()> {
        let (version, disabled) = if containerd_major()? >= 2 {
            // 2.x splits CRI into three plugins; NRI (on by default) would listen on
            // the host-wide /var/run/nri/nri.sock.
            (
                3,
                r#"["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images", "io.containerd.nri.v1.nri"]"#,
            )
        } else {
            (2, r#"["io.containerd.grpc.v1.cri"]"#)
        };
        let (root, state, sock) = (self.root.display(), self.state.display(), self.address());
        let text = format!(
            r#"# Written by crab-integration's second_containerd; as hack/containerd.sh's.
version = {version}
root = "{root}"
state = "{state}"
disabled_plugins = {disabled}

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins]
  # Default is /opt/containerd; keep everything under our own root.
  [plugins."io.containerd.internal.v1.opt"]
    path = "{root}/opt"
"#
        );
        let config = self.config();
        std::fs::write(&config, text).with_context(|| format!("write {}", config.display()))
    }

    /// Starts containerd (its state directory and config file made again, as
    /// `hack/containerd.sh start` does) and waits until it answers; how long
    /// that took.
    pub fn spawn(&mut self) -> Result<Duration> {
        ensure!(self.child.is_none(), "containerd is already running");
        let started = Instant::now();
        std::fs::create_dir_all(&self.state)
            .with_context(|| format!("create {}", self.state.display()))?;
        self.write_config()?;
        close_inherited_descriptors_on_exec()?;
        let containerd = which("containerd")?;
        // containerd's own shims (runc's) are the ones beside it; the crab shim
        // is found on the system's PATH, as the test containerd finds it.
        let mut path = String::from("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
        if let Some(dir) = containerd.parent().and_then(Path::to_str) {
            if !path.split(':').any(|p| p == dir) {
                path = format!("{dir}:{path}");
            }
        }
        let log_path = self.root.join("containerd.log");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("open {}", log_path.display()))?;
        let mut cmd = Command::new(&containerd);
        cmd.arg("--config")
            .arg(self.config())
            .env_clear()
            .env("PATH", path)
            .env(
                "HOME",
                std::env::var_os("HOME").unwrap_or_else(|| "/root".into()),
            )
            .env("CRAB_CONFIG", &self.crab_config)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("the log's descriptor")?)
            .stderr(log);
        for var in ["RUST_LOG", "RUST_BACKTRACE"] {
            if let Some(v) = std::env::var_os(var) {
                cmd.env(var, v);
            }
        }
        // Its own process group: a signal to the test's group does not reach it.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd
            .spawn()
            .with_context(|| format!("start {}", containerd.display()))?;
        self.child = Some(child);
        loop {
            if self.answers() {
                return Ok(started.elapsed());
            }
            let exited = self
                .child
                .as_mut()
                .map(|c| c.try_wait())
                .transpose()
                .context("wait for containerd")?
                .flatten();
            if let Some(status) = exited {
                self.child = None;
                bail!(
                    "containerd exited ({status}) before it answered:\n{}",
                    tail(&log_path)
                );
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "containerd did not answer on {} within {START_TIMEOUT:?}:\n{}",
                    self.address(),
                    tail(&log_path)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether containerd answers on its socket.
    pub fn answers(&self) -> bool {
        Path::new(&self.address()).exists()
            && self.ctr(&["version"]).status().is_ok_and(|s| s.success())
    }

    /// containerd's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills containerd with SIGKILL, and reaps it.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill().context("kill containerd")?;
            child.wait().context("reap containerd")?;
        }
        Ok(())
    }

    /// Stops containerd with SIGTERM (SIGKILL after a while), and reaps it.
    fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while child.try_wait().context("wait for containerd")?.is_none() {
            if Instant::now() > deadline {
                child.kill().context("kill containerd")?;
                child.wait().context("reap containerd")?;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// `ctr` on this containerd, in the test namespace.
    pub fn ctr(&self, args: &[&str]) -> Command {
        let mut c = Command::new("timeout");
        c.args(["--kill-after=5", "60", "ctr", "--address"])
            .arg(self.address())
            .args(["--namespace", &self.namespace])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// `ctr ARGS`, which must succeed; its stdout.
    pub fn ctr_ok(&self, args: &[&str]) -> Result<String> {
        let out = self
            .ctr(args)
            .output()
            .with_context(|| format!("run ctr {args:?}"))?;
        let (o, e) = text(&out);
        ensure!(
            out.status.success(),
            "ctr {args:?}: {:?} {o}{e}",
            out.status
        );
        Ok(o)
    }

    /// Imports `$CRAB_IMAGE_DIR/NAME.tar` (`hack/build-images.sh`'s archive).
    fn import(&self, name: &str) -> Result<()> {
        let dir = std::env::var("CRAB_IMAGE_DIR").unwrap_or_else(|_| "/var/lib/crab/images".into());
        let tar = Path::new(&dir).join(format!("{name}.tar"));
        ensure!(
            tar.is_file(),
            "no {} (hack/build-images.sh {name})",
            tar.display()
        );
        self.ctr_ok(&["images", "import", tar.to_str().context("utf-8 path")?])
            .with_context(|| format!("import {}", tar.display()))?;
        Ok(())
    }

    /// Pids of the shims this containerd started (their `-address` is its socket).
    pub fn shim_pids(&self) -> Vec<i32> {
        let address = self.address();
        processes()
            .into_iter()
            .filter(|(_, args)| {
                args.first()
                    .is_some_and(|a| a.ends_with("containerd-shim-crab-v2"))
                    && args
                        .windows(2)
                        .any(|w| w[0] == "-address" && w[1] == address)
            })
            .map(|(pid, _)| pid)
            .collect()
    }

    /// The ttrpc sockets of its shims: each bundle's `address` file names its
    /// shim's (under `/run/containerd/s/`, shared by every containerd of the host).
    pub fn shim_sockets(&self) -> Vec<PathBuf> {
        let tasks = self.state.join("io.containerd.runtime.v2.task");
        let mut sockets = Vec::new();
        for ns in std::fs::read_dir(&tasks).into_iter().flatten().flatten() {
            for bundle in std::fs::read_dir(ns.path()).into_iter().flatten().flatten() {
                if let Ok(address) = std::fs::read_to_string(bundle.path().join("address")) {
                    let address = address.trim();
                    sockets.push(PathBuf::from(
                        address.strip_prefix("unix://").unwrap_or(address),
                    ));
                }
            }
        }
        sockets
    }

    /// The ids of its containers in the test namespace.
    pub fn containers(&self) -> Result<Vec<String>> {
        Ok(self
            .ctr_ok(&["containers", "ls", "-q"])?
            .lines()
            .map(String::from)
            .collect())
    }

    /// Removes every container, task first.
    fn remove_containers(&self) -> Result<()> {
        for id in self.containers()? {
            let _ = self.ctr(&["task", "kill", "-s", "KILL", &id]).output();
            let _ = self.ctr(&["task", "rm", "-f", &id]).output();
            self.ctr_ok(&["containers", "rm", &id])
                .with_context(|| format!("remove container {id}"))?;
        }
        Ok(())
    }

    /// A containerd of this name that a killed test left running, its shims and
    /// containers, and its directories.
    fn remove_leftovers(&mut self) -> Result<()> {
        let config = self.config().display().to_string();
        let stale: Vec<i32> = processes()
            .into_iter()
            .filter(|(_, args)| {
                args.first().is_some_and(|a| a.ends_with("containerd"))
                    && args
                        .windows(2)
                        .any(|w| w[0] == "--config" && w[1] == config)
            })
            .map(|(pid, _)| pid)
            .collect();
        if !stale.is_empty() || self.root.exists() {
            // Its containers, through it when it runs, else by a fresh start.
            if stale.is_empty() && self.crab_config.exists() {
                self.spawn().context("start the earlier run's containerd")?;
            }
            if self.answers() {
                self.remove_containers()?;
            }
            self.stop()?;
            for pid in stale {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        for pid in self.shim_pids() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        self.remove_dirs()
    }

    /// Unmounts whatever is mounted under its directories and removes them,
    /// then the trees Crab's store keeps for its containers (with their snapshots
    /// and checkpoint histories): `crabctl fs gc` of its snapshotter takes every
    /// tree whose owner, a snapshot of that snapshotter, is gone.
    fn remove_dirs(&self) -> Result<()> {
        for dir in [&self.state, &self.crab_state] {
            remove_dir(dir)?;
        }
        unmount_under(&self.root)?;
        self.remove_image_copies()?;
        let entries = match std::fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("list {}", self.root.display())),
        };
        // The crab configuration stays for `crabctl fs gc`.
        for e in entries.flatten().filter(|e| e.path() != self.crab_config) {
            let p = e.path();
            let removed = if e.file_type().is_ok_and(|t| t.is_dir()) {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            removed.with_context(|| format!("remove {}", p.display()))?;
        }
        if self.crab_config.exists() {
            let snapshots = self
                .root
                .join("io.containerd.snapshotter.v1.overlayfs/snapshots");
            let out = Command::new("crabctl")
                .arg("--config")
                .arg(&self.crab_config)
                .args(["fs", "gc", "--snapshots"])
                .arg(&snapshots)
                .stdin(Stdio::null())
                .output()
                .context("run crabctl fs gc")?;
            let (o, e) = text(&out);
            ensure!(out.status.success(), "crabctl fs gc: {o}{e}");
        }
        remove_dir(&self.root)
    }
}

impl SecondContainerd {
    /// The copies Crab's btrfs store made of this containerd's images (a store's
    /// image copy is keyed by its layer directories, which go with the root):
    /// those of single-layer images, as the test images are.
    fn remove_image_copies(&self) -> Result<()> {
        let Ok(toml) = std::fs::read_to_string(&self.crab_config) else {
            return Ok(());
        };
        let config =
            crab_runtime::config::Config::parse(&toml, &self.crab_config.display().to_string())
                .context("the crab configuration")?;
        if config.storage.backend != crab_runtime::config::Backend::Btrfs {
            return Ok(());
        }
        let snapshots = self
            .root
            .join("io.containerd.snapshotter.v1.overlayfs/snapshots");
        for e in std::fs::read_dir(&snapshots)
            .into_iter()
            .flatten()
            .flatten()
        {
            let layer = e.path().join("fs");
            let key = crab_runtime::storage::ImageSource::from_layers(vec![layer])?.key;
            let copy = Path::new(&config.storage.pool).join("images").join(key);
            if copy.exists() {
                let out = Command::new("btrfs")
                    .args(["subvolume", "delete"])
                    .arg(&copy)
                    .output()
                    .context("run btrfs subvolume delete")?;
                let (o, e) = text(&out);
                ensure!(out.status.success(), "delete {}: {o}{e}", copy.display());
            }
        }
        Ok(())
    }
}

/// Unmounts whatever is mounted under `dir`, and removes it (absent is fine).
fn remove_dir(dir: &Path) -> Result<()> {
    unmount_under(dir)?;
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("remove {}", dir.display()))
        }
        _ => Ok(()),
    }
}

impl Drop for SecondContainerd {
    fn drop(&mut self) {
        if self.child.is_none() && self.crab_config.exists() {
            // Killed by the test and not started again: its containers are removed
            // through a fresh start.
            if let Err(e) = self.spawn() {
                eprintln!("second containerd: start for the clean-up: {e:#}");
            }
        }
        if self.child.is_some() {
            if let Err(e) = self.remove_containers() {
                eprintln!("second containerd: remove its containers: {e:#}");
            }
        }
        if let Err(e) = self.stop() {
            eprintln!("second containerd: stop: {e:#}");
        }
        // Shims exit once their containers are gone; one that did not is killed.
        let gone = crate::wait_until(Duration::from_secs(10), || self.shim_pids().is_empty());
        if !gone {
            for pid in self.shim_pids() {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        if let Err(e) = self.remove_dirs() {
            eprintln!("second containerd: {e:#}");
        }
        for (var, value) in self.saved_env.drain(..) {
            match value {
                Some(v) => std::env::set_var(var, v),
                None => std::env::remove_var(var),
            }
        }
    }
}

/// The major version of the containerd on `PATH`.
fn containerd_major() -> Result<u32> {
    let out = Command::new("containerd")
        .arg("--version")
        .output()
        .context("run containerd --version")?;
    let (o, _) = text(&out);
    // "containerd github.com/containerd/containerd 1.7.24~ds1 ..."
    o.split_whitespace()
        .nth(2)
        .and_then(|v| v.trim_start_matches('v').split('.').next()?.parse().ok())
        .with_context(|| format!("containerd's version in {o:?}"))
}

/// The path of `name` on `PATH`.
fn which(name: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("{name} is not on PATH"))
}

/// Marks every descriptor above stderr close-on-exec: the test process inherits
/// the install lock's (`flock`), which a daemon must not hold.
fn close_inherited_descriptors_on_exec() -> Result<()> {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .context("list /proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // The directory's own descriptor is gone by now: EBADF.
        let Ok(flags) = fcntl(fd, FcntlArg::F_GETFD) else {
            continue;
        };
        let flags = FdFlag::from_bits_truncate(flags) | FdFlag::FD_CLOEXEC;
        fcntl(fd, FcntlArg::F_SETFD(flags)).with_context(|| format!("close-on-exec fd {fd}"))?;
    }
    Ok(())
}

/// The last lines of containerd's log, for an error.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
