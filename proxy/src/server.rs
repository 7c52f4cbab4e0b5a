//! The proxy's HTTP side: accept, route the agent API, mark turn boundaries,
//! forward, hold the answer until the turn's checkpoint is durable, stream it
//! back.

use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use crate::api::{self, Sandbox};
use crate::turn::Boundary;
use crate::upstream::Upstream;
use crate::{is_turn_boundary, Error, Result};

pub(crate) type Body = BoxBody<Bytes, hyper::Error>;

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

/// One proxy: its upstream, what turn boundaries do, and optionally the agent
/// API. Shared by every listener it serves, so a container that moved to a new
/// network namespace (after a rollback) keeps the same turns and sandbox.
pub struct Proxy {
    upstream: Upstream,
    boundary: Arc<dyn Boundary>,
    sandbox: Option<api::Agent>,
    fail_closed: bool,
    pool: Pool,
}

/// Upstream connections are kept this long after their last answer ended, for
/// later requests; less than the shortest common keep-alive timeout of servers
/// (5 s: uvicorn, Node), so that the upstream seldom closes one as it is reused.
const POOL_IDLE: Duration = Duration::from_secs(4);

/// At most this many idle upstream connections are kept.
const POOL_MAX: usize = 32;

/// An idle upstream connection and when its last answer ended.
type Idle = (Instant, SendRequest<Incoming>);

/// Idle upstream connections (HTTP/1 keep-alive), most recently used last.
#[derive(Clone, Default)]
struct Pool(Arc<Mutex<Vec<Idle>>>);

impl Pool {
    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently used idle connection that is still open, if any.
    fn take(&self) -> Option<SendRequest<Incoming>> {
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
    fn give_back(&self, mut s: SendRequest<Incoming>) {
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
    /// Without [`Proxy::with_sandbox`], the agent API answers 404.
    pub fn new(upstream: Upstream, boundary: Arc<dyn Boundary>, fail_closed: bool) -> Proxy {
        Proxy {
            upstream,
            boundary,
            sandbox: None,
            fail_closed,
            pool: Pool::default(),
        }
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

    /// Serves one already-bound listener (e.g. made in a container's network
    /// namespace by [`crate::netns::bind_in`]) until accepting fails. Call it
    /// once per listener, each in a task of its own.
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
        loop {
            let (stream, _) = listener.accept().await.map_err(|source| Error::Io {
                what: "accept".into(),
                source,
            })?;
            // Answers stream back chunk by chunk: no Nagle delay between them.
            let _ = stream.set_nodelay(true);
            let proxy = self.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let proxy = proxy.clone();
                    async move { Ok::<_, std::convert::Infallible>(proxy.handle(req).await) }
                });
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(error = %e, "client connection ended");
                }
            });
        }
    }

    /// The one place where the agent API is told from proxied traffic.
    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        if api::is_reserved(req.uri().path()) {
            return api::handle(self.sandbox.as_ref(), req).await;
        }
        self.forward(req).await
    }

    async fn forward(&self, mut req: Request<Incoming>) -> Response<Body> {
        // Only the method and path are logged: headers carry credentials.
        let (method, path) = (req.method().clone(), req.uri().path().to_string());
        let gate = is_turn_boundary(&method, &path).then(|| self.boundary.turn());
        let upstream = &self.upstream;
        let bad_gateway = |why: String| {
            tracing::warn!(%method, %path, %upstream, error = %why, "upstream failed");
            plain(
                StatusCode::BAD_GATEWAY,
                format!("crab proxy: upstream {upstream}: {why}\n"),
            )
        };
        // Origin-form request line; the Host the upstream expects.
        let path_and_query = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        *req.uri_mut() = path_and_query.parse().expect("a path parses as a URI");
        if let Ok(host) = upstream.host_header().parse() {
            req.headers_mut().insert(http::header::HOST, host);
        }
        let resp = loop {
            let (mut sender, pooled) = match self.pool.take() {
                Some(s) => (s, true),
                None => match upstream.connect().await {
                    Ok(s) => (s, false),
                    Err(why) => return bad_gateway(why),
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
                    _ => return bad_gateway(format!("request failed: {}", e.error())),
                },
            }
        };
        if let Some(gate) = gate {
            // The answer waits for the turn's checkpoint: the agent must not act
            // on it before the state it acts on is safe.
            let (result, held) = gate.hold().await;
            self.boundary.gated(held);
            if let Err(e) = result {
                tracing::warn!(%method, %path, error = %e, "turn checkpoint failed");
                if self.fail_closed {
                    return plain(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("crab proxy: the sandbox checkpoint failed: {e}\n"),
                    );
                }
            }
        }
        resp.map(|b| b.boxed())
    }
}
