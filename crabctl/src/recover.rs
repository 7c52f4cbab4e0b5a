//! `crabctl restore` and `crabctl fork`: new tasks from Crab's checkpoints, made
//! through containerd (so `ctr task ls` and every client see them).

use std::time::Instant;

use anyhow::{bail, Context, Result};
use crab_runtime::checkpoint::history_store::HistoryStore;
use crab_runtime::checkpoint::source::Source;
use crab_runtime::config::Config;
use crab_runtime::storage::{fault, ContainerKey};

use crate::containerd::Client;

/// The checkpoint `name`, or the newest one, of container `key`.
fn checkpoint_name(config: &Config, key: &ContainerKey, name: Option<&str>) -> Result<String> {
    let h = HistoryStore::open(config, key)?;
    let entry = match name {
        Some(n) => h.find(n)?,
        None => match h.history().latest() {
            Some(e) => e,
            None => bail!("{key} has no checkpoints"),
        },
    };
    Ok(entry.name.clone())
}

/// `crabctl restore ID [CKPT]`: after the container's task died (its shim and
/// processes killed), a new task under the same id, from the checkpoint (the
/// newest durable one unless named). Nothing waits for containerd to notice the
/// crash: the old task is deleted at once ([`crate::crashed`]), while the
/// container's record and mounts are read.
pub fn restore(
    config: &Config,
    address: &str,
    namespace: &str,
    id: &str,
    ckpt: Option<&str>,
) -> Result<()> {
    let key = ContainerKey::new(namespace, id)?;
    let started = Instant::now();
    let checkpoint = checkpoint_name(config, &key, ckpt)?;
    let shim = crate::crashed::probe(config, namespace, id);
    let (pid, cleared) = crate::containerd::runtime()?.block_on(async {
        let client = Client::connect(address, namespace).await?;
        let clear = async {
            crate::crashed::clear(&client, shim, id).await?;
            if crate::crashed::remove_left(config, address, namespace, id).await? {
                eprintln!("{id}: removed what the dead shim's cleanup had left");
            }
            anyhow::Ok(started.elapsed())
        };
        let record = async {
            let c = client.container(id).await?;
            let mounts = client.mounts(&c.snapshotter, &c.snapshot_key).await?;
            anyhow::Ok((c, mounts))
        };
        let (cleared, (c, mounts)) = tokio::try_join!(clear, record)?;
        fault::point("restore.deleted");
        let source = Source::History {
            namespace: namespace.into(),
            id: id.into(),
            checkpoint: checkpoint.clone(),
        };
        let pid = client.start_restored(&c, mounts, source).await?;
        anyhow::Ok((pid, cleared))
    })?;
    println!(
        "{id}: restored from checkpoint {checkpoint} in {} ms (the old task cleared in {} ms); \
         init pid {pid}",
        started.elapsed().as_millis(),
        cleared.as_millis()
    );
    Ok(())
}

/// What a fork made.
pub struct Forked {
    /// The checkpoint the forks run from.
    pub checkpoint: String,
    /// The new containers, with their init pids and how long each took.
    pub made: Vec<(String, i32, std::time::Duration)>,
    /// Of the whole time, the checkpoint taken first (when none was named).
    pub checkpointed: std::time::Duration,
}

/// `crabctl fork ID [CKPT] --count N`: N new containers running from the checkpoint
/// (a new full one when none is named), each with its own clone of the files.
pub fn fork(
    config: &Config,
    address: &str,
    namespace: &str,
    id: &str,
    ckpt: Option<&str>,
    count: usize,
    prefix: Option<&str>,
) -> Result<()> {
    let started = Instant::now();
    let f = fork_into(config, address, namespace, id, ckpt, count, prefix, false)?;
    for (new_id, pid, took) in &f.made {
        println!(
            "{new_id}: forked from {id} checkpoint {} in {} ms; init pid {pid}",
            f.checkpoint,
            took.as_millis()
        );
    }
    println!(
        "{count} forks of {id} in {} ms ({} ms of them for the checkpoint)",
        started.elapsed().as_millis(),
        f.checkpointed.as_millis()
    );
    Ok(())
}

/// Makes the forks (see [`fork`]); fails, naming each failure, unless all were made.
/// Forks the sandbox's agent asked for (`by_agent`) are admitted by the host's
/// `[quota]` first, join the sandbox's lineage, and get no agent API unless the
/// quota allows it ([`crate::quota`]).
#[allow(clippy::too_many_arguments)]
pub fn fork_into(
    config: &Config,
    address: &str,
    namespace: &str,
    id: &str,
    ckpt: Option<&str>,
    count: usize,
    prefix: Option<&str>,
    by_agent: bool,
) -> Result<Forked> {
    let key = ContainerKey::new(namespace, id)?;
    let started = Instant::now();
    let rt = crate::containerd::runtime()?;
    let client = rt.block_on(Client::connect(address, namespace))?;
    let swept = rt.block_on(client.discard_abandoned())?;
    if !swept.is_empty() {
        eprintln!("discarded containers a dead fork or import left: {swept:?}");
    }
    let mut src = rt.block_on(client.container(id))?;
    if by_agent {
        rt.block_on(crate::quota::admit_forks(
            &client,
            &config.quota,
            &src,
            count,
        ))?;
        src = crate::quota::agent_fork_template(&config.quota, &src)?;
    }
    let checkpoint = match ckpt {
        Some(n) => checkpoint_name(config, &key, Some(n))?,
        None => crate::ckpt::take_full(config, namespace, id)?,
    };
    fault::point("fork.checkpointed");
    let checkpointed = started.elapsed();
    let prefix = prefix
        .map(str::to_string)
        .unwrap_or_else(|| format!("{id}-fork"));
    let parent = rt
        .block_on(client.stat_snapshot(&src.snapshotter, &src.snapshot_key))?
        .map(|info| info.parent)
        .with_context(|| format!("snapshot {} of {id} is gone", src.snapshot_key))?;
    // All at once: the work is in containerd, the shims and CRIU, which run in
    // parallel; this process only waits.
    let results = rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for i in 1..=count {
            let (client, src, parent) = (client.clone(), src.clone(), parent.clone());
            let new_id = format!("{prefix}-{i}");
            let source = Source::History {
                namespace: namespace.into(),
                id: id.into(),
                checkpoint: checkpoint.clone(),
            };
            set.spawn(async move {
                let t = Instant::now();
                let pid = async {
                    let c = client.create_container_like(&src, &new_id).await?;
                    fault::point("fork.created");
                    let made = async {
                        let mounts = client
                            .prepare(&c.snapshotter, &c.snapshot_key, &parent)
                            .await?;
                        fault::point("fork.prepared");
                        let pid = client.start_restored(&c, mounts, source).await?;
                        fault::point("fork.started");
                        client.finish(&c.id).await?;
                        anyhow::Ok(pid)
                    }
                    .await;
                    if made.is_err() {
                        // Not left for a retry to trip over: the error says what failed.
                        if let Err(e) = client.discard(&c).await {
                            tracing::warn!(id = %c.id, error = %format!("{e:#}"), "discard a failed fork");
                        }
                    }
                    made
                }
                .await;
                (new_id, pid, t.elapsed())
            });
        }
        let mut out = Vec::new();
        while let Some(r) = set.join_next().await {
            out.push(r.context("fork task")?);
        }
        anyhow::Ok(out)
    })?;
    let mut failed = Vec::new();
    let mut made = Vec::new();
    for (new_id, pid, took) in results {
        match pid {
            Ok(pid) => made.push((new_id, pid as i32, took)),
            Err(e) => failed.push(format!("{new_id}: {e:#}")),
        }
    }
    if !failed.is_empty() {
        bail!(
            "{} of {count} forks failed:\n{}",
            failed.len(),
            failed.join("\n")
        );
    }
    made.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Forked {
        checkpoint,
        made,
        checkpointed,
    })
}
