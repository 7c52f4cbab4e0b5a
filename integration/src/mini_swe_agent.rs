//! mini-swe-agent on the host, acting on a crab sandbox made through Docker, for
//! `tests/mini_swe_agent.rs`: where it is installed, how it is started, and the
//! turn proxy it talks through. See docs/agents.md.
//!
//! Environment:
//! - `CRAB_MINI_SWE_AGENT_VENV`: the venv holding mini-swe-agent [`VERSION`]
//!   (default `/var/lib/crab/mini-swe-agent/venv`, made by `hack/mini-swe-agent.sh`,
//!   which `hack/setup.sh` runs)
//! - those of [`crate::docker`] (dockerd, the root with the docker CLI).
//!
//! A missing venv or dockerd fails the test, with what to run.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::docker::{docker_host, docker_rootfs, docker_run, MOBY};
use crate::{address, text};

/// The release the tests were written against (`hack/mini-swe-agent.sh` installs it).
pub const VERSION: &str = "2.4.6";

/// Where the proxy listens inside the sandbox, and so the agent's `api_base`.
pub const LISTEN: &str = "127.0.0.1:8787";

/// Where the scripted LLM listens when the agent reaches it through the
/// sandbox's host door ([`Agent::go_through_door`]): the proxy is then the
/// shim's, started for the annotation `io.crab.proxy.upstream`, which may only
/// choose an upstream the host's configuration names in advance (the test
/// configuration, `hack/test-config.sh`, names this one). One listener per
/// process answers every run's script by the run's API key
/// ([`crate::scripted::Server::paced_by_key`]).
pub const DOOR_UPSTREAM: &str = "127.0.0.1:18787";

/// A key no other run of this process has, for [`Options::api_key`].
pub fn new_api_key() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("sk-crab-run-{}-{n}", std::process::id())
}

/// The driver: mini-swe-agent's own classes, run in the sandbox's network
/// namespace (the file says how).
const DRIVER: &str = include_str!("mini_swe_agent.py");

/// The venv holding mini-swe-agent.
pub fn venv() -> PathBuf {
    std::env::var("CRAB_MINI_SWE_AGENT_VENV")
        .unwrap_or_else(|_| "/var/lib/crab/mini-swe-agent/venv".into())
        .into()
}

/// The venv's python, once it is checked to hold mini-swe-agent [`VERSION`].
pub fn python() -> PathBuf {
    let venv = venv();
    let python = venv.join("bin/python");
    let out = Command::new(&python)
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('mini-swe-agent'))",
        ])
        .output();
    let found = out
        .as_ref()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    assert_eq!(
        found,
        VERSION,
        "no mini-swe-agent {VERSION} in {} ({out:?}): run hack/mini-swe-agent.sh \
         (hack/setup.sh does)",
        venv.display()
    );
    python
}

/// A `docker` executable for mini-swe-agent: the CLI of the trixie root
/// ([`crate::docker`]), pointed at the test's dockerd. Written in `dir`.
pub fn docker_wrapper(dir: &Path) -> PathBuf {
    let root = docker_rootfs();
    assert!(
        Path::new(&root).join("usr/bin/docker").exists(),
        "no docker CLI in {root}: run hack/docker.sh install (hack/setup.sh does)"
    );
    let version = docker_run(&["version", "-f", "{{.Server.Version}}"], None, T);
    let (o, e) = text(&version);
    assert!(
        version.status.success(),
        "dockerd does not answer at {}: run hack/docker.sh start, then \
         eval \"$(hack/docker.sh env)\"\n{o}{e}",
        docker_host()
    );
    let path = dir.join("docker");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\n# The docker CLI of the trixie root (hack/docker.sh), for mini-swe-agent.\n\
             exec chroot '{root}' /usr/bin/docker -H '{}' \"$@\"\n",
            docker_host()
        ),
    )
    .expect("write the docker wrapper");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod the docker wrapper");
    path
}

const T: Duration = Duration::from_secs(60);

/// The model mini-swe-agent is told to use: litellm's OpenAI provider, at `api_base`.
pub const MODEL: &str = "openai/crab-scripted";
/// Its price per token in and out (the registry the driver is given), in dollars.
pub const INPUT_COST: f64 = 1e-6;
/// See [`INPUT_COST`].
pub const OUTPUT_COST: f64 = 2e-6;

/// What the driver is told (see `mini_swe_agent.py`).
pub struct Options<'a> {
    /// The sandbox's image (as dockerd names it).
    pub image: &'a str,
    /// DockerEnvironment's run args: `--runtime crab` and the rest.
    pub run_args: &'a [&'a str],
    /// A built-in config of mini-swe-agent (`mini`: the `mini` CLI's).
    pub config: &'a str,
    /// `litellm` (tool calls) or `litellm_textbased` (fenced blocks).
    pub model_class: &'a str,
    /// The task.
    pub task: &'a str,
    /// The LLM's base URL (`.../v1`); `None`: the turn proxy's, at [`LISTEN`]
    /// in the sandbox's network namespace.
    pub api_base: Option<&'a str>,
    /// The API key the agent sends (`None`: a fixed dummy): the run's own one
    /// when its scripted server answers by key ([`Scripted::paced_by_key`]).
    ///
    /// [`Scripted::paced_by_key`]: crate::scripted::Server::paced_by_key
    pub api_key: Option<&'a str>,
    /// How many times mini-swe-agent asks before a failed request fails the
    /// run (its `MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT`; 1: no retry, so every
    /// request is a turn). A run crashed with its request in flight through
    /// the host door needs more: that request dies with the shim's proxy.
    pub attempts: u32,
}

/// A running mini-swe-agent: the driver process, its lines, and its files.
pub struct Agent {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// The sandbox's container id (Docker's, containerd's and the shim's).
    pub id: String,
    /// A temporary directory: the docker wrapper, the trajectory, the driver's stderr.
    pub dir: tempfile::TempDir,
}

impl Agent {
    /// Starts the driver; returns once DockerEnvironment has started the sandbox.
    pub fn start(o: &Options) -> Agent {
        let python = python();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let docker = docker_wrapper(dir.path());
        let driver = dir.path().join("driver.py");
        std::fs::write(&driver, DRIVER).expect("write the driver");
        // The model's price, so that mini-swe-agent counts each call's cost as it
        // would a real model's (its `litellm_model_registry`).
        let registry = dir.path().join("registry.json");
        let price = serde_json::json!({MODEL: {"litellm_provider": "openai", "mode": "chat",
            "max_tokens": 8192, "input_cost_per_token": INPUT_COST,
            "output_cost_per_token": OUTPUT_COST}});
        std::fs::write(&registry, price.to_string()).expect("write the model registry");
        let args = serde_json::json!({
            "image": o.image, "run_args": o.run_args, "docker": docker,
            "config": o.config, "model_class": o.model_class,
            "model": MODEL,
            "api_base": o.api_base.map_or_else(|| format!("http://{LISTEN}/v1"), String::from),
            "api_key": o.api_key.unwrap_or("sk-dummy-for-the-scripted-server"),
            "task": o.task, "trajectory": dir.path().join("trajectory.json"),
        });
        let stderr = std::fs::File::create(dir.path().join("stderr")).expect("stderr file");
        // No `timeout` around it: the test bounds each wait, and a drop kills
        // the driver itself.
        let mut child = Command::new(&python)
            .arg(&driver)
            .arg(args.to_string())
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("LANG", "C.UTF-8")
            .env("HOME", dir.path())
            // Nothing but the LLM: litellm's cost map from its package, not the
            // network; mini-swe-agent's settings from an empty directory; no
            // banner; retries only as the caller says (see `Options::attempts`).
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            .env("LITELLM_MODEL_REGISTRY_PATH", &registry)
            .env("MSWEA_GLOBAL_CONFIG_DIR", dir.path().join("config"))
            .env("MSWEA_SILENT_STARTUP", "1")
            .env(
                "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT",
                o.attempts.max(1).to_string(),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start the mini-swe-agent driver");
        let stdin = child.stdin.take();
        let out = child.stdout.take().expect("the driver's stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                eprintln!("mini-swe-agent driver: {line}");
                let _ = tx.send(line);
            }
        });
        let mut agent = Agent {
            child,
            stdin,
            lines,
            id: String::new(),
            dir,
        };
        let line = agent.line("container ", Duration::from_secs(120));
        agent.id = line.trim().to_string();
        agent
    }

    /// The driver's next line starting with `prefix` (what follows it); panics,
    /// with its stderr, if none comes within `timeout`.
    pub fn line(&self, prefix: &str, timeout: Duration) -> String {
        let end = std::time::Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    if let Some(rest) = l.strip_prefix(prefix) {
                        return rest.to_string();
                    }
                }
                Err(e) => panic!(
                    "no `{prefix}` line from the driver ({e})\nstderr:\n{}",
                    self.stderr()
                ),
            }
        }
    }

    /// Lets the agent run in the network namespace of process `pid`.
    pub fn go(&mut self, pid: i32) {
        self.tell(&pid.to_string());
    }

    /// Lets the agent run where it is, in the host's network (a baseline
    /// without the turn proxy: its LLM reached directly).
    pub fn go_in_host_network(&mut self) {
        self.tell("host");
    }

    /// Lets the agent run in the host's network, asking its LLM through the
    /// sandbox proxy's host door, the unix socket at `door` (`crabctl door`).
    pub fn go_through_door(&mut self, door: &str) {
        self.tell(&format!("door {door}"));
    }

    fn tell(&mut self, line: &str) {
        let w = self.stdin.as_mut().expect("the driver's stdin");
        writeln!(w, "{line}").expect("tell the driver where to run");
    }

    /// Closes the driver's stdin (it then ends, and mini-swe-agent stops the
    /// sandbox); its exit code.
    pub fn finish(&mut self) -> Option<i32> {
        self.stdin.take();
        self.child.wait().expect("wait for the driver").code()
    }

    /// What the driver wrote on stderr (mini-swe-agent's and litellm's logs).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    /// The trajectory mini-swe-agent saved (its `output_path`).
    pub fn trajectory(&self) -> serde_json::Value {
        let path = self.dir.path().join("trajectory.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}\nstderr:\n{}", path.display(), self.stderr()));
        serde_json::from_str(&text).expect("the trajectory is JSON")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stdin.take();
        if matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(500));
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The turn proxy of a Docker container, started by hand (`crabctl proxy`, as
/// docs/proxy.md shows for a container started without one), and stopped when
/// dropped. The test's dockerd gives every crab container the same runtime
/// configuration, whose `[proxy] upstreams` cannot name a server on a port
/// picked at run time; by hand, the upstream is the caller's to choose.
pub struct Proxy {
    child: Child,
    /// Its stdout, kept open (a line it prints later must not meet a closed pipe).
    _out: BufReader<std::process::ChildStdout>,
}

impl Proxy {
    /// Starts it for Docker container `id`, forwarding to `upstream`, listening
    /// on [`LISTEN`] in the container's network namespace; returns once it listens.
    pub fn start(id: &str, upstream: &str, log: &Path) -> Proxy {
        let mut child = Command::new("crabctl")
            .arg("-a")
            .arg(address())
            .args(["-n", MOBY, "proxy", id, "--upstream", upstream])
            .args(["--listen", LISTEN])
            .arg("--log")
            .arg(log)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start crabctl proxy");
        let out = child.stdout.take().expect("the proxy's stdout");
        let mut out = BufReader::new(out);
        let mut first = String::new();
        let _ = out.read_line(&mut first);
        let mut proxy = Proxy { child, _out: out };
        assert!(
            first.contains("proxy listening"),
            "crabctl proxy did not start ({:?}): {first:?}\nlog: {}",
            proxy.child.try_wait(),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        proxy
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
