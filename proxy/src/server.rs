//! The proxy's HTTP side: accept, mark turn boundaries, forward, hold the
//! answer until the turn's checkpoint is durable, stream it back.

use std::future::Future;
use std::net::TcpListener;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::{is_turn_boundary, Error, Result};

/// Resolves when what a turn boundary started is durable (or failed, with why).
pub struct Gate(Pin<Box<dyn Future<Output = std::result::Result<(), String>> + Send>>);

impl Gate {
    /// A gate on `f`, which must already be running (spawned) so that it
    /// overlaps with the upstream request.
    pub fn new(f: impl Future<Output = std::result::Result<(), String>> + Send + 'static) -> Gate {
        Gate(Box::pin(f))
    }

    /// A gate that is open at once.
    pub fn open() -> Gate {
        Gate::new(async { Ok(()) })
    }
}

/// What a turn boundary does: start the turn's checkpoint, and say when it is
/// durable. Called once per LLM request, before the request goes upstream.
pub trait Boundary: Send + Sync + 'static {
    /// The agent's turn ended: start the checkpoint and return its gate.
    fn turn(&self) -> Gate;
}

/// Where requests go: a plain-HTTP `host:port`.
#[derive(Debug, Clone)]
pub struct Upstream {
    authority: String,
}

impl Upstream {
    /// Parses `http://host:port` (a path, if any, is ignored: the agent's
    /// request path is kept).
    pub fn parse(url: &str) -> Result<Upstream> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| Error::BadUpstream(url.to_string()))?;
        let authority = rest.split('/').next().unwrap_or("");
        if authority.is_empty() || !authority.contains(':') {
            return Err(Error::BadUpstream(url.to_string()));
        }
        Ok(Upstream {
            authority: authority.to_string(),
        })
    }
}

type Body = BoxBody<Bytes, hyper::Error>;

fn plain(status: StatusCode, msg: String) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(msg))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r
}

/// Serves `listener` (already bound, e.g. in a container's network namespace)
/// until it fails. With `fail_closed`, an answer whose checkpoint failed is
/// replaced by a 503; otherwise the failure is only logged.
pub async fn serve(
    listener: TcpListener,
    upstream: Upstream,
    boundary: Arc<dyn Boundary>,
    fail_closed: bool,
) -> Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener).map_err(|source| Error::Io {
        what: "listen".into(),
        source,
    })?;
    loop {
        let (stream, _) = listener.accept().await.map_err(|source| Error::Io {
            what: "accept".into(),
            source,
        })?;
        let (upstream, boundary) = (upstream.clone(), boundary.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let (upstream, boundary) = (upstream.clone(), boundary.clone());
                async move {
                    Ok::<_, std::convert::Infallible>(
                        forward(req, &upstream, boundary.as_ref(), fail_closed).await,
                    )
                }
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

async fn forward(
    mut req: Request<Incoming>,
    upstream: &Upstream,
    boundary: &dyn Boundary,
    fail_closed: bool,
) -> Response<Body> {
    // Only the method and path are logged: headers carry credentials.
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let gate = is_turn_boundary(&method, &path).then(|| boundary.turn());
    let stream = match TcpStream::connect(&upstream.authority).await {
        Ok(s) => s,
        Err(e) => {
            return plain(
                StatusCode::BAD_GATEWAY,
                format!("crab proxy: cannot reach {}: {e}\n", upstream.authority),
            )
        }
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(x) => x,
        Err(e) => return plain(StatusCode::BAD_GATEWAY, format!("crab proxy: {e}\n")),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "upstream connection ended");
        }
    });
    // Origin-form request line; the Host the upstream expects.
    let path_and_query = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    *req.uri_mut() = path_and_query.parse().expect("a path parses as a URI");
    if let Ok(host) = upstream.authority.parse() {
        req.headers_mut().insert(http::header::HOST, host);
    }
    let resp = match sender.send_request(req).await {
        Ok(r) => r,
        Err(e) => return plain(StatusCode::BAD_GATEWAY, format!("crab proxy: {e}\n")),
    };
    if let Some(gate) = gate {
        // The answer waits for the turn's checkpoint: the agent must not act on
        // it before the state it acts on is safe.
        if let Err(e) = gate.0.await {
            tracing::warn!(%method, %path, error = %e, "turn checkpoint failed");
            if fail_closed {
                return plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("crab proxy: the sandbox checkpoint failed: {e}\n"),
                );
            }
        }
    }
    resp.map(|b| b.boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_need_a_scheme_host_and_port() {
        assert!(Upstream::parse("http://127.0.0.1:8000").is_ok());
        assert!(Upstream::parse("http://llm:80/v1").is_ok());
        assert!(Upstream::parse("https://api.example.com").is_err());
        assert!(Upstream::parse("http://nohost").is_err());
    }
}
