//! The journal of LLM exchanges and the fast-forward of a restored agent,
//! through a real proxy: a stub LLM on one socket, the proxy on another.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use crab_proxy::{Boundary, Gate, Journal, Proxy, TurnContext, Upstream, REPLAY_PLAN};
use http::StatusCode;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const REQUEST: &str = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
const OTHER: &str = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"bye\"}]}";

/// A boundary whose turns record checkpoints `first`, `first + 1`, ... and
/// note, at each turn, whether the previous seq's exchange was on disk.
struct SeqBoundary {
    next: AtomicU64,
    dir: PathBuf,
    turns: AtomicUsize,
    previous_on_disk: Mutex<Vec<bool>>,
}

impl SeqBoundary {
    fn new(first: u64, dir: &Path) -> Arc<SeqBoundary> {
        Arc::new(SeqBoundary {
            next: AtomicU64::new(first),
            dir: dir.to_path_buf(),
            turns: AtomicUsize::new(0),
            previous_on_disk: Mutex::new(Vec::new()),
        })
    }
    fn turns(&self) -> usize {
        self.turns.load(Ordering::SeqCst)
    }
}

impl Boundary for SeqBoundary {
    fn turn(&self, _: &TurnContext) -> Gate {
        self.turns.fetch_add(1, Ordering::SeqCst);
        let seq = self.next.fetch_add(1, Ordering::SeqCst);
        let previous = self.dir.join(format!("{}.exchange", seq - 1));
        self.previous_on_disk
            .lock()
            .unwrap()
            .push(previous.exists());
        Gate::new(async move { Ok(Some(seq)) })
    }
}

/// A fail-closed proxy to the stub at `up`, journaling in `journal`.
fn start(up: SocketAddr, boundary: Arc<dyn Boundary>, journal: Arc<Journal>) -> SocketAddr {
    let upstream = Upstream::parse(&format!("http://{up}")).unwrap();
    listen(&Arc::new(
        Proxy::new(upstream, boundary, true).with_journal(journal),
    ))
}

fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The exchange file of `seq`, once it is there (it is renamed in after the
/// answer's end).
async fn exchange(dir: &Path, seq: u64) -> Vec<u8> {
    let path = dir.join(format!("{seq}.exchange"));
    let deadline = Instant::now() + Duration::from_secs(3);
    while !path.exists() {
        assert!(Instant::now() < deadline, "no {}", path.display());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    std::fs::read(path).unwrap()
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    n.sort();
    n
}

fn sse() -> Vec<u8> {
    SSE.concat().into_bytes()
}

/// A journal in a fresh directory, and a proxy to a fresh stub LLM that
/// records into it, its turns checkpoints 41, 42, ...
struct Journaled {
    _dir: tempfile::TempDir,
    jdir: PathBuf,
    proxy: SocketAddr,
    boundary: Arc<SeqBoundary>,
}

async fn journaled() -> Journaled {
    let (up, _) = start_stub().await;
    let dir = tempfile::tempdir().unwrap();
    let jdir = dir.path().join("journal");
    let journal = Arc::new(Journal::open(&jdir).unwrap());
    let boundary = SeqBoundary::new(41, &jdir);
    let proxy = start(up, boundary.clone(), journal);
    Journaled {
        _dir: dir,
        jdir,
        proxy,
        boundary,
    }
}

/// After a restore whose plan is checkpoints `from..=to`: a new proxy on the
/// same journal, to a new stub LLM (what it saw), its turns from `next`.
async fn restored(
    jdir: &Path,
    from: u64,
    to: u64,
    next: u64,
) -> (
    SocketAddr,
    Arc<SeqBoundary>,
    Arc<Journal>,
    Arc<Mutex<Vec<Seen>>>,
) {
    std::fs::write(
        jdir.join(REPLAY_PLAN),
        format!(r#"{{"from": {from}, "to": {to}}}"#),
    )
    .unwrap();
    let (up, seen) = start_stub().await;
    let journal = Arc::new(Journal::open(jdir).unwrap());
    let boundary = SeqBoundary::new(next, jdir);
    let proxy = start(up, boundary.clone(), journal.clone());
    (proxy, boundary, journal, seen)
}

#[tokio::test]
async fn an_sse_answer_is_journaled_byte_identical_under_its_checkpoint_seq() {
    let Journaled { jdir, proxy, .. } = &journaled().await;
    let (jdir, proxy) = (jdir.as_path(), *proxy);

    let got = send(proxy, "POST", "/v1/messages?beta=true", REQUEST).await;
    assert_eq!(got.body(), sse());
    assert_eq!(got.frames.len(), SSE.len(), "still streamed chunk by chunk");

    let file = exchange(jdir, 41).await;
    let nl = file.iter().position(|&b| b == b'\n').unwrap();
    let header: serde_json::Value = serde_json::from_slice(&file[..nl]).unwrap();
    let digest = hex_sha256(format!("/v1/messages\n{REQUEST}").as_bytes());
    assert_eq!(
        header,
        serde_json::json!({"version": 1, "digest": digest, "path": "/v1/messages",
            "status": 200, "content_type": "text/event-stream"})
    );
    assert_eq!(
        &file[nl + 1..],
        sse().as_slice(),
        "the body as the agent got it"
    );
    assert_eq!(names(jdir), ["41.exchange"], "no partial left");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(jdir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
}

#[tokio::test]
async fn a_replayed_request_gets_the_same_bytes_without_a_turn_or_the_llm() {
    // Before the crash: two turns journaled.
    let Journaled { jdir, proxy, .. } = &journaled().await;
    let (jdir, proxy) = (jdir.as_path(), *proxy);
    let live = send(proxy, "POST", "/v1/messages", REQUEST).await;
    let live2 = send(proxy, "POST", "/v1/chat/completions", OTHER).await;
    exchange(jdir, 42).await;

    // Restored to before both: a new proxy, a new LLM that must not be asked.
    let (proxy, boundary, journal, seen) = restored(jdir, 41, 42, 43).await;
    assert!(!jdir.join(REPLAY_PLAN).exists(), "the plan is used once");

    let again = send(proxy, "POST", "/v1/messages?beta=true", REQUEST).await;
    assert_eq!(again.status, live.status);
    assert_eq!(again.content_type, "text/event-stream");
    assert_eq!(again.body(), live.body());
    let again2 = send(proxy, "POST", "/v1/chat/completions", OTHER).await;
    assert_eq!(
        (again2.status, again2.content_type.as_str(), again2.body()),
        (live2.status, "application/json", live2.body())
    );
    assert_eq!(boundary.turns(), 0, "no checkpoint for a replayed turn");
    assert!(seen.lock().unwrap().is_empty(), "the LLM was not asked");
    assert_eq!((journal.replayed(), journal.diverged()), (2, 0));

    // The plan is used up: live again.
    let live3 = send(proxy, "POST", "/v1/messages", REQUEST).await;
    assert_eq!(live3.body(), sse());
    assert_eq!(boundary.turns(), 1);
    assert_eq!(seen.lock().unwrap().len(), 1);
    exchange(jdir, 43).await;
}

#[tokio::test]
async fn a_divergent_request_goes_live_and_ends_the_replay() {
    let Journaled { jdir, proxy, .. } = &journaled().await;
    let (jdir, proxy) = (jdir.as_path(), *proxy);
    send(proxy, "POST", "/v1/chat/completions", REQUEST).await;
    send(proxy, "POST", "/v1/chat/completions", OTHER).await;
    exchange(jdir, 42).await;

    let (proxy, boundary, journal, seen) = restored(jdir, 41, 42, 43).await;

    // The restored agent asks something else first (its clock, say, differs).
    let diverged = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi!\"}]}";
    let got = send(proxy, "POST", "/v1/chat/completions", diverged).await;
    assert_eq!((got.status, got.text().as_str()), (StatusCode::OK, ANSWER));
    assert_eq!(boundary.turns(), 1, "a divergent request is a live turn");
    assert_eq!(
        seen.lock().unwrap()[0].body,
        diverged.as_bytes(),
        "its body went upstream whole"
    );
    assert_eq!((journal.replayed(), journal.diverged()), (0, 1));
    exchange(jdir, 43).await;

    // The replay is over: even a journaled request goes live now.
    send(proxy, "POST", "/v1/chat/completions", OTHER).await;
    assert_eq!(boundary.turns(), 2);
    assert_eq!(seen.lock().unwrap().len(), 2);
    assert_eq!(journal.replayed(), 0);
}

#[tokio::test]
async fn an_answer_dropped_half_way_leaves_no_exchange() {
    let Journaled { jdir, proxy, .. } = &journaled().await;
    let (jdir, proxy) = (jdir.as_path(), *proxy);

    let mut c = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{REQUEST}",
        REQUEST.len()
    );
    c.write_all(head.as_bytes()).await.unwrap();
    // Read until the first SSE event is there, then hang up.
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("Hel") {
        let mut buf = [0u8; 4096];
        let n = c.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed early");
        got.extend_from_slice(&buf[..n]);
    }
    drop(c);
    // The stub would have ended its stream by now.
    tokio::time::sleep(SSE_GAP * 4).await;
    assert!(names(jdir).is_empty(), "left {:?}", names(jdir));
}

#[tokio::test]
async fn an_answer_the_llm_breaks_off_leaves_no_exchange() {
    let Journaled { jdir, proxy, .. } = &journaled().await;
    let (jdir, proxy) = (jdir.as_path(), *proxy);

    let stream = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::post("/v1/responses")
        .header("host", "x")
        .body(http_body_util::Full::new(bytes::Bytes::from(REQUEST)))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    use http_body_util::BodyExt;
    assert!(
        resp.into_body().collect().await.is_err(),
        "the agent sees the break too"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(names(jdir).is_empty(), "left {:?}", names(jdir));
}

#[tokio::test]
async fn the_next_turn_waits_until_the_previous_exchange_is_durable() {
    let Journaled {
        proxy, boundary, ..
    } = &journaled().await;
    let proxy = *proxy;

    // Each next request is sent the moment the previous answer has ended.
    for (path, body) in [
        ("/v1/chat/completions", REQUEST),
        ("/v1/messages", OTHER),
        ("/v1/chat/completions", OTHER),
    ] {
        send(proxy, "POST", path, body).await;
    }
    let on_disk = boundary.previous_on_disk.lock().unwrap().clone();
    assert_eq!(
        &on_disk[1..],
        [true, true],
        "answer k was journaled before turn k+1"
    );
}

#[tokio::test]
async fn answers_without_a_checkpoint_seq_are_not_journaled() {
    let (up, _) = start_stub().await;
    let dir = tempfile::tempdir().unwrap();
    let jdir = dir.path().join("journal");
    let journal = Arc::new(Journal::open(&jdir).unwrap());
    // Fail-closed: the 503 is not the LLM's answer.
    let failing = TestBoundary::new(GateKind::Fail("disk full"));
    let proxy = start(up, failing, journal.clone());
    let got = send(proxy, "POST", "/v1/chat/completions", REQUEST).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    // A turn that recorded nothing (no seq) has nothing to replay after.
    let proxy = start(up, TestBoundary::new(GateKind::Open), journal);
    let got = send(proxy, "POST", "/v1/chat/completions", REQUEST).await;
    assert_eq!(got.status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(names(&jdir).is_empty(), "left {:?}", names(&jdir));
}

#[tokio::test]
async fn other_paths_pass_unjournaled_during_a_replay() {
    let Journaled { jdir, proxy, .. } = &journaled().await;
    let (jdir, proxy) = (jdir.as_path(), *proxy);
    send(proxy, "POST", "/v1/chat/completions", REQUEST).await;
    exchange(jdir, 41).await;

    let (proxy, boundary, journal, seen) = restored(jdir, 41, 41, 42).await;
    let got = send(proxy, "GET", "/v1/models", "").await;
    assert_eq!(got.text(), "ok");
    assert_eq!(seen.lock().unwrap().len(), 1, "a GET goes upstream");
    let got = send(proxy, "POST", "/v1/chat/completions", REQUEST).await;
    assert_eq!(got.text(), ANSWER);
    assert_eq!((journal.replayed(), journal.diverged()), (1, 0));
    assert_eq!(boundary.turns(), 0);
    assert_eq!(names(jdir), ["41.exchange"]);
}

/// Sends `body` to `path` through the host-side door at `sock` and reads the
/// whole answer (the connection closes after it).
async fn through_the_door(sock: &Path, path: &str, body: &str) -> String {
    let mut c = tokio::net::UnixStream::connect(sock).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn an_agent_outside_is_neither_journaled_nor_replayed() {
    // Journaled from inside: seq 41.
    let Journaled { jdir, proxy, .. } = &journaled().await;
    let (jdir, proxy) = (jdir.as_path(), *proxy);
    send(proxy, "POST", "/v1/chat/completions", REQUEST).await;
    exchange(jdir, 41).await;

    // Restored: the plan expects 41 again. The same request through the
    // door is the agent outside, which no restore brought back: it goes live,
    // and its exchange is not kept.
    std::fs::write(jdir.join(REPLAY_PLAN), r#"{"from": 41, "to": 41}"#).unwrap();
    let (up, seen) = start_stub().await;
    let journal = Arc::new(Journal::open(jdir).unwrap());
    let boundary = SeqBoundary::new(42, jdir);
    let upstream = Upstream::parse(&format!("http://{up}")).unwrap();
    let p = Arc::new(Proxy::new(upstream, boundary.clone(), true).with_journal(journal.clone()));
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("door.sock");
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    tokio::spawn(p.serve_unix(listener, |_| Ok(())));

    let got = through_the_door(&sock, "/v1/chat/completions", REQUEST).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(got.ends_with(ANSWER), "{got}");
    assert_eq!(boundary.turns(), 1, "a live turn");
    assert_eq!(seen.lock().unwrap().len(), 1, "the LLM was asked");
    assert_eq!((journal.replayed(), journal.diverged()), (0, 0));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(names(jdir), ["41.exchange"], "seq 42 is not journaled");
}
