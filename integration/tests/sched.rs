//! The host-wide checkpoint bound across shims: with `checkpoint.max_parallel
//! = 1`, checkpoints of several containers asked for at once run one after
//! another, each recorded in full.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_integration::{config_with, crabctl_ok, wait_until, Guard, CRAB, PYTHON};
use serde_json::Value;

/// A python process holding 64 MB of written memory: a dump of it takes long
/// enough for overlaps to show.
const HOLDER: &str = "import time\nb = bytearray(64 << 20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\nopen('/tmp/ready', 'w').write('1')\nwhile True:\n    time.sleep(1)\n";

#[test]
fn checkpoints_of_many_containers_take_turns_within_the_hosts_bound() {
    let config = config_with("[checkpoint]\nmax_parallel = 1");
    let path = config.to_string_lossy().into_owned();
    let guards: Vec<Guard> = (0..3)
        .map(|_| {
            Guard::run_detached(
                CRAB,
                PYTHON,
                &["--runtime-config-path", &path],
                &["python3", "-c", HOLDER],
            )
        })
        .collect();
    for g in &guards {
        assert!(wait_until(Duration::from_secs(60), || g
            .exec(&["cat", "/tmp/ready"])
            .status
            .success()));
    }
    let threads: Vec<_> = guards
        .iter()
        .map(|g| {
            let id = g.id.clone();
            std::thread::spawn(move || crabctl_ok(&["checkpoint", &id]))
        })
        .collect();
    for t in threads {
        t.join().expect("checkpoint thread");
    }
    // Each checkpoint's time in its slot: [created - total, created].
    let mut spans: Vec<(u64, u64)> = guards
        .iter()
        .map(|g| {
            let h: Vec<Value> =
                serde_json::from_str(&crabctl_ok(&["ls", &g.id, "--json"])).unwrap();
            assert_eq!(h.len(), 1, "{h:?}");
            let end = h[0]["created_ms"].as_u64().unwrap();
            let total = h[0]["timings"]["total_ms"].as_u64().unwrap();
            (end - total, end)
        })
        .collect();
    spans.sort();
    for w in spans.windows(2) {
        // 2 ms for the two clocks' rounding.
        assert!(
            w[1].0 + 2 >= w[0].1,
            "two checkpoints ran at once with one slot: {spans:?}"
        );
    }
}
