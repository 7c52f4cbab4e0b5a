//! Upstream connections are kept for later requests (HTTP/1 keep-alive), and
//! one the upstream closed while idle is not used again.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The common stub, counting the connections it accepts.
async fn counting_stub() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let n = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            n.fetch_add(1, Ordering::SeqCst);
            serve_stub_conn(stream, Arc::new(Mutex::new(Vec::new())));
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn an_idle_upstream_connection_is_reused() {
    let (up, accepted) = counting_stub().await;
    let p = start_proxy(up, TestBoundary::new(GateKind::Open), None, true);
    for _ in 0..3 {
        let got = send(p, "POST", "/v1/chat/completions", "{}").await;
        assert_eq!(got.status, StatusCode::OK);
        // The connection goes back to the pool once the answer is read.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_connection_the_upstream_closed_is_not_reused() {
    // Answers once per connection, keep-alive as far as the headers say, then
    // closes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let n = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            n.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    let k = stream.read(&mut buf).await.unwrap();
                    if k == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..k]);
                }
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
            });
        }
    });
    let p = start_proxy(up, TestBoundary::new(GateKind::Open), None, true);
    for _ in 0..3 {
        let got = send(p, "GET", "/v1/models", "").await;
        assert_eq!((got.status, got.text().as_str()), (StatusCode::OK, "ok"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}
