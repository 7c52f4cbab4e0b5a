//! Test harness: drives a real containerd (started by `hack/test.sh`) through `ctr`.
//!
//! Tests run as root, one at a time (`--test-threads=1`: one of them restarts
//! containerd). Every container a test makes is removed by a guard, even when the test
//! fails. Environment:
//! - `CRAB_CONTAINERD_ADDRESS`: containerd's socket (default `/run/crab/containerd/containerd.sock`)
//! - `CRAB_NAMESPACE`: containerd namespace holding the test images (default `crab`)
//! - `CRAB_CONFIG`: the crab runtime configuration the shims use (for the state dir)
//!
//! The CRI tests (`tests/cri.rs`) drive a second, CRI-enabled containerd through
//! [`cri`], which reads its own variables.

use std::io::{BufRead, BufReader, Write};

pub mod agent_eval;
pub mod anthropic;
pub mod bench;
pub mod claude;
pub mod client;
pub mod crash;
pub mod cri;
pub mod docker;
pub mod host;
pub mod image_copies;
pub mod llm;
pub mod mini_crash;
pub mod mini_eval;
pub mod mini_swe_agent;
pub mod mini_trajectory;
pub mod openai;
pub mod pty;
pub mod reboot;
pub mod scripted;
pub mod second_containerd;
pub mod trajectory;
pub mod ttrpc;
pub mod wasm;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
pub use ttrpc::{pb_bytes, pb_fields, shim_call};

/// The crab runtime's name.
pub const CRAB: &str = "io.containerd.crab.v2";
/// runc's shim, the baseline.
pub const RUNC: &str = "io.containerd.runc.v2";
/// The busybox test image.
pub const BUSYBOX: &str = "docker.io/crab/busybox:latest";
/// The python test image.
pub const PYTHON: &str = "docker.io/crab/python:latest";
/// The agent image: node and the real Claude Code CLI (`hack/build-images.sh agent`).
pub const AGENT: &str = "docker.io/crab/agent:latest";

/// containerd's socket.
pub fn address() -> String {
    std::env::var("CRAB_CONTAINERD_ADDRESS")
        .unwrap_or_else(|_| "/run/crab/containerd/containerd.sock".into())
}

/// The namespace tests use.
pub fn namespace() -> String {
    std::env::var("CRAB_NAMESPACE").unwrap_or_else(|_| "crab".into())
}

/// The shims' state directory, from the configuration they use.
pub fn state_dir() -> PathBuf {
    let path = std::env::var("CRAB_CONFIG").unwrap_or_else(|_| "/etc/crab/config.toml".into());
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .find_map(|l| {
            let l = l.trim();
            let rest = l
                .strip_prefix("state_dir")?
                .trim_start()
                .strip_prefix('=')?;
            Some(PathBuf::from(rest.trim().trim_matches('"')))
        })
        .unwrap_or_else(|| PathBuf::from("/run/crab"))
}

/// The LLM journal of container `id` (`<checkpoint.store>/<ns>/<id>/journal`),
/// from the configuration the shims use.
pub fn journal_dir(id: &str) -> PathBuf {
    let path = std::env::var("CRAB_CONFIG").unwrap_or_else(|_| "/etc/crab/config.toml".into());
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let config = crab_runtime::config::Config::parse(&text, &path).expect("the shims' config");
    config
        .checkpoint
        .store
        .join(namespace())
        .join(id)
        .join("journal")
}

/// A unique container id for this test process.
pub fn unique_id(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// `ctr` with the address and namespace set.
pub fn ctr() -> Command {
    let mut c = Command::new("ctr");
    c.arg("--address")
        .arg(address())
        .arg("--namespace")
        .arg(namespace());
    c
}

/// Runs `ctr ARGS` with `stdin` (or /dev/null), bounded by `timeout`.
pub fn ctr_run(args: &[&str], stdin: Option<&[u8]>, timeout: Duration) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.arg("--kill-after=5")
        .arg(timeout.as_secs().to_string())
        .arg("ctr")
        .arg("--address")
        .arg(address())
        .arg("--namespace")
        .arg(namespace())
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn ctr");
    if let Some(data) = stdin {
        let mut w = child.stdin.take().expect("stdin");
        w.write_all(data).expect("write stdin");
    }
    child.wait_with_output().expect("wait ctr")
}

/// The bundle containerd made for the task of container `id` (in its state
/// directory, beside its socket).
pub fn bundle_dir(id: &str) -> PathBuf {
    Path::new(&address())
        .parent()
        .expect("containerd's socket is in its state directory")
        .join("io.containerd.runtime.v2.task")
        .join(namespace())
        .join(id)
}

/// `ctr ARGS`, which must succeed; returns stdout.
pub fn ctr_ok(args: &[&str]) -> String {
    let out = ctr_run(args, None, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "ctr {args:?} failed ({:?}): {}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The text of a command's stdout and stderr.
pub fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A container that is removed (task and all) when dropped.
pub struct Guard {
    /// The container id.
    pub id: String,
}

impl Guard {
    /// Guards `id`.
    pub fn new(id: &str) -> Guard {
        Guard { id: id.to_string() }
    }

    /// Starts a detached container running `args` with `runtime` and extra ctr flags.
    pub fn run_detached(runtime: &str, image: &str, flags: &[&str], args: &[&str]) -> Guard {
        let id = unique_id("t");
        let guard = Guard::new(&id);
        let mut all: Vec<&str> = vec!["run", "-d", "--runtime", runtime];
        all.extend_from_slice(flags);
        all.push(image);
        all.push(&id);
        all.extend_from_slice(args);
        ctr_ok(&all);
        guard
    }

    /// A detached busybox container of the crab runtime running `sh -c script`.
    pub fn sh(script: &str) -> Guard {
        Guard::run_detached(CRAB, BUSYBOX, &[], &["sh", "-c", script])
    }

    /// The init's pid, from `ctr task ls`.
    pub fn pid(&self) -> i32 {
        let out = ctr_ok(&["task", "ls"]);
        out.lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next()? == self.id).then(|| f.next()?.parse().ok())?
            })
            .unwrap_or_else(|| panic!("task {} not listed:\n{out}", self.id))
    }

    /// The task's status word, from `ctr task ls` (None if no task).
    pub fn status(&self) -> Option<String> {
        let out = ctr_ok(&["task", "ls"]);
        out.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&self.id.as_str())).then(|| f.get(2).map(|s| s.to_string()))?
        })
    }

    /// `ctr task exec` of `args`; returns the output.
    pub fn exec(&self, args: &[&str]) -> Output {
        let exec_id = unique_id("x");
        let mut all = vec!["task", "exec", "--exec-id", &exec_id, &self.id];
        all.extend_from_slice(args);
        ctr_run(&all, None, Duration::from_secs(30))
    }

    /// `exec` that must succeed; returns stdout.
    pub fn exec_ok(&self, args: &[&str]) -> String {
        let out = self.exec(args);
        let (o, e) = text(&out);
        assert!(
            out.status.success(),
            "exec {args:?}: {:?} {o}{e}",
            out.status
        );
        o
    }

    /// The number in file `path` inside the container (read through an exec).
    /// A writer that truncates and rewrites the file leaves it empty for an
    /// instant: such a read is retried.
    pub fn number(&self, path: &str) -> u64 {
        let mut out = String::new();
        for _ in 0..50 {
            out = self.exec_ok(&["cat", path]);
            if let Ok(n) = out.trim().parse() {
                return n;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("{path} in {}: {out:?}", self.id)
    }

    /// The memory limit and the processes the container's cgroup view shows (the
    /// v1 memory and pids hierarchies, or the unified tree on a v2-only host).
    pub fn cgroup_view(&self) -> (String, String) {
        let read = |v1: &str, v2: &str| {
            let script = format!("cat /sys/fs/cgroup/{v1} 2>/dev/null || cat /sys/fs/cgroup/{v2}");
            self.exec_ok(&["sh", "-c", &script]).trim().to_string()
        };
        (
            read("memory/memory.limit_in_bytes", "memory.max"),
            read("pids/cgroup.procs", "cgroup.procs"),
        )
    }

    /// Kills the task (SIGKILL), waits until it is stopped and deletes it; the
    /// container stays, ready for a new task.
    pub fn end_task(&self) {
        ctr_ok(&["task", "kill", "-s", "KILL", &self.id]);
        assert!(
            wait_until(Duration::from_secs(10), || self.status().as_deref()
                == Some("STOPPED")),
            "the task of {} did not stop",
            self.id
        );
        ctr_ok(&["task", "rm", &self.id]);
    }

    /// Kills, deletes the task and the container; waits until gone.
    pub fn remove(&self) {
        let _ = ctr_run(
            &["task", "kill", "-s", "KILL", &self.id],
            None,
            Duration::from_secs(10),
        );
        let _ = ctr_run(
            &["task", "rm", "-f", &self.id],
            None,
            Duration::from_secs(20),
        );
        let _ = ctr_run(
            &["container", "rm", &self.id],
            None,
            Duration::from_secs(20),
        );
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.remove();
    }
}

/// A configuration file: the one the test containerd passes its shims
/// (`CRAB_CONFIG`) with `extra` TOML appended; for `--runtime-config-path`.
/// Tables both name are merged, `extra`'s keys winning.
pub fn config_with(extra: &str) -> PathBuf {
    let base = std::env::var("CRAB_CONFIG")
        .ok()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    let mut merged: toml::Table = base.parse().expect("CRAB_CONFIG is TOML");
    let extra: toml::Table = extra.parse().expect("extra config is TOML");
    for (key, value) in extra {
        match (merged.get_mut(&key), value) {
            (Some(toml::Value::Table(mine)), toml::Value::Table(theirs)) => mine.extend(theirs),
            (_, value) => {
                merged.insert(key, value);
            }
        }
    }
    let config = std::env::temp_dir().join(format!("{}.toml", unique_id("cfg")));
    std::fs::write(
        &config,
        toml::to_string(&merged).expect("config serializes"),
    )
    .expect("write config");
    config
}

/// The host's available memory in MiB, as Crab's shim reads it.
pub fn available_mib() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("read /proc/meminfo");
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .expect("MemAvailable")
        / 1024
}

/// Polls `f` until it is true or `timeout` passes; returns the last value.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `ctr events`, collected in the background.
pub struct Events {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Events {
    /// Subscribes to all events of the namespace.
    pub fn subscribe() -> Events {
        let mut child = ctr()
            .arg("events")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("ctr events");
        let out = child.stdout.take().expect("stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        // The subscription is live once ctr has connected; give it a moment.
        std::thread::sleep(Duration::from_millis(300));
        Events { child, lines }
    }

    /// The topics (e.g. `/tasks/start`) of events that mention `needle`, in order.
    pub fn topics_for(&self, needle: &str) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .filter_map(|l| {
                l.split_whitespace()
                    .find(|w| w.starts_with('/'))
                    .map(String::from)
            })
            .collect()
    }

    /// Waits until an event with `topic` mentioning `needle` arrives.
    pub fn wait_for(&self, topic: &str, needle: &str, timeout: Duration) -> bool {
        wait_until(timeout, || {
            self.topics_for(needle).iter().any(|t| t == topic)
        })
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Lines of /proc/self/mountinfo that mention `needle`.
pub fn mounts_mentioning(needle: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .map(String::from)
        .collect()
}

/// Directories under /sys/fs/cgroup whose name is `id`.
pub fn cgroup_dirs_named(id: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, id: &str, depth: u32, out: &mut Vec<PathBuf>) {
        if depth > 6 {
            return;
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                if e.file_name() == id {
                    out.push(p.clone());
                }
                walk(&p, id, depth + 1, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(Path::new("/sys/fs/cgroup"), id, 0, &mut out);
    out
}

/// Files (not directories) under `dir` whose path mentions `needle`.
pub fn files_mentioning(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.to_string_lossy().contains(needle) {
                out.push(p.clone());
            }
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(p);
            }
        }
    }
    out
}

/// Pids of the running `containerd-shim-crab-v2` processes whose command line
/// mentions `id`.
pub fn shim_pids(id: &str) -> Vec<i32> {
    shim_pids_of("containerd-shim-crab-v2", id)
}

/// Pids of running processes of `binary` started for container (group) `id`.
pub fn shim_pids_of(binary: &str, id: &str) -> Vec<i32> {
    crab_eval::sandbox::shim_pids_of(binary, id)
}

/// Pids of the managed proxy of container `id` (`crabctl ... proxy ID --managed`).
pub fn proxy_pids(id: &str) -> Vec<i32> {
    host::processes()
        .into_iter()
        .filter(|(_, args)| {
            args.windows(2).any(|w| w[0] == "proxy" && w[1] == id)
                && args.iter().any(|a| a == "--managed")
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// Runs `args` as `nobody`, without any group, started by a shell that already runs
/// as `nobody`, as an attacker's would be.
pub fn as_nobody(args: &[&str]) -> Output {
    Command::new("setpriv")
        .args([
            "--reuid",
            "nobody",
            "--regid",
            "nogroup",
            "--clear-groups",
            "--",
        ])
        .args(["/bin/sh", "-c", "exec \"$@\"", "sh"])
        .args(args)
        .output()
        .expect("setpriv")
}

/// Runs `crabctl -n <namespace> ARGS` with extra environment variables.
pub fn crabctl(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("crabctl");
    cmd.arg("-a")
        .arg(address())
        .arg("-n")
        .arg(namespace())
        .args(args)
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run crabctl")
}

/// `crabctl ARGS`, which must succeed; returns stdout.
pub fn crabctl_ok(args: &[&str]) -> String {
    let out = crabctl(args, &[]);
    let (o, e) = text(&out);
    assert!(out.status.success(), "crabctl {args:?}: {o}{e}");
    o
}

/// The network interfaces of process `pid`'s namespace, by name.
pub fn interfaces(pid: i32) -> Vec<String> {
    let dev = std::fs::read_to_string(format!("/proc/{pid}/net/dev"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/net/dev: {e}"));
    dev.lines()
        .skip(2)
        .filter_map(|l| l.split(':').next().map(|n| n.trim().to_string()))
        .collect()
}

/// The parent of process `pid`, from `/proc/<pid>/stat`.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name, which may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Kills the shim of container `id` with SIGKILL. A child the shim has just
/// forked and that has not yet exec'd (a helper starting for a turn's
/// checkpoint) still shows the shim's command line: it is killed too, and not
/// taken for a second shim.
pub fn kill_shim_of(id: &str) {
    let matching = shim_pids(id);
    let shims: Vec<i32> = matching
        .iter()
        .copied()
        .filter(|pid| parent_of(*pid).is_none_or(|parent| !matching.contains(&parent)))
        .collect();
    assert_eq!(shims.len(), 1, "one shim serves {id}: {matching:?}");
    let status = std::process::Command::new("kill")
        .args(["-9", &shims[0].to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -9 {}", shims[0]);
    for child in matching.iter().filter(|pid| **pid != shims[0]) {
        // It may have exec'd or died meanwhile.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*child),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Kills container `g`'s shim and init with SIGKILL (the kernel kills the rest of
/// its pid namespace), and waits for nobody to notice: a crash.
pub fn kill_shim_and_init(g: &Guard) {
    let init = g.pid();
    kill_shim_of(&g.id);
    let status = std::process::Command::new("kill")
        .args(["-9", &init.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -9 {init}");
}
