//! The replay LLM: an OpenAI-compatible `/v1/chat/completions` server that
//! answers each run's requests with its trajectory's next tool call, after that
//! turn's think time.
//!
//! A request names its run in `model`. Its turn is the number of tool results
//! in its conversation, so a retried request (after a crash) gets the same
//! answer: the replay is deterministic. The harness sees every request
//! ([`Asked`]), may hold requests from a turn on (a crash is injected while the
//! LLM "thinks"; a held request is reported once its gate is done), and may
//! gate each answer on its own work (a baseline's checkpoint), which then
//! overlaps with the think time.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::trajectory::{Call, Trajectory};

/// Work an answer waits for, started when its request arrives.
pub type GateFuture = Pin<Box<dyn Future<Output = ()> + Send>>;
/// Starts that work for turn `index`.
pub type Gate = Arc<dyn Fn(usize) -> GateFuture + Send + Sync>;

/// A request the replay LLM received.
#[derive(Debug, Clone, Copy)]
pub struct Asked {
    /// The turn it asks for (tool results so far).
    pub index: usize,
    /// When.
    pub at: Instant,
}

struct Run {
    trajectory: Arc<Trajectory>,
    speedup: f64,
    asked: mpsc::UnboundedSender<Asked>,
    /// Requests for this turn or later are held (never answered).
    hold_from: AtomicUsize,
    gate: Option<Gate>,
}

/// The harness's handle on one run.
pub struct RunHandle {
    run: Arc<Run>,
    /// Every request of the run, in order.
    pub asked: mpsc::UnboundedReceiver<Asked>,
}

impl RunHandle {
    /// Holds requests for turn `index` and later (`None`: answer all).
    pub fn hold_from(&self, index: Option<usize>) {
        self.run
            .hold_from
            .store(index.unwrap_or(usize::MAX), Ordering::SeqCst);
    }
}

/// The server.
#[derive(Clone, Default)]
pub struct Replay {
    runs: Arc<Mutex<HashMap<String, Arc<Run>>>>,
}

impl Replay {
    /// Starts serving on 127.0.0.1 (a free port); returns its address.
    pub async fn start(&self) -> std::io::Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let me = self.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let me = me.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let me = me.clone();
                        async move { Ok::<_, std::convert::Infallible>(me.answer(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(addr)
    }

    /// Registers run `id` replaying `trajectory` (think times divided by
    /// `speedup`), its answers gated on `gate` if given.
    pub fn register(
        &self,
        id: &str,
        trajectory: Arc<Trajectory>,
        speedup: f64,
        gate: Option<Gate>,
    ) -> RunHandle {
        let (tx, rx) = mpsc::unbounded_channel();
        let run = Arc::new(Run {
            trajectory,
            speedup,
            asked: tx,
            hold_from: AtomicUsize::new(usize::MAX),
            gate,
        });
        self.lock().insert(id.to_string(), run.clone());
        RunHandle { run, asked: rx }
    }

    /// Forgets run `id`.
    pub fn unregister(&self, id: &str) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Run>>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return reply(StatusCode::BAD_REQUEST, json!({"error": e.to_string()})),
        };
        let Ok(conversation) = serde_json::from_slice::<Value>(&body) else {
            return reply(StatusCode::BAD_REQUEST, json!({"error": "not JSON"}));
        };
        let model = conversation["model"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let Some(run) = self.lock().get(&model).cloned() else {
            return reply(
                StatusCode::NOT_FOUND,
                json!({"error": format!("no run {model:?}")}),
            );
        };
        let index = conversation["messages"]
            .as_array()
            .map(|m| m.iter().filter(|m| m["role"] == "tool").count())
            .unwrap_or(0);
        if index >= run.hold_from.load(Ordering::SeqCst) {
            // The sandbox is about to crash: this answer never comes. The
            // request's own checkpoint (the last completed turn's) is written
            // first, as it is with real think times of seconds.
            if let Some(g) = &run.gate {
                g(index).await;
            }
            let _ = run.asked.send(Asked {
                index,
                at: Instant::now(),
            });
            std::future::pending::<()>().await;
        }
        let _ = run.asked.send(Asked {
            index,
            at: Instant::now(),
        });
        let think = tokio::time::sleep(run.trajectory.think(index, run.speedup));
        match &run.gate {
            Some(g) => {
                tokio::join!(think, g(index));
            }
            None => think.await,
        }
        reply(StatusCode::OK, completion(&model, &run.trajectory, index))
    }
}

fn reply(status: StatusCode, v: Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

/// The chat completion for turn `index`: its tool call, or the end.
pub fn completion(model: &str, t: &Trajectory, index: usize) -> Value {
    let message = match t.turns.get(index) {
        Some(turn) => {
            let (name, args) = match &turn.call {
                Call::Shell { command } => ("shell", json!({ "command": command })),
                Call::WriteFile {
                    path,
                    content,
                    mode,
                } => (
                    "write_file",
                    json!({ "path": path, "content": content, "mode": mode }),
                ),
            };
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": format!("call_{index}"), "type": "function",
                "function": {"name": name, "arguments": args.to_string()}}]})
        }
        None => json!({"role": "assistant", "content": "The task is done."}),
    };
    let finish = if index < t.turns.len() {
        "tool_calls"
    } else {
        "stop"
    };
    json!({"id": format!("replay-{index}"), "object": "chat.completion", "model": model,
           "choices": [{"index": 0, "message": message, "finish_reason": finish}]})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::{State, Turn};

    fn trajectory() -> Trajectory {
        Trajectory {
            format: 1,
            name: "t".into(),
            title: "a task".into(),
            category: "build".into(),
            image: "img".into(),
            workdir: "/sandbox/t".into(),
            turns: vec![
                Turn {
                    think_ms: 1000,
                    call: Call::Shell {
                        command: "ls".into(),
                    },
                },
                Turn {
                    think_ms: 1000,
                    call: Call::WriteFile {
                        path: "a".into(),
                        content: "b".into(),
                        mode: None,
                    },
                },
            ],
            verify: "true".into(),
            state: State {
                paths: vec!["/sandbox/t".into()],
                volatile: vec![],
                probe: None,
            },
        }
    }

    #[test]
    fn each_turn_answers_its_tool_call_and_the_end_stops() {
        let t = trajectory();
        let first = completion("run", &t, 0);
        let call = &first["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "shell");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args["command"], "ls");
        let second = completion("run", &t, 1);
        assert_eq!(
            second["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
            "write_file"
        );
        let end = completion("run", &t, 2);
        assert_eq!(end["choices"][0]["finish_reason"], "stop");
        assert!(end["choices"][0]["message"]["tool_calls"].is_null());
    }

    #[tokio::test]
    async fn a_request_gets_the_turn_its_conversation_reached_and_held_turns_wait() {
        let replay = Replay::default();
        let addr = replay.start().await.unwrap();
        let mut h = replay.register("r1", Arc::new(trajectory()), 1000.0, None);
        let ask = |tools: usize| async move {
            let mut messages = vec![json!({"role": "user", "content": "go"})];
            messages.extend((0..tools).map(|_| json!({"role": "tool", "content": "ok"})));
            let body = json!({"model": "r1", "messages": messages}).to_string();
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .unwrap();
            tokio::spawn(conn);
            let req = http::Request::post("/v1/chat/completions")
                .header("host", "x")
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            let resp = send.send_request(req).await.unwrap();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            serde_json::from_slice::<Value>(&bytes).unwrap()
        };
        let a = ask(1).await;
        assert_eq!(a["id"], "replay-1");
        assert_eq!(h.asked.recv().await.unwrap().index, 1);
        h.hold_from(Some(1));
        let held = tokio::time::timeout(std::time::Duration::from_millis(300), ask(1)).await;
        assert!(held.is_err(), "a held turn was answered");
        assert_eq!(ask(0).await["id"], "replay-0");
    }
}
