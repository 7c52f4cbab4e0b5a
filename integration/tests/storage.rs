//! Every container's rootfs comes from the store (the btrfs pool by default): writes
//! land in the pool, survive new tasks and a killed shim, and the tree of a removed
//! container is collected.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::path::PathBuf;
use std::time::Duration;

use crab_integration::*;

const POOL: &str = "/var/lib/crab/pool";
const T: Duration = Duration::from_secs(60);

fn tree(id: &str) -> PathBuf {
    PathBuf::from(POOL)
        .join("containers")
        .join(namespace())
        .join(id)
}

fn is_subvolume(p: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p)
        .map(|m| m.ino() == 256)
        .unwrap_or(false)
}

fn start_again(g: &Guard) {
    let _ = ctr_run(&["task", "rm", "-f", &g.id], None, T);
    ctr_ok(&["task", "start", "-d", &g.id]);
    assert!(wait_until(T, || g.status().as_deref() == Some("RUNNING")));
}

/// Waits for containerd to drop the removed container `id`'s writable layer (its
/// background garbage collection), then checks that the next create on the host
/// collects `id`'s tree.
fn assert_collected_at_the_next_create(id: &str) {
    let owner_file = tree(id).with_extension("owner");
    let owner = std::fs::read_to_string(&owner_file).expect("the tree records its owner");
    assert!(
        wait_until(Duration::from_secs(30), || !std::path::Path::new(&owner)
            .exists()),
        "containerd kept {owner}"
    );
    let _other = Guard::run_detached(CRAB, BUSYBOX, &[], &["sleep", "1000"]);
    assert!(
        wait_until(Duration::from_secs(20), || !tree(id).exists()),
        "{} still exists",
        tree(id).display()
    );
}

#[test]
fn container_rootfs_is_a_subvolume_in_the_pool() {
    let g = Guard::run_detached(
        CRAB,
        BUSYBOX,
        &[],
        &["sh", "-c", "echo written-inside > /data.txt; sleep 1000"],
    );
    assert!(
        is_subvolume(&tree(&g.id)),
        "{} is not a subvolume",
        tree(&g.id).display()
    );
    let file = tree(&g.id).join("data.txt");
    assert!(wait_until(T, || file.exists()));
    assert_eq!(std::fs::read_to_string(file).unwrap(), "written-inside\n");
}

#[test]
fn writes_survive_a_new_task_of_the_same_container() {
    let g = Guard::run_detached(CRAB, BUSYBOX, &[], &["sleep", "1000"]);
    g.exec_ok(&["sh", "-c", "echo kept > /root/state; rm /bin/ls"]);
    ctr_ok(&["task", "kill", "-s", "KILL", &g.id]);
    assert!(wait_until(T, || g.status().as_deref() == Some("STOPPED")));
    start_again(&g);
    assert_eq!(g.exec_ok(&["cat", "/root/state"]), "kept\n");
    assert!(
        !g.exec(&["ls", "/"]).status.success(),
        "a deleted file came back"
    );
}

#[test]
fn writes_survive_a_killed_shim() {
    let g = Guard::run_detached(CRAB, BUSYBOX, &[], &["sleep", "1000"]);
    g.exec_ok(&["sh", "-c", "echo survived > /root/state"]);
    let shims = shim_pids(&g.id);
    assert_eq!(shims.len(), 1);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(shims[0]),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    assert!(wait_until(T, || g.status().as_deref() != Some("RUNNING")));
    start_again(&g);
    assert_eq!(g.exec_ok(&["cat", "/root/state"]), "survived\n");
}

#[test]
fn a_removed_containers_tree_is_collected_at_the_next_create() {
    let id = unique_id("gone");
    {
        let _g = Guard::new(&id);
        ctr_ok(&["run", "--rm", "--runtime", CRAB, BUSYBOX, &id, "true"]);
    }
    // containerd removes the container's writable layer in its background garbage
    // collection; once that is gone, the next container the host creates collects
    // the tree.
    assert_collected_at_the_next_create(&id);
}

#[test]
fn the_backend_annotation_selects_passthrough_and_rejects_unknown_names() {
    let g = Guard::run_detached(
        CRAB,
        BUSYBOX,
        &["--annotation", "io.crab.storage.backend=passthrough"],
        &["sleep", "1000"],
    );
    g.exec_ok(&["true"]);
    assert!(!tree(&g.id).exists(), "a passthrough container got a tree");

    let id = unique_id("bad");
    let _b = Guard::new(&id);
    let out = ctr_run(
        &[
            "run",
            "--rm",
            "--runtime",
            CRAB,
            "--annotation",
            "io.crab.storage.backend=ext9",
            BUSYBOX,
            &id,
            "true",
        ],
        None,
        T,
    );
    let (o, e) = text(&out);
    assert!(!out.status.success());
    assert!(
        e.contains("ext9") && e.contains("io.crab.storage.backend"),
        "{o}{e}"
    );
}

#[test]
fn overlay_backend_snapshots_and_rolls_back_a_running_container() {
    let g = Guard::run_detached(
        CRAB,
        BUSYBOX,
        &["--annotation", "io.crab.storage.backend=overlay"],
        &["sleep", "1000"],
    );
    assert!(
        !tree(&g.id).exists(),
        "an overlay container got a btrfs tree"
    );
    g.exec_ok(&["sh", "-c", "echo one > /root/f; rm /bin/ls"]);
    crabctl_ok(&["fs", "snapshot", &g.id, "s1"]);
    g.exec_ok(&[
        "sh",
        "-c",
        "echo two > /root/f; touch /root/new; rm /bin/cat",
    ]);
    crabctl_ok(&["fs", "rollback", &g.id, "s1"]);
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
    assert_eq!(
        g.exec_ok(&[
            "sh",
            "-c",
            "cat /root/f; ls /root; test -e /bin/ls || echo no-ls"
        ]),
        "one\nf\nno-ls\n"
    );
    g.remove();
    assert!(
        mounts_mentioning(&g.id).is_empty(),
        "{:?}",
        mounts_mentioning(&g.id)
    );
}

/// Makes a btrfs subvolume named `name` in the container's root directory, as any
/// process that can write a directory can (`BTRFS_IOC_SUBVOL_CREATE` on the
/// directory, `struct btrfs_ioctl_vol_args { i64 fd; char name[4088]; }`), and
/// writes a file in it. (A mutable buffer: Python copies an immutable argument
/// of at most 1024 bytes only.)
const NESTED_SUBVOLUME: &str = r#"
import fcntl, os, struct, time
fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
args = bytearray(struct.pack("q4088s", 0, b"nested"))
fcntl.ioctl(fd, 0x5000940E, args, True)
with open("/nested/data", "w") as f:
    f.write("inside the nested subvolume\n")
with open("/made", "w") as f:
    f.write("yes\n")
time.sleep(1000)
"#;

#[test]
fn a_nested_subvolume_a_container_made_fails_its_checkpoint_and_goes_with_its_tree() {
    let id;
    {
        let g = Guard::run_detached(CRAB, PYTHON, &[], &["python3", "-c", NESTED_SUBVOLUME]);
        id = g.id.clone();
        let made = tree(&id).join("made");
        assert!(wait_until(T, || made.exists()), "no nested subvolume made");
        assert!(is_subvolume(&tree(&id).join("nested")));

        // A snapshot would hold an empty directory in its place: refused, naming it.
        let out = crabctl(&["fs", "snapshot", &id, "s1"], &[]);
        let (o, e) = text(&out);
        assert!(!out.status.success(), "snapshot taken: {o}");
        assert!(e.contains("subvolume at /nested"), "{e}");
        let out = crabctl(&["checkpoint", &id, "--name", "c1"], &[]);
        let (o, e) = text(&out);
        assert!(!out.status.success(), "checkpoint taken: {o}");
        assert!(e.contains("subvolume at /nested"), "{e}");
        assert_eq!(crabctl_ok(&["fs", "ls", &id]), "");
        // The container keeps running.
        assert_eq!(g.status().as_deref(), Some("RUNNING"));
    }
    // Removed: once containerd has dropped its writable layer, the next create
    // collects the tree, nested subvolume included.
    assert_collected_at_the_next_create(&id);
    let list = std::process::Command::new("btrfs")
        .args(["subvolume", "list", POOL])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(!list.contains(&id), "left in the pool:\n{list}");
}
