//! Fast-forward is on by default, and code in the sandbox is hostile: whatever
//! process holds a connection to the sandbox's proxy and sends an LLM request
//! is taken for the agent, and its threads and state paths make no checkpoint
//! by themselves. These attacks try to use that to hide a change from the
//! checkpoints (docs/security.md): a process that holds the connection, then
//! changes a file through a shared mapping (no write syscall), and leaves the
//! connection to a new child. Each turn that changed something must be full;
//! the last, where only the holder ran (the mapping gone), is a skip (so the
//! agent was found and the test can tell).

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::time::Duration;

use crab_integration::{crabctl_ok, journal_dir, llm, wait_until, Guard};
use serde_json::Value;

/// The hostile "agent": the init, one keep-alive connection to the proxy,
/// four LLM requests; between them it stores into a file of the rootfs
/// through a shared mapping, then forks a child that keeps the connection.
const HOLDER: &str = r#"
import http.client, json, mmap, os, time
def main():
    open('/root/victim', 'wb').write(b'clean\n')
    conn = http.client.HTTPConnection('127.0.0.1', 8787, timeout=120)
    def ask(n):
        body = json.dumps({'model': 'm', 'messages': [{'role': 'user', 'content': str(n)}]})
        conn.request('POST', '/v1/chat/completions', body, {'Content-Type': 'application/json'})
        conn.getresponse().read()
    ask(1)
    f = open('/root/victim', 'r+b')
    m = mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    m[0:5] = b'EVIL!'
    ask(2)
    # Unmapped: a holder that keeps a shared writable mapping makes every turn
    # it runs in full (it could store again at any time).
    m.close()
    f.close()
    if os.fork() == 0:
        time.sleep(100000)
    ask(3)
    ask(4)
    open('/dev/shm/done', 'w').write('done')
# Rolled back, it wakes up waiting on a connection that is gone: it stays,
# so that the test can look inside.
try:
    main()
except Exception:
    pass
time.sleep(100000)
"#;

fn history(id: &str) -> Vec<Value> {
    serde_json::from_str(&crabctl_ok(&["ls", id, "--json"])).expect("crabctl ls --json")
}

#[test]
fn a_process_holding_the_proxy_connection_cannot_hide_a_file_or_a_child() {
    let g = llm::proxied_sandbox(Duration::ZERO, "", &["python3", "-c", HOLDER]);
    let done = format!("/proc/{}/root/dev/shm/done", g.pid());
    assert!(
        wait_until(Duration::from_secs(120), || std::path::Path::new(&done)
            .exists()),
        "the holder never finished its four requests: {:?}",
        history(&g.id)
    );
    let h = history(&g.id);
    let kinds: Vec<&str> = h
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or("?"))
        .collect();
    eprintln!("history kinds: {kinds:?}");
    assert_eq!(kinds.len(), 4, "one checkpoint per request: {h:#?}");
    // The first turn takes everything; the store through the mapping changed a
    // file: its turn takes the files (and the holder with them).
    assert_eq!(kinds[0], "full", "{h:#?}");
    assert_eq!(
        kinds[1], "full",
        "the shared-mapping store was hidden: {h:#?}"
    );
    // A child born holding the connection is no agent the journal replays.
    assert_eq!(
        kinds[2], "full",
        "the child holding the connection was hidden: {h:#?}"
    );
    // Only the holder ran: skipped, so it was taken for the agent.
    assert_eq!(kinds[3], "skip", "{h:#?}");
    // The file in the checkpoint of the second turn is the changed one: a
    // rollback to it from outside brings the store back.
    crabctl_ok(&["rollback", &g.id, h[1]["name"].as_str().unwrap()]);
    assert_eq!(g.exec_ok(&["cat", "/root/victim"]), "EVIL!\n");

    // The journal (on by default) holds the turns' answers, and goes with the
    // container's history when the container is removed: a create collects
    // the histories of containers whose snapshots containerd removed (its
    // garbage collection may come after the removal, so creates are repeated).
    let journal = journal_dir(&g.id);
    assert!(
        journal.join("1.exchange").is_file(),
        "{}",
        journal.display()
    );
    g.remove();
    let gone = wait_until(Duration::from_secs(120), || {
        drop(Guard::sh("true"));
        !journal.exists()
    });
    assert!(
        gone,
        "{} kept after the container was removed",
        journal.display()
    );
}
