//! `crabctl proxy`: the turn proxy of one container.
//!
//! Its listener lives in the container's network namespace; each LLM request
//! through it ends a turn (through the shim, queued at low priority and
//! promoted when the answer comes first), and the answer is held until that
//! checkpoint is durable. With `--agent-api` the agent may also checkpoint,
//! list, roll back and fork its own container under `/.crab/` (REST and MCP).
//!
//! The agent API answers only requests carrying the sandbox's token
//! (`Authorization: Bearer`): `CRAB_API_TOKEN` from this process's environment,
//! else (by hand) the container init's, else a fresh one, printed.
//!
//! Run by hand it stays in the foreground. Run by the shim (`--managed`) it also
//! opens the host-side door ([`crate::proxy_door`]), prints `ready ADDR` once
//! listening, exits when its stdin (a pipe only the
//! shim holds) reaches EOF, and on SIGHUP (after a restore or rollback put the
//! container in a new network namespace) listens there too.
//!
//! With `--journal DIR` each LLM exchange is kept in DIR, and after a restore
//! the agent's repeated requests are answered from there (DIR/replay.json, read
//! at start and on SIGHUP); see docs/proxy.md, "Journal and fast-forward".

use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use crab_proxy::logfile::CappedLog;
use crab_proxy::{
    Boundary, Gate, Journal, Limits, LogLimit, Proxy, Sandbox, TurnContext, Upstream,
};
use crab_runtime::api_token;
use crab_runtime::checkpoint::ops::CheckpointRequest;
use crab_runtime::checkpoint::Kind;
use crab_runtime::config::Config;
use crab_runtime::container::Container;
use crab_runtime::control::{self, AgentConn, Request, Response};
use crab_runtime::error::{ErrorKind, Failure};
use serde_json::Value;

/// A turn's checkpoint can take a while under load.
const TURN_TIMEOUT: Duration = Duration::from_secs(600);
/// Reports to the shim are small; they must not hold anything up.
const REPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// How `crabctl proxy` was asked to run.
pub struct Options {
    /// The LLM API.
    pub upstream: String,
    /// Extra trusted roots for an https upstream.
    pub upstream_ca: Option<PathBuf>,
    /// Where to listen in the container.
    pub listen: SocketAddr,
    /// A socket listening there already, passed by the shim.
    pub listen_fd: Option<i32>,
    /// Pass answers on when their checkpoint failed.
    pub fail_open: bool,
    /// Serve the agent API under `/.crab/`.
    pub agent_api: bool,
    /// Started by the shim (see the module docs).
    pub managed: bool,
    /// The log file (rotated at `[proxy] log_max_size`); stderr if none.
    pub log: Option<PathBuf>,
    /// Journal the LLM exchanges here, and fast-forward a restored agent
    /// from them (`replay.json`, loaded at start and on SIGHUP).
    pub journal: Option<PathBuf>,
}

/// The container the proxy serves: where its control socket and containerd are.
#[derive(Clone)]
struct Target {
    config: Config,
    address: String,
    namespace: String,
    id: String,
    /// The agent's checkpoints of the last minute (`[quota]`).
    checkpoints: Arc<crate::quota::PerMinute>,
    /// Whether the LLM exchanges are journaled: only then does the shim need
    /// the agent's connection (to tell the agent's processes, whose
    /// checkpoints it may skip, since the journal can replay them).
    journal: bool,
    /// The next turn's token: unique to this proxy's turns (it starts at a
    /// random point, so that a restarted proxy's do not meet its
    /// predecessor's).
    tokens: Arc<std::sync::atomic::AtomicU64>,
}

impl Target {
    fn call(&self, request: Request, timeout: Duration) -> Result<Response, Failure> {
        match control::call(&self.config, &request, timeout) {
            Ok(Response::Error { kind, message }) => Err(Failure::new(kind, message)),
            Ok(r) => Ok(r),
            // No shim answers: the sandbox's runtime is gone for now.
            Err(e @ crab_runtime::Error::NotFound(_)) => {
                Err(Failure::new(ErrorKind::Unavailable, e.to_string()))
            }
            Err(e) => Err(Failure::new(e.kind(), e.to_string())),
        }
    }

    /// Sends a report without waiting for it.
    fn report(&self, request: Request) {
        // One report per turn, which the sandbox drives: a failing shim must
        // not fill the log.
        static LIMIT: LogLimit = LogLimit::new();
        let t = self.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = t.call(request, REPORT_TIMEOUT) {
                if let Some(dropped) = LIMIT.allow() {
                    tracing::warn!(dropped, error = %e, "report to the shim failed");
                }
            }
        });
    }
}

impl Boundary for Target {
    fn turn(&self, ctx: &TurnContext) -> Gate {
        let agent = agent_conn(self.journal, ctx);
        let token = Some(
            self.tokens
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        );
        let (t, request) = (
            self.clone(),
            Request::Turn {
                namespace: self.namespace.clone(),
                id: self.id.clone(),
                dry_run: false,
                background: true,
                agent,
                token,
            },
        );
        let call = tokio::task::spawn_blocking(move || t.call(request, TURN_TIMEOUT));
        let (t, promote) = (
            self.clone(),
            Request::Promote {
                namespace: self.namespace.clone(),
                id: self.id.clone(),
                token,
            },
        );
        Gate::new(async move {
            match call.await {
                Ok(Ok(Response::Turn { entry, .. })) => Ok(entry.map(|e| e.seq)),
                Ok(Ok(other)) => Err(format!("unexpected answer {other:?}")),
                Ok(Err(e)) => Err(e.message),
                Err(e) => Err(e.to_string()),
            }
        })
        .on_promote(move || t.report(promote))
    }

    fn gated(&self, held: Duration) {
        self.report(Request::Gated {
            namespace: self.namespace.clone(),
            id: self.id.clone(),
            us: held.as_micros() as u64,
        });
    }
}

impl Sandbox for Target {
    fn list(&self) -> Result<Value, Failure> {
        match self.call(
            Request::List {
                namespace: self.namespace.clone(),
                id: self.id.clone(),
            },
            TURN_TIMEOUT,
        )? {
            Response::Entries { entries } => json(&entries),
            other => Err(unexpected(&other)),
        }
    }

    fn checkpoint(&self, name: Option<String>, caller: &TurnContext) -> Result<Value, Failure> {
        self.checkpoints.take(
            self.config.quota.agent_checkpoints_per_minute,
            "quota.agent_checkpoints_per_minute",
        )?;
        let request = Request::Checkpoint {
            namespace: self.namespace.clone(),
            id: self.id.clone(),
            request: CheckpointRequest {
                kind: Kind::Full,
                name,
                mark: false,
            },
            // The shim checks whether the caller runs in an exec it would wait for.
            caller: agent_conn(true, caller),
        };
        match self.call(request, TURN_TIMEOUT)? {
            Response::Entry { entry } => json(&entry),
            other => Err(unexpected(&other)),
        }
    }

    fn rollback(&self, checkpoint: &str, caller: &TurnContext) -> Result<Value, Failure> {
        let request = Request::Rollback {
            namespace: self.namespace.clone(),
            id: self.id.clone(),
            checkpoint: checkpoint.to_string(),
            // The shim checks whether a process of the sandbox holds it.
            caller: agent_conn(true, caller),
        };
        // The shim tells this proxy (SIGHUP) to listen in the new namespace.
        match self.call(request, TURN_TIMEOUT)? {
            Response::RolledBack { report } => json(&report),
            other => Err(unexpected(&other)),
        }
    }

    fn fork(&self, checkpoint: Option<String>, count: u32) -> Result<Vec<String>, Failure> {
        let t = self.clone();
        let prefix = format!(
            "{}-fork{}",
            self.id,
            crab_runtime::checkpoint::Manifest::now_ms()
        );
        // fork_into runs its own async runtime: on a plain thread, not in ours.
        std::thread::spawn(move || {
            crate::recover::fork_into(
                &t.config,
                &t.address,
                &t.namespace,
                &t.id,
                checkpoint.as_deref(),
                count as usize,
                Some(&prefix),
                true,
            )
            .map(|f| f.made.into_iter().map(|(id, _, _)| id).collect())
            .map_err(|e| Failure::new(crate::kind_of(&e), format!("{e:#}")))
        })
        .join()
        .map_err(|_| Failure::new(ErrorKind::Internal, "fork thread panicked"))?
    }
}

/// The caller's connection for the shim: the proxy's view reversed, the
/// caller's socket being the proxy's peer. For a turn only when journaling
/// (without a journal the shim must not skip the agent's checkpoints, so it
/// need not know it); for a rollback and a checkpoint always.
fn agent_conn(journal: bool, ctx: &TurnContext) -> Option<AgentConn> {
    match (journal, ctx.peer, ctx.local) {
        (true, Some(local), Some(remote)) => Some(AgentConn { local, remote }),
        _ => None,
    }
}

fn json<T: serde::Serialize>(v: &T) -> Result<Value, Failure> {
    serde_json::to_value(v).map_err(|e| Failure::new(ErrorKind::Internal, e.to_string()))
}

fn unexpected(answer: &Response) -> Failure {
    Failure::new(ErrorKind::Internal, format!("unexpected answer {answer:?}"))
}

fn netns_inode(path: &str) -> Result<u64> {
    Ok(std::fs::metadata(path)
        .with_context(|| format!("network namespace {path}"))?
        .ino())
}

/// The network namespaces listened in, by inode.
#[derive(Default)]
struct Listening(Mutex<Vec<u64>>);

impl Listening {
    /// Binds in the container's current namespace unless already there.
    fn bind_current(&self, t: &Target, listen: SocketAddr, proxy: &Arc<Proxy>) -> Result<bool> {
        let (path, ns) = current_netns(t)?;
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(&ns) {
            return Ok(false);
        }
        let listener = crab_runtime::netns::bind_in(Path::new(&path), listen)?;
        seen.push(ns);
        serve(proxy, listener);
        Ok(true)
    }

    /// Serves `listener`, bound by the shim in the namespace the container joined
    /// (a pod's: see the shim's `proxy_listener::claim`), as bound in the
    /// container's current namespace.
    fn adopt(&self, t: &Target, listener: std::net::TcpListener, proxy: &Arc<Proxy>) -> Result<()> {
        let (_, ns) = current_netns(t)?;
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(ns);
        serve(proxy, listener);
        Ok(())
    }
}

/// The path and inode of the network namespace the container's init is in now.
fn current_netns(t: &Target) -> Result<(String, u64)> {
    let pid = Container::load(&t.config, &t.namespace, &t.id)?.init_pid()?;
    let path = format!("/proc/{pid}/ns/net");
    let ns = netns_inode(&path)?;
    Ok((path, ns))
}

fn serve(proxy: &Arc<Proxy>, listener: std::net::TcpListener) {
    let proxy = proxy.clone();
    tokio::spawn(async move {
        if let Err(e) = proxy.serve(listener).await {
            tracing::error!(error = %e, "listener ended");
        }
    });
}

/// The agent API's token: `CRAB_API_TOKEN` in this process's environment (the
/// shim passes it so), else, by hand, the one the container's init carries, else
/// a fresh one, printed for the caller to give the agent.
fn agent_token(init_pid: i32, managed: bool) -> Result<String> {
    if let Ok(t) = std::env::var(api_token::ENV) {
        api_token::check(&t).map_err(anyhow::Error::msg)?;
        return Ok(t);
    }
    anyhow::ensure!(
        !managed,
        "the shim gave no {} for the agent API",
        api_token::ENV
    );
    if let Some(t) = api_token::from_environ(init_pid) {
        println!("agent API token: the container's {}", api_token::ENV);
        return Ok(t);
    }
    let t = api_token::generate()?;
    println!("agent API token (Authorization: Bearer): {t}");
    Ok(t)
}

/// The proxy's bounds, from the host configuration's `[proxy]`.
fn limits(config: &Config) -> Result<Limits> {
    let p = &config.proxy;
    Ok(Limits {
        max_connections: p.max_connections as usize,
        header_timeout: Duration::from_secs(p.header_timeout_secs),
        body_timeout: Duration::from_secs(p.body_timeout_secs),
        max_body: p.max_body_bytes().map_err(anyhow::Error::msg)?,
    })
}

/// Logs to `log`, capped, with stderr pointed there too; else to stderr.
fn init_logging(config: &Config, log: Option<&std::path::Path>) -> Result<()> {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            config.log_level.as_str(),
        ))
        .with_ansi(false)
        .with_target(false);
    let Some(path) = log else {
        let _ = builder.with_writer(std::io::stderr).try_init();
        return Ok(());
    };
    let max = config
        .proxy
        .log_max_bytes()
        .map_err(anyhow::Error::msg)
        .context("[proxy] log_max_size")?;
    let file = CappedLog::open(path, max, true)?;
    let _ = builder.with_writer(Mutex::new(file)).try_init();
    Ok(())
}

/// Where this proxy's turn tokens start: the clock's nanoseconds mixed with
/// the pid, so that two proxies of one container (one restarted after the
/// other) do not number their turns alike. Not a secret: the shim only
/// matches a promotion with its turn.
fn first_token() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 40)
}

/// Runs the proxy until it fails (or, managed, until the shim is gone).
pub fn run(config: &Config, address: &str, namespace: &str, id: &str, o: Options) -> Result<()> {
    init_logging(config, o.log.as_deref())?;
    let mut upstream = Upstream::parse(&o.upstream)?;
    if let Some(ca) = &o.upstream_ca {
        upstream = upstream.with_ca_file(ca)?;
    }
    let target = Arc::new(Target {
        config: config.clone(),
        address: address.into(),
        namespace: namespace.into(),
        id: id.into(),
        checkpoints: Arc::default(),
        journal: o.journal.is_some(),
        tokens: Arc::new(first_token().into()),
    });
    let mut proxy = Proxy::new(upstream, target.clone(), !o.fail_open).with_limits(limits(config)?);
    if o.agent_api {
        // The agent API is safe because only the container's own namespace
        // reaches the listener: a container on the host's network would open
        // its rollback to every local user.
        let pid = Container::load(config, namespace, id)?.init_pid()?;
        if netns_inode(&format!("/proc/{pid}/ns/net"))? == netns_inode("/proc/self/ns/net")? {
            tracing::warn!(%id, "the container shares the host's network namespace: agent API off");
        } else {
            let token = agent_token(pid, o.managed)?;
            proxy = proxy.with_sandbox(target.clone(), &token);
        }
    }
    // Opened (and its replay plan loaded) before the first listener serves:
    // a restored agent's first request may already be one to replay.
    let journal = match &o.journal {
        Some(dir) => {
            let j = Arc::new(
                Journal::open(dir).with_context(|| format!("the journal in {}", dir.display()))?,
            );
            proxy = proxy.with_journal(j.clone());
            Some(j)
        }
        None => None,
    };
    let proxy = Arc::new(proxy);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(async move {
        let listening = Listening::default();
        match o.listen_fd {
            Some(fd) => {
                // SAFETY: the shim passes a bound, listening TCP socket at `fd`
                // (`--listen-fd`), which nothing else in this process owns.
                let listener = unsafe { <std::net::TcpListener as std::os::fd::FromRawFd>::from_raw_fd(fd) };
                listening.adopt(&target, listener, &proxy)?;
            }
            None => {
                listening.bind_current(&target, o.listen, &proxy)?;
            }
        }
        if !o.managed {
            println!(
                "{id}: proxy listening on {} in the container's network namespace, to {}",
                o.listen, o.upstream
            );
            std::future::pending::<()>().await;
        }
        // Removed again when this block ends (the shim is gone).
        let mut door = crate::proxy_door::HostDoor::bind(config, namespace, id)?;
        let group = config.control_gid()?;
        let listener = door.take_listener().context("the host door's listener")?;
        let served = proxy.clone();
        tokio::spawn(async move {
            let admit = move |c: &tokio::net::UnixStream| crate::proxy_door::admit(c, group);
            if let Err(e) = served.serve_unix(listener, admit).await {
                tracing::error!(error = %e, "the host door ended");
            }
        });
        tracing::info!(door = %door.path().display(), "host door open");
        println!("ready {}", o.listen);
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("SIGHUP handler")?;
        let mut lifeline = tokio::task::spawn_blocking(|| {
            // EOF when the shim that started this proxy is gone.
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        });
        loop {
            tokio::select! {
                _ = &mut lifeline => return anyhow::Ok(()),
                _ = hup.recv() => {
                    // The runtime writes the replay plan before the SIGHUP of a
                    // restore or rollback: load it before the agent can reach
                    // the new listener.
                    if let Some(j) = journal.clone() {
                        match tokio::task::spawn_blocking(move || j.load_plan()).await {
                            Ok(Ok(_)) => {}
                            Ok(Err(e)) => tracing::warn!(error = %e, "fast-forward: the replay plan was dropped"),
                            Err(e) => tracing::error!(error = %e, "fast-forward: loading the replay plan failed"),
                        }
                    }
                    match listening.bind_current(&target, o.listen, &proxy) {
                        Ok(true) => tracing::info!("listening in the container's new network namespace"),
                        Ok(false) => {}
                        Err(e) => tracing::error!(error = format!("{e:#}"), "cannot listen in the new namespace"),
                    }
                }
            }
        }
    })?;
    // The lifeline's blocking read may still be parked; do not wait for it.
    rt.shutdown_background();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_connection_is_the_proxys_reversed_and_only_when_journaling() {
        let ctx = TurnContext {
            peer: Some("127.0.0.1:40000".parse().unwrap()),
            local: Some("127.0.0.1:8787".parse().unwrap()),
            outside: false,
        };
        let conn = agent_conn(true, &ctx).unwrap();
        assert_eq!(
            conn.local,
            ctx.peer.unwrap(),
            "the agent socket's own address"
        );
        assert_eq!(conn.remote, ctx.local.unwrap(), "the proxy's listener");
        assert_eq!(agent_conn(false, &ctx), None);
        assert_eq!(
            agent_conn(true, &TurnContext::default()),
            None,
            "the host door"
        );
    }
}
