//! `crabctl`: Crab's command-line client for this host.

mod fs;
mod inspect;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use crab_runtime::config::Config;

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
    /// Snapshots of containers' root file systems.
    Fs(fs::FsArgs),
}

fn main() -> Result<()> {
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
        Command::Fs(cmd) => fs::run(&config, &cli.namespace, cmd),
    }
}
