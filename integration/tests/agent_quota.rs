//! The agents' quotas (issue 17 item 5): an agent inside its sandbox calls the agent
//! API's fork in a loop; the host's `[quota]` bounds the forks alive and per minute,
//! the forks get no agent API of their own, and checkpoints per minute are bounded.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::collections::BTreeMap;
use std::time::Duration;

use crab_integration::*;

/// Calls `POST {path}` with `body` in a loop for `secs` seconds from inside the
/// sandbox (with the token its environment carries), then writes the statuses seen
/// to `/result` and, with `stay`, idles (the sandbox's init: a checkpoint is refused
/// while an exec runs, so the agent is the init).
fn loop_script(path: &str, body: &str, secs: u32, stay: bool) -> String {
    format!(
        r#"
import json, os, time, urllib.request, urllib.error
codes = {{}}
end = time.time() + {secs}
while time.time() < end:
    time.sleep(0.05)
    req = urllib.request.Request("http://127.0.0.1:8787{path}", data=b'{body}', method="POST",
        headers={{"Authorization": "Bearer " + os.environ.get("CRAB_API_TOKEN", ""),
                  "Content-Type": "application/json"}})
    try:
        code = urllib.request.urlopen(req, timeout=120).status
    except urllib.error.HTTPError as e:
        code = e.code
    except Exception:
        # A fork restored mid-request finds its connection gone.
        code = "no-answer"
    codes[str(code)] = codes.get(str(code), 0) + 1
open("/result.tmp", "w").write(json.dumps(codes))
os.rename("/result.tmp", "/result")
print(json.dumps(codes))
while {stay}:
    time.sleep(3600)
"#,
        stay = if stay { "True" } else { "False" }
    )
}

/// The statuses the init's loop wrote, once it has.
fn result_of(g: &Guard, within: Duration) -> BTreeMap<String, u32> {
    let mut out = String::new();
    let done = wait_until(within, || {
        out = std::fs::read_to_string(format!("/proc/{}/root/result", g.pid())).unwrap_or_default();
        !out.is_empty()
    });
    assert!(done, "{}: the agent's loop wrote no result", g.id);
    statuses(&out)
}

fn statuses(out: &str) -> BTreeMap<String, u32> {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// A python sandbox whose proxy serves the agent API, under `quota`, its init
/// running `agent`.
fn sandbox(quota: &str, agent: &str) -> Guard {
    llm::proxied_sandbox(
        Duration::ZERO,
        &format!("[quota]\n{quota}"),
        &["python3", "-c", agent],
    )
}

/// The ids of the containers forked from `id` (and from its forks), as containerd
/// lists them.
fn forks_of(id: &str) -> Vec<String> {
    ctr_ok(&["containers", "ls", "-q"])
        .lines()
        .filter(|l| l.starts_with(&format!("{id}-fork")))
        .map(String::from)
        .collect()
}

/// Guards that remove them at the end.
fn guards(ids: &[String]) -> Vec<Guard> {
    ids.iter().map(|id| Guard::new(id)).collect()
}

#[test]
fn a_fork_loop_from_inside_a_sandbox_stays_within_the_quota() {
    let agent = loop_script("/.crab/v1/fork", r#"{"count": 1}"#, 20, true);
    let g = sandbox("agent_forks_alive = 3\nagent_forks_per_minute = 10", &agent);
    let codes = result_of(&g, Duration::from_secs(120));
    let forks = guards(&forks_of(&g.id));
    println!(
        "fork loop for 20 s: statuses {codes:?}; {} forks exist (quota 3)",
        forks.len()
    );
    assert_eq!(codes.get("200"), Some(&3), "{codes:?}");
    assert!(codes.get("429").is_some_and(|n| *n >= 1), "{codes:?}");
    assert_eq!(forks.len(), 3, "forks alive");
    // A fork's agent has no agent API (its token, inherited in memory, opens nothing).
    let f = &forks[0];
    let out = f.exec_ok(&[
        "python3",
        "-c",
        &loop_script("/.crab/v1/fork", r#"{"count": 1}"#, 1, false),
    ]);
    let codes = statuses(out.lines().last().unwrap_or_default());
    assert!(
        codes.keys().all(|c| c == "404"),
        "a fork's agent API answered {codes:?}"
    );
    assert_eq!(forks_of(&g.id).len(), 3);
    // Removing a fork frees its place in the lineage. (From an exec, the agent
    // forks from a checkpoint it has: none is taken while an exec runs.)
    f.remove();
    crabctl_ok(&["checkpoint", &g.id, "--name", "base"]);
    let out = g.exec_ok(&[
        "python3",
        "-c",
        &loop_script(
            "/.crab/v1/fork",
            r#"{"checkpoint": "base", "count": 1}"#,
            1,
            false,
        ),
    ]);
    let codes = statuses(out.lines().last().unwrap_or_default());
    assert_eq!(codes.get("200"), Some(&1), "{codes:?}");
    assert_eq!(forks_of(&g.id).len(), 3);
    let _all = guards(&forks_of(&g.id));
}

#[test]
fn agent_checkpoints_per_minute_are_bounded() {
    let agent = loop_script("/.crab/v1/checkpoints", "{}", 10, true);
    let g = sandbox("agent_checkpoints_per_minute = 4", &agent);
    let codes = result_of(&g, Duration::from_secs(60));
    println!("checkpoint loop for 10 s: statuses {codes:?} (quota 4 per minute)");
    assert_eq!(codes.get("201"), Some(&4), "{codes:?}");
    assert!(codes.get("429").is_some_and(|n| *n >= 1), "{codes:?}");
    let listed = crabctl_ok(&["ls", &g.id, "--json"]);
    let entries: Vec<serde_json::Value> = serde_json::from_str(&listed).unwrap();
    assert_eq!(entries.len(), 4, "{listed}");
}
