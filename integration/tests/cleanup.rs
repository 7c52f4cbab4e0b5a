//! Nothing leaks, containers start concurrently, and the runtime survives restarts.
//!
//! "Nothing left" means, for a container id: no line of /proc/self/mountinfo, no
//! directory under /sys/fs/cgroup (v1 controllers and the cgroup2 tracking dir), no file
//! under the crab state dir or in containerd's bundle dir, and no shim process mentions
//! it. The restart test restarts the test containerd with `hack/containerd.sh restart`,
//! so the tests must run one at a time (`--test-threads=1`) with `CRAB_CONFIG` set, as
//! `hack/test.sh` runs them.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crab_integration::*;

/// What is left of container `id` on the host, one line per leftover.
fn leftovers(id: &str) -> Vec<String> {
    let bundles = Path::new(&address())
        .parent()
        .unwrap()
        .join("io.containerd.runtime.v2.task");
    let mut left: Vec<String> = mounts_mentioning(id)
        .into_iter()
        .map(|m| format!("mount {m}"))
        .collect();
    left.extend(
        cgroup_dirs_named(id)
            .iter()
            .map(|d| format!("cgroup {}", d.display())),
    );
    left.extend(
        files_mentioning(&state_dir(), id)
            .iter()
            .map(|f| format!("state {}", f.display())),
    );
    left.extend(
        files_mentioning(&bundles, id)
            .iter()
            .map(|f| format!("bundle {}", f.display())),
    );
    left.extend(shim_pids(id).iter().map(|p| format!("shim pid {p}")));
    left
}

/// Waits (the shim exits after containerd's shutdown call) until nothing is left of `id`.
fn assert_nothing_left(id: &str) {
    let clean = wait_until(Duration::from_secs(10), || leftovers(id).is_empty());
    assert!(clean, "left behind by {id}:\n{}", leftovers(id).join("\n"));
}

/// Kills the init, then deletes the task and the container; each step must succeed.
fn kill_and_delete(g: &Guard) {
    ctr_ok(&["task", "kill", "-s", "KILL", &g.id]);
    let stopped = wait_until(Duration::from_secs(10), || {
        g.status().as_deref() == Some("STOPPED")
    });
    assert!(
        stopped,
        "{} did not stop after SIGKILL: {:?}",
        g.id,
        g.status()
    );
    ctr_ok(&["task", "rm", &g.id]);
    ctr_ok(&["container", "rm", &g.id]);
    assert_eq!(g.status(), None, "the task of {} is still listed", g.id);
}

/// The tracking cgroup2 directory crab makes for container `id`.
fn tracking_dir(id: &str) -> PathBuf {
    let unified = Path::new("/sys/fs/cgroup/unified");
    let root = if unified.join("cgroup.procs").exists() {
        unified.join("crab")
    } else {
        "/sys/fs/cgroup/crab".into()
    };
    root.join(namespace()).join(id)
}

/// Host pids of the processes in the pid namespace of `init` (the container's processes),
/// found through /proc, independently of crab's own bookkeeping.
fn container_pids(init: i32) -> Vec<i32> {
    let ns = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    let want = ns(init).expect("init's pid namespace");
    let mut pids: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&p| ns(p).as_ref() == Some(&want))
        .collect();
    pids.sort();
    pids
}

fn pids_in(file: &Path) -> Vec<i32> {
    let text =
        std::fs::read_to_string(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    let mut pids: Vec<i32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
    pids.sort();
    pids
}

/// A busybox container running `sleep 1000`.
fn sleeper() -> Guard {
    Guard::run_detached(CRAB, BUSYBOX, &[], &["sleep", "1000"])
}

/// Starts `sleep 999` in `g` as a detached exec process.
fn exec_sleep(g: &Guard) {
    let exec_id = unique_id("x");
    let args = [
        "task",
        "exec",
        "-d",
        "--exec-id",
        &exec_id,
        &g.id,
        "sleep",
        "999",
    ];
    ctr_ok(&args);
}

/// Whether `pid` has exited (gone, or a zombie waiting for a parent that is not crab's).
fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            stat.rsplit(')')
                .next()
                .and_then(|s| s.split_whitespace().next())
                == Some("Z")
        }
    }
}

#[test]
fn run_rm_leaves_no_mount_cgroup_state_file_or_shim() {
    let id = unique_id("c");
    let _guard = Guard::new(&id);
    ctr_ok(&["run", "--rm", "--runtime", CRAB, BUSYBOX, &id, "true"]);
    assert_nothing_left(&id);
}

#[test]
fn kill_then_task_rm_and_container_rm_leave_nothing_behind() {
    let g = sleeper();
    exec_sleep(&g);
    // Every probe of `leftovers` sees the running container, so its silence later means
    // something.
    let live = leftovers(&g.id);
    for kind in ["mount ", "cgroup ", "state ", "bundle ", "shim pid "] {
        assert!(
            live.iter().any(|l| l.starts_with(kind)),
            "no {kind}while running: {live:?}"
        );
    }
    kill_and_delete(&g);
    assert_nothing_left(&g.id);
}

#[test]
fn tracking_cgroup_id_is_its_inode_and_it_holds_init_and_exec_processes() {
    let g = sleeper();
    let init = g.pid();
    exec_sleep(&g);
    let dir = tracking_dir(&g.id);
    let state_file = state_dir().join(namespace()).join(&g.id).join("crab.json");
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state_file).expect("crab.json"))
            .expect("json");
    let inode = std::fs::metadata(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .ino();
    assert_eq!(
        state["cgroup_id"].as_u64(),
        Some(inode),
        "crab.json: {state}"
    );

    assert!(
        wait_until(Duration::from_secs(10), || container_pids(init).len() == 2),
        "exec not running"
    );
    let members = container_pids(init);
    assert!(members.contains(&init));
    assert_eq!(
        pids_in(&dir.join("cgroup.procs")),
        members,
        "tracking dir != container's processes"
    );
    let ps = ctr_ok(&["task", "ps", &g.id]);
    let mut listed: Vec<i32> = ps
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    listed.sort();
    assert_eq!(listed, members, "ctr task ps:\n{ps}");
}

#[test]
fn twenty_concurrent_runs_all_reach_running_answer_exec_and_leave_nothing() {
    let guards: Vec<Guard> = (0..20).map(|_| Guard::new(&unique_id("par"))).collect();
    let runs: Vec<_> = guards
        .iter()
        .map(|g| {
            let id = g.id.clone();
            std::thread::spawn(move || {
                let mut args = vec!["run", "-d", "--runtime", CRAB, BUSYBOX];
                args.extend([id.as_str(), "sleep", "1000"]);
                ctr_run(&args, None, Duration::from_secs(120))
            })
        })
        .collect();
    for (g, run) in guards.iter().zip(runs) {
        let out = run.join().expect("thread");
        let (o, e) = text(&out);
        assert!(out.status.success(), "run of {} failed: {o}{e}", g.id);
    }
    for g in &guards {
        let running = wait_until(Duration::from_secs(10), || {
            g.status().as_deref() == Some("RUNNING")
        });
        assert!(running, "{} is {:?}", g.id, g.status());
        assert_eq!(g.exec_ok(&["echo", &g.id]).trim(), g.id);
    }
    for g in &guards {
        kill_and_delete(g);
    }
    for g in &guards {
        assert_nothing_left(&g.id);
    }
}

#[test]
fn containerd_restart_keeps_the_task_running_and_reachable() {
    assert!(
        std::env::var_os("CRAB_CONFIG").is_some(),
        "CRAB_CONFIG must name the configuration the running containerd passes its shims"
    );
    let g = sleeper();
    let pid = g.pid();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/containerd.sh");
    let out = Command::new(&script)
        .arg("restart")
        .output()
        .expect("run containerd.sh");
    let (o, e) = text(&out);
    assert!(out.status.success(), "containerd.sh restart failed: {o}{e}");
    assert_eq!(g.status().as_deref(), Some("RUNNING"), "after the restart");
    assert_eq!(g.pid(), pid, "the init changed across the restart");
    assert_eq!(
        g.exec_ok(&["echo", "after-restart"]).trim(),
        "after-restart"
    );
    kill_and_delete(&g);
    assert!(is_dead(pid), "init {pid} survived kill and delete");
    assert_nothing_left(&g.id);
}

#[test]
fn killed_shim_is_noticed_and_cleanup_removes_processes_mounts_cgroups_and_state() {
    let g = sleeper();
    let init = g.pid();
    exec_sleep(&g);
    assert!(
        wait_until(Duration::from_secs(10), || container_pids(init).len() == 2),
        "exec not running"
    );
    let procs = container_pids(init);
    let shims = shim_pids(&g.id);
    assert_eq!(shims.len(), 1, "shims of {}: {shims:?}", g.id);
    assert!(tracking_dir(&g.id).exists() && !mounts_mentioning(&g.id).is_empty());

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(shims[0]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill shim");
    let noticed = wait_until(Duration::from_secs(15), || {
        matches!(
            g.status().as_deref(),
            None | Some("STOPPED") | Some("UNKNOWN")
        )
    });
    assert!(
        noticed,
        "containerd still reports {:?} after the shim died",
        g.status()
    );
    let _ = ctr_run(&["task", "rm", "-f", &g.id], None, Duration::from_secs(30));
    ctr_ok(&["container", "rm", &g.id]);
    assert_eq!(g.status(), None);
    // A killed init lingers until every task of its pid namespace is reaped; the exec's
    // zombie now belongs to the host's init, which may take a moment.
    let dead = wait_until(Duration::from_secs(10), || {
        procs.iter().all(|&p| is_dead(p))
    });
    let alive: Vec<i32> = procs.iter().copied().filter(|&p| !is_dead(p)).collect();
    assert!(dead, "processes of {} still alive: {alive:?}", g.id);
    assert!(!tracking_dir(&g.id).exists(), "tracking dir left");
    assert_nothing_left(&g.id);
}

#[test]
fn a_killed_shim_of_a_frozen_container_leaves_no_frozen_process() {
    // Frozen as a checkpoint's dump freezes it, when the shim is killed.
    let g = sleeper();
    let init = g.pid();
    ctr_ok(&["task", "pause", &g.id]);
    let shims = shim_pids(&g.id);
    assert_eq!(shims.len(), 1, "shims of {}: {shims:?}", g.id);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(shims[0]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill shim");
    assert!(
        wait_until(Duration::from_secs(15), || {
            matches!(
                g.status().as_deref(),
                None | Some("STOPPED") | Some("UNKNOWN")
            )
        }),
        "containerd still reports {:?} after the shim died",
        g.status()
    );
    let _ = ctr_run(&["task", "rm", "-f", &g.id], None, Duration::from_secs(30));
    let dead = wait_until(Duration::from_secs(10), || is_dead(init));
    assert!(dead, "the init of {} is still there (frozen?)", g.id);
    assert!(!tracking_dir(&g.id).exists(), "tracking dir left");
}

/// `ctr run --rm` with the runtime configuration `toml`; returns the output.
fn run_with_runtime_config(toml: &str) -> (String, std::process::Output) {
    let id = unique_id("cfg");
    let _guard = Guard::new(&id);
    let file = std::env::temp_dir().join(format!("{id}.toml"));
    std::fs::write(&file, toml).expect("write config");
    let mut args = vec!["run", "--rm", "--runtime", CRAB, "--runtime-config-path"];
    args.extend([file.to_str().unwrap(), BUSYBOX, &id, "true"]);
    let out = ctr_run(&args, None, Duration::from_secs(60));
    let _ = std::fs::remove_file(&file);
    (id, out)
}

#[test]
fn runtime_config_with_unknown_key_is_rejected_naming_the_key() {
    let toml = format!(
        "state_dir = {:?}\nno_such_crab_key = 1\n",
        state_dir().display().to_string()
    );
    let (id, out) = run_with_runtime_config(&toml);
    let (o, e) = text(&out);
    assert!(!out.status.success(), "accepted an unknown key: {o}{e}");
    assert!(
        e.contains("no_such_crab_key"),
        "error does not name the key: {e}"
    );
    assert_nothing_left(&id);
}

#[test]
fn runtime_config_with_bad_backend_is_rejected_naming_storage_backend() {
    let toml = format!(
        "state_dir = {:?}\n[storage]\nbackend = \"ext9\"\n",
        state_dir().display().to_string()
    );
    let (id, out) = run_with_runtime_config(&toml);
    let (o, e) = text(&out);
    assert!(!out.status.success(), "accepted backend ext9: {o}{e}");
    assert!(
        e.contains("storage.backend") && e.contains("ext9"),
        "error does not name storage.backend: {e}"
    );
    assert_nothing_left(&id);
}
