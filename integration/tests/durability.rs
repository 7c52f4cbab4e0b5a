//! `io.crab.checkpoint.durability=shim`: a checkpoint is reported once its
//! process image is written and synced right after, in the background. It
//! survives a crash of the shim; after a crash of the host, one never synced is
//! dropped and the restore takes the newest one that was.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::path::Path;
use std::time::Duration;

use crab_integration::crash::history_dir;
use crab_integration::*;

/// A counter in the shell's memory, written out every 0.2 s.
const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; \
    mv /tmp/count.new /tmp/count; sleep 0.2; done";

fn sandbox() -> Guard {
    let flags = ["--annotation", "io.crab.checkpoint.durability=shim"];
    let g = Guard::run_detached(CRAB, BUSYBOX, &flags, &["sh", "-c", COUNTER]);
    assert!(wait_until(Duration::from_secs(10), || g
        .number("/tmp/count")
        >= 3));
    g
}

/// Writes `/f` = `name`, takes checkpoint `name`; answers its seq and the count
/// just before it.
fn checkpoint(g: &Guard, name: &str) -> (u64, u64) {
    g.exec_ok(&["sh", "-c", &format!("echo {name} > /f")]);
    let at = g.number("/tmp/count");
    crabctl_ok(&["checkpoint", &g.id, "--name", name]);
    let h = history(&g.id);
    let entry = h["entries"].as_array().and_then(|e| e.last()).cloned();
    let entry = entry.expect("an entry");
    assert_eq!(entry["name"], name);
    (entry["seq"].as_u64().expect("a seq"), at)
}

fn history(id: &str) -> serde_json::Value {
    let text = std::fs::read(history_dir(id).join("history.json")).expect("the history");
    serde_json::from_slice(&text).expect("json")
}

fn synced_marker(id: &str, seq: u64) -> std::path::PathBuf {
    history_dir(id).join(format!(".{seq}.synced"))
}

fn wait_for(path: &Path) {
    assert!(
        wait_until(Duration::from_secs(10), || path.exists()),
        "{} never appeared",
        path.display()
    );
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .expect("the boot id")
        .trim()
        .to_string()
}

#[test]
fn a_checkpoint_reported_before_its_sync_is_synced_right_after_and_survives_a_shim_crash() {
    let g = sandbox();
    let (seq, at) = checkpoint(&g, "a");
    // Recorded as not yet synced, in this boot.
    assert_eq!(
        history(&g.id)["unsynced"][seq.to_string()].as_str(),
        Some(boot_id().as_str())
    );
    wait_for(&synced_marker(&g.id, seq));
    // The next open of the history settles it.
    crabctl_ok(&["ls", &g.id]);
    assert!(history(&g.id).get("unsynced").is_none(), "still unsynced");
    assert!(!synced_marker(&g.id, seq).exists());

    g.exec_ok(&["sh", "-c", "echo lost > /f"]);
    kill_shim_and_init(&g);
    let out = crabctl_ok(&["restore", &g.id]);
    assert!(out.contains("restored from checkpoint a"), "{out}");
    assert_eq!(g.exec_ok(&["cat", "/f"]).trim(), "a");
    let now = g.number("/tmp/count");
    assert!(
        now >= at && now < at + 25,
        "count {now}, {at} at the checkpoint"
    );
}

#[test]
fn a_checkpoint_never_synced_before_the_host_went_down_is_dropped_and_the_restore_takes_the_one_before(
) {
    let g = sandbox();
    let (first, at) = checkpoint(&g, "first");
    wait_for(&synced_marker(&g.id, first));
    crabctl_ok(&["ls", &g.id]);
    let (second, _) = checkpoint(&g, "second");
    wait_for(&synced_marker(&g.id, second));
    kill_shim_and_init(&g);
    // What a host crash before the sync leaves: the entry recorded in an earlier
    // boot, no marker.
    std::fs::remove_file(synced_marker(&g.id, second)).expect("remove the marker");
    let path = history_dir(&g.id).join("history.json");
    let mut h = history(&g.id);
    h["unsynced"][second.to_string()] = serde_json::json!("an-earlier-boot");
    std::fs::write(&path, serde_json::to_vec(&h).unwrap()).expect("write the history");

    let out = crabctl_ok(&["restore", &g.id]);
    assert!(out.contains("restored from checkpoint first"), "{out}");
    assert_eq!(g.exec_ok(&["cat", "/f"]).trim(), "first");
    let now = g.number("/tmp/count");
    assert!(
        now >= at && now < at + 25,
        "count {now}, {at} at the checkpoint"
    );
    let listed = crabctl_ok(&["ls", &g.id]);
    assert!(!listed.contains("second"), "{listed}");
    // The next checkpoint collects the torn image.
    crabctl_ok(&["checkpoint", &g.id, "--name", "after"]);
    assert!(
        !history_dir(&g.id).join(second.to_string()).exists(),
        "the torn image is removed"
    );
}

#[test]
fn an_unknown_durability_fails_the_create_naming_the_annotation() {
    let id = unique_id("t");
    let _g = Guard::new(&id);
    let out = ctr()
        .args([
            "run",
            "-d",
            "--runtime",
            CRAB,
            "--annotation",
            "io.crab.checkpoint.durability=sometimes",
            BUSYBOX,
            &id,
            "true",
        ])
        .output()
        .expect("run ctr");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("io.crab.checkpoint.durability"), "{err}");
}
