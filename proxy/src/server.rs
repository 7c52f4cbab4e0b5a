//! The proxy's HTTP side: accept, route the agent API, mark turn boundaries,
//! forward, hold the answer until the turn's checkpoint is durable, stream it
//! back.

use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as _, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;

use crate::api::{self, Sandbox};
use crate::door::Door;
use crate::journal::{self, Journal, Prepared, Recording};
use crate::limits::{self, Cut, GuardedBody, Limits};
use crate::ratelimit::limited;
use crate::target;
use crate::turn::{Boundary, Gate, TurnContext};
use crate::upstream::Upstream;
use crate::{is_turn_boundary, Error, Result};

/// What an answer's body may fail with: the upstream's error, or reading a
/// journaled answer.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub(crate) type Body = BoxBody<Bytes, BoxError>;

/// A whole (not streamed) answer.
pub(crate) fn full(status: StatusCode, content_type: &str, body: Bytes) -> Response<Body> {
    let mut r = Response::new(Full::new(body).map_err(|never| match never {}).boxed());
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    r
}

fn plain(status: StatusCode, msg: String) -> Response<Body> {
    full(status, "text/plain; charset=utf-8", Bytes::from(msg))
}

/// A refusal after which the connection is closed: the request's body (if
/// any) is not read, so the next request could not be told from it.
pub(crate) fn refusal(status: StatusCode, msg: String) -> Response<Body> {
    let mut r = plain(status, msg);
    r.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    r
}

/// One proxy: its upstream, what turn boundaries do, and optionally the agent
/// API. Shared by every listener it serves, so a container that moved to a new
/// network namespace (after a rollback) keeps the same turns and sandbox.
pub struct Proxy {
    upstream: Upstream,
    boundary: Arc<dyn Boundary>,
    sandbox: Option<api::Agent>,
    fail_closed: bool,
    pool: Pool,
    limits: Limits,
    /// One permit per client connection served: the cap.
    connections: Arc<Semaphore>,
    journal: Option<Arc<Journal>>,
}

/// Upstream connections are kept this long after their last answer ended, for
/// later requests; less than the shortest common keep-alive timeout of servers
/// (5 s: uvicorn, Node), so that the upstream seldom closes one as it is reused.
const POOL_IDLE: Duration = Duration::from_secs(4);

/// At most this many idle upstream connections are kept.
const POOL_MAX: usize = 32;

/// An idle upstream connection and when its last answer ended.
type Idle = (Instant, SendRequest<GuardedBody>);

/// Idle upstream connections (HTTP/1 keep-alive), most recently used last.
#[derive(Clone, Default)]
struct Pool(Arc<Mutex<Vec<Idle>>>);

impl Pool {
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently used idle connection that is still open, if any.
    fn take(&self) -> Option<SendRequest<GuardedBody>> {
        let mut idle = self.idle();
        while let Some((since, s)) = idle.pop() {
            if since.elapsed() < POOL_IDLE && s.is_ready() {
                return Some(s);
            }
        }
        None
    }

    /// Keeps `s` for reuse once its answer has been read to the end (an answer
    /// dropped halfway, or `Connection: close`, ends the connection instead).
    fn give_back(&self, mut s: SendRequest<GuardedBody>) {
        let pool = self.clone();
        tokio::spawn(async move {
            if s.ready().await.is_ok() {
                let mut idle = pool.idle();
                idle.retain(|(since, s)| since.elapsed() < POOL_IDLE && !s.is_closed());
                if idle.len() < POOL_MAX {
                    idle.push((Instant::now(), s));
                }
            }
        });
    }
}

impl Proxy {
    /// A proxy to `upstream`. With `fail_closed`, an answer whose checkpoint
    /// failed is replaced by a 503; otherwise the failure is only logged.
    /// Without [`Proxy::with_sandbox`], the agent API answers 404; without
    /// [`Proxy::with_limits`], the default [`Limits`] hold.
    pub fn new(upstream: Upstream, boundary: Arc<dyn Boundary>, fail_closed: bool) -> Proxy {
        let limits = Limits::default();
        Proxy {
            upstream,
            boundary,
            sandbox: None,
            fail_closed,
            pool: Pool::default(),
            connections: Arc::new(Semaphore::new(limits.max_connections)),
            limits,
            journal: None,
        }
    }

    /// Journals each turn's exchange in `journal`, and answers a restored
    /// agent's repeated requests from it while its replay plan lasts.
    pub fn with_journal(mut self, journal: Arc<Journal>) -> Proxy {
        self.journal = Some(journal);
        self
    }

    /// Turns on the agent API (`/.crab/`) on every listener, acting on `sandbox`,
    /// for requests that carry `token` (`Authorization: Bearer <token>`); others
    /// get 401. A process that only shares the sandbox's network namespace does
    /// not know the token.
    pub fn with_sandbox(mut self, sandbox: Arc<dyn Sandbox>, token: &str) -> Proxy {
        self.sandbox = Some(api::Agent {
            sandbox,
            token: token.as_bytes().to_vec(),
        });
        self
    }

    /// Sets the connection cap, the timeouts and the body limit.
    pub fn with_limits(mut self, limits: Limits) -> Proxy {
        self.connections = Arc::new(Semaphore::new(limits.max_connections));
        self.limits = limits;
        self
    }

    /// Serves one already-bound listener (e.g. made in a container's network
    /// namespace) until the listener itself is
    /// unusable. Call it once per listener, each in a task of its own. A
    /// connection beyond the cap is answered 503 and closed at once; a
    /// failing accept (out of descriptors, say) is retried, not fatal.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> Result<()> {
        // A std listener must be non-blocking before tokio takes it.
        listener.set_nonblocking(true).map_err(|source| Error::Io {
            what: "make the listener non-blocking".into(),
            source,
        })?;
        let listener = tokio::net::TcpListener::from_std(listener).map_err(|source| Error::Io {
            what: "listen".into(),
            source,
        })?;
        self.serve_door(listener, |_| Ok(())).await
    }

    /// Serves `door` until it is unusable: each connection `admit` lets in is
    /// served under the cap; one it refuses gets a 403, one over the cap a 503.
    pub(crate) async fn serve_door<D: Door>(
        self: Arc<Self>,
        door: D,
        admit: impl Fn(&D::Conn) -> std::result::Result<(), String>,
    ) -> Result<()> {
        loop {
            let (stream, ctx) = match door.accept().await {
                Ok(accepted) => accepted,
                Err(source) if listener_broken(&source) => {
                    return Err(Error::Io {
                        what: "accept".into(),
                        source,
                    })
                }
                Err(e) => {
                    limited!(warn, error = %e, "accept failed; retrying");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            if let Err(why) = admit(&stream) {
                limited!(warn, %why, "connection refused: the caller may not use this door");
                D::answer(&stream, FORBIDDEN);
                continue;
            }
            let Ok(permit) = self.connections.clone().try_acquire_owned() else {
                limited!(
                    warn,
                    max_connections = self.limits.max_connections,
                    "connection refused: the proxy serves its most connections"
                );
                D::answer(&stream, REFUSED);
                continue;
            };
            let proxy = self.clone();
            tokio::spawn(async move {
                proxy.serve_connection_from(stream, ctx).await;
                drop(permit);
            });
        }
    }

    /// Serves HTTP/1 on one client connection that has no peer address (tests
    /// and the fuzz target give it in-memory streams); see
    /// [`Proxy::serve_connection_from`].
    pub async fn serve_connection<IO>(self: Arc<Self>, io: IO)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        self.serve_connection_from(io, TurnContext::default()).await
    }

    /// Serves HTTP/1 on one client connection until it ends, with the header
    /// timeout and the buffer bounds; its turns carry `ctx`. [`Proxy::serve`]
    /// calls it for each connection it accepts under the cap.
    pub async fn serve_connection_from<IO>(self: Arc<Self>, io: IO, ctx: TurnContext)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let proxy = self.clone();
        let service = service_fn(move |req| {
            let proxy = proxy.clone();
            async move { Ok::<_, std::convert::Infallible>(proxy.handle(req, ctx).await) }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout)
            .max_buf_size(limits::CLIENT_BUF)
            .max_header_size(limits::MAX_HEAD)
            // Copy into one bounded buffer rather than queue the upstream's
            // chunks, however many a slow reader leaves unread.
            .writev(false);
        if let Err(e) = builder.serve_connection(TokioIo::new(io), service).await {
            limited!(debug, error = %e, "client connection ended");
        }
    }

    /// The one place where the agent API is told from proxied traffic, after
    /// the checks every request passes.
    async fn handle(&self, req: Request<Incoming>, ctx: TurnContext) -> Response<Body> {
        let target = match target::origin_form(req.uri()) {
            Ok(t) => t,
            Err(e) => {
                limited!(info, method = %req.method(), error = %e, "bad request target");
                return refusal(StatusCode::BAD_REQUEST, format!("crab proxy: {e}\n"));
            }
        };
        if req.body().size_hint().lower() > self.limits.max_body {
            return refusal(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "crab proxy: the request body is over {} bytes\n",
                    self.limits.max_body
                ),
            );
        }
        let cut = Cut::default();
        let req = req.map(|body| GuardedBody::new(body, &self.limits, cut.clone()));
        if api::is_reserved(target.path()) {
            return api::handle(self.sandbox.as_ref(), req, ctx).await;
        }
        self.forward(req, target, cut, ctx).await
    }

    async fn forward(
        &self,
        mut req: Request<GuardedBody>,
        target: PathAndQuery,
        cut: Cut,
        ctx: TurnContext,
    ) -> Response<Body> {
        // Only the method and path are logged: headers carry credentials.
        let (method, path) = (req.method().clone(), target.path().to_string());
        let turn = is_turn_boundary(&method, target.as_str());
        let journal = self.journal.as_ref().filter(|_| turn);
        let mut digest = None;
        if let Some(j) = journal {
            // An agent outside is never restored: its requests are not the
            // restored agent's to replay, nor to journal.
            if !ctx.outside {
                match journal::prepare(j, req, &path, &cut, &self.limits).await {
                    Prepared::Answer(answer) => return answer,
                    Prepared::Live(r, d) => (req, digest) = (r, Some(d)),
                }
            }
            j.barrier().await;
        }
        // The turn starts once the agent's request has come whole, not at its
        // head: a checkpoint started at the head could freeze the agent half
        // way through writing a body larger than the socket buffers, and the
        // request would reach the LLM only after the dump (not beside it), or
        // never if the sandbox crashed in it. The body still streams.
        let (mut req, turn_started) = if turn {
            let (parts, body) = req.into_parts();
            let (body, whole) = body.ending();
            let boundary = self.boundary.clone();
            let started = tokio::spawn(async move {
                // A body that failed or was dropped (the upstream answered
                // early) starts the turn too, as the head did before.
                let _ = whole.await;
                boundary.turn(&ctx)
            });
            (Request::from_parts(parts, body), Some(started))
        } else {
            (req, None)
        };
        let upstream = &self.upstream;
        let limits = &self.limits;
        let failed = |why: String| {
            if let Some((status, msg)) = cut.why(limits) {
                return refusal(status, format!("crab proxy: {msg}\n"));
            }
            limited!(warn, %method, %path, %upstream, error = %why, "upstream failed");
            plain(
                StatusCode::BAD_GATEWAY,
                format!("crab proxy: upstream {upstream}: {why}\n"),
            )
        };
        // Origin-form request line; the Host the upstream expects.
        *req.uri_mut() = Uri::from(target);
        if let Ok(host) = upstream.host_header().parse() {
            req.headers_mut().insert(http::header::HOST, host);
        }
        let resp = loop {
            let (mut sender, pooled) = match self.pool.take() {
                Some(s) => (s, true),
                None => match upstream.connect().await {
                    Ok(s) => (s, false),
                    Err(why) => return failed(why),
                },
            };
            match sender.try_send_request(req).await {
                Ok(r) => {
                    self.pool.give_back(sender);
                    break r;
                }
                // An idle connection the upstream closed: the request was not
                // written, so it goes on a new connection.
                Err(mut e) => match e.take_message() {
                    Some(unsent) if pooled => req = unsent,
                    _ => return failed(format!("request failed: {}", e.error())),
                },
            }
        };
        let mut seq = None;
        if let Some(started) = turn_started {
            let gate = match started.await {
                Ok(gate) => gate,
                Err(e) => Gate::new(async move { Err(format!("the turn did not start: {e}")) }),
            };
            // The answer waits for the turn's checkpoint: the agent must not act
            // on it before the state it acts on is safe.
            let (result, held) = gate.hold().await;
            self.boundary.gated(held);
            match result {
                Ok(s) => seq = s,
                Err(e) => {
                    limited!(warn, %method, %path, error = %e, "turn checkpoint failed");
                    if self.fail_closed {
                        return plain(
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("crab proxy: the sandbox checkpoint failed: {e}\n"),
                        );
                    }
                }
            }
        }
        // Journaled only with a checkpoint to replay it after.
        if let (Some(j), Some(seq), Some(digest)) = (journal, seq, digest) {
            let content_type = resp
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let rec = Recording {
                seq,
                path,
                status: resp.status(),
                content_type,
                digest,
            };
            return resp.map(|b| j.record(rec, b));
        }
        resp.map(|b| b.map_err(Into::into).boxed())
    }
}

/// After a failed accept that is not the listener's own fault, wait this
/// long: out of descriptors, accepting again at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Whether accept failed because the listener itself is unusable (then
/// retrying is pointless), rather than for a passing reason (EMFILE, ENFILE,
/// ENOBUFS, ENOMEM, ECONNABORTED, ...).
fn listener_broken(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EBADF | libc::EINVAL | libc::ENOTSOCK | libc::EOPNOTSUPP)
    )
}

/// What a connection over the cap gets before it is closed.
const REFUSED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n\
Content-Length: 51\r\nConnection: close\r\nRetry-After: 1\r\n\r\n\
crab proxy: too many connections; try again later\r\n";

/// What a connection from a caller the door does not admit gets.
const FORBIDDEN: &[u8] = b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\n\
Content-Length: 41\r\nConnection: close\r\n\r\n\
crab proxy: this caller may not connect\r\n";
