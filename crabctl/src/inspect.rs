//! `crabctl inspect`.

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
    Ok(())
}
