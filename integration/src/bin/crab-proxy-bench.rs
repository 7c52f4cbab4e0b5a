//! The turn proxy's costs. Prints Markdown tables (figures, not assertions):
//!
//! 1. **latency**: the latency the proxy adds, in-process and without containers:
//!    a stub upstream, a [`crab_proxy::Proxy`] whose gates are open at once, a
//!    keep-alive HTTP/1 client; per request (a non-boundary GET and a boundary
//!    POST) and per streamed SSE chunk, direct next to proxied.
//! 2. **hidden**: real containers of the crab runtime with the shim-started
//!    proxy, an agent in the sandbox (the container's init) that works and then
//!    asks a stub LLM with think time T, for each T: how many turns' checkpoints
//!    finished within the LLM's think time, and how long answers were held.
//! 3. **density**: the same with 1, 8, 32... containers turning at once.
//!
//! `crab-proxy-bench [--requests 2000] [--chunks 100] [--streams 20] [--think 0.5,2,5]
//! [--turns 10] [--containers 1,8,32] [--density-think 2] [--parts latency,hidden,density]
//! [--quick]` (`--help` lists them);
//! the container parts need the private containerd of `hack/containerd.sh`
//! (see `hack/bench.sh proxy`).

use std::convert::Infallible;
use std::io::Write;
use std::net::TcpListener;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use crab_integration::bench::{cores, pct, sorted, List, Quick};
use crab_integration::mini_swe_agent::DOOR_UPSTREAM;
use crab_integration::*;
use crab_proxy::{Boundary, Gate, Proxy, TurnContext, Upstream};
use crab_runtime::checkpoint::stats::{Summary, TurnStats};
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;

// ---------------------------------------------------------------- arguments

/// The turn proxy's costs.
#[derive(Parser)]
struct Cli {
    /// Requests of each kind, for the latency part [default: 2000; --quick: 500]
    #[arg(long, value_name = "N")]
    requests: Option<usize>,
    /// SSE chunks per streamed answer, for the latency part.
    #[arg(long, value_name = "N", default_value_t = 100)]
    chunks: usize,
    /// Streamed answers, for the latency part [default: 20; --quick: 5]
    #[arg(long, value_name = "N")]
    streams: Option<usize>,
    /// The LLM's think times in seconds, one row each, for the hidden part
    /// [default: 0.5,2,5; --quick: 0.5,2]
    #[arg(long, value_name = "S,...")]
    think: Option<List<f64>>,
    /// Turns per container, for the hidden and density parts [default: 10; --quick: 6]
    #[arg(long, value_name = "N")]
    turns: Option<usize>,
    /// Containers turning at once, one row each, for the density part
    /// [default: 1,8,32; --quick: 1,8]
    #[arg(long, value_name = "K,...")]
    containers: Option<List<usize>>,
    /// The LLM's think time in seconds, for the density part.
    #[arg(long, value_name = "S", default_value_t = 2.0)]
    density_think: f64,
    /// The parts to run.
    #[arg(
        long,
        value_name = "PART,...",
        value_delimiter = ',',
        default_value = "latency,hidden,density"
    )]
    parts: Vec<Part>,
    #[command(flatten)]
    quick: Quick,
}

/// A part of the bench (see the module docs).
#[derive(Clone, Copy, clap::ValueEnum)]
enum Part {
    Latency,
    Hidden,
    Density,
}

// ---------------------------------------------------------------- 1. added latency

/// Nanoseconds since the bench started: the clock stub and client share.
fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// A boundary whose gates are open at once: the proxy's own cost only.
struct Open;

impl Boundary for Open {
    fn turn(&self, _: &TurnContext) -> Gate {
        Gate::open()
    }
}

type StubBody = BoxBody<Bytes, Infallible>;

/// A streamed body fed by a channel.
struct Chan(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for Chan {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b))))
    }
}

/// The stub upstream: `GET /v1/models` and `POST /v1/chat/completions` answer
/// a small JSON body; `POST /v1/chat/completions?stream=N&gap_us=G` answers N
/// SSE events G µs apart, each carrying the time it was sent ([`now_ns`]).
async fn stub_upstream(req: Request<Incoming>) -> Result<Response<StubBody>, Infallible> {
    let query = req.uri().query().unwrap_or("").to_string();
    let arg = |name: &str| -> Option<u64> {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
    };
    let post = req.method() == http::Method::POST;
    // Read the whole request body, as a server does.
    let _ = req.into_body().collect().await;
    if let (true, Some(n)) = (post, arg("stream")) {
        let gap = Duration::from_micros(arg("gap_us").unwrap_or(2000));
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            for _ in 0..n {
                tokio::time::sleep(gap).await;
                let event = format!("data: {}\n\n", now_ns());
                if tx.send(Bytes::from(event)).await.is_err() {
                    return;
                }
            }
        });
        let mut r = Response::new(Chan(rx).boxed());
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            "text/event-stream".parse().unwrap(),
        );
        return Ok(r);
    }
    let body = if post {
        r#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ls -la"},"finish_reason":"stop"}]}"#
    } else {
        r#"{"object":"list","data":[{"id":"stub","object":"model"}]}"#
    };
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())).boxed());
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        "application/json".parse().unwrap(),
    );
    Ok(r)
}

async fn serve_stub(listener: tokio::net::TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service_fn(stub_upstream))
                .await;
        });
    }
}

/// A keep-alive HTTP/1 client on one connection.
async fn client(port: u16) -> hyper::client::conn::http1::SendRequest<BoxBody<Bytes, Infallible>> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .expect("HTTP handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
}

const CHAT: &str = r#"{"model":"stub","messages":[{"role":"user","content":"what next?"}]}"#;

fn request(method: &str, path: &str) -> Request<BoxBody<Bytes, Infallible>> {
    let body = if method == "POST" {
        Full::new(Bytes::from_static(CHAT.as_bytes())).boxed()
    } else {
        Empty::new().boxed()
    };
    Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, "127.0.0.1")
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::AUTHORIZATION, "Bearer sk-bench")
        .body(body)
        .expect("a request")
}

/// One whole request and answer; returns its time.
async fn one(
    c: &mut hyper::client::conn::http1::SendRequest<BoxBody<Bytes, Infallible>>,
    method: &str,
    path: &str,
) -> Duration {
    c.ready().await.expect("connection ready");
    let t = Instant::now();
    let resp = c
        .send_request(request(method, path))
        .await
        .expect("request");
    assert!(
        resp.status().is_success(),
        "{method} {path}: {}",
        resp.status()
    );
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let elapsed = t.elapsed();
    assert!(!body.is_empty());
    elapsed
}

/// One streamed answer of `n` events; returns each event's latency (sent
/// upstream to received by the client), in µs.
async fn stream(
    c: &mut hyper::client::conn::http1::SendRequest<BoxBody<Bytes, Infallible>>,
    n: usize,
    gap_us: u64,
) -> Vec<f64> {
    c.ready().await.expect("connection ready");
    let path = format!("/v1/chat/completions?stream={n}&gap_us={gap_us}");
    let resp = c
        .send_request(request("POST", &path))
        .await
        .expect("request");
    let mut body = resp.into_body();
    let mut out = Vec::with_capacity(n);
    let mut pending = String::new();
    while let Some(frame) = body.frame().await {
        let now = now_ns();
        let Ok(data) = frame.expect("frame").into_data() else {
            continue;
        };
        pending.push_str(std::str::from_utf8(&data).expect("utf-8"));
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            let sent: u64 = event
                .trim()
                .strip_prefix("data: ")
                .and_then(|t| t.parse().ok())
                .expect("a timestamped event");
            out.push(now.saturating_sub(sent) as f64 / 1e3);
        }
    }
    assert_eq!(out.len(), n, "events of one stream");
    out
}

fn latency_row(what: &str, direct: Vec<f64>, proxied: Vec<f64>) {
    let (d, p) = (sorted(direct), sorted(proxied));
    let f = |v: f64| format!("{v:.0} µs");
    println!(
        "| {what} | {} / {} / {} | {} / {} / {} | **{:+.0} µs** | {:+.0} µs |",
        f(pct(&d, 0.5)),
        f(pct(&d, 0.95)),
        f(pct(&d, 0.99)),
        f(pct(&p, 0.5)),
        f(pct(&p, 0.95)),
        f(pct(&p, 0.99)),
        pct(&p, 0.5) - pct(&d, 0.5),
        pct(&p, 0.99) - pct(&d, 0.99),
    );
}

fn added_latency(requests: usize, chunks: usize, streams: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        now_ns();
        let stub = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the stub");
        let stub_port = stub.local_addr().unwrap().port();
        tokio::spawn(serve_stub(stub));
        let upstream = Upstream::parse(&format!("http://127.0.0.1:{stub_port}")).unwrap();
        let proxy = Arc::new(Proxy::new(upstream, Arc::new(Open), true));
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let proxy_port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            if let Err(e) = proxy.serve(listener).await {
                eprintln!("proxy: {e}");
            }
        });
        let mut direct = client(stub_port).await;
        let mut proxied = client(proxy_port).await;

        println!("| per | direct: median / p95 / p99 | proxied: median / p95 / p99 | added median | added p99 |");
        println!("|---|---|---|---|---|");
        for (method, path, what) in [
            ("GET", "/v1/models", "request, `GET /v1/models` (no turn)"),
            (
                "POST",
                "/v1/chat/completions",
                "request, `POST /v1/chat/completions` (turn, open gate)",
            ),
        ] {
            let warm = (requests / 10).max(50);
            for _ in 0..warm {
                one(&mut direct, method, path).await;
                one(&mut proxied, method, path).await;
            }
            let (mut d, mut p) = (Vec::new(), Vec::new());
            // Alternated, so that drift of the machine hits both alike.
            for _ in 0..requests {
                d.push(one(&mut direct, method, path).await.as_secs_f64() * 1e6);
                p.push(one(&mut proxied, method, path).await.as_secs_f64() * 1e6);
            }
            latency_row(what, d, p);
        }
        let gap_us = 2000;
        stream(&mut direct, chunks, gap_us).await;
        stream(&mut proxied, chunks, gap_us).await;
        let (mut d, mut p) = (Vec::new(), Vec::new());
        for _ in 0..streams {
            d.extend(stream(&mut direct, chunks, gap_us).await);
            p.extend(stream(&mut proxied, chunks, gap_us).await);
        }
        latency_row(
            &format!("SSE chunk (streams of {chunks}, {} ms apart)", gap_us / 1000),
            d,
            p,
        );
    });
    println!(
        "\nIn one process on 127.0.0.1, {requests} requests per row after {} of warm-up, direct \
         and proxied alternated, each on its own keep-alive connection; a request's time is \
         from sending it to the last byte of its answer. SSE rows: {streams} streams, each \
         event's time from the stub's send to the client's receipt. The proxy's boundary \
         opens every gate at once; {} cores, one tokio runtime for client, proxy and stub.",
        (requests / 10).max(50),
        cores()
    );
}

// ---------------------------------------------------------------- 2, 3. containers

/// The agent, the container's init: waits for the start signal, then each turn
/// does some work (files on even turns, computation only on odd ones), asks
/// the LLM through the proxy (`OPENAI_BASE_URL`, set by the shim) and reads
/// the whole answer, timing it; reports the times, then idles.
const AGENT: &str = r#"
import json, os, time, urllib.request
base = os.environ['OPENAI_BASE_URL']
turns, tag = int(os.environ['BENCH_TURNS']), os.environ['BENCH_TAG']
def call(method, path, body=None):
    req = urllib.request.Request(base + path, method=method, data=body,
        headers={'Content-Type': 'application/json', 'Authorization': 'Bearer sk-bench'})
    return urllib.request.urlopen(req, timeout=900)
for attempt in range(600):
    try:
        call('GET', '/bench/start').read()
        break
    except OSError:
        time.sleep(0.1)
os.makedirs('/root/work', exist_ok=True)
out = []
for k in range(turns):
    if k % 2 == 0:
        for i in range(3):
            with open('/root/work/t%d-%d.py' % (k, i), 'w') as f:
                f.write(('x%d = %d\n' % (k, i)) * (200 * (i + 1)))
    s = sum(i * i for i in range(50000))
    msg = json.dumps({'model': 'stub', 'stream': True,
        'messages': [{'role': 'user', 'content': 'turn %d: %d' % (k, s)}]}).encode()
    t0 = time.monotonic()
    r = call('POST', '/chat/completions', msg)
    r.read(1)
    t1 = time.monotonic()
    r.read()
    out.append([t1 - t0, time.monotonic() - t0])
call('POST', '/bench/done', json.dumps({'tag': tag, 'turns': out}).encode()).read()
while True:
    time.sleep(3600)
"#;

/// The stub LLM of the container parts: `GET /v1/bench/start` waits for
/// [`Llm::go`], `POST /v1/bench/done` hands its body to the bench, anything
/// else waits the think time and answers with SSE chunks. One per process: it
/// listens on the one upstream the test configuration lets an annotation
/// choose (`hack/test-config.sh`).
struct Llm {
    think_ns: Arc<AtomicU64>,
    go: Arc<(Mutex<bool>, Condvar)>,
    done: Mutex<mpsc::Receiver<String>>,
}

impl Llm {
    /// The process's stub, thinking `think` from now on, its start signal not
    /// given and no report left from an earlier part.
    fn get(think: Duration) -> &'static Llm {
        static LLM: OnceLock<Llm> = OnceLock::new();
        let llm = LLM.get_or_init(Llm::listen);
        llm.think_ns
            .store(think.as_nanos() as u64, Ordering::Relaxed);
        *llm.go.0.lock().unwrap() = false;
        let done = llm.done.lock().unwrap();
        while done.try_recv().is_ok() {}
        drop(done);
        llm
    }

    fn listen() -> Llm {
        let l = TcpListener::bind(DOOR_UPSTREAM)
            .unwrap_or_else(|e| panic!("bind the stub LLM on {DOOR_UPSTREAM}: {e}"));
        let think_ns = Arc::new(AtomicU64::new(0));
        let go = Arc::new((Mutex::new(false), Condvar::new()));
        let (tx, done) = mpsc::channel();
        let (g, t) = (go.clone(), think_ns.clone());
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(conn) = conn else { return };
                let (tx, g) = (tx.clone(), g.clone());
                let think = Duration::from_nanos(t.load(Ordering::Relaxed));
                std::thread::spawn(move || llm_answer(conn, think, &g, &tx));
            }
        });
        Llm {
            think_ns,
            go,
            done: Mutex::new(done),
        }
    }

    fn go(&self) {
        *self.go.0.lock().unwrap() = true;
        self.go.1.notify_all();
    }
}

fn llm_answer(
    mut conn: std::net::TcpStream,
    think: Duration,
    go: &(Mutex<bool>, Condvar),
    done: &mpsc::Sender<String>,
) {
    let (head, body) = crab_integration::llm::read_request(&conn);
    let plain = |conn: &mut std::net::TcpStream| {
        let _ =
            conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
    };
    if head.starts_with("GET /v1/bench/start") {
        let mut started = go.0.lock().unwrap();
        while !*started {
            started = go.1.wait(started).unwrap();
        }
        drop(started);
        return plain(&mut conn);
    }
    if head.starts_with("POST /v1/bench/done") {
        let _ = done.send(String::from_utf8_lossy(&body).into_owned());
        return plain(&mut conn);
    }
    std::thread::sleep(think);
    let _ = conn.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    );
    let words = ["ls", " -la", " /root/work"];
    let mut chunks: Vec<String> = words
        .iter()
        .map(|w| format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{w}\"}}}}]}}\n\n"))
        .collect();
    chunks.push("data: [DONE]\n\n".into());
    for chunk in chunks {
        let _ = conn.write_all(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes());
        let _ = conn.flush();
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = conn.write_all(b"0\r\n\r\n");
}

/// What one run of containers gave.
#[derive(Default)]
struct Outcome {
    containers: usize,
    reported: usize,
    /// `crabctl stats --json` of each container.
    stats: Vec<TurnStats>,
    /// Each turn's wait for the answer's first byte beyond the think time, ms.
    extra_ms: Vec<f64>,
    /// Wall time from the start signal to the last report.
    wall: Duration,
}

impl Outcome {
    fn sum(&self, count: fn(&TurnStats) -> u64) -> u64 {
        self.stats.iter().map(count).sum()
    }

    /// Per-container values of a summary's field (of containers with samples).
    fn field(&self, summary: fn(&TurnStats) -> &Summary, q: fn(&Summary) -> f64) -> Vec<f64> {
        sorted(
            self.stats
                .iter()
                .map(summary)
                .filter(|s| s.count > 0)
                .map(q)
                .collect(),
        )
    }

    /// The median of per-container `p50`s.
    fn p50(&self, summary: fn(&TurnStats) -> &Summary) -> f64 {
        pct(&self.field(summary, |s| s.p50), 0.5)
    }

    /// The largest per-container value of `q`.
    fn max_of(&self, summary: fn(&TurnStats) -> &Summary, q: fn(&Summary) -> f64) -> f64 {
        self.field(summary, q).last().copied().unwrap_or(0.0)
    }

    fn hidden(&self) -> f64 {
        let turns = self.sum(|s| s.turns);
        if turns == 0 {
            return 0.0;
        }
        1.0 - self.sum(|s| s.promoted) as f64 / turns as f64
    }

    fn kinds(&self) -> String {
        format!(
            "{} / {} / {} / {}",
            self.sum(|s| s.full),
            self.sum(|s| s.process_only),
            self.sum(|s| s.fs_only),
            self.sum(|s| s.skip)
        )
    }
}

/// `containers` agents of `turns` turns each against a stub LLM thinking `think`.
fn run_agents(containers: usize, turns: usize, think: Duration) -> Outcome {
    let llm = Llm::get(think);
    let annotation = format!("io.crab.proxy.upstream=http://{DOOR_UPSTREAM}");
    let turns_env = format!("BENCH_TURNS={turns}");
    let mut guards = Vec::new();
    for i in 0..containers {
        let tag = format!("BENCH_TAG={i}");
        guards.push(Guard::run_detached(
            CRAB,
            PYTHON,
            &[
                "--annotation",
                &annotation,
                "--env",
                &turns_env,
                "--env",
                &tag,
            ],
            &["python3", "-c", AGENT],
        ));
    }
    // Every agent asks for the start signal once its proxy is up.
    std::thread::sleep(Duration::from_secs(2));
    let started = Instant::now();
    llm.go();
    let deadline = started
        + Duration::from_secs(120)
        + (think + Duration::from_secs(20)) * (turns as u32) * (containers as u32).max(4) / 4;
    let mut out = Outcome {
        containers,
        ..Outcome::default()
    };
    // Turns whose answer came more than 50 ms after the think time.
    let mut slow = Vec::new();
    while out.reported < containers {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(report) = llm.done.lock().unwrap().recv_timeout(left) else {
            eprintln!(
                "only {} of {containers} agents reported within {:?}",
                out.reported,
                started.elapsed()
            );
            break;
        };
        out.reported += 1;
        let v: Value = serde_json::from_str(&report).unwrap_or_default();
        for (k, t) in v["turns"].as_array().into_iter().flatten().enumerate() {
            if let Some(first) = t[0].as_f64() {
                let extra = ((first - think.as_secs_f64()) * 1e3).max(0.0);
                if extra > 50.0 {
                    slow.push(format!("agent {} turn {k}: {extra:.0} ms", v["tag"]));
                }
                out.extra_ms.push(extra);
            }
        }
    }
    out.wall = started.elapsed();
    if !slow.is_empty() {
        eprintln!(
            "note: {containers} containers, think {think:?}: {} of {} turns waited more \
             than 50 ms beyond the think time (first ones: {})",
            slow.len(),
            out.extra_ms.len(),
            slow[..slow.len().min(3)].join(", ")
        );
    }
    for g in &guards {
        let o = crabctl(&["stats", &g.id, "--json"], &[]);
        match serde_json::from_slice::<TurnStats>(&o.stdout) {
            Ok(v) => out.stats.push(v),
            Err(_) => eprintln!("crabctl stats {}: {:?}", g.id, text(&o)),
        }
    }
    out.extra_ms = sorted(std::mem::take(&mut out.extra_ms));
    // The guards remove every container here, also on a panic above.
    drop(guards);
    out
}

fn f1(v: f64) -> String {
    format!("{v:.1}")
}

fn hidden_checkpoints(thinks: &[f64], turns: usize) {
    println!("| think time | turns | full / process / fs / skip | failed | promoted | hidden | answer held p50 / p95 / p99 | checkpoint p50 / p99 | slot wait p99 | agent's wait beyond think p50 / p99 |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for &t in thinks {
        let o = run_agents(1, turns, Duration::from_secs_f64(t));
        let Some(s) = o.stats.first() else {
            println!("| {t} s | no stats | | | | | | | | |");
            continue;
        };
        let g = &s.gating_ms;
        println!(
            "| {t} s | {} | {} | {} | {} | **{:.0}%** | {} / {} / {} ms | {} / {} ms | {} ms | {} / {} ms |",
            o.sum(|s| s.turns),
            o.kinds(),
            o.sum(|s| s.failed),
            o.sum(|s| s.promoted),
            o.hidden() * 100.0,
            f1(g.p50),
            f1(g.p95),
            f1(g.p99),
            f1(s.checkpoint_ms.p50),
            f1(s.checkpoint_ms.p99),
            f1(s.queue_ms.p99),
            f1(pct(&o.extra_ms, 0.5)),
            f1(pct(&o.extra_ms, 0.99)),
        );
    }
    println!(
        "\nOne container per row, {turns} turns; counts and the answer-held, checkpoint and \
         slot-wait figures are the shim's (`crabctl stats --json`); hidden = 1 - promoted / \
         turns (a turn is promoted when the LLM's answer came before its checkpoint was \
         durable). The agent's wait beyond think is its own clock: first byte of the answer \
         minus the stub's think time (so it includes the proxy, connection set-up and \
         Python); {} cores.",
        cores()
    );
}

fn density(sizes: &[usize], turns: usize, think: f64) {
    println!("| containers | turns | failed | hidden | answer held p50 / p95 / p99 (shim) | agent's wait beyond think p50 / p95 / p99 (all turns) | checkpoint p50 / p99 | slot wait p99 | wall |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for &n in sizes {
        let o = run_agents(n, turns, Duration::from_secs_f64(think));
        let e = &o.extra_ms;
        println!(
            "| {n}{} | {} | {} | **{:.0}%** | {} / {} / **{}** ms | {} / {} / {} ms | {} / {} ms | {} ms | {:.0} s |",
            if o.reported < o.containers {
                format!(" ({} reported)", o.reported)
            } else {
                String::new()
            },
            o.sum(|s| s.turns),
            o.sum(|s| s.failed),
            o.hidden() * 100.0,
            f1(o.p50(|s| &s.gating_ms)),
            f1(o.max_of(|s| &s.gating_ms, |q| q.p95)),
            f1(o.max_of(|s| &s.gating_ms, |q| q.p99)),
            f1(pct(e, 0.5)),
            f1(pct(e, 0.95)),
            f1(pct(e, 0.99)),
            f1(o.p50(|s| &s.checkpoint_ms)),
            f1(o.max_of(|s| &s.checkpoint_ms, |q| q.p99)),
            f1(o.max_of(|s| &s.queue_ms, |q| q.p99)),
            o.wall.as_secs_f64(),
        );
    }
    println!(
        "\nThink time {think} s, {turns} turns per container, all agents released at once. \
         The shim keeps each container's samples apart, so the shim's columns merge them: \
         p50 is the median of the containers' p50s, p95 and p99 the largest of their p95s \
         and p99s (with {turns} samples per container, a container's p95 and p99 are its \
         largest sample); hidden = 1 - sum(promoted) / sum(turns). The agent's column merges \
         every turn of every container exactly (first byte minus think time, the agent's \
         clock). Wall: start signal to the last agent's report; {} cores.",
        cores()
    );
}

fn main() {
    let cli = Cli::parse();
    let q = cli.quick;
    let turns = q.or(cli.turns, 10, 6);
    let think = q.or(cli.think, List(vec![0.5, 2.0, 5.0]), List(vec![0.5, 2.0]));
    let sizes = q.or(cli.containers, List(vec![1, 8, 32]), List(vec![1, 8]));
    for part in &cli.parts {
        match part {
            Part::Latency => {
                println!("### Added latency\n");
                added_latency(
                    q.or(cli.requests, 2000, 500),
                    cli.chunks,
                    q.or(cli.streams, 20, 5),
                );
            }
            Part::Hidden => {
                println!("\n### Hidden checkpoints\n");
                hidden_checkpoints(&think, turns);
            }
            Part::Density => {
                println!("\n### Gating at density\n");
                density(&sizes, turns, cli.density_think);
            }
        }
    }
}
