//! The inspector's programs in the running kernel: shell scripts run in a fresh
//! cgroup2 directory against a tmpfs mounted for the test, and the recorded net
//! effects are compared with what the script did. Needs root, bpffs and cgroup2.

// Needs root and eBPF in the kernel: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crab_bpf::{budget, FsFlags, Inspector};

const PIN_ROOT: &str = "/sys/fs/bpf/crab-test";

/// A cgroup2 directory, a tmpfs counted as its rootfs, and the inspector watching.
struct Sandbox {
    cgroup: PathBuf,
    cgid: u64,
    dir: tempfile::TempDir,
    insp: Inspector,
}

fn unified_root() -> PathBuf {
    let hybrid = Path::new("/sys/fs/cgroup/unified");
    if hybrid.join("cgroup.procs").exists() {
        hybrid.to_path_buf()
    } else {
        PathBuf::from("/sys/fs/cgroup")
    }
}

impl Sandbox {
    fn new(name: &str) -> Sandbox {
        let cgroup = unified_root().join(format!("crab-bpf-test-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&cgroup).expect("make cgroup2 dir");
        let cgid = std::fs::metadata(&cgroup).unwrap().ino();
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount tmpfs");
        let insp = Inspector::open(Path::new(PIN_ROOT)).expect("load the inspector");
        let sb = Sandbox {
            cgroup,
            cgid,
            dir,
            insp,
        };
        sb.insp.watch(sb.cgid).unwrap();
        // As after the first full checkpoint: recording starts.
        sb.insp.forget(sb.cgid, |_| true, true, true).unwrap();
        sb
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Runs `script` with sh inside the cgroup, in the tmpfs; waits for it.
    fn run(&self, script: &str) {
        let procs = self.cgroup.join("cgroup.procs");
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script).current_dir(self.root());
        // SAFETY: the closure runs in the forked child before exec and only
        // opens and writes a file, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || std::fs::write(&procs, b"0"));
        }
        let st = cmd.status().expect("run sh");
        assert!(st.success(), "script failed: {script}");
    }

    fn setup(&self, script: &str) {
        // Outside the cgroup: not recorded.
        let ok = Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(self.root())
            .status()
            .unwrap()
            .success();
        assert!(ok, "setup failed: {script}");
    }

    /// Changed paths below the sandbox's tmpfs, relative to it.
    fn paths(&self) -> Vec<(String, FsFlags)> {
        let root = format!("{}/", self.root().display());
        let mut v: Vec<_> = self
            .insp
            .fs_changes(self.cgid, 1000)
            .unwrap()
            .into_iter()
            .filter_map(|c| Some((c.path.strip_prefix(&root)?.to_string(), c.flags)))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = self.insp.unwatch(self.cgid);
        let _ = Command::new("umount").arg(self.dir.path()).status();
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

#[test]
fn a_file_created_written_and_removed_is_no_change() {
    let sb = Sandbox::new("transient");
    sb.run("echo hi > t; cat t > /dev/null; rm t; mkdir -p d/e; echo x > d/e/f; rm -r d");
    let c = sb.insp.counters(sb.cgid).unwrap().unwrap();
    assert_eq!(sb.paths(), vec![]);
    assert_eq!(c.fs_entries, 0, "{:?}", sb.insp.fs_changes(sb.cgid, 100));
    assert!(c.transient >= 1, "the shell's children were born and gone");
    assert_eq!(c.births, 0);
}

#[test]
fn a_write_to_an_existing_file_is_recorded_with_its_path() {
    let sb = Sandbox::new("write");
    sb.setup("mkdir -p a/b && echo old > a/b/f");
    sb.run("echo new >> a/b/f");
    let paths = sb.paths();
    assert_eq!(paths.len(), 1, "{paths:?}");
    assert_eq!(paths[0].0, "a/b/f");
    assert!(paths[0].1.has(FsFlags::WRITTEN));
    assert!(!paths[0].1.has(FsFlags::CREATED));
}

#[test]
fn reads_leave_nothing() {
    let sb = Sandbox::new("reads");
    sb.setup("mkdir -p src && echo 'int main(){}' > src/m.c");
    sb.run("cat src/m.c > /dev/null; ls -la; find . -name '*.c' > /dev/null; grep main -r .");
    assert_eq!(sb.paths(), vec![]);
}

#[test]
fn rename_over_an_existing_file_counts() {
    let sb = Sandbox::new("rename");
    sb.setup("echo one > f");
    sb.run("echo two > f.tmp && mv f.tmp f");
    let paths = sb.paths();
    assert_eq!(paths.len(), 1, "only f remains changed: {paths:?}");
    assert_eq!(paths[0].0, "f");
}

#[test]
fn a_write_through_a_transient_hard_link_still_counts() {
    let sb = Sandbox::new("hardlink");
    sb.setup("echo one > f");
    sb.run("ln f g && echo two >> g && rm g");
    let paths = sb.paths();
    assert_eq!(paths.len(), 1, "{paths:?}");
    assert_eq!(paths[0].0, "g");
    assert_eq!(
        std::fs::read_to_string(sb.root().join("f")).unwrap(),
        "one\ntwo\n"
    );
}

#[test]
fn chmod_only_and_removal_are_changes() {
    let sb = Sandbox::new("meta");
    sb.setup("echo a > m; echo b > r");
    sb.run("chmod 600 m; rm r");
    let paths = sb.paths();
    assert_eq!(paths.len(), 2, "{paths:?}");
    assert!(
        paths[0].0 == "m" && paths[0].1.has(FsFlags::META),
        "{paths:?}"
    );
    assert!(
        paths[1].0 == "r" && paths[1].1.has(FsFlags::REMOVED),
        "{paths:?}"
    );
}

#[test]
fn processes_outside_the_cgroup_are_not_recorded() {
    let sb = Sandbox::new("other");
    sb.setup("echo a > f; echo b >> f; rm f; mkdir d");
    assert_eq!(sb.insp.counters(sb.cgid).unwrap().unwrap().fs_entries, 0);
    assert!(sb.paths().is_empty());
}

#[test]
fn paths_are_resolved_from_the_working_directory_and_from_dirfds() {
    let sb = Sandbox::new("paths");
    sb.setup("mkdir -p x/y");
    // cd changes the base of relative paths; rm -r uses unlinkat on a dirfd.
    sb.run("cd x && echo 1 > ./y/a && cd y && mkdir z && touch z/b && cd / && rm -r $OLDPWD/z");
    let paths = sb.paths();
    assert_eq!(paths.len(), 1, "{paths:?}");
    assert_eq!(paths[0].0, "x/y/a");
    assert!(paths[0].1.has(FsFlags::CREATED));
}

#[test]
fn a_surviving_background_process_is_a_birth() {
    let sb = Sandbox::new("daemon");
    sb.run("sleep 30 >/dev/null 2>&1 & echo started");
    let c = sb.insp.counters(sb.cgid).unwrap().unwrap();
    assert_eq!(
        c.births,
        1,
        "{:?}",
        sb.insp.proc_changes(sb.cgid, 10).unwrap()
    );
    // The child execs sleep in its own time: its name follows at exec.
    let mut procs = Vec::new();
    for _ in 0..100 {
        procs = sb.insp.proc_changes(sb.cgid, 10).unwrap();
        if procs.iter().any(|p| p.born && p.comm == "sleep") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        procs.iter().any(|p| p.born && p.comm == "sleep"),
        "{procs:?}"
    );
    let _ = std::fs::write(sb.cgroup.join("cgroup.kill"), b"1");
}

#[test]
fn forgetting_starts_from_zero() {
    let sb = Sandbox::new("advance");
    sb.run("echo a > kept");
    assert_eq!(sb.insp.counters(sb.cgid).unwrap().unwrap().fs_entries, 1);
    sb.insp.forget(sb.cgid, |_| true, true, true).unwrap();
    let c = sb.insp.counters(sb.cgid).unwrap().unwrap();
    assert_eq!(c.fs_entries, 0);
    assert!(sb.paths().is_empty());
    // The name existed when the new epoch began: removing it is a change.
    sb.run("rm kept");
    assert_eq!(sb.insp.counters(sb.cgid).unwrap().unwrap().fs_entries, 1);
}

#[test]
fn repeated_writes_are_recorded_again_after_a_checkpoint_forgot_them() {
    let sb = Sandbox::new("cache");
    sb.setup("echo a > f");
    // Many writes to one file: the first records it, the rest hit the cache.
    sb.run("for i in 1 2 3 4 5; do echo $i >> f; done");
    assert_eq!(sb.paths().len(), 1);
    sb.insp.forget(sb.cgid, |_| true, true, true).unwrap();
    assert!(sb.paths().is_empty());
    // Same file, same dentry: still a change after the checkpoint.
    sb.run("echo 6 >> f");
    let paths = sb.paths();
    assert_eq!(paths.len(), 1, "{paths:?}");
    assert!(paths[0].1.has(FsFlags::WRITTEN));
}

#[test]
fn a_write_is_recorded_when_the_cgroup_is_watched_again() {
    let sb = Sandbox::new("rewatch");
    sb.setup("echo a > f");
    sb.run("echo b >> f");
    assert_eq!(sb.paths().len(), 1);
    // Unwatched and watched again, then checkpointed: the write cache of the
    // first watch must not make the same file look recorded already.
    sb.insp.unwatch(sb.cgid).unwrap();
    sb.insp.watch(sb.cgid).unwrap();
    sb.insp.forget(sb.cgid, |_| true, true, true).unwrap();
    sb.run("echo c >> f");
    let paths = sb.paths();
    assert_eq!(paths.len(), 1, "{paths:?}");
    assert!(paths[0].1.has(FsFlags::WRITTEN));
}

#[test]
fn nothing_is_recorded_before_the_first_full_checkpoint() {
    let sb = Sandbox::new("untracked");
    sb.insp.unwatch(sb.cgid).unwrap();
    sb.insp.watch(sb.cgid).unwrap();
    sb.run("echo a > f; sleep 30 >/dev/null 2>&1 &");
    let c = sb.insp.counters(sb.cgid).unwrap().unwrap();
    assert_eq!((c.fs_entries, c.births), (0, 0), "{c:?}");
    assert_ne!(c.opaque & crab_bpf::opaque::UNTRACKED, 0);
    let _ = std::fs::write(sb.cgroup.join("cgroup.kill"), b"1");
}

/// Issue 17 item 9: 70 000 names in one container (more than the old host-wide
/// table held) overflow that container alone; another container's one change is
/// still recorded exactly, so its turn is classified by what it did.
#[test]
fn one_container_past_its_budget_overflows_alone() {
    let noisy = Sandbox::new("noisy");
    let quiet = Sandbox::new("quiet");
    noisy.run("mkdir d && cd d && i=0; while [ $i -lt 70000 ]; do : > f$i; i=$((i+1)); done");
    let n = noisy.insp.counters(noisy.cgid).unwrap().unwrap();
    assert!(n.overflow > 0, "{n:?}");
    assert!(n.fs_entries <= budget::FS_BUDGET, "{n:?}");
    quiet.run("echo x > one");
    let q = quiet.insp.counters(quiet.cgid).unwrap().unwrap();
    assert_eq!((q.overflow, q.fs_entries), (0, 1), "{q:?}");
    assert_eq!(quiet.paths().len(), 1);
    // A full checkpoint of the noisy one forgets everything: it records again.
    noisy.insp.forget(noisy.cgid, |_| true, true, true).unwrap();
    noisy.run("echo y > after");
    let n = noisy.insp.counters(noisy.cgid).unwrap().unwrap();
    assert_eq!((n.overflow, n.fs_entries), (0, 1), "{n:?}");
}

/// Past its budget of task births a container overflows alone too.
#[test]
fn one_container_past_its_task_budget_overflows_alone() {
    let noisy = Sandbox::new("forky");
    let quiet = Sandbox::new("calm");
    let n = budget::PROC_BUDGET + 100;
    noisy.run(&format!(
        "i=0; while [ $i -lt {n} ]; do sleep 600 & i=$((i+1)); done"
    ));
    let c = noisy.insp.counters(noisy.cgid).unwrap().unwrap();
    let _ = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "xargs kill < {}",
            noisy.cgroup.join("cgroup.procs").display()
        ))
        .status();
    assert!(c.overflow > 0, "{c:?}");
    assert!(c.births <= budget::PROC_BUDGET, "{c:?}");
    quiet.run("sleep 600 &");
    let q = quiet.insp.counters(quiet.cgid).unwrap().unwrap();
    let _ = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "xargs kill < {}",
            quiet.cgroup.join("cgroup.procs").display()
        ))
        .status();
    assert_eq!((q.overflow, q.births), (0, 1), "{q:?}");
}

/// What an adoption's leftovers rely on to skip the walk of the host's tables:
/// stopping the watch of a cgroup that recorded nothing says so, and of one
/// with a recorded name says that records remain, which stay until an unwatch.
#[test]
fn stopping_a_watch_tells_whether_anything_was_recorded() {
    let quiet = Sandbox::new("stop-quiet");
    quiet.setup("echo a > f");
    assert!(
        !quiet.insp.stop_recording(quiet.cgid),
        "nothing was recorded"
    );
    assert!(!quiet.insp.is_watched(quiet.cgid).unwrap());
    // Not watched any more: nothing is known of it, so records may remain.
    assert!(quiet.insp.stop_recording(quiet.cgid));

    let busy = Sandbox::new("stop-busy");
    busy.run("echo b > g");
    assert!(busy.insp.stop_recording(busy.cgid), "a name was recorded");
    assert_eq!(busy.paths().len(), 1, "kept until an unwatch");
    busy.insp.unwatch(busy.cgid).unwrap();
    assert_eq!(busy.paths(), Vec::new());
}
