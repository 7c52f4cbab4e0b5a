//! The OCI spec reaches the container, and bad input is refused clearly.
//!
//! Each test runs a real container through containerd and the crab runtime and looks at
//! what the process sees (mounts, environment, ids, rlimits) or at what the host holds
//! (the v1 cgroup files). Flags `ctr run` has are used as they are; for the rest (rlimits,
//! broken specs) the test writes a whole spec: `ctr run --config FILE ID` takes the spec
//! from FILE and no image, so `root.path` points at the busybox image mounted with
//! `ctr images mount`, and the command is the spec's `process.args`.
//!
//! Bad input is sent to a shim that also serves a running "bystander" container (the
//! sandbox annotation groups containers in one shim), which must keep working.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use crab_integration::*;
use serde_json::{json, Value};

/// The annotation by which containers share one shim.
const SANDBOX_ANNOTATION: &str = "io.kubernetes.cri.sandbox-id";
const MIB: u64 = 1024 * 1024;

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let dir = std::env::temp_dir().join(unique_id("crab-spec"));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The busybox image's root file system, mounted (read-only) until dropped.
struct ImageRoot {
    dir: TempDir,
}

impl ImageRoot {
    fn mount() -> ImageRoot {
        let dir = TempDir::new();
        let root = dir.0.join("rootfs");
        std::fs::create_dir(&root).expect("mkdir rootfs");
        ctr_ok(&["images", "mount", BUSYBOX, root.to_str().unwrap()]);
        ImageRoot { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.0.join("rootfs")
    }

    /// A spec from `ctr oci spec` for container `id` running `args` in this root.
    fn spec(&self, id: &str, args: &[&str]) -> Value {
        let mut spec: Value = serde_json::from_str(&ctr_ok(&["oci", "spec"])).expect("spec json");
        spec["root"] = json!({ "path": self.path(), "readonly": true });
        spec["process"]["args"] = json!(args);
        spec["process"]["env"] = json!(["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]);
        spec["linux"]["cgroupsPath"] = json!(format!("/{}/{id}", namespace()));
        spec
    }

    /// `ctr run --rm --config` of `spec` as container `id`.
    fn run(&self, id: &str, spec: &Value) -> Output {
        let file = self.dir.0.join(format!("{id}.json"));
        std::fs::write(&file, serde_json::to_vec_pretty(spec).unwrap()).expect("write spec");
        let file = file.to_str().unwrap();
        ctr_out(&["run", "--rm", "--runtime", CRAB, "--config", file, id])
    }
}

impl Drop for ImageRoot {
    fn drop(&mut self) {
        let _ = ctr_out(&["images", "unmount", "--rm", self.path().to_str().unwrap()]);
    }
}

/// `ctr run --rm` of `args` in `image` with the crab runtime and extra `flags`.
fn run_rm(image: &str, flags: &[&str], args: &[&str]) -> (String, Output) {
    let id = unique_id("s");
    let _guard = Guard::new(&id);
    let mut all = vec!["run", "--rm", "--runtime", CRAB];
    all.extend_from_slice(flags);
    all.extend_from_slice(&[image, &id]);
    all.extend_from_slice(args);
    (id.clone(), ctr_out(&all))
}

/// The value of a v1 cgroup file of container `id`.
fn cgroup_v1(controller: &str, id: &str, file: &str) -> String {
    let path = format!("/sys/fs/cgroup/{controller}/{}/{id}/{file}", namespace());
    let value = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    value.trim().to_string()
}

/// A busybox container running `sleep 1000` with `flags`.
fn sleeper(flags: &[&str]) -> Guard {
    Guard::run_detached(CRAB, BUSYBOX, flags, &["sleep", "1000"])
}

/// `ctr ARGS` (bounded to two minutes), successful or not.
fn ctr_out(args: &[&str]) -> Output {
    ctr_run(args, None, Duration::from_secs(120))
}

/// The bystander is still running and answers an exec.
fn assert_still_serving(g: &Guard, pid: i32) {
    assert_eq!(g.status().as_deref(), Some("RUNNING"), "{}", g.id);
    assert_eq!(g.pid(), pid, "{} has another init pid", g.id);
    assert_eq!(g.exec_ok(&["echo", "still-here"]).trim(), "still-here");
}

/// `ctr` failed, and its error names every one of `needles`.
fn assert_fails_naming(out: &Output, what: &str, needles: &[&str]) {
    let (o, e) = text(out);
    assert!(!out.status.success(), "{what} succeeded: {o}{e}");
    for n in needles {
        assert!(
            e.contains(n),
            "{what}: the error does not name {n:?}: {e:?} (exit {:?})",
            out.status.code()
        );
    }
}

#[test]
fn bind_mount_rw_writes_reach_the_host_and_ro_mount_refuses_writes() {
    let host = TempDir::new();
    let (rw, ro) = (host.0.join("rw"), host.0.join("ro"));
    std::fs::create_dir(&rw).unwrap();
    std::fs::create_dir(&ro).unwrap();
    std::fs::write(ro.join("seed.txt"), "seeded-on-host\n").unwrap();
    let rw_flag = format!("type=bind,src={},dst=/data,options=rbind:rw", rw.display());
    let ro_flag = format!("type=bind,src={},dst=/ro,options=rbind:ro", ro.display());
    let script = "echo written-inside > /data/out.txt; cat /ro/seed.txt; \
                  if echo x > /ro/new.txt; then echo RO-WAS-WRITABLE; fi";
    let (_, out) = run_rm(
        BUSYBOX,
        &["--mount", &rw_flag, "--mount", &ro_flag],
        &["sh", "-c", script],
    );
    let (o, e) = text(&out);
    assert!(out.status.success(), "run failed: {o}{e}");
    let written = std::fs::read_to_string(rw.join("out.txt")).expect("out.txt on the host");
    assert_eq!(written, "written-inside\n");
    assert_eq!(
        o, "seeded-on-host\n",
        "read-only mount unreadable or written"
    );
    assert!(e.contains("Read-only file system"), "no EROFS: {e}");
    assert!(
        !ro.join("new.txt").exists(),
        "written behind a read-only mount"
    );
}

#[test]
fn env_cwd_and_user_flags_set_the_process_environment_directory_and_ids() {
    let flags = ["--env=CRAB_GREETING=hi", "--cwd=/tmp", "--user=1000:1000"];
    let script = "echo $CRAB_GREETING; pwd; id -u; id -g";
    let (_, out) = run_rm(BUSYBOX, &flags, &["sh", "-c", script]);
    let (o, e) = text(&out);
    assert!(out.status.success(), "run failed: {o}{e}");
    assert_eq!(o, "hi\n/tmp\n1000\n1000\n");
}

#[test]
fn rlimit_nofile_from_the_spec_sets_soft_and_hard_limits() {
    let root = ImageRoot::mount();
    let id = unique_id("s");
    let _guard = Guard::new(&id);
    let mut spec = root.spec(&id, &["sh", "-c", "ulimit -n; ulimit -Hn"]);
    spec["process"]["rlimits"] = json!([{ "type": "RLIMIT_NOFILE", "soft": 321, "hard": 654 }]);
    let out = root.run(&id, &spec);
    let (o, e) = text(&out);
    assert!(out.status.success(), "run failed: {o}{e}");
    assert_eq!(o, "321\n654\n");
}

#[test]
fn memory_limit_flag_is_written_to_the_v1_memory_cgroup() {
    let limit = (64 * MIB).to_string();
    let g = sleeper(&["--memory-limit", &limit]);
    assert_eq!(cgroup_v1("memory", &g.id, "memory.limit_in_bytes"), limit);
}

#[test]
fn allocating_past_memory_limit_is_oom_killed_with_137_and_a_tasks_oom_event() {
    let events = Events::subscribe();
    let limit = (64 * MIB).to_string();
    let hog =
        "b = bytearray(200 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); print('survived')";
    let (id, out) = run_rm(PYTHON, &["--memory-limit", &limit], &["python3", "-c", hog]);
    let (o, e) = text(&out);
    assert_eq!(out.status.code(), Some(137), "not SIGKILLed: {o}{e}");
    assert!(!o.contains("survived"), "200 MiB fit under a 64 MiB limit");
    assert!(
        events.wait_for("/tasks/oom", &id, Duration::from_secs(10)),
        "no /tasks/oom event for {id}; its events: {:?}",
        events.topics_for(&id)
    );
}

#[test]
fn cpus_flag_sets_cfs_quota_to_half_the_period() {
    let g = sleeper(&["--cpus", "0.5"]);
    let quota: f64 = cgroup_v1("cpu", &g.id, "cpu.cfs_quota_us").parse().unwrap();
    let period: f64 = cgroup_v1("cpu", &g.id, "cpu.cfs_period_us")
        .parse()
        .unwrap();
    assert!(
        period > 0.0 && (quota / period - 0.5).abs() < 1e-9,
        "quota {quota} period {period}"
    );
}

/// Sends containerd's task `Update` (new resources, as OCI JSON) to the shim serving
/// `id`: the call containerd makes for `ctr task update`, which this ctr (containerd
/// 1.7) does not have. Returns the ttrpc status (code, message).
fn shim_update(id: &str, resources: &Value) -> (u64, String) {
    let (mut any, mut update) = (Vec::new(), Vec::new());
    pb_bytes(
        &mut any,
        1,
        b"types.containerd.io/opencontainers/runtime-spec/1/LinuxResources",
    );
    pb_bytes(&mut any, 2, resources.to_string().as_bytes());
    pb_bytes(&mut update, 1, id.as_bytes());
    pb_bytes(&mut update, 2, &any);
    shim_call(id, "Update", &update)
}

#[test]
fn task_update_changes_the_memory_limit_of_a_running_container() {
    let before = (64 * MIB).to_string();
    let g = sleeper(&["--memory-limit", &before]);
    assert_eq!(cgroup_v1("memory", &g.id, "memory.limit_in_bytes"), before);
    let (code, message) = shim_update(&g.id, &json!({ "memory": { "limit": 128 * MIB } }));
    assert_eq!(code, 0, "update failed: {message}");
    assert_eq!(
        cgroup_v1("memory", &g.id, "memory.limit_in_bytes"),
        (128 * MIB).to_string()
    );
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
}

#[test]
fn a_rollback_keeps_the_memory_limit_an_update_set_and_its_processes_in_the_containers_cgroups() {
    let before = (64 * MIB).to_string();
    let g = sleeper(&["--memory-limit", &before]);
    crabctl_ok(&["checkpoint", &g.id, "--name", "a"]);
    let (code, message) = shim_update(&g.id, &json!({ "memory": { "limit": 128 * MIB } }));
    assert_eq!(code, 0, "update failed: {message}");
    let old = g.pid();
    crabctl_ok(&["rollback", &g.id, "a"]);
    let pid = g.pid();
    assert_ne!(pid, old, "a new init");
    // The limits the container runs under, not its spec's again.
    assert_eq!(
        cgroup_v1("memory", &g.id, "memory.limit_in_bytes"),
        (128 * MIB).to_string()
    );
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for controller in ["memory", "cpu", "pids", "freezer", "devices"] {
        assert!(
            cgroups
                .lines()
                .any(|l| l.contains(controller) && l.ends_with(&format!("/{}", g.id))),
            "{controller}: {cgroups}"
        );
    }
    assert_eq!(g.status().as_deref(), Some("RUNNING"));
}

#[test]
fn spec_with_empty_args_is_rejected_naming_args_and_the_shim_keeps_serving() {
    let by = sleeper(&[]);
    let pid = by.pid();
    let root = ImageRoot::mount();
    let id = unique_id("s");
    let guard = Guard::new(&id);
    let mut spec = root.spec(&id, &[]);
    spec["annotations"] = json!({ SANDBOX_ANNOTATION: by.id });
    let out = root.run(&id, &spec);
    assert_fails_naming(&out, "a spec with empty process.args", &["args"]);
    assert_eq!(guard.status(), None, "a task was left for {id}");
    assert_still_serving(&by, pid);
}

#[test]
fn missing_rootfs_is_rejected_naming_the_path_and_the_shim_keeps_serving() {
    let by = sleeper(&[]);
    let pid = by.pid();
    let nowhere = std::env::temp_dir().join(unique_id("crab-no-rootfs"));
    let nowhere = nowhere.to_str().unwrap();
    let id = unique_id("s");
    let _guard = Guard::new(&id);
    let sandbox = format!("{SANDBOX_ANNOTATION}={}", by.id);
    let flags = ["--annotation", &sandbox, "--env", "PATH=/bin", "--rootfs"];
    let (_, out) = run_rm(nowhere, &flags, &["true"]);
    assert_fails_naming(&out, "--rootfs <missing>", &[nowhere, "does not exist"]);
    assert_still_serving(&by, pid);

    let root = ImageRoot::mount();
    let mut spec = root.spec(&id, &["true"]);
    spec["root"]["path"] = json!(nowhere);
    spec["annotations"] = json!({ SANDBOX_ANNOTATION: by.id });
    let out = root.run(&id, &spec);
    assert_fails_naming(&out, "a missing root.path", &[nowhere, "does not exist"]);
    assert_still_serving(&by, pid);
}

#[test]
fn kill_with_unknown_exec_id_and_duplicate_exec_id_fail_naming_the_id() {
    let by = sleeper(&[]);
    let pid = by.pid();
    let bogus = unique_id("nope");
    let out = ctr_out(&["task", "kill", "--exec-id", &bogus, &by.id]);
    assert_fails_naming(&out, "kill of an unknown exec id", &[&bogus, "not found"]);
    assert_still_serving(&by, pid);

    let dup = unique_id("dup");
    let exec = format!("task exec -d --exec-id {dup} {} sleep 1000", by.id);
    let exec: Vec<&str> = exec.split(' ').collect();
    ctr_ok(&exec);
    let out = ctr_out(&exec);
    assert_fails_naming(&out, "a reused exec id", &[&dup, "already exists"]);
    assert_still_serving(&by, pid);
}

#[test]
fn starting_a_running_task_again_fails_and_it_keeps_running() {
    let g = sleeper(&[]);
    let pid = g.pid();
    let out = ctr_out(&["task", "start", &g.id]);
    assert_fails_naming(&out, "a second start", &[&g.id, "already exists"]);
    assert_still_serving(&g, pid);
}

#[test]
fn a_spec_without_path_runs_an_absolute_command_with_the_default_path() {
    // As containerd makes a Kubernetes pod's sandbox (pause) container: no env.
    let root = ImageRoot::mount();
    let id = unique_id("s");
    let _guard = Guard::new(&id);
    let mut spec = root.spec(&id, &["/bin/sh", "-c", "echo $PATH"]);
    spec["process"]
        .as_object_mut()
        .expect("process")
        .remove("env");
    let out = root.run(&id, &spec);
    let (o, e) = text(&out);
    assert!(out.status.success(), "{o}{e}");
    assert_eq!(
        o.trim(),
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    );
}

#[test]
fn an_exec_asking_for_a_terminal_gets_one_whatever_its_process_spec_says() {
    // containerd's client sets the request's flag and may leave the spec's false
    // (its TestContainerExecLargeOutputWithTTY does): runc's shim takes the flag.
    let g = sleeper(&[]);
    let exec_id = unique_id("tty");
    let process = json!({
        "args": ["/bin/sh", "-c", "test -t 1 && echo tty > /tmp/tty-seen || echo none > /tmp/tty-seen"],
        "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
        "cwd": "/",
        "terminal": false,
        "user": {"uid": 0, "gid": 0},
    });
    let (mut any, mut exec) = (Vec::new(), Vec::new());
    pb_bytes(
        &mut any,
        1,
        b"types.containerd.io/opencontainers/runtime-spec/1/Process",
    );
    pb_bytes(&mut any, 2, process.to_string().as_bytes());
    pb_bytes(&mut exec, 1, g.id.as_bytes());
    pb_bytes(&mut exec, 2, exec_id.as_bytes());
    exec.extend_from_slice(&[3 << 3, 1]); // terminal: true
    pb_bytes(&mut exec, 7, &any);
    let (code, message) = shim_call(&g.id, "Exec", &exec);
    assert_eq!(code, 0, "Exec: {message}");
    let mut start = Vec::new();
    pb_bytes(&mut start, 1, g.id.as_bytes());
    pb_bytes(&mut start, 2, exec_id.as_bytes());
    let (code, message) = shim_call(&g.id, "Start", &start);
    assert_eq!(code, 0, "Start: {message}");
    let mut seen = String::new();
    assert!(
        wait_until(Duration::from_secs(10), || {
            seen = g
                .exec(&["cat", "/tmp/tty-seen"])
                .stdout
                .iter()
                .map(|&b| b as char)
                .collect();
            !seen.is_empty()
        }),
        "the exec never ran"
    );
    assert_eq!(seen.trim(), "tty");
}

/// `containerd.types.RuntimeInfo` as containerd's Go client decodes it (the fields
/// read here), written down again rather than taken from the shim's own crate.
#[derive(Clone, PartialEq, prost::Message)]
struct RuntimeInfo {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, optional, tag = "3")]
    options: Option<prost_types::Any>,
    #[prost(message, optional, tag = "4")]
    features: Option<prost_types::Any>,
}

/// containerd's introspection: `containerd-shim-crab-v2 -info`, the runtime's
/// options on stdin, answers a `containerd.types.RuntimeInfo` whose features are
/// runtime-spec's document, as containerd 2.x decodes it before a task with
/// idmapped mounts and for its CRI handlers.
#[test]
fn the_shim_answers_containerds_info_request_with_its_features() {
    use prost::Message;
    use std::io::Write;
    let options = prost_types::Any {
        type_url: "runtimeoptions.v1.Options".into(),
        value: vec![],
    };
    let mut child = std::process::Command::new("containerd-shim-crab-v2")
        .arg("-info")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("containerd-shim-crab-v2 on PATH");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&options.encode_to_vec())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let info = RuntimeInfo::decode(out.stdout.as_slice()).unwrap();
    assert_eq!(info.name, "io.containerd.crab.v2");
    assert_eq!(info.options.unwrap().type_url, "runtimeoptions.v1.Options");
    let features = info.features.expect("features");
    assert_eq!(
        features.type_url,
        "types.containerd.io/opencontainers/runtime-spec/1/features/Features"
    );
    let doc: Value = serde_json::from_slice(&features.value).unwrap();
    let namespaces = doc["linux"]["namespaces"].as_array().unwrap();
    assert!(namespaces.contains(&json!("user")), "{doc}");
    // Idmapped mounts are made (tests/idmapped_mounts.rs), so containerd 2.x's
    // CRI reports user namespaces for the handler.
    assert_eq!(doc["linux"]["mountExtensions"]["idmap"]["enabled"], true);
    let options = doc["mountOptions"].as_array().unwrap();
    for o in ["rro", "idmap", "ridmap"] {
        assert!(options.contains(&json!(o)), "{o}: {doc}");
    }
}
