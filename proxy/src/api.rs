//! The agent API: what an agent may do to its own sandbox, under the reserved
//! prefix `/.crab/` on the proxy's listener. These requests never go upstream
//! and never end a turn. REST routes live here; MCP (`/.crab/mcp`) in
//! [`crate::mcp`], both on the same operations ([`Op`]).

use std::sync::Arc;

use bytes::Bytes;
use crab_errkind::{ErrorKind, Failure};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde_json::{json, Value};

use crate::limits::{BodyError, GuardedBody};
use crate::ratelimit::limited;
use crate::server::{full, Body};
use crate::turn::TurnContext;

/// The agent API's requests are small JSON objects; more is refused.
const MAX_BODY: usize = 64 * 1024;

/// The most forks one request may ask for.
pub(crate) const MAX_FORKS: u32 = 64;

/// What an agent may do to the proxy's own container (and only that one: there
/// is no id parameter). The methods block (they talk to the runtime); the
/// proxy calls them on tokio's blocking pool. An `Err` is sent back to the
/// agent as is, with the HTTP status of its kind (404 for a missing
/// checkpoint, 409 while another operation runs, ...).
pub trait Sandbox: Send + Sync + 'static {
    /// The container's checkpoints, as a JSON array.
    fn list(&self) -> std::result::Result<Value, Failure>;
    /// Takes a checkpoint now, optionally named; returns its entry. `caller`:
    /// the connection the request came on (the caller may run in a process
    /// the checkpoint would wait for, such as an exec: then it must not wait).
    fn checkpoint(
        &self,
        name: Option<String>,
        caller: &TurnContext,
    ) -> std::result::Result<Value, Failure>;
    /// Rolls the container back to `checkpoint` (a name or a sequence number).
    /// `caller`: the connection the request came on (the caller may live in the
    /// sandbox: then only its files should go back, so that it gets the answer).
    fn rollback(
        &self,
        checkpoint: &str,
        caller: &TurnContext,
    ) -> std::result::Result<Value, Failure>;
    /// Starts `count` copies of the container from `checkpoint` (the latest
    /// when `None`); returns the new containers' ids.
    fn fork(
        &self,
        checkpoint: Option<String>,
        count: u32,
    ) -> std::result::Result<Vec<String>, Failure>;
}

/// The agent API's side of a proxy: the sandbox it acts on, and the token a
/// request must carry.
pub(crate) struct Agent {
    pub(crate) sandbox: Arc<dyn Sandbox>,
    pub(crate) token: Vec<u8>,
}

/// Whether `given` equals `expected`, in time that does not depend on where they
/// differ (an attacker in the namespace could otherwise guess it byte by byte).
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    if given.len() != expected.len() {
        return false;
    }
    let diff = given
        .iter()
        .zip(expected)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    std::hint::black_box(diff) == 0
}

/// Whether the request carries the sandbox's token as a bearer credential. An
/// empty expected token lets nothing through.
fn authorized(req: &Request<GuardedBody>, token: &[u8]) -> bool {
    let Some(v) = req.headers().get(http::header::AUTHORIZATION) else {
        return false;
    };
    let v = v.as_bytes();
    let Some(given) = v
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case(b"bearer "))
        .map(|_| &v[7..])
    else {
        return false;
    };
    !token.is_empty() && same_secret(given.trim_ascii(), token)
}

/// One thing the agent asked for, its arguments checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Op {
    List,
    Checkpoint {
        name: Option<String>,
    },
    Rollback {
        checkpoint: String,
    },
    Fork {
        checkpoint: Option<String>,
        count: u32,
    },
}

/// Which operation, before its arguments are read.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    List,
    Checkpoint,
    Rollback,
    Fork,
}

impl Op {
    /// Reads the arguments of `kind` from a JSON object (`null` counts as `{}`).
    /// Unknown fields are refused: a misspelt `checkpoint` must not silently
    /// fork or roll back to the latest one.
    pub(crate) fn parse(kind: Kind, args: Value) -> std::result::Result<Op, String> {
        let mut args = match args {
            Value::Null => serde_json::Map::new(),
            Value::Object(m) => m,
            other => return Err(format!("expected a JSON object, got {other}")),
        };
        let allowed: &[&str] = match kind {
            Kind::List => &[],
            Kind::Checkpoint => &["name"],
            Kind::Rollback => &["checkpoint"],
            Kind::Fork => &["checkpoint", "count"],
        };
        if let Some(k) = args.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(format!("unknown field {k:?} (expected: {allowed:?})"));
        }
        let checkpoint = reference(args.remove("checkpoint"))?;
        Ok(match kind {
            Kind::List => Op::List,
            Kind::Checkpoint => Op::Checkpoint {
                name: match args.remove("name") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(s)) if !s.is_empty() => Some(s),
                    Some(v) => return Err(format!("\"name\" must be a non-empty string, got {v}")),
                },
            },
            Kind::Rollback => Op::Rollback {
                checkpoint: checkpoint.ok_or("missing field \"checkpoint\"")?,
            },
            Kind::Fork => Op::Fork {
                checkpoint,
                count: match args.remove("count") {
                    None | Some(Value::Null) => 1,
                    Some(v) => v
                        .as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .filter(|n| (1..=MAX_FORKS).contains(n))
                        .ok_or(format!("\"count\" must be 1 to {MAX_FORKS}, got {v}"))?,
                },
            },
        })
    }

    /// Runs the operation on the blocking pool; the answer is the JSON object
    /// both the REST routes and the MCP tools give back.
    pub(crate) async fn run(
        self,
        sandbox: Arc<dyn Sandbox>,
        caller: TurnContext,
    ) -> std::result::Result<Value, Failure> {
        tokio::task::spawn_blocking(move || {
            Ok(match self {
                Op::List => json!({ "checkpoints": sandbox.list()? }),
                Op::Checkpoint { name } => {
                    json!({ "checkpoint": sandbox.checkpoint(name, &caller)? })
                }
                Op::Rollback { checkpoint } => {
                    json!({ "rolled_back": sandbox.rollback(&checkpoint, &caller)? })
                }
                Op::Fork { checkpoint, count } => {
                    json!({ "ids": sandbox.fork(checkpoint, count)? })
                }
            })
        })
        .await
        .map_err(|e| Failure::new(ErrorKind::Internal, format!("the sandbox call failed: {e}")))?
    }
}

/// A checkpoint named by a string, or by its sequence number.
fn reference(v: Option<Value>) -> std::result::Result<Option<String>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
        Some(Value::Number(n)) if n.is_u64() => Ok(Some(n.to_string())),
        Some(v) => Err(format!(
            "\"checkpoint\" must be a name or a sequence number, got {v}"
        )),
    }
}

/// Whether `path` is under the reserved prefix.
pub(crate) fn is_reserved(path: &str) -> bool {
    path == "/.crab" || path.starts_with("/.crab/")
}

pub(crate) fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    full(status, "application/json", Bytes::from(v.to_string()))
}

fn error(status: StatusCode, msg: impl std::fmt::Display) -> Response<Body> {
    json_response(status, &json!({ "error": msg.to_string() }))
}

fn method_not_allowed(allow: &'static str) -> Response<Body> {
    let mut r = error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method not allowed (allowed: {allow})"),
    );
    r.headers_mut()
        .insert(http::header::ALLOW, http::HeaderValue::from_static(allow));
    r
}

/// A browser page (in the sandbox or reached through DNS rebinding) must not
/// drive the agent API: a request it sends carries an `Origin`, and only
/// loopback origins are let through. Agents' HTTP clients send none.
fn foreign_origin(req: &Request<GuardedBody>) -> bool {
    let Some(origin) = req.headers().get(http::header::ORIGIN) else {
        return false;
    };
    let origin = origin.to_str().unwrap_or("");
    let host = origin
        .split_once("://")
        .map(|(_, rest)| rest)
        .unwrap_or("")
        .split('/')
        .next()
        .unwrap_or("");
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    !(host == "localhost" || host == "::1" || host.starts_with("127."))
}

/// Reads the whole body as JSON; an empty body is `null`.
pub(crate) async fn read_json(
    body: GuardedBody,
) -> std::result::Result<Value, (StatusCode, String)> {
    let bytes = Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|e| {
            let status = match e.downcast_ref::<BodyError>() {
                Some(BodyError::Timeout(_)) => StatusCode::REQUEST_TIMEOUT,
                Some(BodyError::Read(_)) => StatusCode::BAD_REQUEST,
                // Limited's own error, or the proxy's body limit.
                _ => StatusCode::PAYLOAD_TOO_LARGE,
            };
            (
                status,
                format!("cannot read the body (at most {MAX_BODY} bytes): {e}"),
            )
        })?
        .to_bytes();
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            format!("the body is not JSON: {e}"),
        )
    })
}

/// Answers a request under `/.crab/`.
pub(crate) async fn handle(
    agent: Option<&Agent>,
    req: Request<GuardedBody>,
    caller: TurnContext,
) -> Response<Body> {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    limited!(info, %method, %path, "agent API");
    let Some(agent) = agent else {
        return error(
            StatusCode::NOT_FOUND,
            "the agent API is off: this proxy has no sandbox to act on",
        );
    };
    if foreign_origin(&req) {
        return error(StatusCode::FORBIDDEN, "requests from web pages are refused");
    }
    if !authorized(&req, &agent.token) {
        limited!(warn, %method, %path, "agent API request without the sandbox's token");
        let mut r = error(
            StatusCode::UNAUTHORIZED,
            "the agent API needs the sandbox's token: Authorization: Bearer $CRAB_API_TOKEN",
        );
        r.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer realm=\"crab\""),
        );
        return r;
    }
    let sandbox = agent.sandbox.clone();
    let kind = match (path.as_str(), &method) {
        ("/.crab/mcp", &Method::POST) => return crate::mcp::handle(sandbox, req, caller).await,
        ("/.crab/mcp", _) => return method_not_allowed("POST"),
        ("/.crab/v1/checkpoints", &Method::GET) => Kind::List,
        ("/.crab/v1/checkpoints", &Method::POST) => Kind::Checkpoint,
        ("/.crab/v1/checkpoints", _) => return method_not_allowed("GET, POST"),
        ("/.crab/v1/rollback", &Method::POST) => Kind::Rollback,
        ("/.crab/v1/fork", &Method::POST) => Kind::Fork,
        ("/.crab/v1/rollback" | "/.crab/v1/fork", _) => return method_not_allowed("POST"),
        _ => {
            return error(
                StatusCode::NOT_FOUND,
                format!("no such agent API path {path}"),
            )
        }
    };
    let args = match kind {
        Kind::List => Value::Null,
        _ => match read_json(req.into_body()).await {
            Ok(v) => v,
            Err((status, msg)) => return error(status, msg),
        },
    };
    let op = match Op::parse(kind, args) {
        Ok(op) => op,
        Err(msg) => return error(StatusCode::BAD_REQUEST, msg),
    };
    let created = matches!(op, Op::Checkpoint { .. });
    match op.run(sandbox, caller).await {
        Ok(v) if created => json_response(StatusCode::CREATED, &v),
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(failure) => {
            limited!(warn, %method, %path, kind = %failure.kind, error = %failure, "agent API call failed");
            let status = StatusCode::from_u16(failure.kind.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            json_response(
                status,
                &json!({ "error": failure.message, "kind": failure.kind }),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked() {
        assert_eq!(
            Op::parse(Kind::Checkpoint, Value::Null),
            Ok(Op::Checkpoint { name: None })
        );
        assert_eq!(
            Op::parse(Kind::Rollback, json!({"checkpoint": 3})),
            Ok(Op::Rollback {
                checkpoint: "3".into()
            })
        );
        assert!(Op::parse(Kind::Rollback, json!({})).is_err());
        assert!(Op::parse(Kind::Rollback, json!({"checkpoint": true})).is_err());
        assert_eq!(
            Op::parse(Kind::Fork, json!({})),
            Ok(Op::Fork {
                checkpoint: None,
                count: 1
            })
        );
        assert!(Op::parse(Kind::Fork, json!({"count": 0})).is_err());
        assert!(Op::parse(Kind::Fork, json!({"count": 65})).is_err());
        assert!(Op::parse(Kind::Fork, json!({"chekpoint": "a"})).is_err());
        assert!(Op::parse(Kind::List, json!([1])).is_err());
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abcd", b"abcd"));
        assert!(!same_secret(b"abcd", b"abcx"));
        assert!(!same_secret(b"abc", b"abcd"));
    }

    #[test]
    fn the_prefix_is_reserved() {
        assert!(is_reserved("/.crab/v1/fork"));
        assert!(is_reserved("/.crab"));
        assert!(!is_reserved("/.crabby"));
        assert!(!is_reserved("/v1/messages"));
    }
}
