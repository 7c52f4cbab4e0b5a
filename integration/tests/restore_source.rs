//! A task restored from a checkpoint of Crab's history through containerd's own
//! task API (`CreateTask` with Crab's restore option, as `crabctl restore` and
//! `fork` send it): what a missing checkpoint answers, and what the restore holds
//! between `Create` and `Start`.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::time::Duration;

use containerd_client::tonic::{Code, Status};
use crab_integration::client::{restore_from_history, Client};
use crab_integration::*;

const COUNTER: &str =
    "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done";

/// A counter checkpointed as `safe`, then its task killed and deleted (the
/// container stays): ready for a new task restored from its history. Answers the
/// count at the checkpoint.
fn checkpointed_then_gone(g: &Guard) -> u64 {
    assert!(wait_until(Duration::from_secs(10), || g
        .number("/tmp/count")
        >= 5));
    let at = g.number("/tmp/count");
    crabctl_ok(&["checkpoint", &g.id, "--name", "safe"]);
    g.end_task();
    at
}

/// Creates (not starts) a task of `g` restored from its checkpoint `name`.
fn create_from(client: &Client, g: &Guard, name: &str) -> Result<u32, Box<Status>> {
    let rootfs = client.mounts(&g.id).expect("the container's snapshot");
    let (options, _request) = restore_from_history(&namespace(), &g.id, &g.id, name);
    client.create_task(&g.id, rootfs, Some(options))
}

#[test]
fn a_restore_from_a_missing_checkpoint_answers_not_found_through_containerd() {
    let client = Client::connect();
    let g = Guard::sh(COUNTER);
    let at = checkpointed_then_gone(&g);
    let err = create_from(&client, &g, "missing")
        .expect_err("a task from a checkpoint that does not exist");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("missing"), "{}", err.message());
    // Nothing was lost: the real checkpoint still restores.
    create_from(&client, &g, "safe").expect("create a task from checkpoint safe");
    client.start_task(&g.id).expect("start it");
    let now = g.number("/tmp/count");
    assert!(
        now >= at && now < at + 40,
        "count {now}, {at} at the checkpoint"
    );
}

#[test]
fn a_restore_created_before_its_checkpoint_is_removed_still_starts() {
    let client = Client::connect();
    let g = Guard::sh(COUNTER);
    let at = checkpointed_then_gone(&g);
    create_from(&client, &g, "safe").expect("create a task from checkpoint safe");
    // Between Create and Start, the checkpoint goes (a retention would do the
    // same): its entry and its process image are deleted.
    crabctl_ok(&["rm", &g.id, "safe"]);
    let listed = crabctl_ok(&["ls", &g.id]);
    assert!(!listed.contains("safe"), "{listed}");
    client
        .start_task(&g.id)
        .expect("start: the restore pinned its images at Create");
    let now = g.number("/tmp/count");
    assert!(
        now >= at && now < at + 40,
        "count {now}, {at} at the checkpoint"
    );
    assert!(wait_until(Duration::from_secs(10), || g
        .number("/tmp/count")
        > now));
    // The pin goes once the processes are back.
    let pins = crab_integration::crash::store_dir()
        .join(".restores")
        .join(namespace());
    assert!(
        wait_until(Duration::from_secs(10), || std::fs::read_dir(&pins)
            .map(|d| d
                .flatten()
                .all(|e| !e.file_name().to_string_lossy().ends_with(&g.id)))
            .unwrap_or(true)),
        "a pin of {} is left in {}",
        g.id,
        pins.display()
    );
}

#[test]
fn a_restore_request_for_another_container_is_refused_through_containerd() {
    let client = Client::connect();
    let victim = Guard::sh(COUNTER);
    let at = checkpointed_then_gone(&victim);
    let attacker = Guard::sh(COUNTER);
    attacker.end_task();
    // A request naming the victim's checkpoint, written for the victim, sent with the
    // attacker's task: the shim reads whom it is for.
    let (options, _request) = restore_from_history(&namespace(), &victim.id, &victim.id, "safe");
    let rootfs = client
        .mounts(&attacker.id)
        .expect("the attacker's snapshot");
    let err = client
        .create_task(&attacker.id, rootfs, Some(options))
        .expect_err("a task from another container's request");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message()
            .contains(&format!("is for {}/{}", namespace(), victim.id)),
        "{}",
        err.message()
    );
    assert_eq!(attacker.status(), None, "no task was left for the attacker");
    // The victim's checkpoint is untouched.
    create_from(&client, &victim, "safe").expect("the victim's own restore");
    client.start_task(&victim.id).expect("start it");
    let now = victim.number("/tmp/count");
    assert!(
        now >= at && now < at + 40,
        "count {now}, {at} at the checkpoint"
    );
}
