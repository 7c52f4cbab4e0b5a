//! Turn boundaries through a real proxy: a stub LLM on one socket, the proxy
//! on another, a real HTTP client.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use crab_proxy::{Proxy, Upstream};
use http::StatusCode;

const REQUEST: &str = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";

#[tokio::test]
async fn an_llm_post_passes_unchanged_and_is_one_turn() {
    let (up, seen) = start_stub().await;
    let boundary = TestBoundary::new(GateKind::Open);
    let proxy = start_proxy(up, boundary.clone(), None, true);

    let got = send(proxy, "POST", "/v1/chat/completions", REQUEST).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.text(), ANSWER);
    assert_eq!(got.content_type, "application/json");
    assert_eq!(boundary.turns(), 1);
    assert_eq!(boundary.held.lock().unwrap().len(), 1);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, REQUEST.as_bytes());
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].host, up.to_string(), "Host is the upstream's");
}

#[tokio::test]
async fn other_paths_pass_without_a_turn() {
    let (up, seen) = start_stub().await;
    let boundary = TestBoundary::new(GateKind::Open);
    let proxy = start_proxy(up, boundary.clone(), None, true);

    let got = send(proxy, "GET", "/v1/models", "").await;
    assert_eq!((got.status, got.text().as_str()), (StatusCode::OK, "ok"));
    assert_eq!(boundary.turns(), 0);
    assert!(boundary.held.lock().unwrap().is_empty());
    assert_eq!(seen.lock().unwrap()[0].path, "/v1/models");
}

#[tokio::test]
async fn sse_arrives_byte_identical_chunk_by_chunk() {
    let (up, _) = start_stub().await;
    let boundary = TestBoundary::new(GateKind::Open);
    let proxy = start_proxy(up, boundary.clone(), None, true);

    let got = send(proxy, "POST", "/v1/messages", REQUEST).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.content_type, "text/event-stream");
    let frames: Vec<&[u8]> = got.frames.iter().map(|(_, b)| b.as_ref()).collect();
    let chunks: Vec<&[u8]> = SSE.iter().map(|c| c.as_bytes()).collect();
    assert_eq!(frames, chunks, "one frame per upstream chunk, unchanged");
    // Streamed, not buffered: the first chunk came well before the last.
    let spread = got.frames[2].0 - got.frames[0].0;
    assert!(spread >= SSE_GAP, "chunks arrived {spread:?} apart");
    assert_eq!(boundary.turns(), 1);
}

#[tokio::test]
async fn the_answer_is_held_until_the_gate_opens_and_the_gate_is_promoted() {
    let (up, seen) = start_stub().await;
    let release = Arc::new(tokio::sync::Notify::new());
    let boundary = TestBoundary::new(GateKind::Manual(release.clone()));
    let proxy = start_proxy(up, boundary.clone(), None, true);

    let started = Instant::now();
    let answer = tokio::spawn(send(proxy, "POST", "/v1/chat/completions", REQUEST));
    // The upstream answered at once; the agent still has nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "the request went upstream at once"
    );
    assert!(!answer.is_finished(), "the answer is held");
    assert_eq!(boundary.promoted(), 1, "the answer came first: promoted");

    release.notify_one();
    let got = answer.await.unwrap();
    assert_eq!(got.text(), ANSWER);
    assert!(got.frames[0].0 - started >= Duration::from_millis(300));
    assert_eq!(boundary.promoted(), 1, "promoted once");
    let held = boundary.held.lock().unwrap().clone();
    assert_eq!(held.len(), 1);
    assert!(held[0] >= Duration::from_millis(250), "held {:?}", held[0]);
}

#[tokio::test]
async fn a_gate_that_opened_before_the_answer_is_not_promoted() {
    let (up, _) = start_stub().await;
    let boundary = TestBoundary::new(GateKind::After(Duration::from_millis(20)));
    let proxy = start_proxy(up, boundary.clone(), None, true);

    let got = send(proxy, "POST", "/v1/chat/completions?delay_ms=300", REQUEST).await;
    assert_eq!(got.text(), ANSWER);
    assert_eq!(boundary.promoted(), 0);
    let held = boundary.held.lock().unwrap().clone();
    assert_eq!(held.len(), 1, "gated() once per turn");
    assert!(held[0] < Duration::from_millis(50), "held {:?}", held[0]);
}

#[tokio::test]
async fn a_failed_checkpoint_gives_503_when_fail_closed() {
    let (up, _) = start_stub().await;
    let boundary = TestBoundary::new(GateKind::Fail("disk full"));
    let proxy = start_proxy(up, boundary.clone(), None, true);

    let got = send(proxy, "POST", "/v1/chat/completions", REQUEST).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(got.text().contains("disk full"), "{}", got.text());
    assert_eq!(boundary.held.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_failed_checkpoint_passes_the_answer_when_fail_open() {
    let (up, _) = start_stub().await;
    let boundary = TestBoundary::new(GateKind::Fail("disk full"));
    let proxy = start_proxy(up, boundary.clone(), None, false);

    let got = send(proxy, "POST", "/v1/chat/completions", REQUEST).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.text(), ANSWER);
}

#[tokio::test]
async fn an_unreachable_upstream_gives_502_naming_it() {
    // A port that was free a moment ago: nothing listens there.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let up = free.local_addr().unwrap();
    drop(free);
    let boundary = TestBoundary::new(GateKind::Open);
    let proxy = start_proxy(up, boundary, None, true);

    let got = send(proxy, "POST", "/v1/chat/completions", REQUEST).await;
    assert_eq!(got.status, StatusCode::BAD_GATEWAY);
    assert!(
        got.text().contains(&format!("http://{up}")),
        "{}",
        got.text()
    );
    assert!(!got.text().contains("sk-secret"));
}

#[tokio::test]
async fn one_proxy_serves_two_listeners_with_shared_state() {
    let (up, seen) = start_stub().await;
    let boundary = TestBoundary::new(GateKind::Open);
    let upstream = Upstream::parse(&format!("http://{up}")).unwrap();
    let proxy = Arc::new(Proxy::new(upstream, boundary.clone(), true));
    let (a, b) = (listen(&proxy), listen(&proxy));

    for addr in [a, b] {
        let got = send(addr, "POST", "/v1/chat/completions", REQUEST).await;
        assert_eq!(got.text(), ANSWER);
    }
    assert_eq!(boundary.turns(), 2, "one boundary for both listeners");
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_turn_names_the_connection_its_request_came_on() {
    let (up, _) = start_stub().await;
    let boundary = TestBoundary::new(GateKind::Open);
    let proxy = start_proxy(up, boundary.clone(), None, true);

    send(proxy, "POST", "/v1/chat/completions", REQUEST).await;
    let ctx = boundary.contexts.lock().unwrap()[0];
    assert_eq!(ctx.local, Some(proxy), "the listener's address");
    let peer = ctx.peer.expect("a TCP client has a peer address");
    assert!(peer.ip().is_loopback() && peer.port() != proxy.port());
}

/// An agent frozen by its turn's checkpoint half way through its request's
/// body would send the rest only after the dump: the turn starts when the
/// body has come whole, not at the request's head.
#[tokio::test]
async fn a_turn_starts_once_the_request_body_has_come_whole() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (up, seen) = start_stub().await;
    let boundary = TestBoundary::new(GateKind::Open);
    let proxy = start_proxy(up, boundary.clone(), None, true);

    let mut s = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let (first, rest) = REQUEST.split_at(REQUEST.len() / 2);
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        REQUEST.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(first.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(boundary.turns(), 0, "the turn started before the body came");
    s.write_all(rest.as_bytes()).await.unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(boundary.turns(), 1);
    assert_eq!(seen.lock().unwrap()[0].body, REQUEST.as_bytes());
}
