//! A scripted LLM on the host that speaks OpenAI's chat completions API, for
//! running a real, unmodified agent (mini-swe-agent) against it.
//!
//! Each `POST /v1/chat/completions` gets the [`Step`] of the script at its place
//! in the conversation (step `i` answers a conversation holding `i` answers of
//! the assistant, so a request sent again gets the same step). A step is one
//! shell command with a short thought before it, in the form the request asks
//! for: a call of the `bash` function when the request offers a function tool
//! of that name (mini-swe-agent 2's default, tool calls), else text, the thought
//! then the command alone in a fenced block of [`FENCE`] (its text-based
//! models' format). The answer streams (`chat.completion.chunk`s, then `data:
//! [DONE]`) when the request asks for `"stream": true`, else it is one
//! `chat.completion` with `usage`. `HEAD`/`GET /` get an empty 200; anything else
//! a 404 in the API's error shape, and a line on stderr. Every request is recorded.
//! A test may hold a step's answers ([`Scripted::hold_step`]) to stop the agent
//! there, as the Anthropic server does.

use serde_json::{json, Value};

use crate::scripted::{self, Hold, Reply, Request, Script};

/// The info string of the fenced block holding a text answer's command: what
/// mini-swe-agent's text-based models look for (`action_regex`).
pub const FENCE: &str = "mswea_bash_command";

/// The name of the function tool whose calls carry the command.
pub const TOOL: &str = "bash";

/// One answer of the script: a thought, then one shell command.
#[derive(Clone, Debug)]
pub struct Step {
    /// Why (the answer's text before the command).
    pub thought: String,
    /// The command.
    pub command: String,
}

impl Step {
    /// A step running `command`, saying `thought` first.
    pub fn new(thought: &str, command: &str) -> Step {
        Step {
            thought: thought.into(),
            command: command.into(),
        }
    }
}

/// One request as the server saw it (the same record as the Anthropic server's).
pub use crate::scripted::Seen;

impl Seen {
    /// Whether it is a chat completions call (what the turn proxy counts as a turn).
    pub fn is_chat(&self) -> bool {
        self.method == "POST" && self.target.split('?').next() == Some("/v1/chat/completions")
    }

    /// Whether the request offered the `bash` function tool.
    pub fn offers_tool(&self) -> bool {
        offers_tool(&self.body)
    }

    /// The text of the messages after the conversation's last assistant
    /// message (what the agent tells the LLM about the last step), joined.
    pub fn since_last_answer(&self) -> String {
        let messages = self.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let start = messages
            .iter()
            .rposition(|m| m["role"] == "assistant")
            .map_or(0, |i| i + 1);
        messages[start..]
            .iter()
            .map(|m| content_text(&m["content"]))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A message's content as text: a string, or the text parts of a list.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

fn offers_tool(body: &Value) -> bool {
    body["tools"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["function"]["name"] == TOOL))
}

/// A running scripted server of OpenAI's chat completions API; it lives as long as the
/// test process.
pub type Scripted = scripted::Server<OpenAi>;

/// OpenAI's chat completions API, as [`Scripted`] speaks it.
pub struct OpenAi;

/// The id the server gives the tool call of step `i`.
pub fn tool_call_id(i: usize) -> String {
    format!("call_crab_{i:02}")
}

impl scripted::Api for OpenAi {
    type Step = Step;
    const NAME: &'static str = "scripted OpenAI server";
    const REQUEST_ID_HEADER: &'static str = "x-request-id";

    fn answer(request: &Request, script: &Script<Step>, hold: &Hold) -> (Option<usize>, Reply) {
        let (method, path, body) = (&request.method, &request.path, &request.body);
        let mut step = None;
        let reply = match (method.as_str(), path.as_str()) {
            ("POST", "/v1/chat/completions") => {
                let i = script.step_for(body, hold);
                step = Some(i);
                let model = body["model"].as_str().unwrap_or("scripted").to_string();
                let tool = offers_tool(body);
                if body["stream"] == true {
                    let usage = body["stream_options"]["include_usage"] == true;
                    let text = sse(&model, i, &script.steps[i], tool, usage);
                    (200, "text/event-stream", text)
                } else {
                    let c = completion(&model, i, &script.steps[i], tool);
                    (200, "application/json", c.to_string())
                }
            }
            ("HEAD" | "GET", "/") => (200, "application/json", String::new()),
            _ => {
                eprintln!(
                    "scripted OpenAI server: unexpected {method} {}",
                    request.target
                );
                let e = json!({"error": {"message": format!("{method} {path} is not scripted"),
                    "type": "invalid_request_error", "param": null, "code": "not_found"}});
                (404, "application/json", e.to_string())
            }
        };
        (step, reply)
    }
}

/// The answer's text: the thought, and with no tool, the command in its fence.
fn text(step: &Step, tool: bool) -> String {
    if tool {
        format!("THOUGHT: {}", step.thought)
    } else {
        format!(
            "THOUGHT: {}\n\n```{FENCE}\n{}\n```",
            step.thought, step.command
        )
    }
}

/// The call of the `bash` function carrying step `i`'s command, complete.
fn tool_call(i: usize, step: &Step) -> Value {
    json!({"id": tool_call_id(i), "type": "function", "function": {"name": TOOL,
        "arguments": json!({"command": step.command}).to_string()}})
}

fn finish_reason(tool: bool) -> &'static str {
    if tool {
        "tool_calls"
    } else {
        "stop"
    }
}

fn usage() -> Value {
    json!({"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120})
}

/// The whole answer as one `chat.completion` (a request that did not stream).
fn completion(model: &str, i: usize, step: &Step, tool: bool) -> Value {
    let mut message = json!({"role": "assistant", "content": text(step, tool)});
    if tool {
        message["tool_calls"] = json!([tool_call(i, step)]);
    }
    json!({"id": format!("chatcmpl-crab-{i:02}"), "object": "chat.completion",
        "created": 1_700_000_000, "model": model, "choices": [{"index": 0,
        "message": message, "finish_reason": finish_reason(tool)}], "usage": usage()})
}

/// The answer as the API streams it: the role, the text in two parts, the
/// tool call (its arguments in two parts), the finish reason, the usage when
/// asked for, then `[DONE]`.
fn sse(model: &str, i: usize, step: &Step, tool: bool, with_usage: bool) -> String {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": format!("chatcmpl-crab-{i:02}"), "object": "chat.completion.chunk",
            "created": 1_700_000_000, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut chunks = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    let whole = text(step, tool);
    let cut = whole
        .char_indices()
        .nth(whole.chars().count() / 2)
        .map_or(0, |c| c.0);
    let (a, b) = whole.split_at(cut);
    for part in [a, b] {
        chunks.push(chunk(json!({"content": part}), Value::Null));
    }
    if tool {
        let call = tool_call(i, step);
        let args = call["function"]["arguments"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let (a, b) = args.split_at(args.len() / 2);
        chunks.push(chunk(
            json!({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                "function": {"name": TOOL, "arguments": a}}]}),
            Value::Null,
        ));
        chunks.push(chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": b}}]}),
            Value::Null,
        ));
    }
    chunks.push(chunk(json!({}), json!(finish_reason(tool))));
    if with_usage {
        let mut last = chunk(json!({}), Value::Null);
        last["choices"] = json!([]);
        last["usage"] = usage();
        chunks.push(last);
    }
    let mut out: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    out.push_str("data: [DONE]\n\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    fn send(port: u16, method: &str, path: &str, body: &Value) -> String {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let body = body.to_string();
        write!(
            c,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        answer
    }

    fn body_of(answer: &str) -> &str {
        answer.split_once("\r\n\r\n").unwrap().1
    }

    fn bash_tool() -> Value {
        json!([{"type": "function", "function": {"name": "bash", "parameters": {}}}])
    }

    #[test]
    fn test_a_conversation_gets_the_step_at_its_place_and_a_repeat_the_same_step() {
        let s = Scripted::start(vec![Step::new("look", "ls"), Step::new("done", "true")]);
        let first = json!({"model": "m", "messages": [{"role": "user", "content": "go"}]});
        let second = json!({"model": "m", "messages": [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "x"}, {"role": "user", "content": "out"}]});
        for body in [&first, &first, &second, &second] {
            let a = send(s.port, "POST", "/v1/chat/completions", body);
            assert!(a.starts_with("HTTP/1.1 200"), "{a}");
        }
        let steps: Vec<_> = s.seen().iter().map(|r| r.step).collect();
        assert_eq!(steps, [Some(0), Some(0), Some(1), Some(1)]);
        assert!(s.seen().iter().all(Seen::is_chat));
        assert_eq!(s.seen()[2].since_last_answer(), "out");
    }

    #[test]
    fn test_without_tools_the_command_is_the_only_fenced_block_of_the_text() {
        let s = Scripted::start(vec![Step::new("Look around.", "ls -la /")]);
        let a = send(
            s.port,
            "POST",
            "/v1/chat/completions",
            &json!({"model": "m", "messages": []}),
        );
        let c: Value = serde_json::from_str(body_of(&a)).unwrap();
        assert_eq!(c["object"], "chat.completion");
        assert_eq!(c["choices"][0]["finish_reason"], "stop");
        assert_eq!(c["usage"]["total_tokens"], 120);
        let text = c["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(text.starts_with("THOUGHT: Look around."), "{text}");
        let blocks: Vec<&str> = text.split("```").collect();
        assert_eq!(blocks.len(), 3, "{text}");
        assert_eq!(blocks[1], format!("{FENCE}\nls -la /\n"));
    }

    #[test]
    fn test_with_the_bash_tool_offered_the_command_is_a_tool_call() {
        let s = Scripted::start(vec![Step::new("Look around.", "ls -la /")]);
        let body = json!({"model": "m", "messages": [], "tools": bash_tool()});
        let c: Value = serde_json::from_str(body_of(&send(
            s.port,
            "POST",
            "/v1/chat/completions",
            &body,
        )))
        .unwrap();
        assert_eq!(c["choices"][0]["finish_reason"], "tool_calls");
        let call = &c["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["id"], tool_call_id(0));
        assert_eq!(call["function"]["name"], "bash");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"command": "ls -la /"}));
        assert!(s.seen()[0].offers_tool());
    }

    #[test]
    fn test_a_streamed_answer_joins_to_the_whole_one_and_ends_with_done() {
        let step = Step::new("Write it.", "echo hi > /f");
        for tool in [false, true] {
            let text = sse("m", 2, &step, tool, true);
            assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
            let chunks: Vec<Value> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter(|d| *d != "[DONE]")
                .map(|d| serde_json::from_str(d).unwrap())
                .collect();
            assert!(chunks
                .iter()
                .all(|c| c["object"] == "chat.completion.chunk"));
            let deltas: Vec<&Value> = chunks
                .iter()
                .filter_map(|c| c["choices"].get(0))
                .map(|c| &c["delta"])
                .collect();
            let content: String = deltas
                .iter()
                .filter_map(|d| d["content"].as_str())
                .collect();
            let whole = completion("m", 2, &step, tool);
            assert_eq!(content, whole["choices"][0]["message"]["content"]);
            let args: String = deltas
                .iter()
                .filter_map(|d| d["tool_calls"][0]["function"]["arguments"].as_str())
                .collect();
            if tool {
                assert_eq!(
                    args,
                    whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
                );
            } else {
                assert_eq!(args, "");
            }
            let finish: Vec<&Value> = chunks
                .iter()
                .filter_map(|c| c["choices"].get(0))
                .map(|c| &c["finish_reason"])
                .filter(|f| !f.is_null())
                .collect();
            assert_eq!(finish, [&json!(finish_reason(tool))]);
            assert_eq!(chunks.last().unwrap()["usage"]["total_tokens"], 120);
        }
    }

    #[test]
    fn test_a_held_step_is_answered_once_let_go_and_other_steps_are_not_held() {
        let s = Scripted::start(vec![Step::new("look", "ls"), Step::new("done", "true")]);
        let port = s.port;
        s.hold_step(1);
        let first = json!({"model": "m", "messages": [{"role": "user", "content": "go"}]});
        assert!(send(port, "POST", "/v1/chat/completions", &first).starts_with("HTTP/1.1 200"));
        let second = json!({"model": "m", "messages": [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "x"}, {"role": "user", "content": "out"}]});
        let held = std::thread::spawn(move || send(port, "POST", "/v1/chat/completions", &second));
        assert!(s.wait_held(Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(100));
        assert!(!held.is_finished(), "step 1 was answered while held");
        s.let_go();
        let answer = held.join().unwrap();
        assert!(answer.contains("THOUGHT: done"), "{answer}");
        let steps: Vec<_> = s.seen().iter().map(|r| r.step).collect();
        assert_eq!(steps, [Some(0), Some(1)]);
    }

    #[test]
    fn test_other_paths_get_a_404_in_the_apis_error_shape() {
        let s = Scripted::start(vec![Step::new("x", "true")]);
        let a = send(s.port, "POST", "/v1/completions", &json!({}));
        assert!(a.starts_with("HTTP/1.1 404"), "{a}");
        let e: Value = serde_json::from_str(body_of(&a)).unwrap();
        assert_eq!(e["error"]["code"], "not_found");
        assert!(e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v1/completions"));
        assert_eq!(s.seen()[0].step, None);
    }
}
