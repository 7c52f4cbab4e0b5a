//! A scripted LLM on the host that speaks Anthropic's Messages API, for running
//! a real, unmodified agent (Claude Code) against it.
//!
//! Each `POST /v1/messages` of the agent's main loop (a request offering the
//! `Bash` tool) gets the [`Step`] of the script at its place in the
//! conversation (step `i` answers a conversation holding `i` answers of the
//! assistant, so a request sent again gets the same step), streamed as the API does
//! (`message_start`, `content_block_start`, `content_block_delta`s with
//! `input_json_delta` or `text_delta`, `content_block_stop`, `message_delta`
//! with the stop reason, `message_stop`), or as one JSON message when the
//! request did not ask to stream. Side requests (no `Bash` tool, such as a
//! title or quota check) get a short text answer and leave the script where it
//! was. `POST /v1/messages/count_tokens` gets a count, `HEAD`/`GET /` an empty
//! 200; anything else a 404 in the API's error shape, and a line on stderr.
//! Every request is recorded.

use serde_json::{json, Value};

use crate::scripted::{self, Hold, Reply, Request, Script};

/// One answer of the script.
#[derive(Clone, Debug)]
pub enum Step {
    /// A `tool_use` block of the named tool with this input; stop reason `tool_use`.
    Tool(&'static str, Value),
    /// A text answer; stop reason `end_turn`.
    Text(&'static str),
}

/// One request as the server saw it.
pub use crate::scripted::Seen;

impl Seen {
    /// Whether it is a Messages API call (what the turn proxy counts as a turn).
    pub fn is_message(&self) -> bool {
        self.method == "POST" && self.target.split('?').next() == Some("/v1/messages")
    }

    /// The `tool_result` blocks of its messages: (tool_use_id, content as text).
    pub fn tool_results(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for m in self.body["messages"].as_array().into_iter().flatten() {
            for b in m["content"].as_array().into_iter().flatten() {
                if b["type"] == "tool_result" {
                    let content = match &b["content"] {
                        Value::String(s) => s.clone(),
                        v => v.to_string(),
                    };
                    out.push((b["tool_use_id"].as_str().unwrap_or("").into(), content));
                }
            }
        }
        out
    }
}

/// A running scripted server of Anthropic's Messages API; it lives as long as the
/// test process.
pub type Scripted = scripted::Server<Anthropic>;

/// Anthropic's Messages API, as [`Scripted`] speaks it.
pub struct Anthropic;

/// The id the server gives the `tool_use` block of step `i`.
pub fn tool_use_id(i: usize) -> String {
    format!("toolu_crab_{i:02}")
}

impl scripted::Api for Anthropic {
    type Step = Step;
    const NAME: &'static str = "scripted Anthropic server";
    const REQUEST_ID_HEADER: &'static str = "request-id";

    fn answer(request: &Request, script: &Script<Step>, hold: &Hold) -> (Option<usize>, Reply) {
        let (method, path, body) = (&request.method, &request.path, &request.body);
        let mut step = None;
        let reply = match (method.as_str(), path.as_str()) {
            ("POST", "/v1/messages") => {
                let main_loop = body["tools"]
                    .as_array()
                    .is_some_and(|t| t.iter().any(|t| t["name"] == "Bash"));
                let answer = if main_loop {
                    let i = script.step_for(body, hold);
                    step = Some(i);
                    (i, script.steps[i].clone())
                } else {
                    (usize::MAX, Step::Text("OK"))
                };
                let model = body["model"]
                    .as_str()
                    .unwrap_or("claude-scripted")
                    .to_string();
                if body["stream"] == true {
                    (200, "text/event-stream", sse(&model, answer.0, &answer.1))
                } else {
                    let m = message(&model, answer.0, &answer.1);
                    (200, "application/json", m.to_string())
                }
            }
            ("POST", "/v1/messages/count_tokens") => (
                200,
                "application/json",
                json!({"input_tokens": body.to_string().len() / 4}).to_string(),
            ),
            ("HEAD" | "GET", "/") => (200, "application/json", String::new()),
            _ => {
                eprintln!(
                    "scripted Anthropic server: unexpected {method} {}",
                    request.target
                );
                let e = json!({"type": "error", "error": {"type": "not_found_error",
                    "message": format!("{method} {path} is not scripted")}});
                (404, "application/json", e.to_string())
            }
        };
        (step, reply)
    }
}

/// The content block of step `i`, complete.
fn block(i: usize, step: &Step) -> Value {
    match step {
        Step::Tool(name, input) => {
            json!({"type": "tool_use", "id": tool_use_id(i), "name": name, "input": input})
        }
        Step::Text(text) => json!({"type": "text", "text": text}),
    }
}

fn stop_reason(step: &Step) -> &'static str {
    match step {
        Step::Tool(..) => "tool_use",
        Step::Text(_) => "end_turn",
    }
}

/// The whole answer as one message (a request that did not ask to stream).
fn message(model: &str, i: usize, step: &Step) -> Value {
    json!({"id": format!("msg_crab_{i:02}"), "type": "message", "role": "assistant",
        "model": model, "content": [block(i, step)], "stop_reason": stop_reason(step),
        "stop_sequence": null, "usage": {"input_tokens": 100, "output_tokens": 20}})
}

/// The answer as the API streams it: one content block, its delta in two parts.
fn sse(model: &str, i: usize, step: &Step) -> String {
    let mut start = message(model, i, step);
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    start["usage"]["output_tokens"] = json!(1);
    let (empty, parts): (Value, Vec<Value>) = match step {
        Step::Tool(name, input) => {
            let whole = input.to_string();
            let (a, b) = whole.split_at(whole.len() / 2);
            (
                json!({"type": "tool_use", "id": tool_use_id(i), "name": name, "input": {}}),
                [a, b]
                    .iter()
                    .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
                    .collect(),
            )
        }
        Step::Text(text) => {
            let cut = text
                .char_indices()
                .nth(text.chars().count() / 2)
                .map_or(0, |c| c.0);
            let (a, b) = text.split_at(cut);
            (
                json!({"type": "text", "text": ""}),
                [a, b]
                    .iter()
                    .map(|p| json!({"type": "text_delta", "text": p}))
                    .collect(),
            )
        }
    };
    let mut events = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": start}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": empty}),
        ),
    ];
    for delta in parts {
        events.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        ));
    }
    events.push((
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push((
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason(step),
            "stop_sequence": null}, "usage": {"output_tokens": 20}}),
    ));
    events.push(("message_stop", json!({"type": "message_stop"})));
    events
        .iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    fn post(port: u16, body: &Value) -> String {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let body = body.to_string();
        write!(
            c,
            "POST /v1/messages?beta=true HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn test_a_tool_use_streams_in_the_apis_order_and_its_deltas_join_to_the_input() {
        let input = json!({"command": "echo hi", "description": "Say hi"});
        let text = sse("m", 3, &Step::Tool("Bash", input.clone()));
        let events: Vec<Value> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(events[1]["content_block"]["id"], tool_use_id(3));
        let joined: String = events[2..4]
            .iter()
            .map(|e| e["delta"]["partial_json"].as_str().unwrap())
            .collect();
        assert_eq!(serde_json::from_str::<Value>(&joined).unwrap(), input);
        assert_eq!(events[5]["delta"]["stop_reason"], "tool_use");
    }

    /// A main-loop request whose conversation holds `answers` of the assistant.
    fn main_loop(answers: usize) -> Value {
        let mut messages = vec![json!({"role": "user", "content": "task"})];
        for _ in 0..answers {
            messages.push(json!({"role": "assistant", "content": "done"}));
            messages.push(json!({"role": "user", "content": "result"}));
        }
        json!({"model": "m", "tools": [{"name": "Bash"}], "messages": messages})
    }

    #[test]
    fn test_holding_the_next_step_lets_the_held_one_go_and_holds_the_next() {
        let s = Scripted::start(vec![Step::Text("first"), Step::Text("second")]);
        let port = s.port;
        s.hold_step(0);
        let first = std::thread::spawn(move || post(port, &main_loop(0)));
        assert!(s.wait_held(std::time::Duration::from_secs(10)));
        assert!(!first.is_finished(), "step 0 was answered while held");
        s.hold_step(1);
        assert!(first.join().unwrap().contains("\"first\""));
        let second = std::thread::spawn(move || post(port, &main_loop(1)));
        assert!(s.wait_held(std::time::Duration::from_secs(10)));
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!second.is_finished(), "step 1 was answered while held");
        s.let_go();
        assert!(second.join().unwrap().contains("\"second\""));
    }

    #[test]
    fn test_the_step_is_the_conversations_place_and_side_requests_take_none() {
        let s = Scripted::start(vec![Step::Text("first"), Step::Text("second")]);
        let side = json!({"model": "m", "messages": []});
        assert!(post(s.port, &side).contains("\"OK\""));
        assert!(post(s.port, &main_loop(0)).contains("\"first\""));
        assert!(post(s.port, &side).contains("\"OK\""));
        assert!(post(s.port, &main_loop(1)).contains("\"second\""));
        // Sent again (a retry, a replay): the same step.
        assert!(post(s.port, &main_loop(0)).contains("\"first\""));
        // Past the end, the last step again.
        assert!(post(s.port, &main_loop(5)).contains("\"second\""));
        let steps: Vec<_> = s.seen().iter().map(|r| r.step).collect();
        assert_eq!(steps, [None, Some(0), None, Some(1), Some(0), Some(1)]);
        assert!(s.seen().iter().all(Seen::is_message));
    }
}
