//! Byte quotas (issue 17 items 5 and 6): a sandbox that fills its share of the pool
//! fails alone while another keeps taking turns; what its checkpoints pin counts;
//! process images past a sandbox's or the host's quota are retained away or refused.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::time::{Duration, Instant};

use crab_integration::*;

/// A busybox sandbox of the crab runtime under the test configuration plus `extra`.
fn sandbox(extra: &str, flags: &[&str], script: &str) -> Guard {
    let config = config_with(extra).display().to_string();
    let mut all = vec!["--runtime-config-path", config.as_str()];
    all.extend_from_slice(flags);
    Guard::run_detached(CRAB, BUSYBOX, &all, &["sh", "-c", script])
}

/// Writes `mb` MiB to `path` in `g` with dd; answers whether it succeeded and its
/// error output.
fn dd(g: &Guard, path: &str, mb: u32) -> (bool, String) {
    let out = g.exec(&[
        "dd",
        "if=/dev/zero",
        &format!("of={path}"),
        "bs=1M",
        &format!("count={mb}"),
        "conv=fsync",
    ]);
    (out.status.success(), text(&out).1)
}

fn size_of(g: &Guard, path: &str) -> u64 {
    g.exec_ok(&["stat", "-c", "%s", path])
        .trim()
        .parse()
        .unwrap()
}

const MB: u64 = 1 << 20;
const POOL_QUOTA: &str = "[quota]\nsandbox_pool_bytes = \"64M\"";
const IDLE: &str = "sleep 1000000";

#[test]
fn a_sandbox_that_fills_its_pool_quota_fails_alone_while_another_keeps_taking_turns() {
    // The exit code and the error go to /dev/shm: once the tree is full, not even a
    // new empty file fits in it.
    let hog = sandbox(
        POOL_QUOTA,
        &[],
        "dd if=/dev/zero of=/big bs=1M count=400 2>/dev/shm/dd.err; echo $? > /dev/shm/dd.rc; sleep 1000000",
    );
    let worker = sandbox(POOL_QUOTA, &[], IDLE);
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut turns = 0;
    let mut after_hog = 0;
    while after_hog < 3 {
        assert!(Instant::now() < deadline, "the hog's dd never ended");
        if hog.exec(&["test", "-e", "/dev/shm/dd.rc"]).status.success() {
            after_hog += 1;
        }
        turns += 1;
        worker.exec_ok(&["sh", "-c", &format!("echo {turns} > /turn")]);
        crabctl_ok(&["checkpoint", &worker.id, "--name", &format!("t{turns}")]);
    }
    let rc = hog.exec_ok(&["cat", "/dev/shm/dd.rc"]);
    assert_ne!(rc.trim(), "0", "dd past the quota succeeded");
    let err = hog.exec_ok(&["cat", "/dev/shm/dd.err"]);
    assert!(err.contains("Disk quota exceeded"), "{err}");
    let big = size_of(&hog, "/big");
    assert!(
        (32 * MB..=64 * MB).contains(&big),
        "the hog wrote {big} bytes"
    );
    // A full sandbox can still be checkpointed (a snapshot owns no data).
    crabctl_ok(&["checkpoint", &hog.id, "--name", "full"]);
    // The worker still writes and rolls back.
    assert!(dd(&worker, "/data", 32).0, "the worker could not write");
    crabctl_ok(&["rollback", &worker.id, "t2"]);
    assert_eq!(worker.exec_ok(&["cat", "/turn"]).trim(), "2");
    // The hog gets its space back by deleting, once no checkpoint pins it.
    crabctl_ok(&["rm", &hog.id, "full"]);
    hog.exec_ok(&["rm", "/big"]);
    // btrfs frees a deleted snapshot's extents in the background.
    assert!(
        wait_until(Duration::from_secs(60), || dd(&hog, "/again", 32).0),
        "the hog could not write after deleting"
    );
}

#[test]
fn what_a_checkpoint_pins_counts_against_the_pool_quota_until_it_is_removed() {
    let g = sandbox(POOL_QUOTA, &[], IDLE);
    assert!(dd(&g, "/a", 40).0);
    crabctl_ok(&["checkpoint", &g.id, "--name", "pins-a"]);
    g.exec_ok(&["rm", "/a"]);
    let usage = crabctl_ok(&["fs", "quota", &g.id]);
    let (used, limit) = usage.trim().split_once(" of ").expect("USED of LIMIT");
    assert_eq!(limit, (64 * MB).to_string());
    assert!(used.parse::<u64>().unwrap() >= 40 * MB, "{usage}");
    let (ok, err) = dd(&g, "/b", 40);
    assert!(!ok && err.contains("Disk quota exceeded"), "{ok} {err}");
    g.exec_ok(&["rm", "-f", "/b"]);
    crabctl_ok(&["rm", &g.id, "pins-a"]);
    // btrfs frees a deleted snapshot's extents in the background.
    assert!(
        wait_until(Duration::from_secs(60), || dd(&g, "/b", 40).0),
        "the space the removed checkpoint pinned never came back"
    );
}

#[test]
fn an_overlay_sandbox_past_its_measured_quota_gets_no_more_snapshots() {
    let overlay = ["--annotation", "io.crab.storage.backend=overlay"];
    let quota = "[quota]\nsandbox_pool_bytes = \"32M\"";
    let g = sandbox(quota, &overlay, IDLE);
    let other = sandbox(quota, &overlay, IDLE);
    assert!(dd(&g, "/a", 10).0);
    crabctl_ok(&["checkpoint", &g.id, "--name", "fits"]);
    assert!(dd(&g, "/b", 10).0);
    let out = crabctl(&["checkpoint", &g.id, "--name", "too-big"], &[]);
    let (o, e) = text(&out);
    assert_eq!(out.status.code(), Some(9), "{o}{e}");
    assert!(e.contains("quota.sandbox_pool_bytes"), "{e}");
    let listed = crabctl_ok(&["ls", &g.id]);
    assert!(
        listed.contains("fits") && !listed.contains("too-big"),
        "{listed}"
    );
    // The refused checkpoint left the sandbox running and its neighbour unaffected.
    g.exec_ok(&["true"]);
    other.exec_ok(&["sh", "-c", "echo 1 > /x"]);
    crabctl_ok(&["checkpoint", &other.id]);
}

/// A python sandbox holding `mb` MiB of written heap (so each process image is
/// larger than that).
fn heap_sandbox(extra: &str, mb: u32) -> Guard {
    let config = config_with(extra).display().to_string();
    let script = format!(
        "import time\nx = bytearray({mb} << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\n\
         open('/ready', 'w').close()\ntime.sleep(1e6)"
    );
    let g = Guard::run_detached(
        CRAB,
        PYTHON,
        &["--runtime-config-path", &config],
        &["python3", "-c", &script],
    );
    assert!(wait_until(Duration::from_secs(20), || g
        .exec(&["test", "-e", "/ready"])
        .status
        .success()));
    g
}

fn entries(id: &str) -> Vec<serde_json::Value> {
    serde_json::from_str(&crabctl_ok(&["ls", id, "--json"])).expect("crabctl ls --json")
}

#[test]
fn process_images_past_the_sandbox_quota_retire_the_oldest_and_one_that_cannot_fit_is_refused() {
    let g = heap_sandbox("[quota]\nsandbox_checkpoint_bytes = \"60M\"", 20);
    for name in ["one", "two", "three"] {
        crabctl_ok(&["checkpoint", &g.id, "--name", name]);
    }
    let kept = entries(&g.id);
    let names: Vec<&str> = kept.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["two", "three"], "{kept:?}");
    let bytes: u64 = kept
        .iter()
        .map(|e| e["process_bytes"].as_u64().unwrap())
        .sum();
    assert!(bytes > 40 * MB && bytes <= 60 * MB, "{bytes}");
    crabctl_ok(&["rollback", &g.id, "two"]);

    let small = heap_sandbox("[quota]\nsandbox_checkpoint_bytes = \"10M\"", 20);
    let out = crabctl(&["checkpoint", &small.id], &[]);
    let (o, e) = text(&out);
    assert_eq!(out.status.code(), Some(9), "{o}{e}");
    assert!(e.contains("quota.sandbox_checkpoint_bytes"), "{e}");
    assert!(entries(&small.id).is_empty());
    // Not left frozen.
    small.exec_ok(&["true"]);
    assert_eq!(small.status().as_deref(), Some("RUNNING"));
}

#[test]
fn the_host_quota_refuses_the_checkpoint_that_would_pass_it() {
    let store = std::env::temp_dir().join(unique_id("host-quota-store"));
    let extra = format!(
        "[checkpoint]\nstore = \"{}\"\n[quota]\nhost_checkpoint_bytes = \"40M\"",
        store.display()
    );
    let first = heap_sandbox(&extra, 20);
    let second = heap_sandbox(&extra, 20);
    crabctl_ok(&["checkpoint", &first.id, "--name", "first"]);
    let out = crabctl(&["checkpoint", &second.id], &[]);
    let (o, e) = text(&out);
    assert_eq!(out.status.code(), Some(9), "{o}{e}");
    assert!(e.contains("quota.host_checkpoint_bytes"), "{e}");
    // Once the first sandbox's images are gone, the second fits.
    crabctl_ok(&["rm", &first.id, "first"]);
    crabctl_ok(&["checkpoint", &second.id]);
    drop((first, second));
    let _ = std::fs::remove_dir_all(&store);
}
