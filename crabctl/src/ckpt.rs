//! `crabctl checkpoint / ls / rm / rollback`: a running container's checkpoint history,
//! through its shim's control socket (`ls` of a container whose shim is gone
//! reads the history itself).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use crab_runtime::checkpoint::history::Entry;
use crab_runtime::checkpoint::history_store::HistoryStore;
use crab_runtime::checkpoint::ops::CheckpointRequest;
use crab_runtime::checkpoint::Kind;
use crab_runtime::config::Config;
use crab_runtime::control::{self, Request, Response};
use crab_runtime::error::Failure;
use crab_runtime::storage::ContainerKey;

/// Longest a request may take (a large dump).
const TIMEOUT: Duration = Duration::from_secs(600);

pub(crate) fn call(config: &Config, request: Request) -> Result<Response> {
    match control::call(config, &request, TIMEOUT)? {
        Response::Error { kind, message } => Err(Failure::new(kind, message).into()),
        r => Ok(r),
    }
}

/// Parses `full`, `fs-only`, `process-only`.
pub fn parse_kind(s: &str) -> Result<Kind, String> {
    serde_json::from_str(&format!("\"{s}\""))
        .map_err(|_| format!("unknown kind {s:?} (full, fs-only, process-only, skip)"))
}

/// `crabctl checkpoint`.
pub fn checkpoint(
    config: &Config,
    namespace: &str,
    id: &str,
    request: CheckpointRequest,
) -> Result<()> {
    let r = call(
        config,
        Request::Checkpoint {
            namespace: namespace.into(),
            id: id.into(),
            request,
            caller: None,
        },
    )?;
    if let Response::Entry { entry } = r {
        println!(
            "{id}: checkpoint {} ({}, seq {}) in {} ms: fs {} ms, dump {} ms, {} bytes of process image",
            entry.name,
            entry.kind.name(),
            entry.seq,
            entry.timings.total_ms,
            entry.timings.fs_ms,
            entry.timings.dump_ms,
            entry.process_bytes
        );
    }
    Ok(())
}

/// Takes a new full checkpoint of a running container; returns its name.
pub fn take_full(config: &Config, namespace: &str, id: &str) -> Result<String> {
    let request = Request::Checkpoint {
        namespace: namespace.into(),
        id: id.into(),
        request: CheckpointRequest {
            kind: Kind::Full,
            name: None,
            mark: false,
        },
        caller: None,
    };
    match call(config, request)? {
        Response::Entry { entry } => Ok(entry.name),
        other => bail!("checkpoint {id}: unexpected answer {other:?}"),
    }
}

/// `crabctl ls`.
pub fn list(config: &Config, namespace: &str, id: &str, json: bool) -> Result<()> {
    let entries = entries(config, namespace, id)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&entries)?);
        return Ok(());
    }
    println!("SEQ\tNAME\tKIND\tPARENT\tFS\tPROCESSES\tBYTES\tMS\tMARKED");
    for e in &entries {
        print_entry(e);
    }
    Ok(())
}

/// The checkpoints of container `namespace/id`, from its shim; when no shim
/// answers (it crashed, or the task is gone), from the history on disk, under
/// its lock as the shim reads it: after a crash, the history is what one
/// chooses the checkpoint to restore from.
fn entries(config: &Config, namespace: &str, id: &str) -> Result<Vec<Entry>> {
    let request = Request::List {
        namespace: namespace.into(),
        id: id.into(),
    };
    match control::call(config, &request, TIMEOUT) {
        Ok(Response::Entries { entries }) => Ok(entries),
        Ok(Response::Error { kind, message }) => Err(Failure::new(kind, message).into()),
        Ok(r) => bail!("unexpected answer {r:?}"),
        Err(crab_runtime::Error::NotFound(why)) => {
            let key = ContainerKey::new(namespace, id)?;
            if !HistoryStore::exists(config, &key) {
                bail!("container {why} not found, and it has no checkpoint history");
            }
            tracing::debug!(%key, "no shim answers: the history is read from disk");
            let history = HistoryStore::open(config, &key)
                .with_context(|| format!("read the checkpoint history of {key}"))?;
            Ok(history.history().entries.clone())
        }
        Err(e) => Err(e.into()),
    }
}

fn print_entry(e: &Entry) {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    println!(
        "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
        e.seq,
        e.name,
        e.kind.name(),
        opt(e.parent.map(|p| p.to_string())),
        opt(e.fs_snapshot.clone()),
        opt(e.process_image.map(|p| p.to_string())),
        e.process_bytes,
        e.timings.total_ms,
        if e.marked { "yes" } else { "" }
    );
}

/// `crabctl rm`.
pub fn remove(config: &Config, namespace: &str, id: &str, checkpoint: &str) -> Result<()> {
    call(
        config,
        Request::Remove {
            namespace: namespace.into(),
            id: id.into(),
            checkpoint: checkpoint.into(),
        },
    )?;
    println!("{id}: removed checkpoint {checkpoint}");
    Ok(())
}

/// `crabctl rollback`.
pub fn rollback(config: &Config, namespace: &str, id: &str, checkpoint: &str) -> Result<()> {
    let r = call(
        config,
        Request::Rollback {
            namespace: namespace.into(),
            id: id.into(),
            checkpoint: checkpoint.into(),
            caller: None,
        },
    )?;
    if let Response::RolledBack { report } = r {
        println!(
            "{id}: rolled back to {} (seq {}) in {} ms; {}; init pid {}",
            report.checkpoint.name,
            report.checkpoint.seq,
            report.ms,
            match (report.processes, report.standby) {
                (true, true) => "processes and files restored (standby adopted)",
                (true, false) => "processes and files restored",
                _ => "files restored, processes kept",
            },
            report.pid
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crab_runtime::checkpoint::Timings;

    fn entry(seq: u64) -> Entry {
        Entry {
            seq,
            name: seq.to_string(),
            parent: seq.checked_sub(1).filter(|p| *p > 0),
            kind: Kind::Full,
            fs_snapshot: Some(format!("ckpt-{seq}")),
            process_image: Some(seq),
            created_ms: 0,
            process_bytes: 1,
            timings: Timings::default(),
            marked: false,
        }
    }

    #[test]
    fn test_ls_of_a_container_whose_shim_is_gone_reads_its_history_from_disk() {
        let dir = std::env::temp_dir().join(format!("crabctl-ls-{}", std::process::id()));
        let mut config = Config {
            state_dir: dir.join("run"),
            ..Config::default()
        };
        config.checkpoint.store = dir.join("store");
        let key = ContainerKey::new("ns", "crashed").unwrap();
        let mut h = HistoryStore::open(&config, &key).unwrap();
        h.history_mut().entries = vec![entry(1), entry(2)];
        h.history_mut().next_seq = 3;
        h.save().unwrap();
        drop(h);
        // No control socket: no shim serves the container.
        let listed = entries(&config, "ns", "crashed").unwrap();
        assert_eq!(listed, vec![entry(1), entry(2)]);
        // A container that never had a history is still not found.
        let e = entries(&config, "ns", "never").unwrap_err().to_string();
        assert!(e.contains("not found"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
