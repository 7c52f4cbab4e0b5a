//! The agent API under `/.crab/`, REST and MCP, through a real proxy with a
//! Sandbox that records its calls.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use common::*;
use http::StatusCode;
use serde_json::{json, Value};

struct Setup {
    proxy: SocketAddr,
    sandbox: Arc<TestSandbox>,
    boundary: Arc<TestBoundary>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn setup() -> Setup {
    let (up, seen) = start_stub().await;
    let boundary = TestBoundary::new(GateKind::Open);
    let sandbox = Arc::new(TestSandbox::default());
    let proxy = start_proxy(up, boundary.clone(), Some(sandbox.clone()), true);
    Setup {
        proxy,
        sandbox,
        boundary,
        seen,
    }
}

impl Setup {
    /// Nothing under `/.crab/` may reach the upstream or end a turn.
    fn assert_local(&self) {
        assert!(self.seen.lock().unwrap().is_empty(), "went upstream");
        assert_eq!(self.boundary.turns(), 0, "was a turn");
    }
}

#[tokio::test]
async fn rest_routes_reach_the_sandbox() {
    let s = setup().await;
    let p = s.proxy;

    let got = send(p, "GET", "/.crab/v1/checkpoints", "").await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.content_type, "application/json");
    assert_eq!(
        got.json(),
        json!({"checkpoints": [{"seq": 1, "name": "first"}]})
    );

    let got = send(p, "POST", "/.crab/v1/checkpoints", "{\"name\":\"before\"}").await;
    assert_eq!(got.status, StatusCode::CREATED);
    assert_eq!(
        got.json(),
        json!({"checkpoint": {"seq": 2, "name": "before"}})
    );

    let got = send(p, "POST", "/.crab/v1/checkpoints", "").await;
    assert_eq!(got.status, StatusCode::CREATED, "an empty body is allowed");

    let got = send(
        p,
        "POST",
        "/.crab/v1/rollback",
        "{\"checkpoint\":\"first\"}",
    )
    .await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.json(), json!({"rolled_back": {"seq": 1}}));

    let got = send(
        p,
        "POST",
        "/.crab/v1/fork",
        "{\"checkpoint\":2,\"count\":2}",
    )
    .await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.json(), json!({"ids": ["web-fork-0", "web-fork-1"]}));

    let got = send(p, "POST", "/.crab/v1/fork", "{}").await;
    assert_eq!(
        got.json(),
        json!({"ids": ["web-fork-0"]}),
        "count 1 by default"
    );

    assert_eq!(
        s.sandbox.calls(),
        [
            "list",
            "checkpoint Some(\"before\")",
            "checkpoint None",
            "rollback first",
            "fork Some(\"2\") 2",
            "fork None 1",
        ]
    );
    s.assert_local();
}

#[tokio::test]
async fn rest_errors_are_json_with_the_right_status() {
    let s = setup().await;
    let p = s.proxy;
    let error = |got: &Got| got.json()["error"].as_str().unwrap().to_string();

    for (method, path, body, status) in [
        (
            "POST",
            "/.crab/v1/rollback",
            "{not json",
            StatusCode::BAD_REQUEST,
        ),
        ("POST", "/.crab/v1/rollback", "{}", StatusCode::BAD_REQUEST),
        (
            "POST",
            "/.crab/v1/fork",
            "{\"count\":0}",
            StatusCode::BAD_REQUEST,
        ),
        (
            "POST",
            "/.crab/v1/fork",
            "{\"count\":65}",
            StatusCode::BAD_REQUEST,
        ),
        (
            "POST",
            "/.crab/v1/fork",
            "{\"chekpoint\":\"a\"}",
            StatusCode::BAD_REQUEST,
        ),
        (
            "POST",
            "/.crab/v1/checkpoints",
            "[1]",
            StatusCode::BAD_REQUEST,
        ),
        (
            "GET",
            "/.crab/v1/rollback",
            "",
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (
            "DELETE",
            "/.crab/v1/checkpoints",
            "",
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        ("GET", "/.crab/v2/anything", "", StatusCode::NOT_FOUND),
        ("GET", "/.crab", "", StatusCode::NOT_FOUND),
    ] {
        let got = send(p, method, path, body).await;
        assert_eq!(got.status, status, "{method} {path} {body}: {}", got.text());
        assert!(!error(&got).is_empty());
    }
    assert!(
        s.sandbox.calls().is_empty(),
        "no bad request reached the sandbox"
    );

    // The sandbox's own failures say why, with the status of their kind.
    let got = send(p, "POST", "/.crab/v1/checkpoints", "{\"name\":\"fail\"}").await;
    assert_eq!(got.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(error(&got), "disk full");
    let got = send(p, "POST", "/.crab/v1/checkpoints", "{\"name\":\"busy\"}").await;
    assert_eq!(got.status, StatusCode::CONFLICT);
    assert!(error(&got).contains("busy"), "{}", got.text());
    let got = send(
        p,
        "POST",
        "/.crab/v1/rollback",
        "{\"checkpoint\":\"missing\"}",
    )
    .await;
    assert_eq!(got.status, StatusCode::NOT_FOUND);
    assert!(error(&got).contains("missing"));
    s.assert_local();
}

#[tokio::test]
async fn web_pages_are_refused() {
    let s = setup().await;
    let headers = [("origin", "http://evil.example:8080")];
    let got = send_with(
        s.proxy,
        "POST",
        "/.crab/v1/rollback",
        "{\"checkpoint\":1}",
        &headers,
    )
    .await;
    assert_eq!(got.status, StatusCode::FORBIDDEN);
    let headers = [("origin", "http://127.0.0.1:8080")];
    let got = send_with(s.proxy, "GET", "/.crab/v1/checkpoints", "", &headers).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(s.sandbox.calls(), ["list"]);
}

#[tokio::test]
async fn requests_without_the_sandbox_token_are_refused() {
    let s = setup().await;
    let wrong = format!("Bearer {}x", &API_TOKEN[..API_TOKEN.len() - 1]);
    let cases: [&[(&str, &str)]; 5] = [
        // A sidecar in the namespace that knows nothing, the LLM key, a guess of the
        // right length, a prefix of the token, the token without the scheme.
        &[("authorization", "")],
        &[("authorization", "Bearer sk-secret")],
        &[("authorization", &wrong)],
        &[("authorization", &API_TOKEN[..20])],
        &[("authorization", API_TOKEN)],
    ];
    for headers in cases {
        for (method, path, body) in [
            ("GET", "/.crab/v1/checkpoints", ""),
            ("POST", "/.crab/v1/checkpoints", "{}"),
            ("POST", "/.crab/v1/rollback", "{\"checkpoint\":1}"),
            ("POST", "/.crab/v1/fork", "{\"count\":64}"),
            (
                "POST",
                "/.crab/mcp",
                &call(1, "sandbox_checkpoint", json!({})).to_string(),
            ),
        ] {
            let got = send_with(s.proxy, method, path, body, headers).await;
            assert_eq!(
                got.status,
                StatusCode::UNAUTHORIZED,
                "{method} {path} {headers:?}"
            );
            let e = got.json()["error"].as_str().unwrap_or_default().to_string();
            assert!(e.contains("CRAB_API_TOKEN"), "{}", got.text());
        }
    }
    assert!(s.sandbox.calls().is_empty(), "{:?}", s.sandbox.calls());
    // The scheme's case does not matter.
    let lower = format!("bearer {API_TOKEN}");
    let got = send_with(
        s.proxy,
        "GET",
        "/.crab/v1/checkpoints",
        "",
        &[("authorization", &lower)],
    )
    .await;
    assert_eq!(got.status, StatusCode::OK);
    s.assert_local();
}

#[tokio::test]
async fn without_a_sandbox_the_agent_api_is_off() {
    let (up, seen) = start_stub().await;
    let boundary = TestBoundary::new(GateKind::Open);
    let p = start_proxy(up, boundary.clone(), None, true);
    for (method, path) in [
        ("GET", "/.crab/v1/checkpoints"),
        ("POST", "/.crab/v1/rollback"),
        ("POST", "/.crab/mcp"),
        ("GET", "/.crab/nothing"),
    ] {
        let got = send(p, method, path, "{}").await;
        assert_eq!(got.status, StatusCode::NOT_FOUND, "{method} {path}");
        let error = got.json()["error"].as_str().unwrap().to_string();
        assert!(error.contains("agent API is off"), "{error}");
    }
    assert!(seen.lock().unwrap().is_empty());
}

/// One JSON-RPC exchange with the MCP endpoint.
async fn rpc(p: SocketAddr, msg: Value) -> (StatusCode, Value) {
    let got = send(p, "POST", "/.crab/mcp", &msg.to_string()).await;
    if got.body().is_empty() {
        return (got.status, Value::Null);
    }
    assert_eq!(got.content_type, "application/json");
    (got.status, got.json())
}

fn call(id: u32, tool: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": tool, "arguments": arguments}})
}

#[tokio::test]
async fn mcp_initialize_list_and_notifications() {
    let s = setup().await;
    let p = s.proxy;

    let (status, r) = rpc(
        p,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-03-26", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "0"}}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(r["id"], 1);
    assert_eq!(r["result"]["protocolVersion"], "2025-03-26");
    assert_eq!(r["result"]["capabilities"], json!({"tools": {}}));
    assert_eq!(r["result"]["serverInfo"]["name"], "crab-sandbox");

    let (_, r) = rpc(
        p,
        json!({"jsonrpc": "2.0", "id": 2, "method": "initialize",
        "params": {"protocolVersion": "1999-01-01"}}),
    )
    .await;
    assert_eq!(r["result"]["protocolVersion"], "2025-06-18");

    let (status, r) = rpc(
        p,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    assert_eq!((status, r), (StatusCode::ACCEPTED, Value::Null));

    let (_, r) = rpc(p, json!({"jsonrpc": "2.0", "id": "p", "method": "ping"})).await;
    assert_eq!(r, json!({"jsonrpc": "2.0", "id": "p", "result": {}}));

    let (_, r) = rpc(
        p,
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}),
    )
    .await;
    let tools = r["result"]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "sandbox_checkpoint",
            "sandbox_rollback",
            "sandbox_list_checkpoints",
            "sandbox_fork"
        ]
    );
    for t in tools {
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
        assert!(t["description"].as_str().unwrap().len() > 40);
    }
    assert_eq!(tools[1]["inputSchema"]["required"], json!(["checkpoint"]));
    assert!(s.sandbox.calls().is_empty());
    s.assert_local();
}

#[tokio::test]
async fn mcp_tools_call_the_sandbox() {
    let s = setup().await;
    let p = s.proxy;
    let text = |r: &Value| -> Value {
        assert_eq!(r["result"]["isError"], false, "{r}");
        assert_eq!(r["result"]["content"][0]["type"], "text");
        serde_json::from_str(r["result"]["content"][0]["text"].as_str().unwrap()).unwrap()
    };

    let (_, r) = rpc(p, call(1, "sandbox_checkpoint", json!({"name": "a"}))).await;
    assert_eq!(text(&r), json!({"checkpoint": {"seq": 2, "name": "a"}}));
    let (_, r) = rpc(p, call(2, "sandbox_list_checkpoints", json!({}))).await;
    assert_eq!(
        text(&r),
        json!({"checkpoints": [{"seq": 1, "name": "first"}]})
    );
    let (_, r) = rpc(p, call(3, "sandbox_rollback", json!({"checkpoint": "a"}))).await;
    assert_eq!(text(&r), json!({"rolled_back": {"seq": 1}}));
    let (_, r) = rpc(p, call(4, "sandbox_fork", json!({"count": 3}))).await;
    assert_eq!(
        text(&r),
        json!({"ids": ["web-fork-0", "web-fork-1", "web-fork-2"]})
    );
    // No arguments at all is an empty object.
    let (_, r) = rpc(
        p,
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
        "params": {"name": "sandbox_checkpoint"}}),
    )
    .await;
    assert_eq!(text(&r)["checkpoint"]["seq"], 2);

    assert_eq!(
        s.sandbox.calls(),
        [
            "checkpoint Some(\"a\")",
            "list",
            "rollback a",
            "fork None 3",
            "checkpoint None"
        ]
    );
    s.assert_local();
}

#[tokio::test]
async fn mcp_errors() {
    let s = setup().await;
    let p = s.proxy;

    // Tool failures and bad arguments are results the LLM can read.
    let (status, r) = rpc(
        p,
        call(1, "sandbox_rollback", json!({"checkpoint": "missing"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(r["result"]["isError"], true);
    assert!(r["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("missing"));
    let (_, r) = rpc(p, call(2, "sandbox_rollback", json!({}))).await;
    assert_eq!(r["result"]["isError"], true);
    assert!(r["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("checkpoint"));

    let (_, r) = rpc(p, call(3, "sandbox_destroy", json!({}))).await;
    assert_eq!(r["error"]["code"], -32602);
    assert_eq!(r["id"], 3);
    let (_, r) = rpc(
        p,
        json!({"jsonrpc": "2.0", "id": 4, "method": "resources/list"}),
    )
    .await;
    assert_eq!(r["error"]["code"], -32601);

    let got = send(p, "POST", "/.crab/mcp", "{\"jsonrpc\":").await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST);
    assert_eq!(got.json()["error"]["code"], -32700);
    assert_eq!(got.json()["id"], Value::Null);
    let (status, r) = rpc(p, json!([{"jsonrpc": "2.0", "id": 5, "method": "ping"}])).await;
    assert_eq!(
        (status, r["error"]["code"].clone()),
        (StatusCode::BAD_REQUEST, json!(-32600))
    );

    let got = send(p, "GET", "/.crab/mcp", "").await;
    assert_eq!(got.status, StatusCode::METHOD_NOT_ALLOWED);

    assert_eq!(s.sandbox.calls(), ["rollback missing"]);
    s.assert_local();
}
