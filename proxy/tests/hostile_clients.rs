//! A hostile sandbox against its proxy (issue 17 item 7): odd request lines
//! get 400 (never a panic), a head or body that never ends is cut at its
//! timeout, a body over the limit gets 413, and a connection over the cap is
//! refused at once, the proxy serving again when connections end.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use crab_proxy::{Limits, Proxy, Upstream};
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A bound for what must happen "at once": generous, only to catch a hang.
const LIVENESS: Duration = Duration::from_secs(10);

/// A proxy with `limits` to a fresh stub; its address.
async fn proxy_with(limits: Limits) -> SocketAddr {
    let (up, _) = start_stub().await;
    let upstream = Upstream::parse(&format!("http://{up}")).unwrap();
    let proxy = Proxy::new(upstream, TestBoundary::new(GateKind::Open), true)
        .with_sandbox(Arc::new(TestSandbox::default()), API_TOKEN)
        .with_limits(limits);
    listen(&Arc::new(proxy))
}

/// Writes `raw` on a new connection and reads until the proxy closes it (or
/// the liveness bound); returns what came back.
async fn exchange(addr: SocketAddr, raw: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    read_to_close(&mut s).await.0
}

/// Reads until EOF or a reset; the text and when it ended.
async fn read_to_close(s: &mut TcpStream) -> (String, Instant) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(LIVENESS, read)
        .await
        .expect("the proxy neither answered nor closed");
    (String::from_utf8_lossy(&got).into_owned(), Instant::now())
}

fn status_of(answer: &str) -> u16 {
    answer
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {answer:?}"))
}

#[tokio::test]
async fn an_absolute_form_request_gets_400_not_a_panic() {
    let p = proxy_with(Limits::default()).await;
    let huge_header = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 << 10)
    );
    let many_headers = format!(
        "GET / HTTP/1.1\r\nHost: x\r\n{}\r\n",
        (0..200)
            .map(|i| format!("X-{i}: y\r\n"))
            .collect::<String>()
    );
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        // The line that panicked a handler before.
        ("absolute form, no path", b"GET http://x?y HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(), 400),
        ("absolute form to the agent API", b"POST http://x/.crab/v1/fork HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec(), 400),
        ("authority form", b"CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\nConnection: close\r\n\r\n".to_vec(), 400),
        ("asterisk", b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(), 400),
        ("odd method", b"G\x01T / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 400),
        ("bytes in the path", b"GET /v1/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 400),
        ("no version", b"GET /\r\n\r\n".to_vec(), 400),
        ("huge header", huge_header.into_bytes(), 431),
        ("too many headers", many_headers.into_bytes(), 431),
    ];
    for (what, raw, want) in cases {
        let answer = exchange(p, &raw).await;
        let got = status_of(&answer);
        println!("{what}: {got}");
        assert_eq!(got, want, "{what}: {answer}");
    }
    let body = exchange(
        p,
        b"GET http://x?y HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(body.contains("absolute-form"), "{body}");
    // The proxy still serves.
    let got = send(p, "GET", "/v1/models", "").await;
    assert_eq!(got.status, StatusCode::OK);
}

#[tokio::test]
async fn a_request_head_that_never_ends_is_cut_at_the_header_timeout() {
    let timeout = Duration::from_secs(1);
    let p = proxy_with(Limits {
        header_timeout: timeout,
        ..Limits::default()
    })
    .await;
    let mut s = TcpStream::connect(p).await.unwrap();
    let start = Instant::now();
    s.write_all(b"GET /v1/mo").await.unwrap();
    // A byte every 100 ms: always sending, never done.
    let (mut r, mut w) = s.into_split();
    let drip = tokio::spawn(async move {
        while w.write_all(b"d").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(LIVENESS, async {
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    let after = start.elapsed();
    drip.abort();
    println!("a dripping request head was cut after {after:?} (timeout {timeout:?})");
    assert!(closed.is_ok(), "the dripping head was never cut");
    assert!(after >= timeout, "cut before the timeout: {after:?}");
}

#[tokio::test]
async fn a_body_that_stalls_is_cut_at_the_body_timeout() {
    let timeout = Duration::from_secs(1);
    let p = proxy_with(Limits {
        body_timeout: timeout,
        ..Limits::default()
    })
    .await;
    for (path, auth) in [
        ("/v1/embeddings", "sk-secret"),
        ("/.crab/v1/checkpoints", API_TOKEN),
    ] {
        let mut s = TcpStream::connect(p).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {auth}\r\n\
             Content-Length: 100\r\n\r\n{{\"a\":"
        );
        let start = Instant::now();
        s.write_all(head.as_bytes()).await.unwrap();
        let (answer, end) = read_to_close(&mut s).await;
        println!(
            "{path}: a stalled body got {} after {:?}",
            &answer[..12.min(answer.len())],
            end - start
        );
        assert_eq!(status_of(&answer), 408, "{path}: {answer}");
        assert!(end - start >= timeout, "{path}: cut early");
    }
}

#[tokio::test]
async fn a_body_over_the_limit_gets_413() {
    let p = proxy_with(Limits {
        max_body: 1024,
        ..Limits::default()
    })
    .await;
    // Said up front.
    let big = format!(
        "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n{}",
        "a".repeat(2000)
    );
    let answer = exchange(p, big.as_bytes()).await;
    assert_eq!(status_of(&answer), 413, "{answer}");
    // Found out while streaming upstream (chunked, no length).
    let chunk = "b".repeat(600);
    let chunked = format!(
        "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
         258\r\n{chunk}\r\n258\r\n{chunk}\r\n0\r\n\r\n"
    );
    let answer = exchange(p, chunked.as_bytes()).await;
    assert_eq!(status_of(&answer), 413, "{answer}");
    // A body under the limit passes.
    let got = send(p, "POST", "/v1/embeddings", "{}").await;
    assert_eq!(got.status, StatusCode::OK);
}

#[tokio::test]
async fn a_connection_beyond_the_cap_is_refused_and_the_proxy_serves_again_after() {
    let p = proxy_with(Limits {
        max_connections: 3,
        ..Limits::default()
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(p).await.unwrap();
        s.write_all(b"GET /v1/mo").await.unwrap();
        held.push(s);
    }
    // Let the proxy accept them all before the next one comes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    let mut over = TcpStream::connect(p).await.unwrap();
    let (answer, end) = read_to_close(&mut over).await;
    println!(
        "over the cap: {:?} after {:?}",
        answer.lines().next(),
        end - start
    );
    assert_eq!(status_of(&answer), 503, "{answer}");
    assert!(answer.contains("too many connections"), "{answer}");
    // The held connections end; the proxy serves new ones.
    drop(held);
    let served = tokio::time::timeout(LIVENESS, async {
        loop {
            let answer = exchange(
                p,
                b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            )
            .await;
            if status_of(&answer) == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        served.is_ok(),
        "the proxy did not serve again after the held connections ended"
    );
}
