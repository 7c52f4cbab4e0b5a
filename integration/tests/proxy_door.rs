//! The host-side door of a sandbox's turn proxy (issue 18): an orchestrator on
//! the host (an agent acting on the sandbox from outside) reaches the proxy through
//! a unix socket, without entering the sandbox's network namespace; its LLM
//! requests end turns as the agent's inside do. Only root (or `control_group`)
//! gets in.

// Needs root and the private containerd: built only with the `host-tests` feature (hack/test.sh enables it).
#![cfg(feature = "host-tests")]

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crab_integration::llm::{sandbox_with_proxy, SSE};
use crab_integration::{as_nobody, crabctl, crabctl_ok, text, wait_until};
use serde_json::Value;

/// One streaming chat request over the unix socket at `door` (HTTP/1.0, so the
/// answer comes unchunked, until the close); the raw answer.
fn ask(door: &Path) -> String {
    let mut s = UnixStream::connect(door).expect("connect to the door");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = r#"{"model":"stub","stream":true,"messages":[{"role":"user","content":"next?"}]}"#;
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.0\r\nHost: sandbox\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

fn door_of(id: &str) -> PathBuf {
    assert!(
        wait_until(Duration::from_secs(20), || crabctl(&["door", id], &[])
            .status
            .success()),
        "no door for {id}"
    );
    PathBuf::from(crabctl_ok(&["door", id]).trim())
}

fn turns(id: &str) -> usize {
    let h: Vec<Value> = serde_json::from_str(&crabctl_ok(&["ls", id, "--json"])).unwrap();
    h.len()
}

#[test]
fn an_orchestrator_on_the_host_takes_turns_through_the_door() {
    let g = sandbox_with_proxy(Duration::ZERO);
    let door = door_of(&g.id);
    let inspect = crabctl_ok(&["inspect", &g.id]);
    assert!(
        inspect.contains(&format!("proxy door:      unix:{}", door.display())),
        "{inspect}"
    );
    let mode = std::fs::metadata(&door).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let answer = ask(&door);
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    assert!(
        answer.ends_with(&SSE.concat()),
        "SSE bytes changed: {answer}"
    );
    assert_eq!(turns(&g.id), 1, "the door's request ended a turn");
    ask(&door);
    assert_eq!(turns(&g.id), 2);

    let id = g.id.clone();
    drop(g);
    assert!(!door.exists(), "the door of removed {id} is left");
}

/// Connects to `door` as `nobody`; what it read, or why it could not. The proxy
/// answers a refused caller as soon as it accepts and closes at once, so the
/// request may meet a closed socket (EPIPE): the answer is in the receive buffer
/// all the same.
fn nobody_connects(door: &Path) -> String {
    let script = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\n\
        try:\n s.connect(sys.argv[1])\n\
        \x20try: s.sendall(b'GET /v1/models HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n\
        \x20except BrokenPipeError: pass\n\
        \x20print(s.recv(200).decode(errors='replace'))\n\
        except OSError as e: print('refused:', e)";
    let out = as_nobody(&["/usr/bin/python3", "-c", script, &door.to_string_lossy()]);
    let (o, e) = text(&out);
    format!("{o}{e}")
}

#[test]
fn a_host_user_cannot_use_the_door_even_when_its_mode_is_loosened() {
    let g = sandbox_with_proxy(Duration::ZERO);
    let door = door_of(&g.id);
    // The state dir is root-only: the socket cannot even be reached.
    let seen = nobody_connects(&door);
    assert!(
        seen.contains("refused") && seen.contains("Permission denied"),
        "{seen}"
    );
    // Reached anyway (a loosened mode, the path bound elsewhere): the proxy checks
    // the caller's credentials.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let elsewhere = dir.path().join("door");
    std::fs::write(&elsewhere, b"").unwrap();
    let bound = Command::new("mount")
        .arg("--bind")
        .args([&door, &elsewhere])
        .status()
        .unwrap();
    assert!(bound.success());
    std::fs::set_permissions(&door, std::fs::Permissions::from_mode(0o666)).unwrap();
    let seen = nobody_connects(&elsewhere);
    let _ = Command::new("umount").arg(&elsewhere).status();
    assert!(seen.starts_with("HTTP/1.1 403"), "{seen}");
    assert_eq!(turns(&g.id), 0);
    // Root still gets in.
    assert!(ask(&door).starts_with("HTTP/1.0 200"));
}
