//! A connection from a user other than root gets nothing from the snapshotter, even
//! where the socket's permissions would let it connect (root only: the test
//! switches a child process to uid 65534).
#![cfg(feature = "host-tests")]

mod support;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

/// Connects as `uid`, sends HTTP/2's preface and an empty SETTINGS frame, and prints
/// how many bytes the server answered with before closing.
const CLIENT: &str = r#"
import os, socket, sys
os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[2]))
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.settimeout(5)
got = b""
try:
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    while len(got) < 9:
        b = s.recv(64)
        if not b:
            break
        got += b
except (BrokenPipeError, ConnectionResetError, socket.timeout):
    pass
print(len(got))
"#;

fn answered(sock: &std::path::Path, uid: u32) -> usize {
    let out = Command::new("python3")
        .args(["-c", CLIENT, &sock.display().to_string(), &uid.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn test_a_non_root_peer_is_refused_where_root_is_served() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sock = dir.path().join("open.sock");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (s, _) = support::open(&dir.path().join("root"));
    let service = crab_snapshotter::service::Service::new(s);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn({
        let sock = sock.clone();
        async move {
            // Not serve::bind: this socket is open to everyone on purpose.
            let l = tokio::net::UnixListener::bind(&sock).unwrap();
            std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
            crab_snapshotter::serve::serve(l, service, async {
                let _ = stopped.await;
            })
            .await
        }
    });
    while !sock.exists() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(answered(&sock, 0) >= 9, "root got no SETTINGS frame");
    assert_eq!(answered(&sock, 65534), 0, "uid 65534 got an answer");
    let _ = stop.send(());
    rt.block_on(server).unwrap().unwrap();
}
