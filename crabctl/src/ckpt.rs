//! `crabctl checkpoint / ls / rm / rollback`: a running container's checkpoint history,
//! through its shim's control socket.

use std::time::Duration;

use anyhow::{bail, Result};
use crab_runtime::checkpoint::history::Entry;
use crab_runtime::checkpoint::ops::CheckpointRequest;
use crab_runtime::checkpoint::Kind;
use crab_runtime::config::Config;
use crab_runtime::control::{self, Request, Response};
use crab_runtime::error::Failure;

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
    };
    match call(config, request)? {
        Response::Entry { entry } => Ok(entry.name),
        other => bail!("checkpoint {id}: unexpected answer {other:?}"),
    }
}

/// `crabctl ls`.
pub fn list(config: &Config, namespace: &str, id: &str, json: bool) -> Result<()> {
    let r = call(
        config,
        Request::List {
            namespace: namespace.into(),
            id: id.into(),
        },
    )?;
    let Response::Entries { entries } = r else {
        bail!("unexpected answer {r:?}");
    };
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
