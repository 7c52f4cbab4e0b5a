//! `crab-snapshotter`: Crab's containerd snapshotter, for containerd's
//! `[proxy_plugins]` (see the Kubernetes page of Crab's documentation).

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

/// Serves containerd's snapshots API on a Unix socket.
#[derive(Parser)]
#[command(name = "crab-snapshotter", version)]
struct Args {
    /// Where the layers and the records live.
    #[arg(long, default_value = "/var/lib/crab/snapshotter")]
    root: PathBuf,
    /// The socket containerd's proxy plugin dials.
    #[arg(long, default_value = "/run/crab/snapshotter/snapshotter.sock")]
    address: PathBuf,
    /// Crab's configuration (where its stores are); default: CRAB_CONFIG, else
    /// /etc/crab/config.toml.
    #[arg(long)]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let (config, source) =
        crab_runtime::config::Config::load_with_env(None, args.config.as_deref())
            .context("load Crab's configuration")?;
    tracing::info!(?source, "configuration");
    let trees = crab_runtime::storage::usage::Trees::open(&config);
    let snapshotter = crab_snapshotter::Snapshotter::open(&args.root, Box::new(trees))
        .with_context(|| format!("open the snapshotter at {}", args.root.display()))?;
    let listener = crab_snapshotter::serve::bind(&args.address)
        .with_context(|| format!("listen on {}", args.address.display()))?;
    tracing::info!(root = %snapshotter.root().display(), address = %args.address.display(), "serving");
    let service = crab_snapshotter::service::Service::new(snapshotter);
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    crab_snapshotter::serve::serve(listener, service, shutdown)
        .await
        .context("serve")?;
    Ok(())
}
