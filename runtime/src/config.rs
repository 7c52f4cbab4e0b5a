//! The runtime configuration.
//!
//! One TOML file per host, `/etc/crab/config.toml` unless said otherwise. Where it comes
//! from, first match wins:
//! 1. containerd runtime options `ConfigBody` (the TOML text itself);
//! 2. containerd runtime options `ConfigPath`;
//! 3. the `CRAB_CONFIG` environment variable of containerd (the shim inherits it), which
//!    is how a private containerd points its shims at a private configuration;
//! 4. `/etc/crab/config.toml`, when it exists;
//! 5. the built-in defaults.
//!
//! Unknown keys and bad values are rejected, and the message names the key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Default location of the host configuration file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/crab/config.toml";
/// Environment variable naming a configuration file (see the module docs).
pub const CONFIG_ENV: &str = "CRAB_CONFIG";

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where container state lives (`<state_dir>/<namespace>/<id>`); a tmpfs is right.
    pub state_dir: PathBuf,
    /// Parent of the per-container cgroup2 directories that identify a container's tasks
    /// to eBPF. On hybrid hosts it must lie in the unified (cgroup2) hierarchy. Unused
    /// on cgroup v2-only hosts, where each container's own cgroup identifies it.
    pub tracking_cgroup: PathBuf,
    /// Log level of the shim (`error`, `warn`, `info`, `debug`, `trace`).
    pub log_level: LogLevel,
    /// A group (name or gid) whose members may use the containers' control sockets
    /// besides root; empty: root only. The shim checks each caller's credentials
    /// (SO_PEERCRED), whatever the socket file's mode.
    pub control_group: String,
    /// The snapshot-capable root file system of each container.
    pub storage: Storage,
    /// Where checkpoints are kept.
    pub checkpoint: Checkpoint,
    /// When turns are checkpointed, and at which grain.
    pub policy: Policy,
    /// The turn proxy the shim starts for each container.
    pub proxy: Proxy,
    /// An agent that lives in the sandbox (see `docs/agents.md`).
    pub agent: Agent,
    /// What the agent inside a sandbox may make through the agent API.
    pub quota: Quota,
    /// For the fault-injection tests only: a file naming the step (see
    /// `storage::fault`) at which the helper process running a checkpoint, rollback
    /// or store operation kills itself (with a `shim:` prefix its shim too), as a
    /// crash would. Read when each helper starts, so a test arms one operation at a
    /// time; absent or empty: no fault.
    pub fault_file: Option<PathBuf>,
    /// How migration archives are signed and checked.
    pub archive: Archive,
    /// Standby replicas for rollbacks in milliseconds (see `docs/standby.md`).
    pub standby: Standby,
}

/// Standby replica settings: a checkpoint restored ahead of time, stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Standby {
    /// Whether containers keep one (the annotation `io.crab.standby` chooses per
    /// container). Off by default: a standby costs the memory of its processes.
    pub enabled: bool,
    /// How many standbys the host keeps at most, over all containers; a container
    /// beyond it rolls back the slow way.
    pub max_per_host: u32,
    /// The largest process image (MiB) a container's replica is made of; 0: no
    /// bound. A replica holds as much memory as its checkpoint's image.
    pub max_image_mib: u64,
    /// The host memory (MiB, the kernel's `MemAvailable`) replicas leave free: one
    /// is made only when what is available exceeds this by its image, and one held
    /// when availability falls below this is dropped (replicas go first under
    /// memory pressure, before the kernel reclaims or kills anything else).
    pub min_available_mib: u64,
    /// How many replicas of its newest checkpoint a container keeps for forks (the
    /// annotation `io.crab.standby.forks` chooses per container; at most
    /// [`MAX_FORK_REPLICAS`]). Each is a whole copy of the checkpoint's processes
    /// and counts in `max_per_host`. 0: none, every fork restores from the images.
    pub forks: u32,
}

impl Default for Standby {
    fn default() -> Self {
        Standby {
            enabled: false,
            max_per_host: 8,
            max_image_mib: 0,
            min_available_mib: 1024,
            forks: 0,
        }
    }
}

/// The annotation by which a container asks for replicas for forks (a count).
pub const FORK_REPLICAS_ANNOTATION: &str = "io.crab.standby.forks";

/// The most replicas for forks one container keeps.
pub const MAX_FORK_REPLICAS: u32 = 64;

/// The annotation by which a container asks for a standby replica (`true`) or
/// declines one (`false`), whatever [`Standby::enabled`] says.
pub const STANDBY_ANNOTATION: &str = "io.crab.standby";

impl Standby {
    /// Applies a container's [`STANDBY_ANNOTATION`].
    pub fn choose(&mut self, value: &str) -> Result<(), String> {
        self.enabled = switch(value)?;
        Ok(())
    }

    /// Whether a container keeps any replica: for its rollbacks or for forks.
    pub fn wants_replicas(&self) -> bool {
        self.enabled || self.forks > 0
    }

    /// Applies a container's [`FORK_REPLICAS_ANNOTATION`].
    pub fn choose_forks(&mut self, value: &str) -> Result<(), String> {
        let n: u32 = value
            .parse()
            .map_err(|_| format!("{value:?} is not a count"))?;
        if n > MAX_FORK_REPLICAS {
            return Err(format!("{n} is more than {MAX_FORK_REPLICAS}"));
        }
        self.forks = n;
        Ok(())
    }
}

/// The value of an on/off annotation: `true` or `false`, nothing else.
pub fn switch(value: &str) -> Result<bool, String> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(format!("{other:?} is neither true nor false")),
    }
}

/// Shim log levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[allow(missing_docs)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    /// The level's name, as `tracing` filters spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// Storage backend settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Storage {
    /// Which backend gives containers their root file system.
    pub backend: Backend,
    /// The btrfs pool: the mount point of a btrfs file system.
    pub pool: String,
    /// The ZFS dataset under which Crab keeps images and containers.
    pub zfs_dataset: String,
    /// The overlay store's directory (any file system; xfs or btrfs give reflinks).
    pub overlay_dir: PathBuf,
    /// Size of the embedded loop-file pool the set-up creates, e.g. `"8G"`.
    pub pool_size: String,
}

/// Storage backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// The rootfs containerd's snapshotter mounts, used as it is (no snapshots).
    Passthrough,
    /// containerd's layers as overlay lower dirs, the upper dir snapshotted by Crab.
    Overlay,
    /// A btrfs subvolume per container.
    Btrfs,
    /// A ZFS dataset per container.
    Zfs,
}

impl Backend {
    /// Whether its store can name the changes since the image without a walk
    /// ([`crate::storage::Store::changed_since_image`]): asking one that cannot
    /// would only cost a helper process per checkpoint.
    pub fn names_changes(self) -> bool {
        self == Backend::Btrfs
    }
}

/// Checkpoint store settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Checkpoint {
    /// Directory of per-container manifests and process images.
    pub store: PathBuf,
    /// How many checkpoints per container are kept (marked ones are kept as well).
    pub keep_last: u32,
    /// The CRIU binary (4.2 or later): a path, or a name looked up in `PATH`.
    pub criu: PathBuf,
    /// How many dumps and restores may run at once on this host (0: no bound).
    pub max_parallel: u32,
    /// Seconds after which a CRIU run is killed.
    pub criu_timeout_s: u64,
    /// Milliseconds a checkpoint that dumps processes waits for running exec
    /// processes (a platform's probe, a `docker exec`) to exit before it fails:
    /// they are not descendants of the init, so CRIU cannot dump them. New execs
    /// wait for the checkpoint meanwhile.
    pub exec_wait_ms: u64,
    /// Whether a checkpoint through containerd's API that carries no checkpoint
    /// options stops the container. Docker (`docker checkpoint create`, with or
    /// without `--leave-running`), the CRI plugin and `ctr task checkpoint` (with
    /// or without `--exit`) send runc's options only to runc's runtimes, so Crab
    /// cannot tell what such a client meant; the annotation
    /// `io.crab.checkpoint.exit` chooses per container. Options that are sent
    /// always win.
    pub exit_when_unspecified: bool,
    /// When a checkpoint's process image must be on disk
    /// ([`crate::checkpoint::durability`]).
    pub durability: Durability,
}

/// When a checkpoint's process image must be on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Synced before the checkpoint is reported: it survives a host crash.
    Host,
    /// Written (the kernel's page cache) before it is reported, synced right
    /// after in the background: it survives a crash of the shim, not of the host.
    Shim,
}

/// The annotation by which a container chooses [`Checkpoint::durability`]
/// (`host` or `shim`).
pub const CHECKPOINT_DURABILITY_ANNOTATION: &str = "io.crab.checkpoint.durability";

/// The annotation by which a container chooses [`Checkpoint::exit_when_unspecified`]
/// (`docker run --annotation io.crab.checkpoint.exit=true`).
pub const CHECKPOINT_EXIT_ANNOTATION: &str = "io.crab.checkpoint.exit";

impl Checkpoint {
    /// Applies a container's [`CHECKPOINT_EXIT_ANNOTATION`] (`true` or `false`).
    pub fn choose_exit(&mut self, value: &str) -> Result<(), String> {
        self.exit_when_unspecified = switch(value)?;
        Ok(())
    }

    /// Applies a container's [`CHECKPOINT_DURABILITY_ANNOTATION`].
    pub fn choose_durability(&mut self, value: &str) -> Result<(), String> {
        self.durability = match value {
            "host" => Durability::Host,
            "shim" => Durability::Shim,
            other => return Err(format!("{other:?} is neither host nor shim")),
        };
        Ok(())
    }

    /// [`Checkpoint::exec_wait_ms`] as a duration.
    pub fn exec_wait(&self) -> Duration {
        Duration::from_millis(self.exec_wait_ms)
    }
}

/// Checkpoint policy settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// `adaptive` checkpoints only what changed; `full` dumps everything every time.
    pub mode: PolicyMode,
    /// Whether a failed checkpoint holds the agent back (`true`) or is only logged.
    pub fail_closed: bool,
    /// Where the host's eBPF inspector is pinned (a bpffs directory).
    pub bpf_pin_root: PathBuf,
    /// End a turn when an exec'd process exits (agents that act through
    /// `exec` from outside the sandbox).
    pub turn_on_exec: bool,
}

/// The turn proxy (see `docs/proxy.md`). Off unless an upstream is set, here
/// or by a container's annotation `io.crab.proxy.upstream`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Proxy {
    /// The LLM API the proxy forwards to (`http://host:port` or
    /// `https://host[:port]`); empty: no proxy.
    pub upstream: String,
    /// Where it listens, inside each container's network namespace
    /// (annotation `io.crab.proxy.listen`).
    pub listen: String,
    /// Further upstreams a container's annotation `io.crab.proxy.upstream` may
    /// choose (`upstream` itself is always allowed). An annotation chooses among
    /// them; it never adds one: the proxy connects from the host's network.
    pub upstreams: Vec<String>,
    /// Addresses beyond loopback that the annotation `io.crab.proxy.listen` may
    /// name: an IP (any port) or `ip:port`. Empty: loopback only, so that the
    /// agent API is never reachable from outside the sandbox.
    pub allow_listen: Vec<String>,
    /// Put `OPENAI_BASE_URL` and `ANTHROPIC_BASE_URL`, pointing at the
    /// listener, into the container's environment (unless the spec sets them).
    pub inject_env: bool,
    /// Serve the agent API (checkpoint, list, rollback, fork; also as MCP
    /// tools) under `/.crab/` on the listener.
    pub agent_api: bool,
    /// Extra trusted CA certificates (PEM) for an https upstream.
    pub upstream_ca: PathBuf,
    /// The proxy program (`crabctl`): a path, or a name looked up beside the
    /// shim's own binary, then in `PATH`.
    pub command: PathBuf,
    /// Client connections one proxy serves at once (over all its listeners);
    /// more are answered 503 and closed. With the buffers' bound, this bounds
    /// the proxy's memory (docs/proxy.md, "Limits").
    pub max_connections: u32,
    /// Seconds a client has to send a whole request head (also how long an
    /// idle keep-alive connection is kept).
    pub header_timeout_secs: u64,
    /// Seconds a request body may send nothing while the proxy waits for it.
    pub body_timeout_secs: u64,
    /// The largest request body passed upstream (`32M`); the agent API takes
    /// 64 KiB at most whatever this says.
    pub max_body: String,
    /// Size at which the proxy's log is rotated to `<log>.1` (`1M`): the log
    /// takes at most twice this.
    pub log_max_size: String,
}

/// An agent inside the sandbox, talking to its LLM through the turn proxy
/// (`docs/agents.md`, "Fast-forward"). A container's annotations
/// `io.crab.agent.fast-forward` and `io.crab.agent.state-paths` choose for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Agent {
    /// Journal the LLM exchanges, and after a restore answer the agent's
    /// repeated requests from the journal until it is where the restored
    /// checkpoint was. With it, the agent's own processes (those holding the
    /// proxy connection) and `state_paths` no longer make a turn a checkpoint
    /// by themselves: a turn that changed nothing else is skipped. On by
    /// default; a container turns it off with `io.crab.agent.fast-forward=false`.
    pub fast_forward: bool,
    /// The most turns a restore replays from the journal: a turn that would
    /// make the run of turns since the agent's last process image longer is
    /// full, however little changed. This bounds the journal (retention keeps
    /// the exchanges from the oldest image a kept checkpoint uses) and the
    /// time a restore takes to bring the agent back. At least 1.
    pub max_replay_turns: u32,
    /// Absolute paths in the container (and everything under them) that only
    /// the agent's bookkeeping writes (its transcript, its settings): replay
    /// writes them again, so they alone do not make a checkpoint.
    pub state_paths: Vec<String>,
}

/// The most state paths a container may declare.
const MAX_STATE_PATHS: usize = 16;

impl Agent {
    /// Takes the state paths a container's annotation declares (comma-separated
    /// absolute paths): they replace the host's. Each must be absolute, plain
    /// (no `.` or `..` component, no empty one) and not the root itself, which
    /// would leave every file out of the turn's signal.
    pub fn choose_state_paths(&mut self, wanted: &str) -> std::result::Result<(), String> {
        let paths: Vec<String> = wanted
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect();
        if paths.len() > MAX_STATE_PATHS {
            return Err(format!("{} paths; at most {MAX_STATE_PATHS}", paths.len()));
        }
        for p in &paths {
            check_state_path(p)?;
        }
        self.state_paths = paths;
        Ok(())
    }

    /// Checks the host's state paths.
    pub fn check(&self) -> std::result::Result<(), String> {
        self.state_paths
            .iter()
            .try_for_each(|p| check_state_path(p))
    }
}

fn check_state_path(p: &str) -> std::result::Result<(), String> {
    let plain = p.len() <= 4096
        && p.starts_with('/')
        && p.len() > 1
        && p[1..]
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    if plain {
        Ok(())
    } else {
        Err(format!(
            "{p:?} is not a plain absolute path below / (no empty, . or .. component)"
        ))
    }
}

impl Default for Agent {
    fn default() -> Self {
        Agent {
            fast_forward: true,
            max_replay_turns: 32,
            // Claude Code's transcript, settings and shell snapshots (root's
            // home, and $HOME when it is /home/<user>), its task output.
            state_paths: vec!["/root/.claude".into(), "/tmp/claude-0".into()],
        }
    }
}

/// Migration archives (`crabctl export`, `crabctl import`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Archive {
    /// The key that signs exports and checks imports (HMAC-SHA256): a regular
    /// file owned by root, mode 0600 or stricter, holding at least 32 bytes. Hosts
    /// that move containers between them need the same file. Empty: a key is
    /// generated at first use in `<checkpoint.store>/.archive.key`, which serves
    /// this host only.
    pub key_file: PathBuf,
}

/// Policy modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyMode {
    /// Skip / fs-only / process-only / full, as the inspector classifies the turn.
    Adaptive,
    /// A full checkpoint every time.
    Full,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            state_dir: PathBuf::from("/run/crab"),
            tracking_cgroup: default_tracking_cgroup(),
            log_level: LogLevel::Info,
            control_group: String::new(),
            storage: Storage::default(),
            checkpoint: Checkpoint::default(),
            policy: Policy::default(),
            proxy: Proxy::default(),
            agent: Agent::default(),
            quota: Quota::default(),
            fault_file: None,
            archive: Archive::default(),
            standby: Standby::default(),
        }
    }
}

impl Proxy {
    /// Whether a proxy runs.
    pub fn enabled(&self) -> bool {
        !self.upstream.is_empty()
    }

    /// Checks the upstreams and the listen addresses; the error names the key.
    pub fn check(&self) -> std::result::Result<(), (&'static str, String)> {
        if self.enabled() {
            check_url(&self.upstream).map_err(|m| ("proxy.upstream", m))?;
        }
        for u in &self.upstreams {
            check_url(u).map_err(|m| ("proxy.upstreams", m))?;
        }
        self.listen
            .parse::<std::net::SocketAddr>()
            .map_err(|e| ("proxy.listen", format!("{:?}: {e}", self.listen)))?;
        if self.max_connections == 0 {
            return Err(("proxy.max_connections", "must be at least 1".into()));
        }
        if self.header_timeout_secs == 0 {
            return Err(("proxy.header_timeout_secs", "must be at least 1".into()));
        }
        if self.body_timeout_secs == 0 {
            return Err(("proxy.body_timeout_secs", "must be at least 1".into()));
        }
        self.max_body_bytes().map_err(|m| ("proxy.max_body", m))?;
        self.log_max_bytes()
            .map_err(|m| ("proxy.log_max_size", m))?;
        for a in &self.allow_listen {
            if a.parse::<std::net::IpAddr>().is_err() && a.parse::<std::net::SocketAddr>().is_err()
            {
                return Err((
                    "proxy.allow_listen",
                    format!("{a:?} is neither an IP address nor ip:port"),
                ));
            }
        }
        Ok(())
    }

    /// `max_body` in bytes.
    pub fn max_body_bytes(&self) -> std::result::Result<u64, String> {
        parse_size(&self.max_body)
    }

    /// `log_max_size` in bytes.
    pub fn log_max_bytes(&self) -> std::result::Result<u64, String> {
        parse_size(&self.log_max_size)
    }

    /// Takes the upstream a container's annotation chooses: the configured
    /// `upstream` or one of `upstreams`, nothing else.
    pub fn choose_upstream(&mut self, wanted: &str) -> std::result::Result<(), String> {
        let same = |a: &str| a.trim_end_matches('/') == wanted.trim_end_matches('/');
        if wanted.is_empty() || !(same(&self.upstream) || self.upstreams.iter().any(|u| same(u))) {
            let mut allowed: Vec<&str> = self.upstreams.iter().map(String::as_str).collect();
            if self.enabled() {
                allowed.insert(0, &self.upstream);
            }
            return Err(format!(
                "{wanted:?} is not an upstream the host allows (allowed: {allowed:?}; \
                 the host configuration's [proxy] upstream and upstreams)"
            ));
        }
        self.upstream = wanted.to_string();
        Ok(())
    }

    /// Takes the listen address a container's annotation asks for: a loopback
    /// address, or one the host's `allow_listen` names.
    pub fn choose_listen(&mut self, wanted: &str) -> std::result::Result<(), String> {
        let addr: std::net::SocketAddr = wanted
            .parse()
            .map_err(|e| format!("{wanted:?} is not ip:port: {e}"))?;
        let allowed = addr.ip().is_loopback()
            || self.allow_listen.iter().any(|a| {
                a.parse::<std::net::IpAddr>() == Ok(addr.ip())
                    || a.parse::<std::net::SocketAddr>() == Ok(addr)
            });
        if !allowed {
            return Err(format!(
                "{wanted} is not a loopback address, and the host's [proxy] allow_listen \
                 ({:?}) does not name it: the agent API would be open beyond the sandbox",
                self.allow_listen
            ));
        }
        self.listen = addr.to_string();
        Ok(())
    }
}

impl Default for Proxy {
    fn default() -> Self {
        Proxy {
            upstream: String::new(),
            listen: "127.0.0.1:8787".into(),
            upstreams: Vec::new(),
            allow_listen: Vec::new(),
            inject_env: true,
            agent_api: true,
            upstream_ca: PathBuf::new(),
            command: PathBuf::from("crabctl"),
            max_connections: 64,
            header_timeout_secs: 10,
            body_timeout_secs: 30,
            max_body: "32M".into(),
            log_max_size: "1M".into(),
        }
    }
}

impl Default for Storage {
    fn default() -> Self {
        Storage {
            backend: Backend::Btrfs,
            pool: "/var/lib/crab/pool".into(),
            zfs_dataset: "crab/crab".into(),
            overlay_dir: PathBuf::from("/var/lib/crab/overlay"),
            pool_size: "8G".into(),
        }
    }
}

/// Bounds on what agents make through the agent API (the operator's `crabctl` is not
/// bounded). A lineage is a sandbox and every fork made from it or from its forks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Quota {
    /// Containers agents forked that exist at once, per lineage (0: agents cannot
    /// fork).
    pub agent_forks_alive: u32,
    /// Forks the agents of one lineage may make per minute.
    pub agent_forks_per_minute: u32,
    /// Checkpoints an agent may ask for per minute (`POST /.crab/v1/checkpoints`;
    /// a turn's own checkpoint is not counted).
    pub agent_checkpoints_per_minute: u32,
    /// Whether a fork an agent made serves the agent API itself (its agent could
    /// then fork again, within the lineage's quota).
    pub agent_forks_get_agent_api: bool,
    /// Bytes a sandbox may hold in the storage pool: what it wrote that its tree or
    /// its checkpoints' snapshots still hold (btrfs simple quotas, ZFS `quota`; the
    /// overlay store measures its upper directory at each snapshot). A write past it
    /// fails inside that sandbox only. `"none"`: unbounded.
    pub sandbox_pool_bytes: String,
    /// Bytes of process images a sandbox's checkpoints may hold: older checkpoints
    /// go first (marked ones stay), and a checkpoint that cannot fit is refused.
    pub sandbox_checkpoint_bytes: String,
    /// Bytes of process images all checkpoints on the host may hold; a checkpoint
    /// that would pass it is refused. `"none"`: unbounded.
    pub host_checkpoint_bytes: String,
}

impl Quota {
    /// `quota.sandbox_pool_bytes` in bytes (`None`: unbounded).
    pub fn sandbox_pool_limit(&self) -> Option<u64> {
        parse_limit(&self.sandbox_pool_bytes).ok().flatten()
    }

    /// `quota.sandbox_checkpoint_bytes` in bytes (`None`: unbounded).
    pub fn sandbox_checkpoint_limit(&self) -> Option<u64> {
        parse_limit(&self.sandbox_checkpoint_bytes).ok().flatten()
    }

    /// `quota.host_checkpoint_bytes` in bytes (`None`: unbounded).
    pub fn host_checkpoint_limit(&self) -> Option<u64> {
        parse_limit(&self.host_checkpoint_bytes).ok().flatten()
    }
}

impl Default for Quota {
    fn default() -> Self {
        Quota {
            agent_forks_alive: 8,
            agent_forks_per_minute: 4,
            agent_checkpoints_per_minute: 30,
            agent_forks_get_agent_api: false,
            sandbox_pool_bytes: "2G".into(),
            sandbox_checkpoint_bytes: "4G".into(),
            host_checkpoint_bytes: "none".into(),
        }
    }
}

impl Default for Checkpoint {
    fn default() -> Self {
        Checkpoint {
            store: PathBuf::from("/var/lib/crab/checkpoints"),
            keep_last: 16,
            criu: PathBuf::from("criu"),
            max_parallel: 4,
            criu_timeout_s: 300,
            // A Kubernetes exec probe times out after 1 s by default and a
            // monitoring exec is shorter: 5 s covers them with room for a loaded
            // host, and is as long as a turn's answer may be held for one.
            exec_wait_ms: 5000,
            durability: Durability::Host,
            // As containerd's checkpoint API without options means for runc.
            exit_when_unspecified: false,
        }
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            mode: PolicyMode::Adaptive,
            fail_closed: true,
            bpf_pin_root: PathBuf::from("/sys/fs/bpf/crab"),
            turn_on_exec: false,
        }
    }
}

/// `/sys/fs/cgroup/unified/crab` on hybrid hosts, `/sys/fs/cgroup/crab` on unified ones.
fn default_tracking_cgroup() -> PathBuf {
    let unified = Path::new("/sys/fs/cgroup/unified");
    if unified.join("cgroup.procs").exists() {
        unified.join("crab")
    } else {
        PathBuf::from("/sys/fs/cgroup/crab")
    }
}

/// Where a configuration was found, for error messages and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Runtime options `ConfigBody`.
    Body(String),
    /// A file (from `ConfigPath`, `CRAB_CONFIG`, or the default path).
    File(PathBuf),
    /// Nothing given and no default file: built-in defaults.
    Defaults,
}

impl Config {
    /// Parses TOML text; `origin` names it in error messages.
    pub fn parse(text: &str, origin: &str) -> Result<Config> {
        let de = toml::Deserializer::new(text);
        let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            let message = inner.message().to_string();
            Error::Config {
                path: origin.to_string(),
                message: if key == "." || key.is_empty() {
                    message
                } else {
                    format!("key `{key}`: {message}")
                },
            }
        })?;
        config.validate(origin)?;
        Ok(config)
    }

    /// Loads the configuration from the first source that applies (see the module docs).
    pub fn load(
        body: Option<&str>,
        path: Option<&Path>,
        env: Option<&Path>,
    ) -> Result<(Config, Source)> {
        if let Some(body) = body.filter(|b| !b.trim().is_empty()) {
            return Ok((
                Config::parse(body, "ConfigBody")?,
                Source::Body(body.into()),
            ));
        }
        let default = Path::new(DEFAULT_CONFIG_PATH);
        let chosen = path
            .filter(|p| !p.as_os_str().is_empty())
            .or(env)
            .or(default.exists().then_some(default));
        match chosen {
            Some(file) => {
                let text = std::fs::read_to_string(file).map_err(|e| Error::Config {
                    path: file.display().to_string(),
                    message: format!("cannot read: {e}"),
                })?;
                let config = Config::parse(&text, &file.display().to_string())?;
                Ok((config, Source::File(file.to_path_buf())))
            }
            None => Ok((Config::default(), Source::Defaults)),
        }
    }

    /// [`Config::load`] with `CRAB_CONFIG` taken from the environment.
    pub fn load_with_env(body: Option<&str>, path: Option<&Path>) -> Result<(Config, Source)> {
        let env = std::env::var_os(CONFIG_ENV).map(PathBuf::from);
        Config::load(body, path, env.as_deref())
    }

    /// Serializes to TOML (what the shim stores beside a bundle for `delete`).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("config serializes")
    }

    fn validate(&self, origin: &str) -> Result<()> {
        let bad = |key: &str, message: String| Error::Config {
            path: origin.to_string(),
            message: format!("key `{key}`: {message}"),
        };
        for (key, path) in [
            ("state_dir", &self.state_dir),
            ("storage.overlay_dir", &self.storage.overlay_dir),
            ("tracking_cgroup", &self.tracking_cgroup),
            ("checkpoint.store", &self.checkpoint.store),
            ("policy.bpf_pin_root", &self.policy.bpf_pin_root),
        ] {
            if !path.is_absolute() {
                return Err(bad(
                    key,
                    format!("{} is not an absolute path", path.display()),
                ));
            }
        }
        if self.standby.forks > MAX_FORK_REPLICAS {
            return Err(bad("standby.forks", format!("at most {MAX_FORK_REPLICAS}")));
        }
        if self.checkpoint.keep_last == 0 {
            return Err(bad("checkpoint.keep_last", "must be at least 1".into()));
        }
        if self.checkpoint.criu.as_os_str().is_empty() {
            return Err(bad("checkpoint.criu", "must not be empty".into()));
        }
        if self.storage.pool.trim().is_empty() {
            return Err(bad("storage.pool", "must not be empty".into()));
        }
        parse_size(&self.storage.pool_size).map_err(|m| bad("storage.pool_size", m))?;
        for (key, text) in [
            ("quota.sandbox_pool_bytes", &self.quota.sandbox_pool_bytes),
            (
                "quota.sandbox_checkpoint_bytes",
                &self.quota.sandbox_checkpoint_bytes,
            ),
            (
                "quota.host_checkpoint_bytes",
                &self.quota.host_checkpoint_bytes,
            ),
        ] {
            parse_limit(text).map_err(|m| bad(key, m))?;
        }
        self.proxy.check().map_err(|(key, m)| bad(key, m))?;
        self.agent
            .check()
            .map_err(|m| bad("agent.state_paths", m))?;
        if self.agent.max_replay_turns == 0 {
            return Err(bad("agent.max_replay_turns", "must be at least 1".into()));
        }
        let key_file = &self.archive.key_file;
        if !key_file.as_os_str().is_empty() && !key_file.is_absolute() {
            return Err(bad(
                "archive.key_file",
                format!("{} is not an absolute path", key_file.display()),
            ));
        }
        Ok(())
    }

    /// The gid of `control_group`, if one is set.
    pub fn control_gid(&self) -> Result<Option<u32>> {
        let g = self.control_group.trim();
        if g.is_empty() {
            return Ok(None);
        }
        if let Ok(gid) = g.parse::<u32>() {
            return Ok(Some(gid));
        }
        match nix::unistd::Group::from_name(g) {
            Ok(Some(group)) => Ok(Some(group.gid.as_raw())),
            Ok(None) => Err(Error::Config {
                path: "control_group".into(),
                message: format!("no group {g:?}"),
            }),
            Err(e) => Err(Error::Config {
                path: "control_group".into(),
                message: format!("look up group {g:?}: {e}"),
            }),
        }
    }

    /// The state directory of one containerd namespace.
    pub fn namespace_dir(&self, namespace: &str) -> PathBuf {
        self.state_dir.join(namespace)
    }
}

/// Checks an upstream URL: `http://` or `https://` and a host.
fn check_url(url: &str) -> std::result::Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or(format!("{url:?} is not an http:// or https:// URL"))?;
    if rest.split('/').next().unwrap_or("").is_empty() {
        return Err(format!("{url:?} has no host"));
    }
    Ok(())
}

/// Parses a byte limit: a size as [`parse_size`] reads it, or `none` (no limit).
pub fn parse_limit(text: &str) -> std::result::Result<Option<u64>, String> {
    if text.trim().eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    parse_size(text)
        .map(Some)
        .map_err(|m| format!("{m}, or none"))
}

/// Parses sizes such as `512M`, `8G`, `1T` or a plain byte count.
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (use e.g. 512M, 8G)"))?;
    let mult: u64 = match unit.to_ascii_uppercase().trim_end_matches(['B', 'I']) {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(format!("{text:?} has an unknown unit {unit:?}")),
    };
    n.checked_mul(mult)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("{text:?} is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_containers_exit_annotation_is_true_or_false_and_nothing_else() {
        let mut c = Checkpoint::default();
        c.choose_exit("true").unwrap();
        assert!(c.exit_when_unspecified);
        c.choose_exit("false").unwrap();
        assert!(!c.exit_when_unspecified);
        assert!(c.choose_exit("yes").unwrap_err().contains("\"yes\""));
        assert!(!c.exit_when_unspecified, "a refused value changes nothing");
    }

    #[test]
    fn test_empty_text_gives_defaults() {
        let c = Config::parse("", "t").unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn test_fast_forward_is_on_by_default_and_can_be_turned_off() {
        let c = Config::parse("", "t").unwrap();
        assert!(c.agent.fast_forward);
        assert_eq!(c.agent.max_replay_turns, 32);
        let off = Config::parse("[agent]\nfast_forward = false", "t").unwrap();
        assert!(!off.agent.fast_forward);
    }

    #[test]
    fn test_full_config_parses() {
        let c = Config::parse(
            r#"
state_dir = "/run/x"
log_level = "debug"
[storage]
backend = "zfs"
pool = "crabpool"
pool_size = "2G"
[checkpoint]
store = "/var/x"
keep_last = 3
exec_wait_ms = 250
exit_when_unspecified = true
[policy]
mode = "full"
fail_closed = false
"#,
            "t",
        )
        .unwrap();
        assert_eq!(c.storage.backend, Backend::Zfs);
        assert_eq!(c.checkpoint.keep_last, 3);
        assert_eq!(
            c.checkpoint.exec_wait(),
            std::time::Duration::from_millis(250)
        );
        assert_eq!(Config::default().checkpoint.exec_wait_ms, 5000);
        assert!(c.checkpoint.exit_when_unspecified);
        assert!(!Config::default().checkpoint.exit_when_unspecified);
        assert_eq!(c.policy.mode, PolicyMode::Full);
        assert_eq!(c.log_level, LogLevel::Debug);
    }

    #[test]
    fn test_unknown_key_is_named() {
        let e = Config::parse("[storage]\nbakend = \"zfs\"\n", "t").unwrap_err();
        let m = e.to_string();
        assert!(m.contains("bakend"), "{m}");
    }

    #[test]
    fn test_bad_enum_value_names_the_key() {
        let e = Config::parse("[storage]\nbackend = \"ext9\"\n", "t").unwrap_err();
        let m = e.to_string();
        assert!(m.contains("storage.backend") && m.contains("ext9"), "{m}");
    }

    #[test]
    fn test_bad_type_names_the_key() {
        let e = Config::parse("[checkpoint]\nkeep_last = \"many\"\n", "t").unwrap_err();
        assert!(e.to_string().contains("checkpoint.keep_last"), "{e}");
    }

    #[test]
    fn test_invalid_values_name_the_key() {
        for (text, key) in [
            ("state_dir = \"relative\"", "state_dir"),
            ("[checkpoint]\nkeep_last = 0", "checkpoint.keep_last"),
            ("[agent]\nmax_replay_turns = 0", "agent.max_replay_turns"),
            ("[storage]\npool_size = \"12Q\"", "storage.pool_size"),
            (
                "[quota]\nsandbox_pool_bytes = \"lots\"",
                "quota.sandbox_pool_bytes",
            ),
            (
                "[quota]\nhost_checkpoint_bytes = \"0\"",
                "quota.host_checkpoint_bytes",
            ),
        ] {
            let e = Config::parse(text, "t").unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
    }

    #[test]
    fn test_an_annotation_chooses_only_an_allowed_upstream() {
        let mut p = Proxy {
            upstream: "https://api.openai.com".into(),
            upstreams: vec!["http://10.0.0.5:8000".into()],
            ..Proxy::default()
        };
        let mut chosen = p.clone();
        chosen.choose_upstream("http://10.0.0.5:8000/").unwrap();
        assert_eq!(chosen.upstream, "http://10.0.0.5:8000/");
        // Choosing again, as a restore does with the same annotation.
        chosen.choose_upstream("http://10.0.0.5:8000/").unwrap();
        p.clone().choose_upstream("https://api.openai.com").unwrap();
        for bad in ["http://169.254.169.254", "http://127.0.0.1:22", ""] {
            let e = p.choose_upstream(bad).unwrap_err();
            assert!(e.contains("not an upstream the host allows"), "{e}");
        }
        let mut off = Proxy::default();
        assert!(off.choose_upstream("http://127.0.0.1:1").is_err());
        assert!(!off.enabled());
    }

    #[test]
    fn test_an_annotation_listens_on_loopback_unless_the_host_allows_more() {
        let mut p = Proxy::default();
        p.choose_listen("127.0.0.1:9000").unwrap();
        p.choose_listen("[::1]:9000").unwrap();
        for bad in ["0.0.0.0:8787", "10.0.0.2:8787", "[::]:8787", "nonsense"] {
            assert!(p.choose_listen(bad).is_err(), "{bad}");
        }
        p.allow_listen = vec!["10.0.0.2".into(), "0.0.0.0:8787".into()];
        p.choose_listen("10.0.0.2:1234").unwrap();
        p.choose_listen("0.0.0.0:8787").unwrap();
        assert!(p.choose_listen("0.0.0.0:9999").is_err());
        let e = Config::parse("[proxy]\nallow_listen = [\"nope\"]", "t").unwrap_err();
        assert!(e.to_string().contains("proxy.allow_listen"), "{e}");
        let e = Config::parse("[proxy]\nupstreams = [\"ftp://x\"]", "t").unwrap_err();
        assert!(e.to_string().contains("proxy.upstreams"), "{e}");
    }

    #[test]
    fn test_proxy_limits_must_be_positive_and_sizes_parse() {
        for (text, key) in [
            ("max_connections = 0", "proxy.max_connections"),
            ("header_timeout_secs = 0", "proxy.header_timeout_secs"),
            ("body_timeout_secs = 0", "proxy.body_timeout_secs"),
            ("max_body = \"lots\"", "proxy.max_body"),
            ("log_max_size = \"0\"", "proxy.log_max_size"),
        ] {
            let e = Config::parse(&format!("[proxy]\n{text}"), "t").unwrap_err();
            assert!(e.to_string().contains(key), "{text}: {e}");
        }
        let c = Config::parse("[proxy]\nmax_body = \"1K\"\nlog_max_size = \"2M\"", "t").unwrap();
        assert_eq!(c.proxy.max_body_bytes(), Ok(1024));
        assert_eq!(c.proxy.log_max_bytes(), Ok(2 << 20));
    }

    #[test]
    fn test_a_count_of_fork_replicas_is_bounded_in_the_file_and_the_annotation() {
        let e = Config::parse("[standby]\nforks = 65", "t").unwrap_err();
        assert!(e.to_string().contains("standby.forks"), "{e}");
        let mut c = Config::parse("[standby]\nforks = 64", "t").unwrap();
        assert!(c.standby.wants_replicas());
        c.standby.choose_forks("0").unwrap();
        assert!(!c.standby.wants_replicas());
        for bad in ["65", "lots", "-1", ""] {
            assert!(c.standby.choose_forks(bad).is_err(), "{bad:?}");
        }
        assert_eq!(c.standby.forks, 0, "a refused value changed nothing");
    }

    #[test]
    fn test_body_wins_over_path() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "state_dir = \"/from/file\"").unwrap();
        let (c, s) = Config::load(Some("state_dir = \"/from/body\""), Some(&file), None).unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/from/body"));
        assert!(matches!(s, Source::Body(_)));
        let (c, _) = Config::load(None, Some(&file), None).unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/from/file"));
    }

    #[test]
    fn test_missing_file_is_an_error_naming_it() {
        let e = Config::load(None, Some(Path::new("/nonexistent/crab.toml")), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/crab.toml"), "{e}");
    }

    #[test]
    fn test_roundtrip_through_toml() {
        let c = Config::default();
        assert_eq!(Config::parse(&c.to_toml(), "t").unwrap(), c);
    }

    #[test]
    fn test_byte_quotas_read_sizes_or_none() {
        let c = Config::parse(
            "[quota]\nsandbox_pool_bytes = \"64M\"\nsandbox_checkpoint_bytes = \"none\"",
            "t",
        )
        .unwrap();
        assert_eq!(c.quota.sandbox_pool_limit(), Some(64 << 20));
        assert_eq!(c.quota.sandbox_checkpoint_limit(), None);
        assert_eq!(c.quota.host_checkpoint_limit(), None);
        assert_eq!(Config::default().quota.sandbox_pool_limit(), Some(2 << 30));
    }

    #[test]
    fn test_parse_size_units() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("8G").unwrap(), 8 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("0").is_err());
        assert!(parse_size("G").is_err());
    }

    #[test]
    fn agent_state_paths_must_be_plain_absolute_paths_below_the_root() {
        let mut a = Agent::default();
        a.choose_state_paths("/root/.claude, /tmp/claude-0")
            .unwrap();
        assert_eq!(a.state_paths, ["/root/.claude", "/tmp/claude-0"]);
        for bad in ["/", "/a/../b", "a/b", "/a//b", "/a/./b"] {
            let e = a.choose_state_paths(bad).unwrap_err();
            assert!(e.contains("plain absolute path"), "{bad}: {e}");
        }
        let many = vec!["/x"; 17].join(",");
        assert!(a
            .choose_state_paths(&many)
            .unwrap_err()
            .contains("at most 16"));
    }
}
