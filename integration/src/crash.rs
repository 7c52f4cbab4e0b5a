//! Crash-matrix fixtures (`tests/crash_matrix.rs`, `tests/crash_ops.rs`): a container
//! whose shim reads its faults from its own file, and the checks every crash ends with.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use crate::*;

/// A counter the container rewrites every 0.2 s, and a file the test changes.
pub const COUNTER: &str = "echo before > /f; i=0; while true; do i=$((i+1)); \
    echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done";

/// A container of the crab runtime whose shim reads faults from its own file.
pub struct Crashable {
    /// The container.
    pub guard: Guard,
    fault_file: PathBuf,
    config: PathBuf,
}

impl Crashable {
    pub fn start() -> Crashable {
        Crashable::start_with("")
    }

    /// With `extra` TOML tables after the fault file's key.
    pub fn start_with(extra: &str) -> Crashable {
        let fault_file = std::env::temp_dir().join(format!("{}.fault", unique_id("f")));
        let config = config_with(&format!(
            "fault_file = \"{}\"\n{extra}",
            fault_file.display()
        ));
        let guard = Guard::run_detached(
            CRAB,
            BUSYBOX,
            &["--runtime-config-path", &config.display().to_string()],
            &["sh", "-c", COUNTER],
        );
        let c = Crashable {
            guard,
            fault_file,
            config,
        };
        assert!(wait_until(Duration::from_secs(10), || c.count() >= 3));
        c
    }

    pub fn id(&self) -> &str {
        &self.guard.id
    }

    /// Its configuration file, which names its fault file.
    pub fn config(&self) -> &std::path::Path {
        &self.config
    }

    pub fn count(&self) -> u64 {
        self.guard.number("/tmp/count")
    }

    /// Runs crabctl with the fault armed for this one call; answers its output.
    pub fn crash_during(&self, point: &str, args: &[&str]) -> std::process::Output {
        self.arm(point);
        let out = crabctl(args, &[]);
        self.disarm();
        out
    }

    /// From now on, the container's shim and its helpers die at `point`.
    pub fn arm(&self, point: &str) {
        std::fs::write(&self.fault_file, point).expect("arm the fault");
    }

    /// No fault any more.
    pub fn disarm(&self) {
        std::fs::remove_file(&self.fault_file).expect("disarm the fault");
    }

    /// The counter moves: the container runs and is not frozen.
    pub fn assert_runs(&self, after: &str) {
        let c = self.count();
        assert!(
            wait_until(Duration::from_secs(5), || self.count() > c),
            "{}: the counter stopped at {c} after {after} (left frozen?)",
            self.id()
        );
    }

    /// The checkpoints' entries: (seq, fs snapshot, process image).
    pub fn entries(&self) -> Vec<serde_json::Value> {
        let out = crabctl_ok(&["ls", self.id(), "--json"]);
        serde_json::from_str(&out).expect("crabctl ls --json")
    }

    /// Nothing but the recorded checkpoints' parts is left (see
    /// [`assert_nothing_left_over`]).
    pub fn assert_nothing_left_over(&self) {
        assert_nothing_left_over(self.id());
    }

    /// A file written after checkpoint `name`, then a rollback to it: the file and
    /// the counter are those of the checkpoint.
    pub fn assert_rolls_back_to(&self, name: &str, count_at: u64) {
        self.guard
            .exec_ok(&["sh", "-c", "echo after > /f; echo x > /after"]);
        crabctl_ok(&["rollback", self.id(), name]);
        assert_eq!(self.guard.exec_ok(&["cat", "/f"]).trim(), "before");
        assert_eq!(
            self.guard.exec(&["test", "-e", "/after"]).status.code(),
            Some(1)
        );
        let now = self.count();
        assert!(
            now >= count_at && now < count_at + 25,
            "count {now} after the rollback, {count_at} at checkpoint {name}"
        );
    }

    /// Fifty files written after the snapshot or checkpoint a rollback goes to: a
    /// mirror that dies part of the way leaves some of them.
    pub fn write_fifty_files(&self) {
        self.guard.exec_ok(&[
            "sh",
            "-c",
            "for i in $(seq 1 50); do echo $i > /file$i; done",
        ]);
    }

    /// Waits until containerd sees the task gone (its shim was killed).
    pub fn wait_gone(&self) {
        assert!(
            wait_until(Duration::from_secs(30), || self.guard.status().as_deref()
                != Some("RUNNING")),
            "containerd did not notice the shim's crash"
        );
    }
}

impl Drop for Crashable {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.fault_file);
    }
}

/// Nothing but the recorded checkpoints' parts of container `id` is left: no
/// process image directory (or temporary one) and no checkpoint snapshot that no
/// entry names.
pub fn assert_nothing_left_over(id: &str) {
    let entries: Vec<serde_json::Value> =
        serde_json::from_str(&crabctl_ok(&["ls", id, "--json"])).expect("crabctl ls --json");
    let images: BTreeSet<String> = entries
        .iter()
        .filter_map(|e| e["process_image"].as_u64())
        .map(|s| s.to_string())
        .collect();
    let snapshots: BTreeSet<String> = entries
        .iter()
        .filter_map(|e| e["fs_snapshot"].as_str().map(String::from))
        .collect();
    let dir = history_dir(id);
    let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
        .expect("history dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') || n.parse::<u64>().is_ok())
        .collect();
    assert_eq!(on_disk, images, "process images in {}", dir.display());
    let listed = crabctl_ok(&["fs", "ls", id]);
    let in_store: BTreeSet<String> = listed
        .lines()
        .filter_map(|l| l.split('\t').next())
        .filter(|n| n.starts_with("ckpt-"))
        .map(String::from)
        .collect();
    assert_eq!(in_store, snapshots, "checkpoint snapshots in the store");
}

/// Runs crabctl with `CRAB_FAULT=point`: it must die of SIGKILL there (a point it
/// never reaches fails the test).
pub fn crabctl_killed_at(point: &str, args: &[&str]) {
    use std::os::unix::process::ExitStatusExt;
    let out = crabctl(args, &[("CRAB_FAULT", point)]);
    let (o, e) = text(&out);
    assert_eq!(
        out.status.signal(),
        Some(9),
        "crabctl {args:?} did not die at {point}: {:?} {o}{e}",
        out.status
    );
}

/// Kills the shim of container `c` with SIGKILL and waits until containerd sees its
/// task gone.
pub fn kill_shim(c: &Crashable) {
    let pids = shim_pids(c.id());
    assert!(!pids.is_empty(), "no shim runs for {}", c.id());
    for pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    c.wait_gone();
}

/// No cgroup of container `id` is frozen (cgroup v2 `cgroup.freeze`, v1
/// `freezer.state`).
pub fn assert_not_frozen(id: &str) {
    for dir in cgroup_dirs_named(id) {
        if let Ok(v) = std::fs::read_to_string(dir.join("cgroup.freeze")) {
            assert_eq!(v.trim(), "0", "{} is frozen", dir.display());
        }
        if let Ok(v) = std::fs::read_to_string(dir.join("freezer.state")) {
            assert_eq!(v.trim(), "THAWED", "{} is frozen", dir.display());
        }
    }
}

/// How many copies of [`COUNTER`] run in cgroups of container `id`: a restore
/// that died after CRIU must not leave a second copy writing the same tree.
pub fn counters(id: &str) -> usize {
    let suffix = format!("/{id}");
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    procs
        .flatten()
        .filter(|p| p.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|p| {
            std::fs::read(p.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("count.new"))
        })
        .filter(|p| {
            std::fs::read_to_string(p.path().join("cgroup"))
                .is_ok_and(|c| c.lines().any(|l| l.trim_end().ends_with(&suffix)))
        })
        .count()
}

/// The containers of the test namespace that a fork or an import left unfinished
/// (labelled pending).
pub fn pending_containers() -> Vec<String> {
    ctr_ok(&["containers", "ls", "-q", "labels.\"io.crab.pending\""])
        .lines()
        .map(String::from)
        .collect()
}

/// The checkpoint store of the test configuration (`[checkpoint] store`).
pub fn store_dir() -> PathBuf {
    let config: toml::Table = std::env::var("CRAB_CONFIG")
        .ok()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default()
        .parse()
        .expect("CRAB_CONFIG is TOML");
    let store = config
        .get("checkpoint")
        .and_then(|c| c.get("store"))
        .and_then(|s| s.as_str())
        .unwrap_or("/var/lib/crab/checkpoints");
    PathBuf::from(store)
}

/// Where the checkpoints of container `id` live.
pub fn history_dir(id: &str) -> PathBuf {
    store_dir().join(namespace()).join(id)
}

/// A checkpoint named `base`, the counter's value just before it.
pub fn base_checkpoint(c: &Crashable) -> u64 {
    let at = c.count();
    crabctl_ok(&["checkpoint", c.id(), "--name", "base"]);
    at
}
