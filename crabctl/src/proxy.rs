//! `crabctl proxy`: the turn proxy for one container, in the foreground.
//!
//! Its listener lives in the container's network namespace; each LLM request
//! through it ends a turn (`crabctl turn`, through the shim), and the answer is
//! held until that checkpoint is durable.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use crab_proxy::{Boundary, Gate, Upstream};
use crab_runtime::config::Config;
use crab_runtime::container::Container;
use crab_runtime::control::{self, Request, Response};

/// A turn's checkpoint can take a while under load.
const TURN_TIMEOUT: Duration = Duration::from_secs(600);

struct Turns {
    config: Config,
    namespace: String,
    id: String,
}

impl Boundary for Turns {
    fn turn(&self) -> Gate {
        let (config, request) = (
            self.config.clone(),
            Request::Turn {
                namespace: self.namespace.clone(),
                id: self.id.clone(),
                dry_run: false,
                background: true,
            },
        );
        let call =
            tokio::task::spawn_blocking(move || control::call(&config, &request, TURN_TIMEOUT));
        Gate::new(async move {
            match call.await {
                Ok(Ok(Response::Turn { .. })) => Ok(()),
                Ok(Ok(Response::Error { message })) => Err(message),
                Ok(Ok(other)) => Err(format!("unexpected answer {other:?}")),
                Ok(Err(e)) => Err(e.to_string()),
                Err(e) => Err(e.to_string()),
            }
        })
    }
}

/// Runs the proxy until it fails.
pub fn run(
    config: &Config,
    namespace: &str,
    id: &str,
    upstream: &str,
    listen: SocketAddr,
    fail_open: bool,
) -> Result<()> {
    let upstream_parsed = Upstream::parse(upstream)?;
    let pid = Container::load(config, namespace, id)?.init_pid()?;
    let listener = crab_proxy::netns::bind_in(pid, listen)?;
    println!(
        "{id}: proxy listening on {listen} in the container's network namespace, to {upstream}"
    );
    let boundary = Arc::new(Turns {
        config: config.clone(),
        namespace: namespace.into(),
        id: id.into(),
    });
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?
        .block_on(crab_proxy::serve(
            listener,
            upstream_parsed,
            boundary,
            !fail_open,
        ))?;
    Ok(())
}
