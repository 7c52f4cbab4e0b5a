//! Replicas for forks (docs/standby.md, "Replicas for forks"): a container that
//! asks for them (`io.crab.standby.forks=N`) keeps N replicas of its newest
//! checkpoint, and `crabctl fork` of that checkpoint adopts them: the forks run in
//! the container's shim, each a container of its own (its files, its cgroups, its
//! network), exactly as a fork restored from the images.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_integration::*;

/// A web server on loopback (daemonized: a child of the shell) and a counter.
const SERVER_AND_COUNTER: &str = "mkdir -p /www && echo served > /www/index.html && \
    echo orig > /f && httpd -p 127.0.0.1:8080 -h /www && \
    i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done";

const GET: [&str; 3] = ["wget", "-qO-", "http://127.0.0.1:8080/index.html"];

const LIMIT: &str = "268435456";

fn count(g: &Guard) -> u64 {
    g.number("/tmp/count")
}

/// A server asking for `replicas` replicas for forks, with a memory limit and the
/// cgroup view Docker and Kubernetes give every container.
fn server(replicas: u32) -> Guard {
    let annotation = format!("io.crab.standby.forks={replicas}");
    let flags = [
        "--annotation",
        &annotation,
        "--memory-limit",
        LIMIT,
        "--mount",
        "type=cgroup,src=cgroup,dst=/sys/fs/cgroup,options=ro:nosuid:noexec:nodev",
    ];
    let g = Guard::run_detached(CRAB, BUSYBOX, &flags, &["sh", "-c", SERVER_AND_COUNTER]);
    assert!(wait_until(Duration::from_secs(10), || count(&g) >= 5));
    g
}

/// The init pids of the container's replicas for forks, as `crabctl stats` shows them.
fn replica_pids(id: &str) -> Vec<i32> {
    let out = crabctl_ok(&["stats", id, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v["fork_replicas"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| r["pid"].as_i64())
                .map(|p| p as i32)
                .collect()
        })
        .unwrap_or_default()
}

fn wait_for_replicas(id: &str, n: usize) -> Vec<i32> {
    let mut pids = Vec::new();
    assert!(
        wait_until(Duration::from_secs(30), || {
            pids = replica_pids(id);
            pids.len() == n
        }),
        "{id} has {} replicas for forks, not {n}: {}",
        pids.len(),
        crabctl_ok(&["stats", id])
    );
    pids
}

fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after = stat.rsplit(')').next().expect("stat fields");
    after
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("ppid")
}

#[test]
fn forks_adopt_the_replicas_of_their_checkpoint_and_run_as_containers_of_their_own() {
    let g = server(2);
    let shim = shim_pids(&g.id);
    assert_eq!(shim.len(), 1, "{shim:?}");
    // Read before the checkpoint: the counter ticks on after it.
    let at = count(&g);
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    g.exec_ok(&["sh", "-c", "echo later > /later"]);
    let replicas = wait_for_replicas(&g.id, 2);
    let prefix = unique_id("frep");
    let forks: Vec<Guard> = (1..=3)
        .map(|i| Guard::new(&format!("{prefix}-{i}")))
        .collect();
    let out = crabctl_ok(&["fork", &g.id, "base", "--count", "3", "--prefix", &prefix]);
    assert!(out.contains("3 forks"), "{out}");
    let pids: Vec<i32> = forks.iter().map(|f| f.pid()).collect();
    let adopted: Vec<&i32> = pids.iter().filter(|p| replicas.contains(p)).collect();
    assert_eq!(
        adopted.len(),
        2,
        "forks' inits {pids:?}, replicas {replicas:?}: {out}"
    );
    for (f, &pid) in forks.iter().zip(&pids) {
        assert_eq!(f.status().as_deref(), Some("RUNNING"), "{}", f.id);
        // The checkpoint's memory and files, not the source's since.
        let c = count(f);
        assert!(c >= at, "{}: count {c} below the checkpoint's {at}", f.id);
        assert_eq!(f.exec(&["test", "-e", "/later"]).status.code(), Some(1));
        assert_eq!(f.exec_ok(&GET).trim(), "served", "{}: server", f.id);
        assert!(
            wait_until(Duration::from_secs(5), || count(f) > c),
            "{} does not count",
            f.id
        );
        // Its own cgroups, as the view inside shows them. (The unified
        // hierarchy's line is its tracking cgroup, which keeps the replica's
        // name: cgroup2 renames nothing.)
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        for line in cgroups.lines().filter(|l| !l.starts_with("0::")) {
            assert!(!line.contains("@standby"), "{}: {cgroups}", f.id);
        }
        // The inspector watches the cgroup its processes are in.
        crabctl_ok(&["checkpoint", &f.id]);
        let turn = crabctl_ok(&["turn", &f.id, "--dry-run", "--json"]);
        assert!(!turn.contains("not watched"), "{}: {turn}", f.id);
        assert!(
            cgroups.contains(&format!("/{}\n", f.id)),
            "{}: {cgroups}",
            f.id
        );
        let (limit, procs) = f.cgroup_view();
        assert_eq!(limit, LIMIT, "{}", f.id);
        assert!(procs.lines().any(|p| p == "1"), "{}: view {procs:?}", f.id);
        if replicas.contains(&pid) {
            assert_eq!(
                parent_of(pid),
                shim[0],
                "{}: not in the source's shim",
                f.id
            );
        }
    }
    // Isolated from each other and from the source.
    forks[0].exec_ok(&["sh", "-c", "echo changed > /f"]);
    assert_eq!(forks[1].exec_ok(&["cat", "/f"]).trim(), "orig");
    assert_eq!(g.exec_ok(&["cat", "/f"]).trim(), "orig");
    // The replicas taken are made again.
    let again = wait_for_replicas(&g.id, 2);
    assert!(
        again.iter().all(|p| !pids.contains(p)),
        "{again:?} {pids:?}"
    );
    // A fork's own replicas, and its rollback, are in cgroups named after the
    // fork, not beside its source's.
    crabctl_ok(&["checkpoint", &forks[0].id, "--name", "fork-base"]);
    let out = crabctl_ok(&["rollback", &forks[0].id, "fork-base"]);
    assert!(out.contains("rolled back"), "{out}");
    let cgroups = std::fs::read_to_string(format!("/proc/{}/cgroup", forks[0].pid())).unwrap();
    for line in cgroups.lines().filter(|l| l.contains(":memory:")) {
        assert!(
            line.ends_with(&format!("/{}", forks[0].id)),
            "the fork's rolled back init is in {line}"
        );
    }
    let source_id = g.id.clone();
    // The source goes; its forks, in its shim, run on.
    drop(g);
    for f in &forks {
        let c = count(f);
        assert!(
            wait_until(Duration::from_secs(5), || count(f) > c),
            "{} stopped with its source",
            f.id
        );
    }
    drop(forks);
    assert!(
        wait_until(Duration::from_secs(10), || !alive(shim[0])),
        "the shim outlives every container it served"
    );
    // Nothing of the source's, its forks' or their replicas' cgroups is left.
    let dir = format!("/sys/fs/cgroup/memory/{}", namespace());
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&source_id) || n.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "cgroups left in {dir}: {left:?}");
}

#[test]
fn a_fork_of_an_older_checkpoint_restores_from_the_images() {
    let g = server(1);
    crabctl_ok(&["checkpoint", &g.id, "--name", "old"]);
    g.exec_ok(&["sh", "-c", "echo later > /later"]);
    crabctl_ok(&["checkpoint", &g.id, "--name", "new"]);
    let replicas = wait_for_replicas(&g.id, 1);
    let prefix = unique_id("fold");
    let f = Guard::new(&format!("{prefix}-1"));
    crabctl_ok(&["fork", &g.id, "old", "--prefix", &prefix]);
    assert_eq!(f.status().as_deref(), Some("RUNNING"));
    assert!(
        !replicas.contains(&f.pid()),
        "the newest checkpoint's replica"
    );
    assert_eq!(f.exec(&["test", "-e", "/later"]).status.code(), Some(1));
    assert_eq!(replica_pids(&g.id), replicas, "the replica was taken");
}

#[test]
fn a_fork_whose_replica_died_before_adoption_restores_the_checkpoint_from_the_images() {
    let g = server(1);
    let at = count(&g);
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    g.exec_ok(&["sh", "-c", "echo later > /later && echo changed > /f"]);
    let replicas = wait_for_replicas(&g.id, 1);
    // The fork's Create takes the replica and its tree; its Start finds the
    // init gone and restores from the images into that tree.
    let _ = std::process::Command::new("kill")
        .args(["-9", &replicas[0].to_string()])
        .status();
    let prefix = unique_id("fdead");
    let f = Guard::new(&format!("{prefix}-1"));
    crabctl_ok(&["fork", &g.id, "base", "--prefix", &prefix]);
    assert_eq!(f.status().as_deref(), Some("RUNNING"));
    assert_ne!(f.pid(), replicas[0]);
    let c = count(&f);
    assert!(c >= at, "count {c} below the checkpoint's {at}");
    assert_eq!(f.exec(&["test", "-e", "/later"]).status.code(), Some(1));
    assert_eq!(f.exec_ok(&["cat", "/f"]).trim(), "orig");
    assert_eq!(f.exec_ok(&GET).trim(), "served");
    assert!(wait_until(Duration::from_secs(5), || count(&f) > c));
    // Its files are its own.
    f.exec_ok(&["sh", "-c", "echo fork > /f"]);
    assert_eq!(g.exec_ok(&["cat", "/f"]).trim(), "changed");
    // A new replica is made in the place of the one taken.
    let again = wait_for_replicas(&g.id, 1);
    assert_ne!(again, replicas);
}

#[test]
fn a_count_of_replicas_that_is_no_count_or_too_many_is_refused_naming_the_annotation() {
    for value in ["lots", "65", "-1"] {
        let annotation = format!("io.crab.standby.forks={value}");
        let id = unique_id("fbad");
        let _g = Guard::new(&id);
        let args = [
            "run",
            "-d",
            "--runtime",
            CRAB,
            "--annotation",
            &annotation,
            BUSYBOX,
            &id,
            "sleep",
            "60",
        ];
        let out = ctr_run(&args, None, Duration::from_secs(60));
        let (o, e) = text(&out);
        assert!(!out.status.success(), "{value}: {o}");
        assert!(e.contains("io.crab.standby.forks"), "{value}: {e}");
    }
}

#[test]
fn a_request_forged_outside_the_root_only_directory_takes_no_replica_and_joins_no_shim() {
    use crab_runtime::checkpoint::source::{RestoreOptions, RestoreRequest, Source};
    let victim = server(1);
    crabctl_ok(&["checkpoint", &victim.id, "--name", "base"]);
    let replicas = wait_for_replicas(&victim.id, 1);
    let shim = shim_pids(&victim.id);
    let attacker = Guard::run_detached(
        CRAB,
        BUSYBOX,
        &["--annotation", "io.crab.standby.forks=1"],
        &["sleep", "600"],
    );
    attacker.end_task();
    // The request `crabctl fork` would write, written where any host user could.
    let request = RestoreRequest {
        namespace: namespace(),
        id: attacker.id.clone(),
        options: RestoreOptions {
            source: Source::History {
                namespace: namespace(),
                id: victim.id.clone(),
                checkpoint: "base".into(),
            },
            config_path: None,
            config_body: None,
        },
    };
    let forged = std::env::temp_dir().join(format!("{}.json", unique_id("forged")));
    std::fs::write(&forged, serde_json::to_vec(&request).unwrap()).unwrap();
    let client = crab_integration::client::Client::connect();
    let rootfs = client
        .mounts(&attacker.id)
        .expect("the attacker's snapshot");
    let options = crab_integration::client::options_naming(&forged);
    let created = client.create_task(&attacker.id, rootfs, Some(options));
    let _ = std::fs::remove_file(&forged);
    // Not a request (outside the root-only directory): read as a directory of
    // CRIU images, which a file is not.
    let err = created.expect_err("a task from a forged request");
    assert!(
        err.message().contains(&forged.display().to_string()),
        "{err:?}"
    );
    assert_eq!(attacker.status(), None, "no task was left for the attacker");
    assert_eq!(replica_pids(&victim.id), replicas, "the victim's replica");
    assert_eq!(shim_pids(&victim.id), shim);
    assert_eq!(victim.exec_ok(&["cat", "/f"]).trim(), "orig");
}

#[test]
fn a_crash_of_the_shim_serving_a_source_and_its_forks_leaves_no_replica_stopped() {
    let g = server(2);
    let at = count(&g);
    crabctl_ok(&["checkpoint", &g.id, "--name", "safe"]);
    let replicas = wait_for_replicas(&g.id, 2);
    let prefix = unique_id("fcrash");
    let f = Guard::new(&format!("{prefix}-1"));
    crabctl_ok(&["fork", &g.id, "safe", "--prefix", &prefix]);
    let adopted = f.pid();
    assert!(replicas.contains(&adopted), "{adopted} {replicas:?}");
    let left: Vec<i32> = replicas.iter().copied().filter(|&p| p != adopted).collect();
    // The crash: the shim and the containers' inits, SIGKILL. The replica not
    // adopted stays stopped, its maker gone.
    let shim = shim_pids(&g.id);
    for pid in shim.iter().copied().chain([g.pid(), adopted]) {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
    }
    for c in [&g, &f] {
        assert!(
            wait_until(Duration::from_secs(20), || c.status().as_deref()
                != Some("RUNNING")),
            "containerd did not notice the crash of {}",
            c.id
        );
    }
    let out = crabctl_ok(&["restore", &g.id]);
    assert!(out.contains("restored from checkpoint safe"), "{out}");
    let now = count(&g);
    assert!(
        now >= at && now < at + 25,
        "count {now}, {at} at the checkpoint"
    );
    // The restore's create removed the dead shim's replicas.
    assert!(
        wait_until(Duration::from_secs(10), || left.iter().all(|&p| !alive(p))),
        "a replica of the dead shim is left: {left:?}"
    );
    // The fork, never checkpointed, went with the shim (containerd deleted its
    // dead task); its container is removed as any.
    assert_ne!(f.status().as_deref(), Some("RUNNING"));
    ctr_ok(&["container", "rm", &f.id]);
}

#[test]
fn replicas_for_forks_are_dropped_once_the_host_runs_short_of_memory_and_forks_still_land() {
    // The floor sits 3 GiB under what is free now; a process on the host then
    // takes 6 GiB.
    let floor = available_mib().saturating_sub(3 * 1024);
    let config = config_with(&format!("[standby]\nmin_available_mib = {floor}\n"));
    let config = config.to_string_lossy().to_string();
    let flags = [
        "--annotation",
        "io.crab.standby.forks=2",
        "--runtime-config-path",
        &config,
    ];
    let g = Guard::run_detached(CRAB, BUSYBOX, &flags, &["sh", "-c", SERVER_AND_COUNTER]);
    assert!(wait_until(Duration::from_secs(10), || count(&g) >= 5));
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    let replicas = wait_for_replicas(&g.id, 2);
    let mut hog = std::process::Command::new("python3")
        .args([
            "-c",
            "import time\nb = b'\\x01' * (6 << 30)\nprint('held', flush=True)\ntime.sleep(120)",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start python3");
    let missing = || {
        let out = crabctl_ok(&["stats", &g.id, "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        v["fork_replicas_missing"].as_str().map(str::to_string)
    };
    let dropped = wait_until(Duration::from_secs(30), || {
        missing().is_some_and(|m| m.contains("dropped"))
    });
    let _ = hog.kill();
    let _ = hog.wait();
    assert!(
        dropped,
        "not dropped (floor {floor} MiB, now {} MiB free): {:?}",
        available_mib(),
        missing()
    );
    assert!(replica_pids(&g.id).is_empty());
    assert!(
        wait_until(Duration::from_secs(10), || replicas
            .iter()
            .all(|&p| !alive(p))),
        "a dropped replica's init is still there: {replicas:?}"
    );
    // A fork now restores from the images, and lands.
    let prefix = unique_id("fmem");
    let f = Guard::new(&format!("{prefix}-1"));
    crabctl_ok(&["fork", &g.id, "base", "--prefix", &prefix]);
    assert_eq!(f.status().as_deref(), Some("RUNNING"));
    assert_eq!(f.exec_ok(&GET).trim(), "served");
    let _ = std::fs::remove_file(&config);
}

/// Whether process `pid` exists and is not a zombie.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}
