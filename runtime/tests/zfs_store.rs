//! The ZFS store against a real pool: `hack/zfs.sh` starts ZFS (the zfs-fuse daemon
//! where the kernel has no ZFS) and makes the pool `crab` with Crab's dataset
//! `crab/crab`. Nothing here is skipped: without ZFS every test fails, loudly.
//!
//! zfs-fuse keeps whole-second timestamps, so contents are compared with the shared
//! fingerprint's mtimes cut to seconds (everything else must be equal).

// Needs root and the real store: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

mod support;

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use crab_runtime::storage::zfs::ZfsStore;
use crab_runtime::storage::{ContainerKey, ImageSource, Store};
use crab_runtime::Error;
use support::*;

const ROOT: &str = "crab/crab";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/zfs.sh")
}

/// Runs `hack/zfs.sh` once per test process.
fn zfs_up() {
    static UP: OnceLock<()> = OnceLock::new();
    UP.get_or_init(|| {
        let out = Command::new("bash")
            .arg(script())
            .stdin(Stdio::null())
            .output()
            .expect("run hack/zfs.sh");
        assert!(
            out.status.success(),
            "hack/zfs.sh failed: ZFS (zfs-fuse) must be available for these tests\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

fn store() -> ZfsStore {
    zfs_up();
    ZfsStore::open(ROOT).expect("open crab/crab (made by hack/zfs.sh)")
}

/// A lock over these tests in every process of the host (several test runs may share
/// the pool). Most tests share it; those that make pools or collect what other
/// processes leave (`reconcile`, `collect`) take it alone, so that none collects what
/// another is looking at. Declared before what the test makes, so that it is released
/// after the clean-up.
struct PoolLock(#[allow(dead_code)] fs::File);

fn pool_lock(exclusive: bool) -> PoolLock {
    let path = std::env::temp_dir().join("crab-zfs-tests.lock");
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap();
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    // SAFETY: flock on a descriptor this function owns; no memory is passed.
    let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), op) };
    assert_eq!(rc, 0, "lock {}", path.display());
    PoolLock(f)
}

fn shared() -> PoolLock {
    pool_lock(false)
}

fn alone() -> PoolLock {
    pool_lock(true)
}

fn zfs(args: &[&str]) -> String {
    let out = Command::new("zfs").args(args).output().expect("run zfs");
    assert!(
        out.status.success(),
        "zfs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn zfs_ok(args: &[&str]) -> bool {
    Command::new("zfs")
        .args(args)
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .expect("run zfs")
        .success()
}

/// Every dataset and snapshot under `ds` (itself included), or none if it is gone.
fn datasets_under(ds: &str) -> Vec<String> {
    let out = Command::new("zfs")
        .args(["list", "-H", "-o", "name", "-t", "all", "-r", ds])
        .output()
        .expect("run zfs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Unmounts and destroys `ds` with everything below and every clone of it. Test
/// clean-up only: the store never destroys clones.
fn destroy_all(ds: &str) {
    let mut names: Vec<String> = datasets_under(ds)
        .into_iter()
        .filter(|n| !n.contains('@'))
        .collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for n in &names {
        let _ = Command::new("zfs")
            .args(["unmount", n])
            .stderr(Stdio::null())
            .status();
    }
    // zfs-fuse says "busy" for a moment after an unmount.
    let start = Instant::now();
    while !datasets_under(ds).is_empty() && start.elapsed() < Duration::from_secs(5) {
        let _ = Command::new("zfs")
            .args(["destroy", "-R", ds])
            .stderr(Stdio::null())
            .status();
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A namespace of its own and an image of its own, both removed at the end.
struct Scene {
    ns: String,
    image_dir: PathBuf,
    image: ImageSource,
}

impl Scene {
    fn new(tag: &str) -> Scene {
        let image_dir = temp_dir(tag);
        populate_image(&image_dir);
        Scene {
            ns: unique(&format!("zfs-{tag}")),
            image: ImageSource::from_layers(vec![image_dir.clone()]).unwrap(),
            image_dir,
        }
    }

    fn key(&self, id: &str) -> ContainerKey {
        ContainerKey::new(&self.ns, id).unwrap()
    }

    fn ns_dataset(&self) -> String {
        format!("{ROOT}/containers/{}", self.ns)
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        destroy_all(&self.ns_dataset());
        destroy_all(&format!("{ROOT}/images/{}", self.image.key));
        let _ = fs::remove_dir_all(&self.image_dir);
    }
}

/// The fingerprint with mtimes cut to whole seconds (all zfs-fuse keeps).
fn fp(root: &Path) -> Fingerprint {
    support::whole_second_mtimes();
    fingerprint(root)
}

fn names(s: &dyn Store, k: &ContainerKey) -> Vec<String> {
    s.list(k).unwrap().into_iter().map(|i| i.name).collect()
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A shell whose working directory is `dir`; it prints `ls` and a file each time it
/// reads a line.
struct Resident {
    child: std::process::Child,
}

impl Resident {
    fn start(dir: &Path) -> Resident {
        let child = Command::new("sh")
            .arg("-c")
            .arg("while read -r f; do ls; echo ---; cat \"$f\" 2>&1; echo ===; done")
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        Resident { child }
    }

    /// What it sees: (listing of its cwd, content of `file` relative to it).
    fn look(&mut self, file: &str) -> (Vec<String>, String) {
        use std::io::BufRead;
        writeln!(self.child.stdin.as_mut().unwrap(), "{file}").unwrap();
        let mut r = std::io::BufReader::new(self.child.stdout.as_mut().unwrap());
        let (mut ls, mut content, mut in_ls) = (Vec::new(), String::new(), true);
        loop {
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            let l = line.trim_end_matches('\n');
            match l {
                "---" => in_ls = false,
                "===" => break,
                _ if in_ls => ls.push(l.to_string()),
                _ => {
                    content.push_str(l);
                    content.push('\n');
                }
            }
        }
        (ls, content)
    }
}

impl Drop for Resident {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn zfs_store_passes_the_conformance_suite() {
    let _l = shared();
    support::whole_second_mtimes();
    support::conformance::run(&store());
}

#[test]
fn zfs_store_tells_what_the_tree_of_a_writable_layer_wrote() {
    let _l = shared();
    support::written::written_is_found_by_owner(|| Box::new(store()));
}

#[test]
fn fifty_containers_snapshot_concurrently_and_every_snapshot_is_right() {
    let _l = shared();
    support::conformance::fifty_concurrent_snapshots(std::sync::Arc::new(store()));
}

#[test]
fn snapshot_rollback_clone_export_import_and_destroy() {
    let _l = shared();
    let s = store();
    let sc = Scene::new("main");
    let base = fp(&sc.image_dir);

    let a = sc.key("a");
    let live = s.prepare(&a, &sc.image).expect("prepare");
    assert_eq!(live, s.rootfs(&a).unwrap());
    assert_same("prepared tree", &fp(&live), &base);
    assert!(
        allocated(&live.join("home/crab/sparse.img")) < 8 << 20,
        "a sparse file became dense: {} bytes",
        allocated(&live.join("home/crab/sparse.img"))
    );
    assert!(matches!(
        s.prepare(&a, &sc.image),
        Err(Error::AlreadyExists(_))
    ));
    // The image copy is a dataset with @base, not mounted; the tree is its clone.
    let image_ds = format!("{ROOT}/images/{}", sc.image.key);
    assert_eq!(
        zfs(&["get", "-H", "-o", "value", "mounted", &image_ds]).trim(),
        "no"
    );
    assert_eq!(
        zfs(&[
            "get",
            "-H",
            "-o",
            "value",
            "origin",
            &s.dataset(&a).unwrap()
        ])
        .trim(),
        format!("{image_ds}@base")
    );

    turn_one(&live);
    let fp1 = fp(&live);
    let s1 = s.snapshot(&a, "s1").expect("snapshot s1");
    assert_eq!(s1.name, "s1");
    let age = SystemTime::now().duration_since(s1.created).unwrap();
    assert!(age < Duration::from_secs(60), "created {age:?} ago");
    turn_two(&live);
    let fp2 = fp(&live);
    s.snapshot(&a, "s2").expect("snapshot s2");
    turn_three(&live);
    assert_ne!(fp(&live), fp2);
    assert_eq!(names(&s, &a), ["s1", "s2"]);

    // Processes with the tree open: a directory handle (as a root or cwd would be),
    // a shell whose cwd is inside, a file held open.
    let handle = fs::File::open(&live).unwrap();
    let through = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&handle)
    ));
    let mut resident = Resident::start(&live.join("etc"));
    assert_eq!(resident.look("hostname").1, "third\n");

    s.rollback(&a, "s1").expect("rollback to s1 (older)");
    assert_same("rolled back to s1", &fp(&live), &fp1);
    assert_eq!(names(&s, &a), ["s1", "s2"], "rollback keeps every snapshot");
    let seen = listing(&through);
    assert!(seen.contains(&"new-file.link".to_string()), "{seen:?}");
    assert!(!seen.iter().any(|n| n.starts_with("junk-")), "{seen:?}");
    let (ls, hostname) = resident.look("hostname");
    assert_eq!(hostname, "changed\n");
    assert!(ls.contains(&"config.hard".to_string()), "{ls:?}");
    // Details the fingerprint holds, spelled out.
    assert!(!live.join("home/crab/notes.txt").exists() && live.join("home/crab/notes.md").exists());
    assert!(!live.join("bin/tool").exists() && !live.join("made").is_file());
    assert_eq!(
        fs::read_link(live.join("abs-link")).unwrap(),
        Path::new("/new-file")
    );
    assert_eq!(
        fs::metadata(live.join("new-file")).unwrap().ino(),
        fs::metadata(live.join("new-file.link")).unwrap().ino()
    );
    assert_eq!(
        xattr::get(live.join("new-file"), "user.crab.turn").unwrap(),
        Some(b"1".to_vec())
    );
    assert_eq!(
        fs::metadata(live.join("etc/config")).unwrap().mode() & 0o777,
        0o600
    );
    assert_eq!(
        fs::read(live.join("home/crab/sparse2.img")).unwrap().len(),
        8 << 20
    );

    // To the latest (the native rollback on kernel ZFS, a mirror on zfs-fuse). A file
    // changed in place and held open: whoever opens it again reads the snapshot; the
    // holder reads the snapshot (native) or keeps its own, now unlinked, copy (mirror,
    // as on btrfs).
    fs::write(live.join("etc/hostname"), b"not yet\n").unwrap();
    s.snapshot(&a, "s3").unwrap();
    let held = fs::File::open(live.join("etc/hostname")).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(live.join("etc/hostname"))
        .unwrap()
        .write_all_at(b"NOT", 0)
        .unwrap();
    s.rollback(&a, "s3").expect("rollback to s3 (latest)");
    let mut buf = [0u8; 8];
    held.read_exact_at(&mut buf, 0).unwrap();
    assert!(&buf == b"not yet\n" || &buf == b"NOT yet\n", "{buf:?}");
    assert_eq!(fs::read(live.join("etc/hostname")).unwrap(), b"not yet\n");
    assert_eq!(resident.look("hostname").1, "not yet\n");
    s.delete_snapshot(&a, "s3").unwrap();

    s.rollback(&a, "s2").expect("rollback to s2 (latest again)");
    assert_same("rolled back to s2", &fp(&live), &fp2);
    assert_eq!(
        fs::read_to_string(through.join("new-file/inside")).unwrap(),
        "inside\n"
    );
    assert_eq!(resident.look("config").1, "a = 1\nb = 2\n");
    drop((handle, held, resident));
    s.rollback(&a, "s2").unwrap();
    assert_same("second rollback to s2", &fp(&live), &fp2);

    // Clones are independent of their origin.
    let b = sc.key("b");
    let cloned = s.clone_snapshot(&a, "s1", &b).expect("clone");
    assert_same("clone of s1", &fp(&cloned), &fp1);
    fs::write(cloned.join("only-in-clone"), b"x").unwrap();
    assert!(!live.join("only-in-clone").exists());
    assert_same("origin after the clone's write", &fp(&live), &fp2);
    assert!(s.list(&b).unwrap().is_empty());
    assert!(matches!(
        s.clone_snapshot(&a, "s1", &b),
        Err(Error::AlreadyExists(_))
    ));

    // Export/import, full then incremental, under another container.
    let c = sc.key("c");
    let (mut full, mut incr) = (Vec::new(), Vec::new());
    s.export(&a, "s1", None, &mut full).expect("export s1");
    s.export(&a, "s2", Some("s1"), &mut incr)
        .expect("export s2 from s1");
    assert!(!full.is_empty() && !incr.is_empty() && incr.len() < full.len());
    let err = s.import(&c, &mut incr.as_slice()).unwrap_err();
    assert!(err.to_string().contains("parent"), "{err}");
    assert_eq!(
        datasets_under(&s.dataset(&c).unwrap()),
        Vec::<String>::new()
    );
    assert_eq!(
        s.import(&c, &mut full.as_slice())
            .expect("import full")
            .name,
        "s1"
    );
    assert!(matches!(s.rootfs(&c), Err(Error::NoTree(_))));
    assert!(matches!(s.snapshot(&c, "x"), Err(Error::NoTree(_))));
    assert_eq!(
        s.import(&c, &mut incr.as_slice())
            .expect("import incr")
            .name,
        "s2"
    );
    assert!(matches!(
        s.import(&c, &mut incr.as_slice()),
        Err(Error::SnapshotExists { .. })
    ));
    let e = s.import(&c, &mut full.as_slice()).unwrap_err();
    assert!(e.to_string().contains("full stream"), "{e}");
    assert_eq!(names(&s, &c), ["s1", "s2"]);
    s.rollback(&c, "s2").expect("tree from imported s2");
    assert_same("imported s2", &fp(&s.rootfs(&c).unwrap()), &fp2);
    s.rollback(&c, "s1").expect("rollback imported");
    assert_same("imported s1", &fp(&s.rootfs(&c).unwrap()), &fp1);
    assert_eq!(names(&s, &c), ["s1", "s2"]);
    // A tree made from an imported snapshot can be snapshotted and exported again.
    fs::write(s.rootfs(&c).unwrap().join("after-import"), b"y").unwrap();
    s.snapshot(&c, "s3").unwrap();
    let mut again = Vec::new();
    s.export(&c, "s3", Some("s2"), &mut again).unwrap();

    // Bad input: clear errors, nothing destroyed.
    let before = fp(&live);
    for bad in ["../x", ".tmp", "a b", "x@y", "a/b", ""] {
        assert!(
            matches!(s.snapshot(&a, bad), Err(Error::BadName { .. })),
            "{bad:?}"
        );
        assert!(matches!(s.rollback(&a, bad), Err(Error::BadName { .. })));
        assert!(matches!(
            s.delete_snapshot(&a, bad),
            Err(Error::BadName { .. })
        ));
    }
    assert!(matches!(
        s.snapshot(&a, "s1"),
        Err(Error::SnapshotExists { .. })
    ));
    assert!(matches!(
        s.rollback(&a, "nope"),
        Err(Error::SnapshotNotFound { .. })
    ));
    assert!(matches!(
        s.delete_snapshot(&a, "nope"),
        Err(Error::SnapshotNotFound { .. })
    ));
    assert!(matches!(
        s.clone_snapshot(&a, "nope", &sc.key("d")),
        Err(Error::SnapshotNotFound { .. })
    ));
    assert!(matches!(
        s.export(&a, "s2", Some("nope"), &mut Vec::new()),
        Err(Error::SnapshotNotFound { .. })
    ));
    assert!(matches!(
        s.rollback(&sc.key("ghost"), "s1"),
        Err(Error::SnapshotNotFound { .. })
    ));
    assert!(matches!(
        s.snapshot(&sc.key("ghost"), "s"),
        Err(Error::NoTree(_))
    ));
    assert!(matches!(s.rootfs(&sc.key("ghost")), Err(Error::NoTree(_))));
    assert!(s.list(&sc.key("ghost")).unwrap().is_empty());
    let e = s
        .import(&sc.key("d"), &mut &b"not a stream at all"[..])
        .unwrap_err();
    assert!(e.to_string().contains("ZFS send stream"), "{e}");
    let e = s
        .import(&sc.key("d"), &mut vec![0u8; 4096].as_slice())
        .unwrap_err();
    assert!(e.to_string().contains("not a ZFS send stream"), "{e}");
    let long = ContainerKey::new(&sc.ns, &"x".repeat(128)).unwrap();
    let e = s.snapshot(&long, &"n".repeat(128)).unwrap_err();
    assert!(e.to_string().contains("255"), "{e}");
    assert_same("after bad input", &fp(&live), &before);
    assert_eq!(names(&s, &a), ["s1", "s2"]);
    assert_eq!(
        datasets_under(&s.dataset(&sc.key("d")).unwrap()),
        Vec::<String>::new()
    );

    let used = s.space_used(&a).unwrap();
    assert!(used > 16 << 10, "space used {used}");
    assert!(matches!(
        s.space_used(&sc.key("ghost")),
        Err(Error::NoTree(_))
    ));
    s.delete_snapshot(&a, "s2").expect("delete s2");
    assert_eq!(names(&s, &a), ["s1"]);

    for k in [&b, &c, &a] {
        s.destroy(k).expect("destroy");
        assert!(matches!(s.rootfs(k), Err(Error::NoTree(_))));
        assert!(s.list(k).unwrap().is_empty());
    }
    s.destroy(&a).expect("destroying twice is fine");
    assert_eq!(datasets_under(&sc.ns_dataset()), [sc.ns_dataset()]);
    assert!(!live.exists() || listing(&live).is_empty());
}

/// A file rewritten (same size) in the second its snapshot was taken looks unchanged
/// to a whole-second timestamp comparison; the rollback must restore it anyway.
#[test]
fn rollback_restores_a_file_changed_in_the_snapshots_second() {
    let _l = shared();
    let s = store();
    let sc = Scene::new("second");
    let k = sc.key("a");
    let live = s.prepare(&k, &sc.image).unwrap();
    // Start right after a second ticks, so that both writes and the snapshot between
    // them share a second: same inode, size, ctime and mtime before and after.
    let mut tries = 0;
    loop {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap();
        std::thread::sleep(Duration::from_nanos(
            1_000_000_000 - u64::from(now.subsec_nanos()) + 1_000_000,
        ));
        let t = Instant::now();
        fs::write(live.join("etc/hostname"), b"AAAAAAAA\n").unwrap();
        let name = format!("early-{tries}");
        s.snapshot(&k, &name).unwrap();
        fs::write(live.join("etc/hostname"), b"BBBBBBBB\n").unwrap();
        let quick = t.elapsed() < Duration::from_millis(800);
        s.snapshot(&k, &format!("late-{tries}")).unwrap();
        s.rollback(&k, &name).unwrap();
        assert_eq!(
            fs::read_to_string(live.join("etc/hostname")).unwrap(),
            "AAAAAAAA\n",
            "a same-second change survived the rollback"
        );
        tries += 1;
        if quick || tries == 5 {
            assert!(
                quick,
                "could not write, snapshot and write within one second"
            );
            break;
        }
    }
    s.destroy(&k).unwrap();
}

#[test]
fn clones_keep_their_origin_snapshots_alive() {
    let _l = shared();
    let s = store();
    let sc = Scene::new("clones");
    let a = sc.key("a");
    let live = s.prepare(&a, &sc.image).unwrap();
    turn_one(&live);
    let fp1 = fp(&live);
    s.snapshot(&a, "s1").unwrap();
    turn_two(&live);
    let fp2 = fp(&live);
    s.snapshot(&a, "s2").unwrap();
    let b = sc.key("b");
    let cloned = s.clone_snapshot(&a, "s1", &b).unwrap();

    // Deleting the clone's origin frees the name and hides it; ZFS keeps the data
    // until the clone goes.
    s.delete_snapshot(&a, "s1")
        .expect("delete a snapshot a clone uses");
    assert_eq!(names(&s, &a), ["s2"]);
    s.snapshot(&a, "s1").expect("the name is free again");
    assert_eq!(names(&s, &a), ["s2", "s1"]);
    assert_same("clone after its origin was deleted", &fp(&cloned), &fp1);
    let hidden: Vec<String> = datasets_under(&s.dataset(&a).unwrap())
        .into_iter()
        .filter(|n| n.contains("@.deleted."))
        .collect();
    assert_eq!(hidden.len(), 1, "{hidden:?}");
    assert_eq!(
        zfs(&["get", "-H", "-o", "value", "defer_destroy", &hidden[0]]).trim(),
        "on"
    );
    s.destroy(&b).unwrap();
    assert!(
        !zfs_ok(&["list", &hidden[0]]),
        "ZFS destroyed the deferred snapshot"
    );

    // Destroying the origin container frees its key at once; what the clone uses
    // stays (under retired/) until the clone goes.
    let c = sc.key("c");
    let cloned = s.clone_snapshot(&a, "s2", &c).unwrap();
    s.destroy(&a)
        .expect("destroy a container whose snapshots clones use");
    assert!(matches!(s.rootfs(&a), Err(Error::NoTree(_))));
    assert!(s.list(&a).unwrap().is_empty());
    let origin = zfs(&[
        "get",
        "-H",
        "-o",
        "value",
        "origin",
        &s.dataset(&c).unwrap(),
    ]);
    let (retired, snap) = origin.trim().split_once('@').unwrap();
    assert!(retired.starts_with(&format!("{ROOT}/retired/")), "{origin}");
    assert_eq!(snap, "s2");
    assert_eq!(
        datasets_under(retired),
        [retired.to_string(), origin.trim().to_string()],
        "only what the clone uses is left"
    );
    let again = s.prepare(&a, &sc.image).expect("the key is free");
    assert_same(
        "new tree under the old key",
        &fp(&again),
        &fp(&sc.image_dir),
    );
    assert_same("clone after its origin was destroyed", &fp(&cloned), &fp2);
    s.destroy(&c).unwrap();
    assert!(
        datasets_under(retired).is_empty(),
        "the retired dataset went with its clone"
    );
    s.destroy(&a).unwrap();
    assert_eq!(datasets_under(&sc.ns_dataset()), [sc.ns_dataset()]);
}

#[test]
fn trees_follow_their_owner() {
    let _l = alone();
    let s = store();
    let sc = Scene::new("owner");
    let owner = temp_dir("owner");
    let image = ImageSource {
        owner: Some(owner.clone()),
        ..sc.image.clone()
    };
    let k = sc.key("a");
    let live = s.prepare(&k, &image).unwrap();
    fs::write(live.join("kept"), b"across tasks").unwrap();
    // Same owner (a new task of the same containerd container): the same tree.
    assert_eq!(s.prepare(&k, &image).unwrap(), live);
    assert_eq!(fs::read(live.join("kept")).unwrap(), b"across tasks");
    // Another owner while this one exists: refused. (Owners are containerd's
    // `<snapshots>/<n>/fs`: a collect looks at one snapshotter's.)
    let snapshots = temp_dir("other").join("snapshots");
    fs::create_dir_all(snapshots.join("2/fs")).unwrap();
    let other = ImageSource {
        owner: Some(snapshots.join("2/fs")),
        ..sc.image.clone()
    };
    assert!(matches!(
        s.prepare(&k, &other),
        Err(Error::AlreadyExists(_))
    ));
    // The owner is gone: the tree is replaced.
    fs::remove_dir_all(&owner).unwrap();
    let fresh = s.prepare(&k, &other).unwrap();
    assert!(!fresh.join("kept").exists());
    // And collected once its owner goes too.
    fs::remove_dir_all(other.owner.as_ref().unwrap()).unwrap();
    let elsewhere = s.collect(Path::new("/nonexistent/snapshots")).unwrap();
    assert!(
        !elsewhere.contains(&k),
        "another snapshotter's collect: {elsewhere:?}"
    );
    let gone = s.collect(&snapshots).unwrap();
    assert!(gone.contains(&k), "{gone:?}");
    assert!(matches!(s.rootfs(&k), Err(Error::NoTree(_))));
}

#[test]
fn opening_what_is_not_a_dataset_fails_clearly() {
    zfs_up();
    let e = ZfsStore::open("/var/lib/crab/zfs").unwrap_err().to_string();
    assert!(e.contains("not a ZFS dataset name"), "{e}");
    let e = ZfsStore::open("crab/no-such-dataset")
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not exist"), "{e}");
    let e = ZfsStore::open("crab/crab@snap").unwrap_err().to_string();
    assert!(e.contains("not a ZFS dataset name"), "{e}");
}

#[test]
fn reconcile_removes_dead_work_and_keeps_live_work() {
    let _l = alone();
    let s = store();
    let dead = {
        let mut c = Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    };
    let dead_ds = format!("{ROOT}/tmp/{dead}.0.image-dead");
    zfs(&["create", &dead_ds]);
    zfs(&["snapshot", &format!("{dead_ds}@base")]);
    let tmp_dir = PathBuf::from(
        zfs(&[
            "get",
            "-H",
            "-o",
            "value",
            "mountpoint",
            &format!("{ROOT}/tmp"),
        ])
        .trim(),
    );
    let dead_dir = tmp_dir.join(format!("{dead}.1.mnt"));
    fs::create_dir_all(&dead_dir).unwrap();
    let live_ds = format!("{ROOT}/tmp/{}.999999.keep", std::process::id());
    zfs(&["create", &live_ds]);

    let report = s.reconcile().unwrap();
    assert!(report.removed.contains(&dead_ds), "{report:?}");
    assert!(
        report
            .removed
            .iter()
            .any(|r| r.contains(&format!("{dead}.1.mnt"))),
        "{report:?}"
    );
    assert!(!zfs_ok(&["list", &dead_ds]) && !dead_dir.exists());
    assert!(
        zfs_ok(&["list", &live_ds]),
        "work of a live process was removed"
    );
    destroy_all(&live_ds);
    assert!(datasets_under(&live_ds).is_empty());
}

/// Runs a store operation in a child process (`src/bin/zfs-store-op.rs`, which cargo
/// builds for these tests) that dies (SIGKILL) at fault point `point`, the way a crash
/// would stop it.
fn die_at(point: &str, op: &str, args: &[&str]) {
    let child = env!("CARGO_BIN_EXE_zfs-store-op");
    let status = Command::new(child)
        .arg(ROOT)
        .arg(op)
        .args(args)
        .env("CRAB_FAULT", point)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "the child should have died at {point}: {status:?}"
    );
}

#[test]
fn reconcile_repairs_what_crashes_leave() {
    let _l = alone();
    let s = store();
    let sc = Scene::new("crash");
    let a = sc.key("a");
    let live = s.prepare(&a, &sc.image).unwrap();
    turn_one(&live);
    let fp1 = fp(&live);
    s.snapshot(&a, "s1").unwrap();
    turn_two(&live);
    s.snapshot(&a, "s2").unwrap();
    turn_three(&live);

    // A rollback to an older snapshot dies half-way through its mirror.
    die_at("zfs.rollback.mid", "rollback", &[&sc.ns, "a", "s1"]);
    assert_ne!(fp(&live), fp1);
    let report = s.reconcile().unwrap();
    assert!(
        report
            .completed
            .iter()
            .any(|c| c.contains("rollback") && c.contains(&sc.ns)),
        "{report:?}"
    );
    assert!(
        report.removed.iter().any(|r| r.ends_with(".view")),
        "{report:?}"
    );
    assert_same("after the repaired rollback", &fp(&live), &fp1);
    assert_eq!(names(&s, &a), ["s1", "s2"]);
    let mark = zfs(&[
        "get",
        "-H",
        "-s",
        "local",
        "-o",
        "value",
        "crab:rollback",
        &s.dataset(&a).unwrap(),
    ]);
    assert_eq!(mark.trim(), "", "the mark is gone");

    // An image copy dies before it is published.
    let other_image = temp_dir("crash-image");
    populate_image(&other_image);
    let other = ImageSource::from_layers(vec![other_image.clone()]).unwrap();
    die_at(
        "zfs.image.copied",
        "prepare",
        &[&sc.ns, "b", other_image.to_str().unwrap()],
    );
    assert!(!zfs_ok(&["list", &format!("{ROOT}/images/{}", other.key)]));
    let report = s.reconcile().unwrap();
    assert!(
        report
            .removed
            .iter()
            .any(|r| r.contains(&format!("image-{}", other.key))),
        "{report:?}"
    );
    assert!(
        report.removed.iter().any(|r| r.ends_with(".mnt")),
        "{report:?}"
    );
    let b = sc.key("b");
    assert_same(
        "prepared after the crash",
        &fp(&s.prepare(&b, &other).unwrap()),
        &fp(&other_image),
    );
    s.destroy(&b).unwrap();
    destroy_all(&format!("{ROOT}/images/{}", other.key));
    let _ = fs::remove_dir_all(&other_image);

    // An import dies after receiving, before the rename: the key stays empty.
    let stream = temp_dir("crash-stream").join("s1.zfs");
    s.export(&a, "s1", None, &mut fs::File::create(&stream).unwrap())
        .unwrap();
    die_at(
        "zfs.import.received",
        "import",
        &[&sc.ns, "c", stream.to_str().unwrap()],
    );
    let c = sc.key("c");
    assert!(s.list(&c).unwrap().is_empty());
    let report = s.reconcile().unwrap();
    assert!(
        report.removed.iter().any(|r| r.ends_with(".receive")),
        "{report:?}"
    );
    s.import(&c, &mut fs::File::open(&stream).unwrap())
        .expect("import after the crash");
    s.rollback(&c, "s1").unwrap();
    assert_same(
        "imported after the crash",
        &fp(&s.rootfs(&c).unwrap()),
        &fp1,
    );
    let _ = fs::remove_dir_all(stream.parent().unwrap());

    // A deletion of a snapshot a clone uses dies between its rename and its deferred
    // destroy: reconcile asks for the destroy; ZFS does it with the clone.
    let d = sc.key("d");
    s.clone_snapshot(&a, "s2", &d).unwrap();
    die_at("zfs.delete.renamed", "delete", &[&sc.ns, "a", "s2"]);
    assert_eq!(names(&s, &a), ["s1"]);
    let report = s.reconcile().unwrap();
    assert!(
        report.completed.iter().any(|r| r.contains("@.deleted.")),
        "{report:?}"
    );
    s.destroy(&d).unwrap();
    assert!(!datasets_under(&s.dataset(&a).unwrap())
        .iter()
        .any(|n| n.contains(".deleted.")));

    // A destroy of a container a clone depends on dies after moving it to retired/.
    let e = sc.key("e");
    s.clone_snapshot(&a, "s1", &e).unwrap();
    die_at("zfs.destroy.retired", "destroy", &[&sc.ns, "a"]);
    assert!(matches!(s.rootfs(&a), Err(Error::NoTree(_))));
    s.destroy(&e).unwrap();
    s.reconcile().unwrap();
    let retired = datasets_under(&format!("{ROOT}/retired"));
    assert_eq!(
        retired,
        [format!("{ROOT}/retired")],
        "retired datasets left: {retired:?}"
    );
    for k in [&c, &a] {
        s.destroy(k).unwrap();
    }
    assert_eq!(datasets_under(&sc.ns_dataset()), [sc.ns_dataset()]);
}

/// A pool of its own, small enough to fill.
struct SmallPool {
    name: String,
    dir: PathBuf,
}

impl Drop for SmallPool {
    fn drop(&mut self) {
        // Unmount first, and retry: zfs-fuse says "busy" for a moment after an unmount.
        let start = Instant::now();
        while zfs_ok(&["list", &self.name]) && start.elapsed() < Duration::from_secs(10) {
            destroy_all(&format!("{}/crab", self.name));
            let _ = Command::new("zpool")
                .args(["destroy", "-f", &self.name])
                .stderr(Stdio::null())
                .status();
        }
        if zfs_ok(&["list", &self.name]) {
            eprintln!("could not destroy the test pool {}", self.name);
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

#[test]
fn a_full_pool_gives_pool_full_and_keeps_earlier_snapshots() {
    let _l = alone();
    zfs_up();
    let dir = temp_dir("small-pool");
    let pool = SmallPool {
        name: format!("crabfull{}", std::process::id()),
        dir: dir.clone(),
    };
    let out = Command::new("bash")
        .arg(script())
        .env("CRAB_ZFS_POOL", &pool.name)
        .env("CRAB_ZFS_FILE", dir.join("pool.img"))
        .env("CRAB_ZFS_SIZE", "128M")
        .env("CRAB_ZFS_MOUNT", dir.join("mnt"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let root = format!("{}/crab", pool.name);
    let s = ZfsStore::open(&root).unwrap();
    let image_dir = temp_dir("small-image");
    populate_image(&image_dir);
    let image = ImageSource::from_layers(vec![image_dir.clone()]).unwrap();
    let k = ContainerKey::new("full", "a").unwrap();
    let live = s.prepare(&k, &image).unwrap();
    turn_one(&live);
    let fp1 = fp(&live);
    s.snapshot(&k, "s1").unwrap();

    // Fill it with data that does not compress.
    let mut f = fs::File::create(live.join("filler")).unwrap();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let chunk: Vec<u8> = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let mut written = 0u64;
    let err = loop {
        let mut c = chunk.clone();
        c[..8].copy_from_slice(&written.to_le_bytes());
        match f.write_all(&c).and_then(|()| f.sync_data()) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 1024, "a 128 MB pool took a gigabyte");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    drop(f);

    let e = s.snapshot(&k, "s2").unwrap_err();
    assert!(
        matches!(e, Error::PoolFull { .. }),
        "snapshot on a full pool: {e}"
    );
    let e = s
        .clone_snapshot(&k, "s1", &ContainerKey::new("full", "b").unwrap())
        .unwrap_err();
    assert!(
        matches!(e, Error::PoolFull { .. }),
        "clone on a full pool: {e}"
    );
    let other_dir = temp_dir("small-image-2");
    populate_image(&other_dir);
    let e = s
        .prepare(
            &ContainerKey::new("full", "c").unwrap(),
            &ImageSource::from_layers(vec![other_dir.clone()]).unwrap(),
        )
        .unwrap_err();
    assert!(
        matches!(e, Error::PoolFull { .. }),
        "image copy on a full pool: {e}"
    );
    assert_eq!(names(&s, &k), ["s1"], "earlier snapshots are intact");
    assert_eq!(
        datasets_under(&format!("{root}/tmp")),
        [format!("{root}/tmp")],
        "no work left behind"
    );
    assert!(datasets_under(&format!("{root}/containers/full/b")).is_empty());
    assert!(datasets_under(&format!("{root}/containers/full/c")).is_empty());

    // The snapshot's content is intact. A rollback may need space itself (zfs-fuse
    // mirrors from a clone): then it is refused before it changes anything.
    match s.rollback(&k, "s1") {
        Ok(()) => {}
        Err(Error::PoolFull { .. }) => {
            assert!(
                live.join("filler").exists(),
                "a refused rollback changed the tree"
            );
            fs::remove_file(live.join("filler")).expect("free space on a full pool");
            // Freed space returns when ZFS writes its transaction group.
            let start = Instant::now();
            loop {
                match s.rollback(&k, "s1") {
                    Err(Error::PoolFull { .. }) if start.elapsed() < Duration::from_secs(60) => {
                        std::thread::sleep(Duration::from_millis(200))
                    }
                    other => break other.expect("rollback once there is space"),
                }
            }
        }
        Err(e) => panic!("rollback on a full pool: {e}"),
    }
    assert_same("after the pool was full", &fp(&live), &fp1);
    // Freed space returns when ZFS writes its transaction group.
    let start = Instant::now();
    loop {
        match s.snapshot(&k, "s2") {
            Err(Error::PoolFull { .. }) if start.elapsed() < Duration::from_secs(60) => {
                std::thread::sleep(Duration::from_millis(200))
            }
            other => break other.map(drop).expect("space again"),
        }
    }
    let _ = fs::remove_dir_all(image_dir);
    let _ = fs::remove_dir_all(other_dir);
}

/// Prints how long the operations take on this pool for a small tree.
#[test]
fn latencies() {
    let _l = shared();
    let s = store();
    let sc = Scene::new("latency");
    let k = sc.key("a");
    let live = s.prepare(&k, &sc.image).unwrap();
    let time = |what: &str, f: &mut dyn FnMut(usize)| {
        let mut v: Vec<Duration> = (0..5)
            .map(|i| {
                let t = Instant::now();
                f(i);
                t.elapsed()
            })
            .collect();
        v.sort();
        eprintln!(
            "zfs {what:<22} median {:>4} ms  (min {} max {})",
            v[2].as_millis(),
            v[0].as_millis(),
            v[4].as_millis()
        );
    };
    time("snapshot", &mut |i| {
        fs::write(live.join("turn"), format!("{i}")).unwrap();
        s.snapshot(&k, &format!("t{i}")).unwrap();
    });
    time("rollback (latest)", &mut |_| {
        fs::write(live.join("turn"), b"dirty").unwrap();
        s.rollback(&k, "t4").unwrap();
    });
    time("rollback (older)", &mut |i| {
        s.rollback(&k, &format!("t{}", i % 4)).unwrap();
    });
    time("clone", &mut |i| {
        s.clone_snapshot(&k, "t0", &sc.key(&format!("c{i}")))
            .unwrap();
    });
    time("destroy (clone)", &mut |i| {
        s.destroy(&sc.key(&format!("c{i}"))).unwrap();
    });
    let mut stream = Vec::new();
    time("export (full)", &mut |_| {
        stream.clear();
        s.export(&k, "t0", None, &mut stream).unwrap();
    });
    time("import (full)", &mut |i| {
        s.import(&sc.key(&format!("i{i}")), &mut stream.as_slice())
            .unwrap();
    });
    s.destroy(&k).unwrap();
}

/// Whether `dir` is a mount point (another device than its parent's).
fn is_mount_point(dir: &Path) -> bool {
    let dev = |p: &Path| fs::metadata(p).map(|m| m.dev()).ok();
    dev(dir) != dev(dir.parent().unwrap())
}

#[test]
fn a_compound_zfs_stream_with_a_host_mountpoint_is_refused() {
    let _lock = shared();
    let s = store();
    let sc = Scene::new("compound");
    let victim = temp_dir("victim");
    fs::write(victim.join("host-file"), b"host").unwrap();
    // The attacker's dataset, whose mountpoint property is the victim directory:
    // `zfs send -R` carries its properties, and `zfs receive` of it alone would
    // mount what it receives over that directory.
    let src = format!("{}/attacker", sc.ns_dataset());
    zfs(&["create", "-p", &src]);
    let planted =
        Path::new(zfs(&["get", "-H", "-o", "value", "mountpoint", &src]).trim()).join("planted");
    fs::write(&planted, b"from the stream").unwrap();
    zfs(&["snapshot", &format!("{src}@s1")]);
    zfs(&["unmount", &src]);
    zfs(&["set", &format!("mountpoint={}", victim.display()), &src]);
    let out = Command::new("zfs")
        .args(["send", "-R", &format!("{src}@s1")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stream = out.stdout;
    destroy_all(&src);
    assert!(!is_mount_point(&victim));

    let c = sc.key("c");
    let e = s.import(&c, &mut stream.as_slice()).unwrap_err();
    assert!(matches!(e, Error::ImportRefused(_)), "{e}");
    assert!(e.to_string().contains("compound ZFS stream"), "{e}");
    assert!(
        !is_mount_point(&victim),
        "mounted over {}",
        victim.display()
    );
    assert_eq!(listing(&victim), ["host-file"]);
    assert_eq!(fs::read(victim.join("host-file")).unwrap(), b"host");
    assert!(datasets_under(&s.dataset(&c).unwrap()).is_empty());
    let mine = format!("{}.", std::process::id());
    let left: Vec<String> = datasets_under(&format!("{ROOT}/tmp"))
        .into_iter()
        .filter(|d| d.contains(&mine) && d.contains("receive"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = fs::remove_dir_all(victim);
}

/// Writes `mb` MiB of bytes no compression shrinks to `path`, synced chunk by chunk.
fn write_mb(path: &Path, mb: usize) -> std::io::Result<()> {
    let mut f = fs::File::create(path)?;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..mb {
        let chunk: Vec<u8> = (0..1 << 17)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect();
        f.write_all(&chunk)?;
        f.sync_all()?;
    }
    Ok(())
}

#[test]
fn a_tree_quota_counts_what_its_snapshots_pin_and_a_fork_gets_its_own() {
    let _l = shared();
    let s = store().with_tree_limit(Some(16 << 20));
    let sc = Scene::new("quota");
    let a = sc.key("a");
    let live = s.prepare(&a, &sc.image).unwrap();
    write_mb(&live.join("a"), 10).unwrap();
    s.snapshot(&a, "pins").unwrap();
    fs::remove_file(live.join("a")).unwrap();
    let usage = s.quota_usage(&a).unwrap().unwrap();
    assert_eq!(usage.limit, Some(16 << 20));
    assert!(usage.used >= 10 << 20, "{usage:?}");
    let e = write_mb(&live.join("b"), 10).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EDQUOT), "{e}");
    fs::remove_file(live.join("b")).unwrap();

    let b = sc.key("b");
    let forked = s.clone_snapshot(&a, "pins", &b).unwrap();
    let quota = zfs(&[
        "get",
        "-Hp",
        "-o",
        "value",
        "quota",
        &s.dataset(&b).unwrap(),
    ]);
    assert_eq!(quota.trim(), (16u64 << 20).to_string());
    write_mb(&forked.join("c"), 10).expect("the fork's own quota has room");
    s.destroy(&b).unwrap();
    s.destroy(&a).unwrap();
}

/// An image's copy (`images/<key>`) goes once the collecting snapshotter removed
/// its layer, but only when no clone uses it any more: a container's dataset
/// keeps it until the container is destroyed. Another snapshotter never takes it.
#[test]
fn an_image_copy_goes_once_its_layer_is_gone_and_no_clone_uses_it() {
    let _l = alone();
    let s = store();
    let snapshots = temp_dir("zfs-copies").join("snapshots");
    let layer = snapshots.join("1/fs");
    populate_image(&layer);
    let image = ImageSource::from_layers(vec![layer.clone()]).unwrap();
    let ns = unique("zfs-copies");
    let k = ContainerKey::new(&ns, "a").unwrap();
    let live = s.prepare(&k, &image).unwrap();
    fs::write(live.join("mine"), b"kept").unwrap();
    let copy = format!("{ROOT}/images/{}", image.key);
    assert!(zfs_ok(&["list", &format!("{copy}@base")]));

    let gone = s.collect_images(&snapshots).unwrap();
    assert!(!gone.contains(&image.key), "its layer is there: {gone:?}");
    fs::remove_dir_all(&layer).unwrap();
    // (A copy made before records were kept may go here: it cannot be checked.)
    let elsewhere = s.collect_images(&temp_dir("elsewhere")).unwrap();
    assert!(!elsewhere.contains(&image.key), "{elsewhere:?}");
    let gone = s.collect_images(&snapshots).unwrap();
    assert!(!gone.contains(&image.key), "a clone uses it: {gone:?}");
    assert!(zfs_ok(&["list", &copy]));
    assert_eq!(fs::read(live.join("mine")).unwrap(), b"kept");

    s.destroy(&k).unwrap();
    let gone = s.collect_images(&snapshots).unwrap();
    assert_eq!(gone, vec![image.key.clone()]);
    assert!(!zfs_ok(&["list", &copy]));
    let _ = zfs_ok(&["destroy", "-r", &format!("{ROOT}/containers/{ns}")]);
}
