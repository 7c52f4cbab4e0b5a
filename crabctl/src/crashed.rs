//! The task a crash left, cleared at once before `crabctl restore` makes the new one.
//!
//! When a shim dies, containerd sees its ttrpc connection close and at once runs
//! the shim binary's `delete`, which kills what is left of the container and
//! removes its cgroups, state, rootfs mount, control socket, proxy log and the
//! dead shim's socket. A `Tasks.Delete` sent meanwhile waits for that cleanup,
//! drops the task and answers with the closed connection's error ("ttrpc:
//! closed"). So the old task is deleted right away, and a failed delete is
//! followed by asking containerd whether the task is still there: there is no
//! need to wait for containerd's own events.
//!
//! Whether the old shim is alive is read from its control socket: a live shim
//! accepts the connection, a dead one leaves the socket behind with nobody
//! listening. A task whose shim is alive and still running is not a crash:
//! the restore is refused at once (`crabctl rollback` is for a running task).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use containerd_client::tonic::Code;
use crab_runtime::config::Config;

use crate::containerd::Client;

/// How long a task containerd has not let go of yet is tried again.
const DEADLINE: Duration = Duration::from_secs(10);
/// The pause between two tries (containerd answers in well under a millisecond).
const PAUSE: Duration = Duration::from_millis(5);

/// What the old task's shim is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shim {
    /// It accepts connections on its control socket.
    Alive,
    /// Its control socket is left with nobody listening: it was killed.
    Dead,
    /// There is no control socket (already cleaned up, or never made).
    Unknown,
}

/// Probes the shim of container `id` through its control socket.
pub fn probe(config: &Config, namespace: &str, id: &str) -> Shim {
    probe_socket(&crab_runtime::control::socket_path(config, namespace, id))
}

fn probe_socket(path: &Path) -> Shim {
    let Ok(address) = crab_runtime::socket_path::SocketPath::new(path) else {
        return Shim::Unknown;
    };
    match std::os::unix::net::UnixStream::connect(address.as_path()) {
        // Closed unanswered: the shim reads one request per connection.
        Ok(_) => Shim::Alive,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Shim::Dead,
        Err(_) => Shim::Unknown,
    }
}

/// Deletes the task a crash left of container `id` (none is fine); returns once
/// containerd no longer has it. Fails at once when the task is running under a
/// live shim.
pub async fn clear(client: &Client, shim: Shim, id: &str) -> Result<()> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let status = match client.delete_task(id).await {
            Ok(()) => return Ok(()),
            Err(s) if s.code() == Code::NotFound => return Ok(()),
            Err(s) => s,
        };
        if shim == Shim::Alive && status.code() == Code::FailedPrecondition {
            bail!(
                "the task of {id} is not a crashed one: {} (its shim answers); \
                 `crabctl restore` brings back a container whose task died, \
                 `crabctl rollback` rolls a running one back",
                status.message()
            );
        }
        // A dead shim: containerd answers once its cleanup ran, with the closed
        // connection's error, and no longer has the task.
        if !client.has_task(id).await? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("delete the old task of {id}: {}", status.message());
        }
        tokio::time::sleep(PAUSE).await;
    }
}

/// Removes what the dead shim's own cleanup left of container `id`
/// ([`crate::leftovers`]), once containerd no longer has the task ([`clear`]).
/// Nothing is done while a shim answers on the container's control socket: it
/// owns the container. The shim is probed again here, not before [`clear`]: a
/// shim killed a moment ago can still take connections until it is gone.
/// Answers whether anything was left.
pub async fn remove_left(
    config: &Config,
    address: &str,
    namespace: &str,
    id: &str,
) -> Result<bool> {
    if probe(config, namespace, id) == Shim::Alive {
        return Ok(false);
    }
    let (config, address, namespace, id) = (
        config.clone(),
        address.to_string(),
        namespace.to_string(),
        id.to_string(),
    );
    tokio::task::spawn_blocking(move || {
        crate::leftovers::remove(&config, &address, &namespace, &id)
    })
    .await
    .context("the removal's task")?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn test_the_shim_is_alive_dead_or_unknown_by_its_control_socket() {
        let dir = std::env::temp_dir().join(format!("crabctl-crashed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.ctl");
        let _ = std::fs::remove_file(&path);
        assert_eq!(probe_socket(&path), Shim::Unknown);
        let listener = UnixListener::bind(&path).unwrap();
        assert_eq!(probe_socket(&path), Shim::Alive);
        drop(listener);
        assert_eq!(probe_socket(&path), Shim::Dead);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
