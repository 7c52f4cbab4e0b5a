//! `crabctl`: Crab's command-line client for this host.

mod ckpt;
mod containerd;
mod crashed;
mod file_caps;
mod fs;
mod inspect;
mod leftovers;
mod migrate;
mod pending;
mod proxy;
mod proxy_door;
mod quota;
mod recover;
mod remap;
mod turn;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use crab_runtime::config::Config;
use crab_runtime::error::{ErrorKind, Failure};

#[derive(Parser)]
#[command(
    version,
    about = "Crab: checkpoint/restore runtime for agent sandboxes"
)]
struct Cli {
    /// Configuration file (default: $CRAB_CONFIG, then /etc/crab/config.toml).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// containerd namespace of the container.
    #[arg(long, short = 'n', global = true, default_value = "default")]
    namespace: String,
    /// containerd's socket (for restore, fork and import).
    #[arg(
        long,
        short = 'a',
        global = true,
        env = "CONTAINERD_ADDRESS",
        default_value = "/run/containerd/containerd.sock"
    )]
    address: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the configuration and print it with every default filled in.
    Config,
    /// Print what Crab records about a running container (cgroup id, bundle, ...).
    Inspect {
        /// Container id.
        id: String,
    },
    /// Print the host-side door of a container's turn proxy: the unix socket
    /// through which an orchestrator on the host reaches the proxy (fails when the
    /// container has no proxy running).
    Door {
        /// Container id.
        id: String,
    },
    /// The host-wide eBPF inspector.
    #[command(subcommand)]
    Inspector(inspect::InspectorCmd),
    /// Snapshots of containers' root file systems.
    Fs(fs::FsArgs),
    /// Checkpoint a running container (processes and files) into its history.
    Checkpoint {
        /// Container id.
        id: String,
        /// What to capture: full, fs-only or process-only.
        #[arg(long, default_value = "full", value_parser = ckpt::parse_kind)]
        kind: crab_runtime::checkpoint::Kind,
        /// A name for it (default: its sequence number).
        #[arg(long)]
        name: Option<String>,
        /// Keep it whatever the retention (checkpoint.keep_last).
        #[arg(long)]
        mark: bool,
    },
    /// End an agent's turn: classify what changed since the last checkpoint
    /// (skip, fs-only, process-only, full) and take that checkpoint.
    Turn {
        /// Container id.
        id: String,
        /// Classify only; take nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// A container's turn metrics: turns by kind, checkpoint latency, slot
    /// waits, how long answers were held.
    Stats {
        /// Container id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run the turn proxy of a container in the foreground: a listener in its
    /// network namespace that forwards to an LLM API; each LLM request ends a
    /// turn, and its answer waits for that turn's checkpoint.
    Proxy {
        /// Container id.
        id: String,
        /// The LLM API: http://host:port or https://host[:port].
        #[arg(long)]
        upstream: String,
        /// Extra trusted CA certificates (PEM) for an https upstream.
        #[arg(long)]
        upstream_ca: Option<PathBuf>,
        /// Where to listen, inside the container.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Serve the listening socket the shim bound at `--listen` and passed
        /// at this descriptor (a pod's containers share a network namespace).
        #[arg(long, hide = true, requires = "managed")]
        listen_fd: Option<i32>,
        /// Pass answers on even when their checkpoint failed (only log).
        #[arg(long)]
        fail_open: bool,
        /// Serve the agent API (checkpoint, list, rollback, fork; REST and
        /// MCP) under /.crab/ on the listener.
        #[arg(long)]
        agent_api: bool,
        /// Started by the shim: print `ready ADDR`, exit at EOF on stdin,
        /// listen in the container's new namespace on SIGHUP.
        #[arg(long, hide = true)]
        managed: bool,
        /// Log to this file, rotated to FILE.1 at `[proxy] log_max_size`
        /// (default: stderr).
        #[arg(long)]
        log: Option<PathBuf>,
        /// Journal each LLM exchange in DIR (made 0700 if missing), and
        /// answer a restored agent's repeated requests from it (DIR/replay.json,
        /// read at start and on SIGHUP).
        #[arg(long, value_name = "DIR")]
        journal: Option<PathBuf>,
    },
    /// List a container's checkpoints.
    Ls {
        /// Container id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a checkpoint.
    Rm {
        /// Container id.
        id: String,
        /// Checkpoint name or sequence number.
        checkpoint: String,
    },
    /// Bring a container whose task died (shim and processes killed) back from its
    /// newest checkpoint, or a named one, under the same id.
    Restore {
        /// Container id.
        id: String,
        /// Checkpoint name or sequence number (default: the newest).
        checkpoint: Option<String>,
    },
    /// Start N new containers from a checkpoint of a container (a new full checkpoint
    /// when none is named), each with its own copy of the files and namespaces.
    Fork {
        /// Container id.
        id: String,
        /// Checkpoint name or sequence number.
        checkpoint: Option<String>,
        /// How many.
        #[arg(long, default_value_t = 1)]
        count: usize,
        /// Their ids are PREFIX-1 ... PREFIX-N (default: ID-fork).
        #[arg(long)]
        prefix: Option<String>,
    },
    /// Write a checkpoint (a new full one when none is named) as one archive for
    /// another host: processes, files (as a delta against the image), spec, manifest.
    Export {
        /// Container id.
        id: String,
        /// Checkpoint name or sequence number.
        checkpoint: Option<String>,
        /// The archive to write.
        #[arg(short = 'o', long)]
        output: PathBuf,
    },
    /// Create a container from an archive written by export and start it restored
    /// (the image must be in this containerd). The archive must be signed with this
    /// host's archive key ([archive] key_file); its spec is rebuilt from an
    /// allow-list, and anything beyond it is refused unless --allow names its kind.
    Import {
        /// The archive.
        file: PathBuf,
        /// The new container's id.
        #[arg(long)]
        id: String,
        /// Keep settings of these kinds although beyond the allow-list, comma
        /// separated: host-mounts, capabilities, devices, host-namespaces,
        /// privileged, hooks, annotations, user-mappings, other.
        #[arg(long, value_delimiter = ',')]
        allow: Vec<crab_runtime::checkpoint::import_spec::Grant>,
        /// Leave settings of these kinds out instead of refusing the archive,
        /// comma separated: host-mounts, hooks, annotations (a Docker container's
        /// archive: --allow host-mounts --drop hooks).
        #[arg(long, value_delimiter = ',')]
        drop: Vec<crab_runtime::checkpoint::import_spec::Grant>,
        /// Import an archive that is unsigned, or whose signature this host's key
        /// does not match.
        #[arg(long)]
        allow_unsigned: bool,
        /// The crab configuration the new container runs with (as `ctr run
        /// --runtime-config-path`); without it, the shim's default.
        #[arg(long)]
        runtime_config_path: Option<PathBuf>,
        /// The image of this containerd the container's files go on, instead of the
        /// one the archive names (an archive of a Docker container names none).
        #[arg(long)]
        image: Option<String>,
    },
    /// Roll a running container back to a checkpoint, in place (same id, same task).
    Rollback {
        /// Container id.
        id: String,
        /// Checkpoint name or sequence number.
        checkpoint: String,
    },
}

/// Runs the command; a failure exits with the code of its kind (see
/// docs/checkpoint.md: 3 not found, 4 exists, 5 precondition, 6 invalid, 7 busy,
/// 8 unavailable, 1 anything else).
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:?}");
            std::process::ExitCode::from(kind_of(&e).exit_code() as u8)
        }
    }
}

/// The kind of a failure: the first cause that knows its own.
pub(crate) fn kind_of(e: &anyhow::Error) -> ErrorKind {
    e.chain()
        .find_map(|cause| {
            cause.downcast_ref::<Failure>().map(|f| f.kind).or_else(|| {
                cause
                    .downcast_ref::<crab_runtime::Error>()
                    .map(|r| r.kind())
            })
        })
        .unwrap_or(ErrorKind::Internal)
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    let (config, source) =
        Config::load_with_env(None, cli.config.as_deref()).context("load configuration")?;
    match cli.command {
        Command::Config => {
            println!("# from {source:?}");
            print!("{}", config.to_toml());
            Ok(())
        }
        Command::Inspect { id } => inspect::run(&config, &cli.namespace, &id),
        Command::Door { id } => inspect::door(&config, &cli.namespace, &id).map(|p| {
            if p.as_os_str().len() > crab_runtime::socket_path::MAX_SOCKET_PATH {
                eprintln!(
                    "warning: this path is longer than a unix socket address holds \
                         ({} bytes): connect through its directory \
                         (/proc/self/fd/<dir fd>/{}), or set a shorter state_dir",
                    crab_runtime::socket_path::MAX_SOCKET_PATH,
                    p.file_name().unwrap_or_default().to_string_lossy()
                );
            }
            println!("{}", p.display())
        }),
        Command::Inspector(cmd) => inspect::inspector(&config, cmd),
        Command::Fs(cmd) => fs::run(&config, &cli.namespace, cmd),
        Command::Checkpoint {
            id,
            kind,
            name,
            mark,
        } => ckpt::checkpoint(
            &config,
            &cli.namespace,
            &id,
            crab_runtime::checkpoint::ops::CheckpointRequest { kind, name, mark },
        ),
        Command::Turn { id, dry_run, json } => {
            turn::run(&config, &cli.namespace, &id, dry_run, json)
        }
        Command::Stats { id, json } => turn::stats(&config, &cli.namespace, &id, json),
        Command::Proxy {
            id,
            upstream,
            upstream_ca,
            listen,
            listen_fd,
            fail_open,
            agent_api,
            managed,
            log,
            journal,
        } => proxy::run(
            &config,
            &cli.address,
            &cli.namespace,
            &id,
            proxy::Options {
                upstream,
                upstream_ca,
                listen,
                listen_fd,
                fail_open,
                agent_api,
                managed,
                log,
                journal,
            },
        ),
        Command::Ls { id, json } => ckpt::list(&config, &cli.namespace, &id, json),
        Command::Rm { id, checkpoint } => ckpt::remove(&config, &cli.namespace, &id, &checkpoint),
        Command::Restore { id, checkpoint } => recover::restore(
            &config,
            &cli.address,
            &cli.namespace,
            &id,
            checkpoint.as_deref(),
        ),
        Command::Fork {
            id,
            checkpoint,
            count,
            prefix,
        } => recover::fork(
            &config,
            &cli.address,
            &cli.namespace,
            &id,
            checkpoint.as_deref(),
            count,
            prefix.as_deref(),
        ),
        Command::Export {
            id,
            checkpoint,
            output,
        } => migrate::export(
            &config,
            &cli.address,
            &cli.namespace,
            &id,
            checkpoint.as_deref(),
            &output,
        ),
        Command::Import {
            file,
            id,
            allow,
            drop,
            allow_unsigned,
            runtime_config_path,
            image,
        } => migrate::import(
            &config,
            &cli.address,
            &cli.namespace,
            &file,
            &id,
            &migrate::ImportOptions {
                allow: allow.into_iter().collect(),
                drop: drop.into_iter().collect(),
                allow_unsigned,
                runtime_config_path,
                image,
            },
        ),
        Command::Rollback { id, checkpoint } => {
            ckpt::rollback(&config, &cli.namespace, &id, &checkpoint)
        }
    }
}
