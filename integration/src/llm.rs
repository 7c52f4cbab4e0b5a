//! A stub LLM server on the host, for the proxy tests and benches: it answers
//! every request with the same answer after a configurable think time: SSE
//! chunks when the request asks to stream (`"stream": true`), else one JSON body.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::Duration;

/// The chunks of every answer.
pub const SSE: [&str; 3] = [
    "data: {\"choices\":[{\"delta\":{\"content\":\"ls\"}}]}\n\n",
    "data: {\"choices\":[{\"delta\":{\"content\":\" -la\"}}]}\n\n",
    "data: [DONE]\n\n",
];

/// The whole answer to a request that did not ask to stream.
pub const JSON_ANSWER: &str = "{\"choices\":[{\"message\":{\"content\":\"ls -la\"}}]}";

/// One request as the stub saw it.
pub struct Seen {
    /// Request line and headers.
    pub head: String,
    /// The body.
    pub body: String,
}

/// Starts a stub on 127.0.0.1: each request waits `think` (or its own
/// `"think_ms"`), then gets its answer (SSE chunks `gap` apart). Returns its port and the requests it sees.
pub fn stub(think: Duration, gap: Duration) -> (u16, mpsc::Receiver<Seen>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind the stub LLM");
    let port = l.local_addr().expect("stub address").port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(conn) = conn else { return };
            let tx = tx.clone();
            std::thread::spawn(move || answer(conn, think, gap, tx));
        }
    });
    (port, rx)
}

/// Reads one HTTP/1 request from `conn`: its head (request line and headers)
/// and its body (by Content-Length).
pub fn read_request(conn: &std::net::TcpStream) -> (String, Vec<u8>) {
    let mut r = BufReader::new(conn.try_clone().expect("clone a socket"));
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let len = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
        })
        .unwrap_or(0);
    let mut body = vec![0; len];
    let _ = r.read_exact(&mut body);
    (head, body)
}

fn answer(mut conn: std::net::TcpStream, think: Duration, gap: Duration, tx: mpsc::Sender<Seen>) {
    let (head, body) = read_request(&conn);
    let body = String::from_utf8_lossy(&body).into_owned();
    let stream = body.replace(' ', "").contains("\"stream\":true");
    // A request may set its own think time: `"think_ms": N` in its body.
    let think = body
        .split("\"think_ms\":")
        .nth(1)
        .and_then(|r| {
            let digits: String = r
                .trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .map(Duration::from_millis)
        .unwrap_or(think);
    let _ = tx.send(Seen { head, body });
    std::thread::sleep(think);
    if !stream {
        let _ = conn.write_all(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{JSON_ANSWER}",
                JSON_ANSWER.len()
            )
            .as_bytes(),
        );
        return;
    }
    let _ = conn.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    );
    for chunk in SSE {
        let _ = conn.write_all(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes());
        let _ = conn.flush();
        std::thread::sleep(gap);
    }
    let _ = conn.write_all(b"0\r\n\r\n");
}

/// A python sandbox idling, whose shim-started proxy forwards to a stub LLM
/// (answers `gap` apart in chunks) that the annotation names.
pub fn sandbox_with_proxy(gap: Duration) -> crate::Guard {
    proxied_sandbox(gap, "", &["sleep", "infinity"])
}

/// A python sandbox running `args`, whose shim-started proxy forwards to a stub
/// LLM (answers `gap` apart in chunks) that the annotation names; the host's
/// configuration allows that upstream (`[proxy] upstreams`), with `extra` TOML
/// tables after it.
pub fn proxied_sandbox(gap: Duration, extra: &str, args: &[&str]) -> crate::Guard {
    let (port, _seen) = stub(Duration::ZERO, gap);
    let upstream = format!("http://127.0.0.1:{port}");
    let config = crate::config_with(&format!("[proxy]\nupstreams = [\"{upstream}\"]\n{extra}"));
    crate::Guard::run_detached(
        crate::CRAB,
        crate::PYTHON,
        &[
            "--runtime-config-path",
            &config.to_string_lossy(),
            "--annotation",
            &format!("io.crab.proxy.upstream={upstream}"),
        ],
        args,
    )
}
