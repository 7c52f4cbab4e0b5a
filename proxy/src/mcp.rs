//! An MCP server on `POST /.crab/mcp` (the "streamable HTTP" transport, always
//! answering with plain JSON, never SSE): the agent API as tools an LLM can
//! call. Stateless: no session id, every request stands alone.

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use serde_json::{json, Value};

use crate::api::{json_response, read_json, Kind, Op, Sandbox, MAX_FORKS};
use crate::limits::GuardedBody;
use crate::server::{full, Body};
use crate::turn::TurnContext;

/// Protocol versions this server speaks, the newest first (the answer when the
/// client asks for one it does not know).
const VERSIONS: [&str; 3] = ["2025-06-18", "2025-03-26", "2024-11-05"];

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;

/// The tools and their operations, in the order `tools/list` gives them.
const TOOLS: [(&str, Kind); 4] = [
    ("sandbox_checkpoint", Kind::Checkpoint),
    ("sandbox_rollback", Kind::Rollback),
    ("sandbox_list_checkpoints", Kind::List),
    ("sandbox_fork", Kind::Fork),
];

fn tools() -> Value {
    let reference = json!({
        "type": ["string", "integer"],
        "description": "A checkpoint's name, or its sequence number, as sandbox_list_checkpoints shows them."
    });
    json!([
        {
            "name": "sandbox_checkpoint",
            "description": "Save a checkpoint of this sandbox now: its files and running processes. \
                Take one before a risky step (installing packages, deleting or rewriting files, \
                migrations) so that sandbox_rollback can bring this exact state back. \
                Returns the new checkpoint's entry.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "A name to find the checkpoint by later, e.g. \"before-upgrade\"."}
                },
                "additionalProperties": false
            }
        },
        {
            "name": "sandbox_rollback",
            "description": "Restore this sandbox to a checkpoint: files and processes return to the \
                state they had then, and everything done in the sandbox since is undone. Your own \
                memory of the conversation is kept. Use it when a step went wrong and is hard to \
                undo by hand.",
            "inputSchema": {
                "type": "object",
                "properties": {"checkpoint": reference},
                "required": ["checkpoint"],
                "additionalProperties": false
            }
        },
        {
            "name": "sandbox_list_checkpoints",
            "description": "List this sandbox's checkpoints, oldest first, with their names and \
                sequence numbers, to choose one for sandbox_rollback or sandbox_fork.",
            "inputSchema": {"type": "object", "properties": {}, "additionalProperties": false}
        },
        {
            "name": "sandbox_fork",
            "description": "Start copies of this sandbox from a checkpoint (the latest one when none \
                is given), e.g. to try several approaches side by side. This sandbox is not \
                changed. Returns the new sandboxes' container ids.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "checkpoint": reference,
                    "count": {
                        "type": "integer", "minimum": 1, "maximum": MAX_FORKS, "default": 1,
                        "description": "How many copies to start."
                    }
                },
                "additionalProperties": false
            }
        }
    ])
}

fn rpc_error(id: &Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

/// Answers one HTTP request to the MCP endpoint.
pub(crate) async fn handle(
    sandbox: Arc<dyn Sandbox>,
    req: Request<GuardedBody>,
    caller: TurnContext,
) -> Response<Body> {
    let msg = match read_json(req.into_body()).await {
        Ok(Value::Null) => {
            let e = rpc_error(&Value::Null, INVALID_REQUEST, "empty body");
            return json_response(StatusCode::BAD_REQUEST, &e);
        }
        Ok(v) => v,
        Err((StatusCode::BAD_REQUEST, why)) => {
            return json_response(
                StatusCode::BAD_REQUEST,
                &rpc_error(&Value::Null, PARSE_ERROR, why),
            )
        }
        Err((status, why)) => {
            return json_response(status, &rpc_error(&Value::Null, INVALID_REQUEST, why))
        }
    };
    let Value::Object(msg) = msg else {
        let e = rpc_error(&Value::Null, INVALID_REQUEST, "batches are not supported");
        return json_response(StatusCode::BAD_REQUEST, &e);
    };
    let id = msg.get("id").cloned();
    let method = msg.get("method").and_then(Value::as_str);
    if msg.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        let e = rpc_error(
            id.as_ref().unwrap_or(&Value::Null),
            INVALID_REQUEST,
            "not JSON-RPC 2.0",
        );
        return json_response(StatusCode::BAD_REQUEST, &e);
    }
    // Notifications and the client's answers to us need no reply.
    let (Some(id), Some(method)) = (id, method) else {
        return full(
            StatusCode::ACCEPTED,
            "application/json",
            bytes::Bytes::new(),
        );
    };
    let params = msg.get("params").cloned().unwrap_or(Value::Null);
    let answer = match call(sandbox, method, params, caller).await {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message)) => rpc_error(&id, code, message),
    };
    json_response(StatusCode::OK, &answer)
}

async fn call(
    sandbox: Arc<dyn Sandbox>,
    method: &str,
    params: Value,
    caller: TurnContext,
) -> std::result::Result<Value, (i64, String)> {
    match method {
        "initialize" => {
            let asked = params.get("protocolVersion").and_then(Value::as_str);
            let version = VERSIONS
                .into_iter()
                .find(|v| Some(*v) == asked)
                .unwrap_or(VERSIONS[0]);
            Ok(json!({
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "crab-sandbox", "version": env!("CARGO_PKG_VERSION")},
                "instructions": "Tools on the sandbox you work in: checkpoint it before risky \
                    steps, roll it back when a step went wrong, fork it to try alternatives."
            }))
        }
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": tools()})),
        "tools/call" => {
            let name = params.get("name").and_then(Value::as_str).unwrap_or("");
            let Some((_, kind)) = TOOLS.iter().find(|(n, _)| *n == name) else {
                return Err((INVALID_PARAMS, format!("unknown tool {name:?}")));
            };
            let args = params.get("arguments").cloned().unwrap_or(Value::Null);
            // Bad arguments and sandbox failures are the tool's result, so the
            // LLM sees them and can correct its call.
            let outcome = match Op::parse(*kind, args) {
                Ok(op) => op.run(sandbox, caller).await.map_err(|f| f.message),
                Err(why) => Err(format!("bad arguments: {why}")),
            };
            Ok(match outcome {
                Ok(v) => {
                    json!({"content": [{"type": "text", "text": v.to_string()}], "isError": false})
                }
                Err(why) => json!({"content": [{"type": "text", "text": why}], "isError": true}),
            })
        }
        _ => Err((METHOD_NOT_FOUND, format!("unknown method {method:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_is_listed_with_a_schema() {
        let tools = tools();
        let listed: Vec<&str> = tools
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                assert_eq!(t["inputSchema"]["type"], "object");
                assert!(t["description"].as_str().unwrap().len() > 40);
                t["name"].as_str().unwrap()
            })
            .collect();
        let named: Vec<&str> = TOOLS.iter().map(|(n, _)| *n).collect();
        assert_eq!(listed, named);
    }
}
