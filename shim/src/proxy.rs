//! The container's turn proxy: a child process of the shim (`crabctl proxy
//! --managed`), so the shim never speaks HTTP.
//!
//! - **When.** The runtime config's `[proxy] upstream`, or the annotation
//!   `io.crab.proxy.upstream`, turns it on; `io.crab.proxy.listen` moves it.
//! - **The environment.** Before the container is made, its spec gets
//!   `OPENAI_BASE_URL` and `ANTHROPIC_BASE_URL` pointing at the listener
//!   (unless the spec sets them already).
//! - **The agent API's token.** With the agent API on, the container's processes
//!   also get `CRAB_API_TOKEN` (the spec's own, else a fresh random one), and the
//!   proxy answers `/.crab/` only to requests that carry it. After a restore the
//!   token is read back from the restored init's environment.
//! - **Lifetime.** The proxy reads a pipe whose other end only the shim holds:
//!   when the shim dies, even by SIGKILL, the proxy sees EOF and exits. The shim
//!   stops it when the task is deleted.
//! - **Restore and rollback.** They put the processes in a new network
//!   namespace; SIGHUP tells the proxy to bind a listener there too (it keeps
//!   the old one, which an agent outside the sandbox may still be using).

use std::io::{BufRead, BufReader};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crab_runtime::api_token;
use crab_runtime::checkpoint::journal;
use crab_runtime::config::Config;
use crab_runtime::storage::ContainerKey;
use nix::sys::signal::Signal;
use oci_spec::runtime::Spec;

use crate::error::{ShimError, ShimResult};

/// The annotation that turns the proxy on for one container (its upstream).
pub const UPSTREAM_ANNOTATION: &str = "io.crab.proxy.upstream";
/// The annotation that sets where it listens in the container.
pub const LISTEN_ANNOTATION: &str = "io.crab.proxy.listen";
/// The annotation that turns the agent's fast-forward on (`true`) or off
/// (`false`) for one container (`[agent] fast_forward`).
pub const FAST_FORWARD_ANNOTATION: &str = "io.crab.agent.fast-forward";
/// The annotation that declares the agent's state paths (comma-separated).
pub const STATE_PATHS_ANNOTATION: &str = "io.crab.agent.state-paths";
/// How long the shim waits for the proxy's listener.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// containerd's CRI annotation of a container's role in its pod.
const CONTAINER_TYPE_ANNOTATION: &str = "io.kubernetes.cri.container-type";

/// Applies the container's proxy annotations to `config`, and checks them. A pod's
/// sandbox (pause) container gets no proxy: kubelet passes the pod's annotations to
/// every container of the pod, the sandbox's included, and its proxy would take the
/// listener's port in the network namespace the pod's containers share.
pub fn configure(config: &mut Config, spec: &Spec) -> ShimResult<()> {
    let sandbox = spec
        .annotations()
        .as_ref()
        .and_then(|a| a.get(CONTAINER_TYPE_ANNOTATION))
        .is_some_and(|t| t == "sandbox");
    if sandbox {
        config.proxy.upstream.clear();
        return Ok(());
    }
    // An annotation chooses among what the host allows; it never adds: the
    // upstream is reached from the host's network, and a listener beyond
    // loopback would open the agent API to whoever reaches that address.
    let refused =
        |key: &str, m: String| ShimError::InvalidArgument(format!("turn proxy: {key}: {m}"));
    if let Some(a) = spec.annotations() {
        if let Some(u) = a.get(UPSTREAM_ANNOTATION) {
            config
                .proxy
                .choose_upstream(u)
                .map_err(|m| refused(UPSTREAM_ANNOTATION, m))?;
        }
        if a.get(api_token::AGENT_API_ANNOTATION).map(String::as_str) == Some("false") {
            config.proxy.agent_api = false;
        }
        if let Some(l) = a.get(LISTEN_ANNOTATION) {
            config
                .proxy
                .choose_listen(l)
                .map_err(|m| refused(LISTEN_ANNOTATION, m))?;
        }
        // The agent's fast-forward concerns its own sandbox only: what it leaves
        // out of a turn's signal, replay writes again.
        if let Some(v) = a.get(FAST_FORWARD_ANNOTATION) {
            config.agent.fast_forward =
                crab_runtime::config::switch(v).map_err(|m| refused(FAST_FORWARD_ANNOTATION, m))?;
        }
        if let Some(p) = a.get(STATE_PATHS_ANNOTATION) {
            config
                .agent
                .choose_state_paths(p)
                .map_err(|m| refused(STATE_PATHS_ANNOTATION, m))?;
        }
    }
    config.proxy.check().map_err(|(key, m)| refused(key, m))
}

/// Whether the container's proxy serves the agent API, which needs a token.
pub fn wants_token(config: &Config) -> bool {
    config.proxy.enabled() && config.proxy.agent_api
}

/// The agent API token of a container about to be created: the one its spec sets
/// (a platform that drives the agent API from outside the sandbox chooses it),
/// else a fresh one. `None` when its proxy serves no agent API.
pub fn token_for_create(config: &Config, spec: &Spec) -> ShimResult<Option<String>> {
    if !wants_token(config) {
        return Ok(None);
    }
    let given = spec
        .process()
        .as_ref()
        .and_then(|p| p.env().as_ref())
        .and_then(|env| api_token::from_env_list(env.iter().map(String::as_str)));
    match given {
        Some(t) => {
            api_token::check(&t).map_err(|m| ShimError::InvalidArgument(format!("spec: {m}")))?;
            Ok(Some(t))
        }
        None => Ok(Some(api_token::generate()?)),
    }
}

/// The agent API token of a restored container: the one its restored init carries
/// (the token is in the sandbox's memory, and a checkpoint keeps it), else a fresh
/// one, which only its execs will know.
pub fn token_for_restored(config: &Config, init_pid: i32) -> ShimResult<Option<String>> {
    if !wants_token(config) {
        return Ok(None);
    }
    match api_token::from_environ(init_pid) {
        Some(t) => Ok(Some(t)),
        None => {
            tracing::warn!(
                pid = init_pid,
                "the restored init has no agent API token: a new one, for execs only"
            );
            Ok(Some(api_token::generate()?))
        }
    }
}

/// The variables that point an agent's SDK at the proxy.
fn base_urls(listen: &str) -> [(&'static str, String); 2] {
    [
        ("OPENAI_BASE_URL", format!("http://{listen}/v1")),
        ("ANTHROPIC_BASE_URL", format!("http://{listen}")),
    ]
}

/// The variables the container's processes get: the base URLs (none when the
/// configuration asks for no proxy, or for no injection) and the agent API's
/// token (whenever there is one: without it the agent API refuses the agent).
pub fn env_vars(config: &Config, token: Option<&str>) -> Vec<(String, String)> {
    let mut vars = Vec::new();
    if !config.proxy.enabled() {
        return vars;
    }
    if config.proxy.inject_env {
        vars.extend(
            base_urls(&config.proxy.listen)
                .into_iter()
                .map(|(name, value)| (name.to_string(), value)),
        );
    }
    if let Some(t) = token {
        vars.push((api_token::ENV.to_string(), t.to_string()));
    }
    vars
}

/// The running proxy of one container.
#[derive(Debug)]
pub struct TurnProxy {
    child: Child,
    /// The write end of the proxy's lifeline pipe.
    _lifeline: OwnedFd,
}

/// Where to find the proxy program: a path as given, else beside the shim's
/// own binary, else a name for `PATH`.
fn program(config: &Config) -> PathBuf {
    let cmd = &config.proxy.command;
    if cmd.is_absolute() {
        return cmd.clone();
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(cmd)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| cmd.clone())
}

/// Where the proxy of container `id` logs (in the state dir, removed with the
/// task). The proxy rotates it to `<log>.1` at `[proxy] log_max_size`.
pub fn log_path(config: &Config, namespace: &str, id: &str) -> PathBuf {
    config
        .namespace_dir(namespace)
        .join(format!("{id}.proxy.log"))
}

/// Removes the proxy's log of container `id` and the rotated one before it, and
/// its host door's socket (a proxy that was killed could not).
pub fn remove_logs(config: &Config, namespace: &str, id: &str) {
    let log = log_path(config, namespace, id);
    let _ = std::fs::remove_file(rotated_log(&log));
    let _ = std::fs::remove_file(log);
    let _ = std::fs::remove_file(crab_runtime::control::proxy_socket_path(
        config, namespace, id,
    ));
}

/// Where the proxy rotates its log (`<log>.1`; see `[proxy] log_max_size`).
fn rotated_log(log: &Path) -> PathBuf {
    let mut p = log.as_os_str().to_owned();
    p.push(".1");
    PathBuf::from(p)
}

/// What the proxy is started with.
pub struct Launch<'a> {
    /// The container's resolved configuration file (beside its bundle).
    pub config_file: &'a Path,
    /// containerd's address, for forks.
    pub address: &'a str,
    /// containerd namespace.
    pub namespace: &'a str,
    /// Container id.
    pub id: &'a str,
    /// Where its log goes.
    pub log: &'a Path,
    /// The agent API's token (given to the proxy in its environment).
    pub token: Option<&'a str>,
    /// A listener bound already (see [`crate::proxy_listener`]), handed to the
    /// proxy as its descriptor 3.
    pub listener: Option<&'a std::net::TcpListener>,
}

/// The descriptor a passed listener has in the proxy.
const LISTEN_FD: i32 = 3;

/// Starts the proxy and waits until it listens in the container.
pub fn start(config: &Config, l: &Launch) -> ShimResult<TurnProxy> {
    let fail = |m: String| ShimError::Other(format!("turn proxy of {}: {m}", l.id));
    let (life_r, life_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| fail(format!("pipe: {e}")))?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(l.log)
        .map_err(|e| fail(format!("open {}: {e}", l.log.display())))?;
    let program = program(config);
    let mut cmd = Command::new(&program);
    // Not the shim's directory, which goes with the container it started for.
    cmd.current_dir("/")
        .arg("--config")
        .arg(l.config_file)
        .args(["--address", l.address, "--namespace", l.namespace])
        .args(["proxy", l.id, "--managed"])
        .arg("--log")
        .arg(l.log)
        .args(["--upstream", &config.proxy.upstream])
        .args(["--listen", &config.proxy.listen]);
    if !config.policy.fail_closed {
        cmd.arg("--fail-open");
    }
    if config.proxy.agent_api {
        cmd.arg("--agent-api");
    }
    if let Some(l) = l.listener {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let fd = l.as_raw_fd();
        cmd.args(["--listen-fd", &LISTEN_FD.to_string()]);
        // SAFETY: runs in the forked child before exec and calls only dup2 and
        // fcntl, which are async-signal-safe; `fd` stays open in the parent (the
        // listener is borrowed for the whole spawn). dup2 clears close-on-exec
        // on the copy (fcntl does, when the socket is at LISTEN_FD already), so
        // the proxy inherits the socket at LISTEN_FD alone.
        unsafe {
            cmd.pre_exec(move || {
                let r = if fd == LISTEN_FD {
                    libc::fcntl(fd, libc::F_SETFD, 0)
                } else {
                    libc::dup2(fd, LISTEN_FD)
                };
                if r < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    // Never on the command line, which every local user can read.
    cmd.env_remove(api_token::ENV);
    if let Some(t) = l.token {
        cmd.env(api_token::ENV, t);
    }
    if !config.proxy.upstream_ca.as_os_str().is_empty() {
        cmd.arg("--upstream-ca").arg(&config.proxy.upstream_ca);
    }
    if config.agent.fast_forward {
        // The proxy makes the directory (root-only) when it opens the journal.
        let key = ContainerKey::new(l.namespace, l.id).map_err(|e| fail(e.to_string()))?;
        cmd.arg("--journal").arg(journal::dir(config, &key));
    }
    let mut child = cmd
        .stdin(Stdio::from(life_r))
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .map_err(|e| fail(format!("run {}: {e}", program.display())))?;
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let proxy = TurnProxy {
        child,
        _lifeline: life_w,
    };
    match rx.recv_timeout(READY_TIMEOUT) {
        Ok(line) if line.starts_with("ready ") => {
            tracing::info!(id = %l.id, listen = %line.trim_end(), "turn proxy");
            Ok(proxy)
        }
        Ok(line) => {
            proxy.stop();
            let log = std::fs::read_to_string(l.log).unwrap_or_default();
            let last = log.lines().last().unwrap_or("").to_string();
            Err(fail(format!(
                "it did not start ({:?}): {last}",
                line.trim_end()
            )))
        }
        Err(_) => {
            proxy.stop();
            Err(fail(format!("not listening after {READY_TIMEOUT:?}")))
        }
    }
}

impl TurnProxy {
    /// After a restore or rollback: listen in the container's new namespace too.
    pub fn relisten(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        if let Err(e) = nix::sys::signal::kill(pid, Signal::SIGHUP) {
            tracing::warn!(error = %e, "cannot tell the turn proxy to relisten");
        }
    }

    /// Stops it (the task is deleted).
    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
