//! Containers grouped in one shim (as containerd groups a Kubernetes pod's): one
//! container's long checkpoint must not stall the task API of another, and a
//! second conflicting operation on the checkpointing container fails as busy.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crab_integration::*;

/// The annotation by which containers share one shim.
const SANDBOX_ANNOTATION: &str = "io.kubernetes.cri.sandbox-id";

/// A python process holding 500 MB it has written (so CRIU dumps all of it).
const BIG: &str = "b = b'\\1' * (500 << 20); open('/tmp/ready', 'w').write('1'); \
                   import time; time.sleep(100000)";

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A configuration whose CRIU takes `secs` longer to dump: a window in which the
/// dump is certainly still running.
fn slow_dump_config(secs: u32) -> String {
    let wrapper = std::env::temp_dir().join(format!("{}.sh", unique_id("criu")));
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nif [ \"$1\" = dump ]; then sleep {secs}; fi\nexec criu \"$@\"\n"),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = config_with(&format!("[checkpoint]\ncriu = \"{}\"", wrapper.display()));
    config.display().to_string()
}

#[test]
fn checkpoint_of_one_container_does_not_stall_another_in_the_same_shim() {
    let config = slow_dump_config(4);
    let big = Guard::run_detached(
        CRAB,
        PYTHON,
        &["--runtime-config-path", &config],
        &["python3", "-c", BIG],
    );
    assert!(
        wait_until(Duration::from_secs(60), || {
            big.exec(&["cat", "/tmp/ready"]).status.success()
        }),
        "the 500 MB process never got ready"
    );
    let group = format!("{SANDBOX_ANNOTATION}={}", big.id);
    let small = Guard::run_detached(
        CRAB,
        BUSYBOX,
        &["--annotation", &group],
        &["sleep", "100000"],
    );
    let shims = shim_pids(&big.id);
    assert_eq!(shims.len(), 1, "one shim serves both: {shims:?}");
    assert!(
        shim_pids(&small.id).is_empty(),
        "the second container got a shim of its own"
    );

    let mut checkpoint = Command::new("crabctl")
        .args(["-a", &address(), "-n", &namespace(), "checkpoint", &big.id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn crabctl checkpoint");

    // While the dump runs, a second checkpoint is refused at once.
    std::thread::sleep(Duration::from_millis(1000));
    let t = Instant::now();
    let second = crabctl(&["checkpoint", &big.id], &[]);
    let refused_ms = millis(t.elapsed());
    assert!(
        !second.status.success(),
        "a second checkpoint ran beside the first"
    );
    assert!(
        text(&second).1.contains("busy: checkpointing"),
        "{}",
        text(&second).1
    );
    let pause = ctr_run(&["task", "pause", &big.id], None, Duration::from_secs(30));
    assert!(
        !pause.status.success(),
        "pause during a checkpoint succeeded"
    );
    assert!(
        text(&pause).1.contains("busy: checkpointing"),
        "pause: {}",
        text(&pause).1
    );

    // The other container answers meanwhile.
    let t = Instant::now();
    let listed = ctr_ok(&["task", "ls"]);
    let ls_ms = millis(t.elapsed());
    assert!(listed.contains(&small.id), "{listed}");
    let t = Instant::now();
    ctr_ok(&["task", "kill", "-s", "KILL", &small.id]);
    let kill_ms = millis(t.elapsed());
    let t = Instant::now();
    let stopped = wait_until(Duration::from_secs(10), || {
        small.status().as_deref() == Some("STOPPED")
    });
    let exit_ms = millis(t.elapsed());
    assert!(stopped, "the killed container's exit was not reported");
    let still_dumping = checkpoint.try_wait().expect("poll crabctl").is_none();
    println!(
        "while a 500 MB dump ran in the same shim: ctr task ls {ls_ms:.0} ms, \
         ctr task kill {kill_ms:.0} ms, exit seen after {exit_ms:.0} ms more; \
         second checkpoint refused in {refused_ms:.0} ms (dump still running: {still_dumping})"
    );
    assert!(
        still_dumping,
        "the checkpoint ended before the other container was served: the test proved nothing"
    );

    let out = checkpoint.wait_with_output().expect("wait crabctl");
    assert!(out.status.success(), "checkpoint: {}", text(&out).1);
    let history = crabctl_ok(&["ls", &big.id]);
    assert_eq!(history.lines().skip(1).count(), 1, "{history}");
    // The claim ended with the checkpoint.
    ctr_ok(&["task", "pause", &big.id]);
    ctr_ok(&["task", "resume", &big.id]);
}
