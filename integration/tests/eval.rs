//! The evaluation harness against the real stack: a recorded trajectory whose
//! state lives in a process's memory, replayed through Crab's proxy, crashed
//! halfway (shim and processes killed), and recovered. Crab's restore ends in
//! the fault-free run's state; a recovery with the files alone does not; runc's
//! full checkpoints restore the crash turn's, not an older one. Each recovery
//! resumes at the turn its strategy promises (the harness fails it otherwise).

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::path::Path;
use std::sync::Arc;

use crab_eval::replay::Replay;
use crab_eval::report::correct;
use crab_eval::run::{run, Env};
use crab_eval::sandbox::Ctr;
use crab_eval::strategy::Strategy;
use crab_eval::trajectory::Trajectory;
use crab_integration::{address, config_with, namespace};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crashed_sandbox_recovered_by_crab_ends_as_the_fault_free_run_and_files_alone_do_not() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../eval/trajectories/repl-kv.json");
    let t = Arc::new(Trajectory::load(&path).unwrap());
    let replay = Replay::default();
    let replay_addr = replay.start().await.unwrap();
    let env = Env {
        ctr: Ctr {
            address: address(),
            namespace: namespace(),
        },
        replay,
        replay_addr,
        speedup: 50.0,
        // The sandboxes' proxy annotation names the replay server: the host allows it.
        crab_config: config_with(&format!(
            "[checkpoint]\nkeep_last = 1000\n[proxy]\nupstreams = [\"http://{replay_addr}\"]"
        )),
        progress: None,
    };
    let plain = run(&env, t.clone(), Strategy::Plain, None).await;
    let reference = plain.ending.clone().expect("the fault-free run ends");
    assert!(reference.verified, "the fault-free run fails its own check");

    // Crab's runtime without the turn proxy: the same end, and no checkpoint.
    let bare = run(&env, t.clone(), Strategy::CrabPlain, Some(3)).await;
    assert!(correct(&bare, &plain), "crab-plain: {:?}", bare.ending);
    assert_eq!(bare.recovery, None, "crab-plain was crashed");
    assert_eq!(
        bare.kinds,
        Default::default(),
        "crab-plain took checkpoints"
    );

    let k = t.turns.len() / 2;
    let crab = run(&env, t.clone(), Strategy::Crab, Some(k)).await;
    assert!(
        crab.recovery.is_some(),
        "no crash happened: {:?}",
        crab.ending
    );
    assert!(
        correct(&crab, &plain),
        "crab after a crash at turn {k}: {:?}",
        crab.ending
    );
    assert_eq!(crab.resumed_at, Some(k + 1), "crab lost a turn");

    // runc's full checkpoints: the newest (the crash turn's) restores.
    let runc = run(&env, t.clone(), Strategy::RuncFull, Some(k)).await;
    assert!(
        correct(&runc, &plain),
        "runc-full after a crash at turn {k}: {:?}",
        runc.ending
    );
    assert_eq!(
        runc.resumed_at,
        Some(k + 1),
        "runc-full restored an older checkpoint"
    );
    assert_eq!(runc.incomplete, 0, "a runc checkpoint had no process image");
    // Requests 0..=k+1 before the crash, k+1..=end after it: one checkpoint each.
    assert_eq!(runc.checkpoint_ms.len(), t.turns.len() + 2);

    let files_only = run(&env, t.clone(), Strategy::ChatFs, Some(k)).await;
    assert!(
        !correct(&files_only, &plain),
        "the key-value daemon's memory came back without its process: {:?}",
        files_only.ending
    );
}
