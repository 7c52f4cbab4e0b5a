//! Crash at any step of a restore, a fork, an export and an import (issue 17 item
//! 13, the rows after the checkpoint's and the rollback's): crabctl (through
//! `CRAB_FAULT`, which the test sets for the crabctl it starts) or the shim that
//! restores (through the configuration's `fault_file`, `shim:<point>`) is killed with
//! SIGKILL between two steps. After each: a retry of the same command works and gives
//! back the checkpoint's files and in-memory counter, nothing is frozen, exactly one
//! copy of the processes runs, the next checkpoint works, and nothing the dead
//! operation made is left (containers, snapshots, unpacked or partial archives).
//! docs/security.md reports the matrix.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::path::{Path, PathBuf};
use std::time::Duration;

use crab_integration::crash::*;
use crab_integration::*;

/// The container `g` holds the checkpoint's state: the file the checkpoint saw, a
/// counter that went on from the checkpoint's value, one copy of its processes, not
/// frozen.
fn assert_holds_base(g: &Guard, at: u64) {
    assert_eq!(g.exec_ok(&["cat", "/f"]).trim(), "before", "{}", g.id);
    let now = g.number("/tmp/count");
    assert!(
        now >= at && now < at + 25,
        "{}: count {now}, {at} at base",
        g.id
    );
    let c = g.number("/tmp/count");
    assert!(
        wait_until(Duration::from_secs(5), || g.number("/tmp/count") > c),
        "{}: the counter stopped at {c} (frozen?)",
        g.id
    );
    assert_not_frozen(&g.id);
    assert_eq!(counters(&g.id), 1, "{}: copies of the counter", g.id);
}

/// Runs crabctl `args` with a crash at `point`: crabctl's own (it dies), or `shim:`
/// that of the shim creating the task of each container `made` (the command fails,
/// and containerd's clean-up after the dead shim leaves no state and no cgroup).
fn crash_at(c: &Crashable, point: &str, args: &[&str], made: &[&str]) {
    if !point.starts_with("shim:") {
        crabctl_killed_at(point, args);
        return;
    }
    let out = c.crash_during(point, args);
    let (o, e) = text(&out);
    assert!(
        !out.status.success(),
        "crabctl {args:?} survived {point}: {o}{e}"
    );
    // It failed where the shim died: containerd's Create, or its Start.
    let call = if point == "shim:restore.prepared" {
        "create the task of"
    } else {
        "start the task of"
    };
    assert!(e.contains(call), "crabctl {args:?} at {point}: {o}{e}");
    for id in made {
        let dir = state_dir().join(namespace()).join(id);
        assert!(
            wait_until(Duration::from_secs(10), || !dir.exists()
                && cgroup_dirs_named(id).is_empty()),
            "left after {point}: {} {:?}",
            dir.display(),
            cgroup_dirs_named(id)
        );
    }
}

/// The pins of process images that restores into `id` hold
/// (`<store>/.restores/<namespace>/<pid>.<n>.<id>`): a restore removes its own once
/// the processes are back, the next one those of dead shims.
fn pins_of(id: &str) -> Vec<String> {
    let suffix = format!(".{id}");
    names_in(&store_dir().join(".restores").join(namespace()))
        .into_iter()
        .filter(|n| n.ends_with(&suffix))
        .collect()
}

/// No restore into `ids` holds a pin any more.
fn assert_no_pins(ids: &[&str]) {
    for id in ids {
        assert!(
            wait_until(Duration::from_secs(10), || pins_of(id).is_empty()),
            "pins left for {id}: {:?}",
            pins_of(id)
        );
    }
}

/// A fork or an import whose shim died discarded what it made: no container record
/// under the ids it was making, and their trees go as any removed container's do:
/// once containerd's garbage collection has removed the snapshot (the tree's
/// owner), the next container's create collects them (docs/storage.md).
fn assert_nothing_made(ids: &[&str]) {
    let listed = ctr_ok(&["containers", "ls", "-q"]);
    for id in ids {
        assert!(
            !listed.lines().any(|l| l.trim() == *id),
            "container {id} left"
        );
    }
    let has_tree = |id: &str| crabctl(&["fs", "du", id], &[]).status.success();
    let next_create = || {
        let id = unique_id("next");
        let out = ctr_run(
            &["run", "--rm", "--runtime", CRAB, BUSYBOX, &id, "true"],
            None,
            Duration::from_secs(60),
        );
        assert!(out.status.success(), "ctr run: {:?}", text(&out));
    };
    for id in ids {
        assert!(
            wait_until(Duration::from_secs(30), || {
                !has_tree(id) || {
                    next_create();
                    std::thread::sleep(Duration::from_millis(500));
                    false
                }
            }),
            "the tree of {id} outlived the next creates"
        );
    }
}

/// The container's task is killed with its shim, then a `crabctl restore` dies at
/// `point` (crabctl's own, or `shim:` the new shim's): the next restore brings back
/// the checkpoint, whole and once.
fn crash_in_restore(point: &str) {
    let c = Crashable::start();
    let at = base_checkpoint(&c);
    c.guard
        .exec_ok(&["sh", "-c", "echo after > /f; echo x > /after"]);
    kill_shim(&c);
    crash_at(&c, point, &["restore", c.id()], &[c.id()]);
    let out = crabctl_ok(&["restore", c.id()]);
    assert!(out.contains("restored from checkpoint base"), "{out}");
    assert_holds_base(&c.guard, at);
    assert_no_pins(&[c.id()]);
    assert_eq!(
        c.guard.exec(&["test", "-e", "/after"]).status.code(),
        Some(1)
    );
    crabctl_ok(&["checkpoint", c.id(), "--name", "next"]);
    c.assert_nothing_left_over();
}

#[test]
fn crabctl_killed_after_deleting_the_dead_task_restores_on_retry() {
    crash_in_restore("restore.deleted");
}

#[test]
fn crabctl_killed_after_creating_the_task_restores_on_retry() {
    crash_in_restore("task.created");
}

#[test]
fn shim_killed_after_preparing_the_restore_restores_on_retry() {
    crash_in_restore("shim:restore.prepared");
}

#[test]
fn shim_killed_before_criu_restores_restores_on_retry() {
    crash_in_restore("shim:restore.starting");
}

#[test]
fn shim_killed_after_criu_restored_leaves_one_copy_after_the_retry() {
    crash_in_restore("shim:restore.restored");
}

/// A `crabctl fork --count 2` dies at `point` (or `shim:` the forks' shims do): the
/// same fork again makes both forks (the dead one's containers are discarded first),
/// each holding the checkpoint, and no container is left pending.
fn crash_in_fork(point: &str) {
    let c = Crashable::start();
    let at = base_checkpoint(&c);
    let forks = [format!("{}-fork-1", c.id()), format!("{}-fork-2", c.id())];
    let guards: Vec<Guard> = forks.iter().map(|f| Guard::new(f)).collect();
    let args = ["fork", c.id(), "base", "--count", "2"];
    crash_at(&c, point, &args, &[&forks[0], &forks[1]]);
    if point.starts_with("shim:") {
        assert_nothing_made(&[&forks[0], &forks[1]]);
    }
    assert_not_frozen(c.id());
    crabctl_ok(&["fork", c.id(), "base", "--count", "2"]);
    for g in &guards {
        assert_holds_base(g, at);
    }
    assert_no_pins(&[&forks[0], &forks[1]]);
    assert_eq!(pending_containers(), Vec::<String>::new());
    c.assert_runs("the forks");
    crabctl_ok(&["checkpoint", c.id(), "--name", "next"]);
    crabctl_ok(&["checkpoint", &forks[0], "--name", "first"]);
    c.assert_nothing_left_over();
}

#[test]
fn crabctl_killed_after_the_fork_checkpoint_forks_on_retry() {
    crash_in_fork("fork.checkpointed");
}

#[test]
fn crabctl_killed_after_creating_a_fork_container_forks_on_retry() {
    crash_in_fork("fork.created");
}

#[test]
fn crabctl_killed_after_preparing_a_fork_snapshot_forks_on_retry() {
    crash_in_fork("fork.prepared");
}

#[test]
fn crabctl_killed_after_creating_a_fork_task_forks_on_retry() {
    crash_in_fork("task.created");
}

#[test]
fn crabctl_killed_after_starting_a_fork_forks_on_retry() {
    crash_in_fork("fork.started");
}

#[test]
fn shim_killed_after_preparing_a_forks_restore_forks_on_retry() {
    crash_in_fork("shim:restore.prepared");
}

#[test]
fn shim_killed_before_criu_restores_a_fork_forks_on_retry() {
    crash_in_fork("shim:restore.starting");
}

#[test]
fn shim_killed_after_criu_restored_a_fork_leaves_one_copy_after_the_retry() {
    crash_in_fork("shim:restore.restored");
}

/// A fresh directory for archives, removed at the end.
fn archive_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary directory")
}

/// The names in `dir`.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Imports `archive` as a new container, which must hold the checkpoint.
fn import_holds_base(archive: &Path, at: u64) -> Guard {
    let id = unique_id("imported");
    let g = Guard::new(&id);
    crabctl_ok(&["import", &archive.display().to_string(), "--id", &id]);
    assert_holds_base(&g, at);
    g
}

/// A `crabctl export` dies at `point`: no file has the archive's name, the retry
/// writes a whole archive (and removes the dead one's partial archive and staging
/// directory), which imports.
fn crash_in_export(point: &str) {
    let c = Crashable::start();
    let at = base_checkpoint(&c);
    let dir = archive_dir();
    let archive = dir.path().join("a.tar");
    let path = archive.display().to_string();
    crabctl_killed_at(point, &["export", c.id(), "base", "-o", &path]);
    assert!(
        !archive.exists(),
        "a half-made export has the archive's name"
    );
    assert_not_frozen(c.id());
    crabctl_ok(&["export", c.id(), "base", "-o", &path]);
    assert_eq!(names_in(dir.path()), ["a.tar"]);
    // Other hosts' tests may be exporting (live work): only dead work counts.
    let dead: Vec<String> = names_in(&store_dir().join(".exports"))
        .into_iter()
        .filter(|n| {
            !n.split('.')
                .next()
                .and_then(|p| p.parse::<u32>().ok())
                .is_some_and(|p| Path::new(&format!("/proc/{p}")).exists())
        })
        .collect();
    assert_eq!(dead, Vec::<String>::new(), "staging left by dead exports");
    import_holds_base(&archive, at);
    c.assert_runs("the export");
    crabctl_ok(&["checkpoint", c.id(), "--name", "next"]);
    c.assert_nothing_left_over();
}

#[test]
fn crabctl_killed_after_the_export_checkpoint_exports_on_retry() {
    crash_in_export("export.checkpointed");
}

#[test]
fn crabctl_killed_with_the_archive_staged_leaves_no_archive() {
    crash_in_export("export.staged");
}

#[test]
fn crabctl_killed_with_the_archive_written_before_its_rename_leaves_no_archive() {
    crash_in_export("export.written");
}

/// The unpacked imports of the test namespace.
fn unpacked() -> Vec<String> {
    names_in(&store_dir().join(".imports").join(namespace()))
}

/// A `crabctl import` dies at `point` (or `shim:` the imported container's shim,
/// which runs with the source's configuration and so its fault file): the retry
/// under the same id discards what the dead one made and imports; nothing is left
/// pending or unpacked.
fn crash_in_import(point: &str) {
    let c = Crashable::start();
    let at = base_checkpoint(&c);
    let dir = archive_dir();
    let archive: PathBuf = dir.path().join("a.tar");
    crabctl_ok(&[
        "export",
        c.id(),
        "base",
        "-o",
        &archive.display().to_string(),
    ]);
    let id = unique_id("imported");
    let g = Guard::new(&id);
    let path = archive.display().to_string();
    let config = c.config().display().to_string();
    let args = [
        "import",
        &path,
        "--id",
        &id,
        "--runtime-config-path",
        &config,
    ];
    crash_at(&c, point, &args, &[&id]);
    if point.starts_with("shim:") {
        assert_nothing_made(&[&id]);
    }
    crabctl_ok(&args);
    assert_holds_base(&g, at);
    assert_eq!(pending_containers(), Vec::<String>::new());
    assert!(
        wait_until(Duration::from_secs(10), || unpacked().is_empty()),
        "unpacked imports left: {:?}",
        unpacked()
    );
    crabctl_ok(&["checkpoint", &id, "--name", "first"]);
}

#[test]
fn crabctl_killed_after_unpacking_imports_on_retry() {
    crash_in_import("import.unpacked");
}

#[test]
fn crabctl_killed_after_creating_the_container_imports_on_retry() {
    crash_in_import("import.created");
}

#[test]
fn crabctl_killed_after_preparing_the_snapshot_imports_on_retry() {
    crash_in_import("import.prepared");
}

#[test]
fn crabctl_killed_after_creating_the_imported_task_imports_on_retry() {
    crash_in_import("task.created");
}

#[test]
fn crabctl_killed_after_starting_the_imported_task_imports_on_retry() {
    crash_in_import("import.started");
}

#[test]
fn shim_killed_after_preparing_an_imports_restore_imports_on_retry() {
    crash_in_import("shim:restore.prepared");
}

#[test]
fn shim_killed_before_criu_restores_an_import_imports_on_retry() {
    crash_in_import("shim:restore.starting");
}

#[test]
fn shim_killed_after_criu_restored_an_import_leaves_one_copy_after_the_retry() {
    crash_in_import("shim:restore.restored");
}
