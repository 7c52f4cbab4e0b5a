//! `crabctl fs`: snapshots of a container's root file system in its store.
//!
//! A running container is frozen (cgroup freezer) around a snapshot and a rollback, so
//! that the snapshot is consistent and its processes see a whole tree. While a shim
//! runs the container, both go through its control socket (the one door to a live
//! container: the shim keeps other operations out meanwhile, and tells the
//! inspector that a rolled-back tree is not the one it watched); only a container
//! without a shim is changed here directly.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use crab_runtime::checkpoint::history::check_hand_snapshot_name;
use crab_runtime::config::{Backend, Config};
use crab_runtime::container::Container;
use crab_runtime::control::{self, Request, Response};
use crab_runtime::error::Failure;
use crab_runtime::storage::in_helper::StoreCall;
use crab_runtime::storage::{self, ContainerKey, Store};

#[derive(clap::Args)]
pub struct FsArgs {
    /// The store to use (default: the one the container was created with, else the
    /// configuration's); `reconcile` and `gc` without it visit every store present.
    #[arg(long, value_parser = parse_backend)]
    backend: Option<Backend>,
    #[command(subcommand)]
    command: FsCommand,
}

fn parse_backend(s: &str) -> Result<Backend, String> {
    serde_json::from_str(&format!("\"{s}\""))
        .map_err(|_| format!("unknown backend {s:?} (btrfs, zfs, overlay, passthrough)"))
}

#[derive(Subcommand)]
pub enum FsCommand {
    /// Take a read-only snapshot of the container's tree.
    Snapshot { id: String, name: String },
    /// List the container's snapshots.
    Ls { id: String },
    /// Make the container's tree equal to a snapshot, in place.
    Rollback { id: String, name: String },
    /// Delete a snapshot.
    Rm { id: String, name: String },
    /// Make a new container tree from a snapshot; prints its path.
    Clone {
        id: String,
        name: String,
        new_id: String,
    },
    /// Write a snapshot as a stream (incremental with --parent).
    Export {
        id: String,
        name: String,
        #[arg(long)]
        parent: Option<String>,
        /// Output file (default: standard output).
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
    },
    /// Read a stream written by export into a snapshot of the container.
    Import {
        id: String,
        /// Input file (default: standard input).
        input: Option<PathBuf>,
    },
    /// Bytes the container's tree references.
    Du { id: String },
    /// Bytes the container holds against its pool quota (`quota.sandbox_pool_bytes`),
    /// and the quota.
    Quota { id: String },
    /// Repair what interrupted operations left behind.
    Reconcile,
    /// Remove the trees of containers containerd has removed, then the image copies
    /// of layers it removed, among those of one containerd's snapshotter (another
    /// containerd on the host keeps its own).
    Gc {
        /// That snapshotter's snapshots directory, e.g.
        /// /var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots
        #[arg(long)]
        snapshots: PathBuf,
    },
}

/// The backend the container uses: what its shim recorded beside its bundle, or the
/// host configuration's.
fn recorded_backend(config: &Config, container: Option<&Container>) -> Backend {
    let recorded = container.and_then(|c| {
        let file = c.state().bundle.join("crab-config.toml");
        Config::load(None, Some(&file), None)
            .ok()
            .map(|(c, _)| c.storage.backend)
    });
    recorded.unwrap_or(config.storage.backend)
}

fn open_store(config: &Config, backend: Backend) -> Result<Box<dyn Store>> {
    match storage::open(config, backend)? {
        Some(s) => Ok(s),
        None => bail!("the container uses the passthrough backend: it has no snapshots"),
    }
}

/// Runs `f` with the container frozen, if there is one and it is running.
fn frozen<T>(c: Option<&Container>, f: impl FnOnce() -> crab_runtime::Result<T>) -> Result<T> {
    Ok(match c {
        Some(c) => c.frozen(f)?,
        None => f()?,
    })
}

/// Asks the container's shim for a snapshot (or a `rollback`) named `name`; `None`
/// when no shim runs the container.
fn through_shim(
    config: &Config,
    namespace: &str,
    id: &str,
    name: &str,
    rollback: bool,
) -> Result<Option<(String, f64)>> {
    let (namespace, id, name) = (namespace.to_string(), id.to_string(), name.to_string());
    let request = if rollback {
        Request::FsRollback {
            namespace,
            id,
            name,
        }
    } else {
        Request::FsSnapshot {
            namespace,
            id,
            name,
        }
    };
    match control::call(config, &request, std::time::Duration::from_secs(600)) {
        Ok(Response::Fs { name, ms }) => Ok(Some((name, ms))),
        Ok(Response::Error { kind, message }) => Err(Failure::new(kind, message).into()),
        Ok(other) => bail!("unexpected answer from the shim: {other:?}"),
        Err(crab_runtime::Error::NotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Every store this host has (those whose pool is present).
fn all_stores(config: &Config) -> Vec<(Backend, Box<dyn Store>)> {
    [Backend::Btrfs, Backend::Zfs, Backend::Overlay]
        .into_iter()
        .filter_map(|b| match storage::open(config, b) {
            Ok(Some(s)) => Some((b, s)),
            _ => None,
        })
        .collect()
}

pub fn run(config: &Config, namespace: &str, args: FsArgs) -> Result<()> {
    let chosen = args.backend;
    let backend_of = |config: &Config, c: Option<&Container>| {
        chosen.unwrap_or_else(|| recorded_backend(config, c))
    };
    let cmd = args.command;
    let container_of = |id: &str| Container::load(config, namespace, id).ok();
    let key = |id: &str| ContainerKey::new(namespace, id).map_err(anyhow::Error::from);
    match cmd {
        FsCommand::Snapshot { id, name } => {
            check_hand_snapshot_name(&name)?;
            if let Some((name, ms)) = through_shim(config, namespace, &id, &name, false)? {
                println!("{name} ({ms:.1} ms)");
                return Ok(());
            }
            let c = container_of(&id);
            let store = open_store(config, backend_of(config, c.as_ref()))?;
            let k = key(&id)?;
            let t = Instant::now();
            let info = frozen(c.as_ref(), || store.snapshot(&k, &name))?;
            println!("{} ({:.1} ms)", info.name, t.elapsed().as_secs_f64() * 1e3);
        }
        FsCommand::Ls { id } => {
            let store = open_store(config, backend_of(config, container_of(&id).as_ref()))?;
            for s in store.list(&key(&id)?)? {
                let when = humantime(s.created);
                println!("{}\t{when}", s.name);
            }
        }
        FsCommand::Rollback { id, name } => {
            if let Some((name, ms)) = through_shim(config, namespace, &id, &name, true)? {
                println!("rolled back to {name} ({ms:.1} ms)");
                return Ok(());
            }
            let c = container_of(&id);
            let store = open_store(config, backend_of(config, c.as_ref()))?;
            let k = key(&id)?;
            let t = Instant::now();
            frozen(c.as_ref(), || store.rollback(&k, &name))?;
            println!(
                "rolled back to {name} ({:.1} ms)",
                t.elapsed().as_secs_f64() * 1e3
            );
        }
        FsCommand::Rm { id, name } => {
            check_hand_snapshot_name(&name)?;
            let store = open_store(config, backend_of(config, container_of(&id).as_ref()))?;
            store.delete_snapshot(&key(&id)?, &name)?;
        }
        FsCommand::Clone { id, name, new_id } => {
            let store = open_store(config, backend_of(config, container_of(&id).as_ref()))?;
            let path = store.clone_snapshot(&key(&id)?, &name, &key(&new_id)?)?;
            println!("{}", path.display());
        }
        FsCommand::Export {
            id,
            name,
            parent,
            output,
        } => {
            let store = open_store(config, backend_of(config, container_of(&id).as_ref()))?;
            let mut out: Box<dyn Write> = match &output {
                Some(p) => {
                    Box::new(File::create(p).with_context(|| format!("create {}", p.display()))?)
                }
                None => Box::new(std::io::stdout().lock()),
            };
            store.export(&key(&id)?, &name, parent.as_deref(), &mut out)?;
            out.flush()?;
        }
        FsCommand::Import { id, input } => {
            let store = open_store(config, chosen.unwrap_or(config.storage.backend))?;
            let info = match &input {
                Some(p) => {
                    let mut f = File::open(p).with_context(|| format!("open {}", p.display()))?;
                    store.import(&key(&id)?, &mut f)?
                }
                None => store.import(&key(&id)?, &mut std::io::stdin().lock())?,
            };
            println!("{}", info.name);
        }
        FsCommand::Du { id } => {
            let store = open_store(config, backend_of(config, container_of(&id).as_ref()))?;
            println!("{}", store.space_used(&key(&id)?)?);
        }
        FsCommand::Quota { id } => {
            let store = open_store(config, backend_of(config, container_of(&id).as_ref()))?;
            match store.quota_usage(&key(&id)?)? {
                Some(u) => match u.limit {
                    Some(limit) => println!("{} of {limit}", u.used),
                    None => println!("{} (no quota)", u.used),
                },
                None => {
                    println!("not accounted as it goes by this backend (measured at each snapshot)")
                }
            }
        }
        FsCommand::Reconcile => {
            let stores = match chosen {
                Some(b) => vec![(b, open_store(config, b)?)],
                None => all_stores(config),
            };
            for (b, store) in stores {
                let r = store
                    .reconcile()
                    .with_context(|| format!("reconcile {b:?}"))?;
                for x in &r.removed {
                    println!("removed {x}");
                }
                for x in &r.completed {
                    println!("completed {x}");
                }
            }
        }
        FsCommand::Gc { snapshots } => {
            let stores = match chosen {
                Some(b) => vec![(b, open_store(config, b)?)],
                None => all_stores(config),
            };
            for (b, store) in stores {
                // As the shim's create collects: the removed containers' checkpoint
                // histories go with their trees (the store's own collect leaves them).
                let collect = storage::in_helper::Collect {
                    scope: snapshots.clone(),
                };
                let gone = collect
                    .serve(config, store.as_ref())
                    .with_context(|| format!("gc {b:?}"))?;
                for k in gone.containers {
                    println!("removed {k}");
                }
                for k in gone.images {
                    println!("removed image copy {k}");
                }
            }
        }
    }
    Ok(())
}

fn humantime(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    format!("{secs:.3}")
}
