//! What the proxy tests share: a stub LLM upstream on a real socket, a
//! Boundary and a Sandbox that record their calls, and a small HTTP client.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use crab_errkind::{ErrorKind, Failure};
use crab_proxy::{Boundary, Gate, Proxy, Sandbox, TurnContext, Upstream};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

/// The SSE events the stub streams, one chunk each.
pub const SSE: [&str; 3] = [
    "data: {\"delta\":\"Hel\"}\n\n",
    "data: {\"delta\":\"lo\"}\n\n",
    "data: [DONE]\n\n",
];
/// The gap between two SSE chunks.
pub const SSE_GAP: Duration = Duration::from_millis(150);
/// The stub's answer to a chat completion.
pub const ANSWER: &str = "{\"choices\":[{\"message\":{\"content\":\"hi\"}}]}";

/// A request as the stub upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub host: String,
    pub body: Bytes,
}

/// A body fed chunk by chunk from a channel, so each chunk is its own frame.
pub struct ChanBody(pub mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChanBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b))))
    }
}

type StubBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// The stub LLM: `POST /v1/chat/completions` answers [`ANSWER`] (after
/// `?delay_ms=N`), `POST /v1/messages` streams [`SSE`], `POST /v1/responses`
/// breaks off its answer, anything else 200 "ok".
async fn stub(req: Request<Incoming>, seen: Arc<Mutex<Vec<Seen>>>) -> Response<StubBody> {
    let (parts, body) = req.into_parts();
    // A body the proxy cut (a test of its limits) arrives truncated.
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        host: parts
            .headers
            .get(http::header::HOST)
            .map(|h| h.to_str().unwrap().to_string())
            .unwrap_or_default(),
        body,
    });
    let delay = parts
        .uri
        .query()
        .and_then(|q| q.strip_prefix("delay_ms="))
        .map(|ms| Duration::from_millis(ms.parse().unwrap()));
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    match parts.uri.path() {
        "/v1/chat/completions" => Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(ANSWER)).boxed())
            .unwrap(),
        "/v1/messages" => {
            let (tx, rx) = mpsc::channel(1);
            tokio::spawn(async move {
                for (i, chunk) in SSE.iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(SSE_GAP).await;
                    }
                    tx.send(Bytes::from_static(chunk.as_bytes())).await.unwrap();
                }
            });
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(ChanBody(rx).boxed())
                .unwrap()
        }
        // Promises more than it sends, then ends: the proxy's upstream body fails.
        "/v1/responses" => {
            let (tx, rx) = mpsc::channel(1);
            tokio::spawn(async move {
                tx.send(Bytes::from_static(b"data: partial\n\n"))
                    .await
                    .unwrap();
            });
            Response::builder()
                .header("content-type", "text/event-stream")
                .header("content-length", "1000")
                .body(ChanBody(rx).boxed())
                .unwrap()
        }
        _ => Response::new(Full::new(Bytes::from("ok")).boxed()),
    }
}

/// Serves HTTP/1 on one accepted connection (plain or TLS).
pub fn serve_stub_conn<IO>(io: IO, seen: Arc<Mutex<Vec<Seen>>>)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let service = service_fn(move |req| {
            let seen = seen.clone();
            async move { Ok::<_, std::convert::Infallible>(stub(req, seen).await) }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(io), service)
            .await;
    });
}

/// Starts the stub upstream on 127.0.0.1; returns its address and what it saw.
pub async fn start_stub() -> (SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            serve_stub_conn(stream, s.clone());
        }
    });
    (addr, seen)
}

/// How the test boundary's gates behave.
pub enum GateKind {
    Open,
    /// Opens after this long.
    After(Duration),
    /// Opens when the test notifies.
    Manual(Arc<tokio::sync::Notify>),
    /// Fails with this message.
    Fail(&'static str),
}

/// A Boundary that counts turns, promotions and held durations.
pub struct TestBoundary {
    pub kind: GateKind,
    pub turns: AtomicUsize,
    pub promoted: Arc<AtomicUsize>,
    pub held: Mutex<Vec<Duration>>,
    /// Each turn's connection, in order.
    pub contexts: Mutex<Vec<TurnContext>>,
}

impl TestBoundary {
    pub fn new(kind: GateKind) -> Arc<TestBoundary> {
        Arc::new(TestBoundary {
            kind,
            turns: AtomicUsize::new(0),
            promoted: Arc::new(AtomicUsize::new(0)),
            held: Mutex::new(Vec::new()),
            contexts: Mutex::new(Vec::new()),
        })
    }
    pub fn turns(&self) -> usize {
        self.turns.load(Ordering::SeqCst)
    }
    pub fn promoted(&self) -> usize {
        self.promoted.load(Ordering::SeqCst)
    }
}

impl Boundary for TestBoundary {
    fn turn(&self, ctx: &TurnContext) -> Gate {
        self.turns.fetch_add(1, Ordering::SeqCst);
        self.contexts.lock().unwrap().push(*ctx);
        let gate = match &self.kind {
            GateKind::Open => Gate::open(),
            GateKind::After(d) => {
                // The deadline is set now, as if the checkpoint were running.
                let sleep = tokio::time::sleep(*d);
                Gate::new(async move {
                    sleep.await;
                    Ok(None)
                })
            }
            GateKind::Manual(n) => {
                let n = n.clone();
                Gate::new(async move {
                    n.notified().await;
                    Ok(None)
                })
            }
            GateKind::Fail(why) => {
                let why = why.to_string();
                Gate::new(async move { Err(why) })
            }
        };
        let promoted = self.promoted.clone();
        gate.on_promote(move || {
            promoted.fetch_add(1, Ordering::SeqCst);
        })
    }
    fn gated(&self, held: Duration) {
        self.held.lock().unwrap().push(held);
    }
}

/// A Sandbox that records its calls; a checkpoint named "fail" fails.
#[derive(Default)]
pub struct TestSandbox {
    pub calls: Mutex<Vec<String>>,
}

impl TestSandbox {
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }
}

impl Sandbox for TestSandbox {
    fn list(&self) -> Result<Value, Failure> {
        self.record("list".into());
        Ok(json!([{"seq": 1, "name": "first"}]))
    }
    fn checkpoint(&self, name: Option<String>, _: &TurnContext) -> Result<Value, Failure> {
        self.record(format!("checkpoint {name:?}"));
        match name.as_deref() {
            Some("fail") => Err(Failure::new(ErrorKind::Internal, "disk full")),
            Some("busy") => Err(Failure::new(
                ErrorKind::Busy,
                "container web is busy: rolling back",
            )),
            _ => Ok(json!({"seq": 2, "name": name})),
        }
    }
    fn rollback(&self, checkpoint: &str, _caller: &TurnContext) -> Result<Value, Failure> {
        self.record(format!("rollback {checkpoint}"));
        match checkpoint {
            "missing" => Err(Failure::new(
                ErrorKind::NotFound,
                "no checkpoint \"missing\"",
            )),
            _ => Ok(json!({"seq": 1})),
        }
    }
    fn fork(&self, checkpoint: Option<String>, count: u32) -> Result<Vec<String>, Failure> {
        self.record(format!("fork {checkpoint:?} {count}"));
        Ok((0..count).map(|i| format!("web-fork-{i}")).collect())
    }
}

/// The sandbox's agent API token in these tests.
pub const API_TOKEN: &str = "0123456789abcdef0123456789abcdef-test";

/// Serves `proxy` on a fresh 127.0.0.1 listener; returns its address.
pub fn listen(proxy: &Arc<Proxy>) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(proxy.clone().serve(listener));
    addr
}

/// A proxy to the plain stub at `upstream`, served on one listener.
pub fn start_proxy(
    upstream: SocketAddr,
    boundary: Arc<TestBoundary>,
    sandbox: Option<Arc<TestSandbox>>,
    fail_closed: bool,
) -> SocketAddr {
    let upstream = Upstream::parse(&format!("http://{upstream}")).unwrap();
    let mut proxy = Proxy::new(upstream, boundary, fail_closed);
    if let Some(s) = sandbox {
        proxy = proxy.with_sandbox(s, API_TOKEN);
    }
    listen(&Arc::new(proxy))
}

/// An answer as the client got it: status, content type, and each body frame
/// with the time it arrived.
pub struct Got {
    pub status: StatusCode,
    pub content_type: String,
    pub frames: Vec<(Instant, Bytes)>,
}

impl Got {
    pub fn body(&self) -> Bytes {
        self.frames
            .iter()
            .flat_map(|(_, b)| b.iter().copied())
            .collect::<Vec<u8>>()
            .into()
    }
    pub fn text(&self) -> String {
        String::from_utf8(self.body().to_vec()).unwrap()
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body()).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }
}

/// Sends one request over a new connection and reads the answer frame by frame.
pub async fn send(addr: SocketAddr, method: &str, path: &str, body: &str) -> Got {
    send_with(addr, method, path, body, &[]).await
}

/// [`send`] with extra headers.
pub async fn send_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Got {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    // The agent's SDK sends its own key upstream; the agent API wants the
    // sandbox's token. A test's own `authorization` header replaces both.
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("authorization"))
    {
        let auth = if path.starts_with("/.crab") {
            format!("Bearer {API_TOKEN}")
        } else {
            "Bearer sk-secret".to_string()
        };
        req = req.header("authorization", auth);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status();
    let content_type = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let mut body = resp.into_body();
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            if !data.is_empty() {
                frames.push((Instant::now(), data));
            }
        }
    }
    Got {
        status,
        content_type,
        frames,
    }
}
