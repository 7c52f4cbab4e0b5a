//! Any bytes as what a client sends on a connection to the proxy: hyper's
//! parser, the request-target check, the limits, the agent API's routing and
//! the forwarding (to a closed port: 502). Must never panic, and the proxy
//! must answer or close.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crab_errkind::{ErrorKind, Failure};
use crab_proxy::{Boundary, Gate, Limits, Proxy, Sandbox, TurnContext, Upstream};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Open;

impl Boundary for Open {
    fn turn(&self, _: &TurnContext) -> Gate {
        Gate::open()
    }
}

struct Refusing;

impl Sandbox for Refusing {
    fn list(&self) -> Result<Value, Failure> {
        Ok(Value::Array(Vec::new()))
    }
    fn checkpoint(&self, _: Option<String>, _: &TurnContext) -> Result<Value, Failure> {
        Err(Failure::new(ErrorKind::Busy, "fuzzing"))
    }
    fn rollback(&self, _: &str, _: &TurnContext) -> Result<Value, Failure> {
        Err(Failure::new(ErrorKind::NotFound, "fuzzing"))
    }
    fn fork(&self, _: Option<String>, _: u32) -> Result<Vec<String>, Failure> {
        Err(Failure::new(ErrorKind::Unavailable, "fuzzing"))
    }
}

/// The token the corpus's agent API requests carry.
const TOKEN: &str = "0123456789abcdef0123456789abcdef-fuzz";

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        // A paused clock: the timeouts that end each connection take no
        // real time.
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
    })
}

fn proxy() -> Arc<Proxy> {
    static PROXY: OnceLock<Arc<Proxy>> = OnceLock::new();
    PROXY
        .get_or_init(|| {
            // Port 9 on loopback: nothing listens, the connect fails at once.
            let upstream = Upstream::parse("http://127.0.0.1:9").unwrap();
            Arc::new(
                Proxy::new(upstream, Arc::new(Open), true)
                    .with_sandbox(Arc::new(Refusing), TOKEN)
                    .with_limits(Limits {
                        header_timeout: Duration::from_millis(200),
                        body_timeout: Duration::from_millis(200),
                        max_body: 4096,
                        ..Limits::default()
                    }),
            )
        })
        .clone()
}

fuzz_target!(|data: &[u8]| {
    let proxy = proxy();
    runtime().block_on(async move {
        let (mut client, server) = tokio::io::duplex(64 << 10);
        let served = tokio::spawn(proxy.serve_connection(server));
        // No shutdown of the client's side: hyper would drop the request
        // unanswered. The proxy closes at the header timeout at the latest.
        let _ = client.write_all(data).await;
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(60), client.read_to_end(&mut answer));
        assert!(read.await.is_ok(), "the proxy neither answered nor closed");
        drop(client);
        served.await.expect("the connection's task panicked");
    });
});
