//! What containerd's own client tests (`integration/client` of containerd 1.7) expect
//! of a runtime, reproduced with the project's own tests: runc's shim passes them,
//! and so must Crab's. The suite itself is another project's code and is not run here.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::path::{Path, PathBuf};
use std::time::Duration;

use crab_integration::client::{CheckpointOptions, Client, CreateOptions};
use crab_integration::*;

/// Whether `pid` is gone (or a zombie nobody reaped yet: dead all the same).
fn dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

/// TestContainerKillInitPidHost: with the host's pid namespace (joined here through
/// the runtime's own `/proc/self/ns/pid`), killing the init does not take its
/// children with it in the kernel; the shim kills them before it reports the
/// init's exit.
#[test]
fn with_the_hosts_pid_namespace_the_inits_exit_ends_its_children_first() {
    for round in 0..5 {
        let c = Guard::run_detached(
            CRAB,
            BUSYBOX,
            &["--with-ns", "pid:/proc/self/ns/pid"],
            &[
                "sh",
                "-c",
                "sleep 1000 & echo $! > /tmp/child; sleep 1000 & echo $! >> /tmp/child; wait",
            ],
        );
        let init = c.pid();
        let file = format!("/proc/{init}/root/tmp/child");
        assert!(wait_until(Duration::from_secs(10), || {
            std::fs::read_to_string(&file).is_ok_and(|s| s.lines().count() == 2)
        }));
        let children: Vec<i32> = std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .map(|l| l.trim().parse().expect("a pid"))
            .collect();
        assert!(children.iter().all(|&p| !dead(p)), "round {round}");
        ctr_ok(&["task", "kill", "-s", "KILL", &c.id]);
        assert!(wait_until(Duration::from_secs(10), || {
            c.status().as_deref() == Some("STOPPED")
        }));
        // Reported stopped: its children must already be dead (not at delete).
        let alive: Vec<i32> = children.iter().copied().filter(|&p| !dead(p)).collect();
        assert!(
            alive.is_empty(),
            "round {round}: {alive:?} outlived the init"
        );
    }
}

/// TestCheckpointRestoreWithImagePath (nerdctl's `checkpoint create` and `start
/// --checkpoint`): the checkpoint goes to the client's directory, and a new task
/// of the same container restores from it, which stays the client's.
#[test]
fn a_checkpoint_to_a_clients_image_path_restores_a_new_task_from_it() {
    let client = Client::connect();
    let c = Guard::sh("i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done");
    assert!(wait_until(Duration::from_secs(10), || c
        .number("/tmp/count")
        >= 5));
    let dir = std::env::temp_dir().join(unique_id("images"));
    let options = CheckpointOptions {
        exit: false,
        image_path: dir.to_string_lossy().into_owned(),
    };
    client
        .checkpoint_task(&c.id, options.to_any(client.containerd_major()))
        .expect("checkpoint with an image path");
    let written: Vec<String> = std::fs::read_dir(&dir)
        .expect("the image path exists")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!written.is_empty(), "nothing written to {}", dir.display());
    let at_checkpoint = c.number("/tmp/count");
    assert!(wait_until(Duration::from_secs(10), || {
        c.number("/tmp/count") >= at_checkpoint + 20
    }));
    ctr_ok(&["task", "kill", "-s", "KILL", &c.id]);
    assert!(wait_until(Duration::from_secs(10), || {
        c.status().as_deref() == Some("STOPPED")
    }));
    ctr_ok(&["task", "rm", &c.id]);

    let options = CreateOptions {
        criu_image_path: dir.to_string_lossy().into_owned(),
        ..Default::default()
    };
    let rootfs = client.mounts(&c.id).expect("the container's snapshot");
    client
        .create_task(
            &c.id,
            rootfs,
            Some(options.to_any(client.containerd_major())),
        )
        .expect("create a task restored from the image path");
    client.start_task(&c.id).expect("start the restored task");
    let restored = c.number("/tmp/count");
    assert!(
        restored < at_checkpoint + 20,
        "{restored}: not the checkpoint's memory (about {at_checkpoint})"
    );
    assert!(wait_until(Duration::from_secs(10), || c
        .number("/tmp/count")
        > restored));
    let kept: Vec<String> = std::fs::read_dir(&dir)
        .expect("the image path is still there")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(kept.len(), written.len(), "{kept:?} vs {written:?}");
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The cgroup `path` made in every hierarchy of this hybrid host, as the Go client's
/// cgroup1.New makes it; removed when dropped.
struct HostCgroup(Vec<PathBuf>);

impl HostCgroup {
    fn new(path: &str) -> HostCgroup {
        let dirs: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| !p.is_symlink() && p.join("cgroup.procs").exists())
            .map(|h| h.join(path))
            .collect();
        for d in &dirs {
            std::fs::create_dir_all(d).unwrap();
        }
        // A new cpuset cgroup has no cpus or mems, and takes no task until given
        // its parent's (cgroup1.New copies them too).
        let cpuset = Path::new("/sys/fs/cgroup/cpuset");
        if let Some(leaf) = dirs.iter().find(|d| d.starts_with(cpuset)) {
            let mut chain: Vec<&Path> = leaf.ancestors().take_while(|a| *a != cpuset).collect();
            chain.reverse();
            for dir in chain {
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let parent = std::fs::read_to_string(dir.parent().unwrap().join(file)).unwrap();
                    std::fs::write(dir.join(file), parent.trim()).unwrap();
                }
            }
        }
        HostCgroup(dirs)
    }

    fn pids(&self, hierarchy: &str) -> Vec<i32> {
        let dir = self
            .0
            .iter()
            .find(|d| d.starts_with(Path::new("/sys/fs/cgroup").join(hierarchy)))
            .expect("hierarchy");
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect()
    }
}

impl Drop for HostCgroup {
    fn drop(&mut self) {
        for d in &self.0 {
            wait_until(Duration::from_secs(10), || {
                std::fs::remove_dir(d).is_ok() || !d.exists()
            });
        }
    }
}

/// TestShimInCgroup: `WithShimCgroup` puts the shim in the client's cgroup.
#[test]
fn a_shim_asked_to_run_in_a_cgroup_runs_there() {
    let client = Client::connect();
    let id = unique_id("shimcg");
    let cgroup = HostCgroup::new(&format!("crab-test/{id}"));
    ctr_ok(&[
        "container",
        "create",
        "--runtime",
        CRAB,
        BUSYBOX,
        &id,
        "sleep",
        "600",
    ]);
    let c = Guard::new(&id);
    let options = CreateOptions {
        shim_cgroup: format!("/crab-test/{id}"),
        ..Default::default()
    };
    let rootfs = client.mounts(&id).expect("the container's snapshot");
    client
        .create_task(&id, rootfs, Some(options.to_any(client.containerd_major())))
        .expect("create the task");
    client.start_task(&id).expect("start");
    let shims = shim_pids(&id);
    assert_eq!(shims.len(), 1, "{shims:?}");
    for hierarchy in ["devices", "memory", "unified"] {
        assert!(
            cgroup.pids(hierarchy).contains(&shims[0]),
            "shim {} not in {hierarchy}:/crab-test/{id}",
            shims[0]
        );
    }
    // The container's own processes are in its own cgroups, not the shim's.
    assert!(!cgroup.pids("memory").contains(&c.pid()));
    drop(c);
}

/// TestContainerNoImage-style: a container on a read-only view snapshot (the Go
/// client's `WithNewSnapshotView`) runs, and its id is free again once it is gone.
#[test]
fn a_container_on_a_read_only_view_runs_and_its_id_is_reused() {
    let client = Client::connect();
    let template = Guard::new(&unique_id("tmpl"));
    ctr_ok(&[
        "container",
        "create",
        "--runtime",
        CRAB,
        BUSYBOX,
        &template.id,
        "true",
    ]);
    let record = client.container(&template.id).expect("template record");
    let parent = client
        .snapshot_parent(&template.id)
        .expect("image snapshot");
    let id = unique_id("view");
    for round in 0..3 {
        let key = format!("{id}-view-{round}");
        let mounts = client.view(&key, &parent).expect("view");
        let container = containerd_client::services::v1::Container {
            id: id.clone(),
            snapshot_key: key.clone(),
            created_at: None,
            updated_at: None,
            ..record.clone()
        };
        client
            .create_container(container)
            .expect("create on the view");
        let g = Guard::new(&id);
        client
            .create_task(&id, mounts, None)
            .unwrap_or_else(|e| panic!("round {round}: create task: {e}"));
        client.start_task(&id).expect("start");
        assert!(
            wait_until(Duration::from_secs(10), || g.status().as_deref()
                == Some("STOPPED")),
            "round {round}: {:?}",
            g.status()
        );
        drop(g);
        // `ctr container rm` removed the view with the container; its tree went
        // with its task.
        let _ = client.remove_snapshot(&key);
        let tree = Path::new("/var/lib/crab/pool/containers")
            .join(namespace())
            .join(&id);
        assert!(
            wait_until(Duration::from_secs(10), || !tree.exists()),
            "round {round}: {} left behind",
            tree.display()
        );
    }
}
