//! `crabctl`: inspect Crab's configuration and containers on this host.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use crab_runtime::config::Config;
use crab_runtime::container::Container;

#[derive(Parser)]
#[command(
    version,
    about = "Crab: checkpoint/restore runtime for agent sandboxes"
)]
struct Cli {
    /// Configuration file (default: $CRAB_CONFIG, then /etc/crab/config.toml).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the configuration and print it with every default filled in.
    Config,
    /// Print what Crab records about a running container (cgroup id, bundle, ...).
    Inspect {
        /// containerd namespace.
        #[arg(long, short = 'n', default_value = "default")]
        namespace: String,
        /// Container id.
        id: String,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let (config, source) =
        Config::load_with_env(None, cli.config.as_deref()).context("load configuration")?;
    match cli.command {
        Command::Config => {
            println!("# from {source:?}");
            print!("{}", config.to_toml());
        }
        Command::Inspect { namespace, id } => {
            let c = Container::load(&config, &namespace, &id)
                .with_context(|| format!("inspect {namespace}/{id}"))?;
            let status = c
                .status()
                .map(|s| s.to_string())
                .unwrap_or_else(|e| format!("unknown ({e})"));
            let s = c.state();
            println!("id:              {}", s.id);
            println!("namespace:       {}", s.namespace);
            println!("status:          {status}");
            println!("bundle:          {}", s.bundle.display());
            println!("tracking cgroup: {}", s.tracking_cgroup.display());
            println!("cgroup id:       {}", s.cgroup_id);
            println!("pids:            {:?}", c.tracking().pids()?);
        }
    }
    Ok(())
}
