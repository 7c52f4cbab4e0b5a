//! Sandboxes with a user namespace (`ctr run --uidmap 0:100000:65536 --gidmap ...`,
//! what Kubernetes' `hostUsers: false` asks for): their processes and files are host
//! ids 100000 and up, execs join the namespace, and CRIU checkpoints, rolls back and
//! restores them, a non-root process inside included (docs/agents.md: why that
//! matters for agents such as Claude Code).

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use crab_integration::*;

const MAPS: &[&str] = &["--uidmap", "0:100000:65536", "--gidmap", "0:100000:65536"];

/// Counts in memory and writes the count to a file, five times a second.
const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done";

fn counter(extra: &[&str]) -> Guard {
    let flags: Vec<&str> = MAPS.iter().chain(extra).copied().collect();
    let g = Guard::run_detached(CRAB, BUSYBOX, &flags, &["sh", "-c", COUNTER]);
    assert!(
        wait_until(Duration::from_secs(10), || g.number("/tmp/count") >= 5),
        "counter did not count"
    );
    g
}

/// The real, effective, saved and file-system ids of `pid` as the host sees them.
fn host_ids(pid: i32, key: &str) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in {status}"));
    line.split_whitespace()
        .skip(1)
        .map(|n| n.parse().unwrap())
        .collect()
}

fn uid_map(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/uid_map"))
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn a_sandbox_with_a_user_namespace_runs_as_mapped_ids_and_its_execs_join_it() {
    let g = counter(&[]);
    let pid = g.pid();
    assert_eq!(host_ids(pid, "Uid:"), [100_000; 4]);
    assert_eq!(host_ids(pid, "Gid:"), [100_000; 4]);
    assert_eq!(uid_map(pid), "0 100000 65536");
    // The files it writes, and its image's, are the mapped ids' on the host.
    let written = std::fs::metadata(format!("/proc/{pid}/root/tmp/count")).unwrap();
    assert_eq!((written.uid(), written.gid()), (100_000, 100_000));
    let image = std::fs::metadata(format!("/proc/{pid}/root/bin")).unwrap();
    assert_eq!((image.uid(), image.gid()), (100_000, 100_000));
    // An exec is in the namespace: root inside, mapped outside (libcontainer's
    // exec alone left it in the host's, as host root).
    let out = g.exec_ok(&[
        "sh",
        "-c",
        "cat /proc/self/uid_map; id -u; ls -ln /tmp/count",
    ]);
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(&words[..4], ["0", "100000", "65536", "0"], "{out}");
    assert!(out.contains(" 0 "), "the file is root's inside: {out}");
    // An exec that stays: its host uid.
    g.exec_ok(&["sh", "-c", "sleep 30 > /dev/null 2>&1 &"]);
    let sleeper = find_in_cgroup_of(pid, "sleep").expect("the exec'd sleep runs");
    assert_eq!(host_ids(sleeper, "Uid:"), [100_000; 4]);
    assert_eq!(uid_map(sleeper), "0 100000 65536");
    // Kill and delete.
    g.remove();
    assert_eq!(g.status(), None);
}

/// A process named `comm` in the same pid namespace as `pid` (its container).
fn find_in_cgroup_of(pid: i32, comm: &str) -> Option<i32> {
    let ns = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|p| {
            std::fs::read_link(format!("/proc/{p}/ns/pid"))
                .ok()
                .as_ref()
                == Some(&ns)
                && std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim() == comm)
        })
}

fn rollback_and_restore(g: &Guard, host_uid: u32) {
    let before = g.number("/tmp/count");
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    g.exec_ok(&["sh", "-c", "echo later > /tmp/later.txt"]);
    let later = g.number("/tmp/count") + 10;
    assert!(wait_until(Duration::from_secs(10), || g
        .number("/tmp/count")
        >= later));

    let started = Instant::now();
    let out = crabctl_ok(&["rollback", &g.id, "base"]);
    let rollback = started.elapsed();
    assert!(out.contains("processes and files restored"), "{out}");
    let now = g.number("/tmp/count");
    assert!(
        (before..later).contains(&now),
        "count {now} after rollback (>= {before}, < {later})"
    );
    assert_eq!(
        g.exec(&["test", "-e", "/tmp/later.txt"]).status.code(),
        Some(1)
    );
    let pid = g.pid();
    assert_eq!(host_ids(pid, "Uid:")[0], host_uid);
    assert_eq!(uid_map(pid), "0 100000 65536");
    assert!(wait_until(Duration::from_secs(5), || g
        .number("/tmp/count")
        > now));

    // After a crash: shim and processes killed, the newest checkpoint restored.
    kill_shim_and_init(g);
    let started = Instant::now();
    let out = crabctl_ok(&["restore", &g.id]);
    let restore = started.elapsed();
    assert!(out.contains("restored from checkpoint"), "{out}");
    let pid = g.pid();
    assert_eq!(host_ids(pid, "Uid:")[0], host_uid);
    assert_eq!(uid_map(pid), "0 100000 65536");
    let now = g.number("/tmp/count");
    assert!(
        (before..later).contains(&now),
        "count {now} after restore (>= {before}, < {later})"
    );
    assert!(wait_until(Duration::from_secs(5), || g
        .number("/tmp/count")
        > now));
    eprintln!(
        "{}: rollback {} ms, restore after a crash {} ms",
        g.id,
        rollback.as_millis(),
        restore.as_millis()
    );
}

#[test]
fn a_namespaced_sandbox_rolls_back_and_restores_with_its_mapping() {
    let g = counter(&[]);
    rollback_and_restore(&g, 100_000);
}

#[test]
fn a_non_root_process_in_a_user_namespace_checkpoints_rolls_back_and_restores() {
    // uid 1000 inside, host uid 101000: CRIU's prlimit on it is allowed because the
    // host's root owns the namespace (without one, this host's root lacks
    // CAP_SYS_RESOURCE for another user's process).
    let g = counter(&["--user", "1000:1000"]);
    assert_eq!(host_ids(g.pid(), "Uid:"), [101_000; 4]);
    rollback_and_restore(&g, 101_000);
}

#[test]
fn a_mapping_of_host_root_into_the_sandbox_is_refused() {
    create_fails_naming(
        &["--uidmap", "0:0:65536", "--gidmap", "0:100000:65536"],
        "maps host uid 0 into the sandbox",
    );
}

/// `ctr run -d` of a busybox with `flags` fails, its error naming `needle`.
fn create_fails_naming(flags: &[&str], needle: &str) {
    let id = unique_id("uns-refused");
    let _g = Guard::new(&id);
    let mut args = vec!["run", "-d", "--runtime", CRAB];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[BUSYBOX, &id, "sleep", "30"]);
    let out = ctr_run(&args, None, Duration::from_secs(60));
    let (o, e) = text(&out);
    assert!(!out.status.success(), "{o}{e}");
    assert!(e.contains(needle), "{e}");
}

#[test]
fn an_archive_of_a_namespaced_sandbox_is_refused_on_import_unless_its_mappings_are_allowed() {
    let g = counter(&[]);
    let file = std::env::temp_dir().join(format!("{}.tar", unique_id("uns")));
    let path = file.display().to_string();
    crabctl_ok(&["export", &g.id, "-o", &path]);
    let id = unique_id("uns-imported");
    let _imported = Guard::new(&id);
    let out = crabctl(&["import", &path, "--id", &id], &[]);
    let _ = std::fs::remove_file(&file);
    let (o, e) = text(&out);
    assert_eq!(out.status.code(), Some(6), "import: {o}{e}");
    assert!(
        e.contains("user-mappings: uidMappings 0:100000:65536 (host ids chosen by the archive)"),
        "{e}"
    );
    let listed = ctr_ok(&["container", "ls", "-q"]);
    assert!(
        !listed.lines().any(|l| l.trim() == id),
        "a refused import created {id}"
    );
}

/// The remapped layers `ctr run --uidmap` made for a mapping of this test's own.
fn remapped_layers(suffix: &str) -> Vec<String> {
    ctr_ok(&["snapshots", "ls"])
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|k| k.ends_with(suffix))
        .map(str::to_string)
        .collect()
}

#[test]
fn an_archive_of_a_namespaced_sandbox_imports_into_its_mapping_when_allowed() {
    // A mapping no other test uses: the import must remap the layers itself, as on
    // a host that never ran the sandbox.
    const MAPS_400K: &[&str] = &["--uidmap", "0:400000:65536", "--gidmap", "0:400000:65536"];
    let g = Guard::run_detached(CRAB, BUSYBOX, MAPS_400K, &["sh", "-c", COUNTER]);
    assert!(wait_until(Duration::from_secs(10), || g
        .number("/tmp/count")
        >= 5));
    let file = std::env::temp_dir().join(format!("{}.tar", unique_id("unsi")));
    let path = file.display().to_string();
    crabctl_ok(&["export", &g.id, "-o", &path]);
    let exported = g.number("/tmp/count");
    drop(g);
    for key in remapped_layers("-400000-400000") {
        ctr_ok(&["snapshots", "rm", &key]);
    }
    assert_eq!(remapped_layers("-400000-400000"), Vec::<String>::new());

    let id = unique_id("unsi-imported");
    let imported = Guard::new(&id);
    let out = crabctl(
        &["import", &path, "--id", &id, "--allow", "user-mappings"],
        &[],
    );
    let _ = std::fs::remove_file(&file);
    let (o, e) = text(&out);
    assert!(out.status.success(), "import: {o}{e}");
    assert_eq!(
        remapped_layers("-400000-400000").len(),
        1,
        "the import's remapped layers"
    );
    // Held by a lease from containerd's garbage collector while they were made
    // (a collection triggered by the removals above once took them mid-remap), and
    // by the container's snapshot after: the lease is gone.
    let leases = ctr_ok(&["leases", "ls"]);
    assert!(!leases.contains("crab-remap-"), "{leases}");
    let pid = imported.pid();
    assert_eq!(host_ids(pid, "Uid:"), [400_000; 4]);
    assert_eq!(uid_map(pid), "0 400000 65536");
    // The image's files owned by the mapped root, as the sandbox's were, and its own
    // files restored.
    for f in ["etc/passwd", "bin", "tmp/count"] {
        let md = std::fs::symlink_metadata(format!("/proc/{pid}/root/{f}")).unwrap();
        assert_eq!((md.uid(), md.gid()), (400_000, 400_000), "{f}");
    }
    let first = imported.number("/tmp/count");
    assert!(
        first >= exported,
        "the count restarted: {first} < {exported}"
    );
    assert!(wait_until(Duration::from_secs(5), || imported
        .number("/tmp/count")
        > first));
}

#[test]
fn forks_of_a_namespaced_sandbox_run_in_its_mapping_with_its_memory() {
    let g = counter(&[]);
    // Several rounds: parallel forks' restores raced on the images' owner once.
    for round in 0..3 {
        let prefix = unique_id("unsf");
        let out = crabctl_ok(&["fork", &g.id, "--count", "2", "--prefix", &prefix]);
        assert!(out.contains("2 forks of"), "round {round}: {out}");
        let at = g.number("/tmp/count");
        for n in 1..=2 {
            let fork = Guard::new(&format!("{prefix}-{n}"));
            let pid = fork.pid();
            // The source's range: a fork shares its images and its tree's owners.
            assert_eq!(host_ids(pid, "Uid:"), [100_000; 4]);
            assert_eq!(uid_map(pid), "0 100000 65536");
            let first = fork.number("/tmp/count");
            assert!(
                first <= at + 5,
                "fork {n} counts from {first}, source at {at}"
            );
            assert!(wait_until(Duration::from_secs(5), || fork
                .number("/tmp/count")
                > first));
            fork.remove();
        }
    }
}

/// Claude Code's script for the test below: a Bash write, a Write, the answer.
fn claude_script() -> Vec<crab_integration::anthropic::Step> {
    use crab_integration::anthropic::Step;
    vec![
        Step::Tool(
            "Bash",
            serde_json::json!({"command": "printf 'hello from crab\\n' > /home/crab/hello.txt && id -u",
                "description": "Write hello.txt"}),
        ),
        Step::Tool(
            "Write",
            serde_json::json!({"file_path": "/home/crab/notes.md", "content": CLAUDE_NOTES}),
        ),
        Step::Text("Done."),
    ]
}

const CLAUDE_NOTES: &str = "# Notes\n\nWritten as uid 1000.\n";

/// The host owner of a file in the sandbox of init `pid`.
fn host_owner(pid: i32, path: &str) -> (u32, u32) {
    let m = std::fs::metadata(format!("/proc/{pid}/root{path}"))
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    (m.uid(), m.gid())
}

#[test]
fn claude_code_as_a_non_root_user_in_a_user_namespace_works_and_rolls_back() {
    use crab_integration::anthropic::Scripted;
    use crab_integration::claude::{self, User};
    let llm = Scripted::start(claude_script());
    let extra: Vec<&str> = MAPS
        .iter()
        .chain(claude::STATE_PATHS_AS_CRAB)
        .copied()
        .collect();
    let g = claude::run_as(
        User::Crab,
        &llm,
        "Write hello.txt and notes.md.",
        &extra,
        "",
    );
    let pid = g.pid();
    assert_eq!(uid_map(pid), "0 100000 65536");
    let (code, out, err) = claude::finished(&g, &llm, Duration::from_secs(240));
    assert_eq!(
        code,
        "0",
        "requests: {:#?}\nstdout: {out}\nstderr: {err}",
        claude::requests(&llm)
    );
    // Its tools ran as uid 1000 inside: 101000 on the host.
    assert_eq!(host_owner(pid, "/home/crab/hello.txt"), (101_000, 101_000));
    assert_eq!(host_owner(pid, "/home/crab/notes.md"), (101_000, 101_000));
    assert_eq!(g.exec_ok(&["cat", "/home/crab/notes.md"]), CLAUDE_NOTES);
    let bash = llm
        .seen()
        .iter()
        .filter(|s| s.step == Some(1))
        .flat_map(|s| s.tool_results())
        .map(|(_, c)| c)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(bash.contains("1000"), "the Bash tool's `id -u`: {bash}");

    // One checkpoint per Messages request, each one of the whole tree (Claude
    // Code, uid 1000, included) or a skip.
    let messages = llm.seen().iter().filter(|s| s.is_message()).count();
    let history: Vec<serde_json::Value> =
        serde_json::from_str(&crabctl_ok(&["ls", &g.id, "--json"])).expect("crabctl ls --json");
    assert_eq!(history.len(), messages, "{history:#?}");
    // Back to the last request's checkpoint: Claude Code, restored waiting for
    // its answer, gets it from the journal and exits again; its files stay
    // the mapped user's.
    let last = history
        .iter()
        .rev()
        .find(|e| e["kind"] == "full")
        .and_then(|e| e["seq"].as_u64())
        .unwrap_or_else(|| panic!("no full checkpoint: {history:#?}"));
    // The exit code's file goes first: only the restored Claude Code's exit
    // (and its shell) can write it again.
    g.exec_ok(&["rm", "/dev/shm/claude.exit"]);
    let out = crabctl_ok(&["rollback", &g.id, &last.to_string()]);
    eprintln!("{out}");
    assert!(out.contains("processes and files restored"), "{out}");
    let (code, out, err) = claude::finished(&g, &llm, Duration::from_secs(120));
    assert_eq!(
        code, "0",
        "after the rollback\nstdout: {out}\nstderr: {err}"
    );
    let pid = g.pid();
    assert_eq!(uid_map(pid), "0 100000 65536");
    assert_eq!(host_ids(pid, "Uid:"), [100_000; 4]);
    assert_eq!(host_owner(pid, "/home/crab/notes.md"), (101_000, 101_000));
    assert_eq!(
        g.exec_ok(&["cat", "/home/crab/hello.txt"]),
        "hello from crab\n"
    );
}

#[test]
fn a_runtime_config_path_beside_a_uid_map_is_the_shims_configuration() {
    // `ctr run --uidmap` sends runc's task options, which hide the container's
    // runtime options from the shim's Create: the shim asks containerd for them.
    // The upstream below is allowed by this configuration alone, so the create
    // fails if the shim read another.
    let config = config_with("[proxy]\nupstreams = [\"http://127.0.0.1:4\"]\n");
    let mut flags: Vec<&str> = MAPS.to_vec();
    flags.extend([
        "--runtime-config-path",
        config.to_str().expect("utf-8 path"),
        "--annotation",
        "io.crab.proxy.upstream=http://127.0.0.1:4",
    ]);
    let g = Guard::run_detached(CRAB, BUSYBOX, &flags, &["sleep", "1000"]);
    assert_eq!(uid_map(g.pid()), "0 100000 65536");
    let env = std::fs::read(format!("/proc/{}/environ", g.pid())).expect("the init's environ");
    assert!(
        env.split(|&b| b == 0)
            .any(|v| v.starts_with(b"OPENAI_BASE_URL=")),
        "no proxy injected: {}",
        String::from_utf8_lossy(&env)
    );
}

fn ns_of(pid: i32, kind: &str) -> std::path::PathBuf {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap()
}

/// A pod in a user namespace (Kubernetes' `hostUsers: false`) as containerd's CRI
/// builds it: the sandbox makes the namespace, and each container joins it and the
/// sandbox's network by path, the pod's maps beside them.
#[test]
fn a_container_joining_a_pods_user_namespace_runs_in_it_rolls_back_its_files_and_refuses_process_checkpoints(
) {
    let pod = Guard::run_detached(CRAB, BUSYBOX, MAPS, &["sleep", "3600"]);
    let sandbox = pod.pid();
    let user = format!("user:/proc/{sandbox}/ns/user");
    let net = format!("network:/proc/{sandbox}/ns/net");
    let g = counter(&["--with-ns", &user, "--with-ns", &net]);
    let pid = g.pid();
    assert_eq!(ns_of(pid, "user"), ns_of(sandbox, "user"));
    assert_eq!(ns_of(pid, "net"), ns_of(sandbox, "net"));
    assert_eq!(host_ids(pid, "Uid:"), [100_000; 4]);
    let out = g.exec_ok(&["sh", "-c", "id -u; cat /proc/self/uid_map"]);
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words, ["0", "0", "100000", "65536"], "{out}");

    // Files: checkpointed and rolled back, the processes kept.
    g.exec_ok(&["sh", "-c", "echo before > /f"]);
    crabctl_ok(&["checkpoint", "--kind", "fs-only", &g.id, "--name", "files"]);
    g.exec_ok(&["sh", "-c", "echo after > /f"]);
    let out = crabctl_ok(&["rollback", &g.id, "files"]);
    assert!(out.contains("files restored, processes kept"), "{out}");
    assert_eq!(g.exec_ok(&["cat", "/f"]).trim(), "before");
    assert_eq!(ns_of(g.pid(), "user"), ns_of(sandbox, "user"));

    // Processes: refused before anything is frozen; the container counts on.
    let out = crabctl(&["checkpoint", &g.id], &[]);
    let (o, e) = text(&out);
    assert!(!out.status.success(), "{o}{e}");
    assert!(e.contains("joins the user namespace"), "{e}");
    let now = g.number("/tmp/count");
    assert!(wait_until(Duration::from_secs(5), || g
        .number("/tmp/count")
        > now));

    // Maps in the spec that are not the namespace's own are refused at create.
    create_fails_naming(
        &[
            "--uidmap",
            "0:200000:65536",
            "--gidmap",
            "0:200000:65536",
            "--with-ns",
            &user,
        ],
        "but the user namespace it joins maps",
    );
}
