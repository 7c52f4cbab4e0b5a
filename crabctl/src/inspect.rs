//! `crabctl inspect` and `crabctl inspector`.

use anyhow::{Context, Result};
use crab_runtime::config::Config;
use crab_runtime::container::Container;

pub fn run(config: &Config, namespace: &str, id: &str) -> Result<()> {
    let c = Container::load(config, namespace, id)
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
    let watched = match crab_bpf::Inspector::open_existing(&config.policy.bpf_pin_root) {
        Some(i) => format!(
            "{} ({} of at most {} containers watched on this host)",
            if i.is_watched(s.cgroup_id)? {
                "watched"
            } else {
                "NOT watched: each turn is a full checkpoint"
            },
            i.watched_count(),
            crab_bpf::budget::MAX_CGROUPS
        ),
        None => "no inspector loaded on this host".into(),
    };
    println!("inspector:       {watched}");
    let door = door(config, namespace, id)
        .map(|p| format!("unix:{}", p.display()))
        .unwrap_or_else(|_| "none (no turn proxy runs)".into());
    println!("proxy door:      {door}");
    Ok(())
}

/// The host-side door of the container's turn proxy, if one is open.
pub fn door(config: &Config, namespace: &str, id: &str) -> Result<std::path::PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let path = crab_runtime::control::proxy_socket_path(config, namespace, id);
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_socket() => Ok(path),
        _ => Err(crab_runtime::error::Failure::new(
            crab_runtime::error::ErrorKind::NotFound,
            format!(
                "{namespace}/{id} has no turn proxy running (no {})",
                path.display()
            ),
        )
        .into()),
    }
}

#[derive(clap::Subcommand)]
pub enum InspectorCmd {
    /// Detach the program sets of other Crab builds (left attached by an
    /// upgrade) that watch no container and that no process holds open.
    Prune {
        /// Only list them.
        #[arg(long)]
        dry_run: bool,
        /// The pin root (default: the configuration's policy.bpf_pin_root).
        #[arg(long)]
        pin_root: Option<std::path::PathBuf>,
    },
}

pub fn inspector(config: &Config, cmd: InspectorCmd) -> Result<()> {
    let InspectorCmd::Prune { dry_run, pin_root } = cmd;
    let root = pin_root.as_ref().unwrap_or(&config.policy.bpf_pin_root);
    let sets = crab_bpf::stale_sets(root, !dry_run)
        .with_context(|| format!("program sets below {}", root.display()))?;
    for s in &sets {
        let what = if s.removed {
            "detached".to_string()
        } else if s.watched > 0 || !s.holders.is_empty() {
            format!(
                "kept: watches {} cgroups, held open by pids {:?}",
                s.watched, s.holders
            )
        } else if dry_run {
            "unused".to_string()
        } else {
            "unused, but its pins could not be removed".to_string()
        };
        println!("{}: {what}", s.dir.display());
    }
    if sets.is_empty() {
        println!("no program sets of other builds below {}", root.display());
    }
    Ok(())
}
