//! Containers that a `crabctl fork` or `crabctl import` is still making.
//!
//! Each makes a container in several calls to containerd (the container record, its
//! snapshot, its task, the task's start). A crabctl killed between two of them would
//! leave a container that nobody finishes or removes, and whose id a retry cannot take.
//! So every container they create carries [`LABEL`], naming the crabctl process, until
//! its task runs; a fork or an import that finds such a container of a dead process
//! discards it (its task, record and snapshot) before it makes its own.

use anyhow::{Context, Result};
use containerd_client::services::v1::containers_client::ContainersClient;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::snapshots::RemoveSnapshotRequest;
use containerd_client::services::v1::tasks_client::TasksClient;
use containerd_client::services::v1::{
    Container, DeleteContainerRequest, KillRequest, ListContainersRequest, UpdateContainerRequest,
};
use containerd_client::tonic::{Code, Request};
use containerd_client::with_namespace;
use crab_runtime::storage::work::pid_alive;

use crate::containerd::Client;

/// The signal that ends a half-made task.
const SIGKILL: u32 = 9;

/// The label of a container being made: the pid of the crabctl making it.
pub const LABEL: &str = "io.crab.pending";

/// Marks a container record about to be created as this process's work.
pub fn mark(c: &mut Container) {
    c.labels
        .insert(LABEL.to_string(), std::process::id().to_string());
}

/// Whether `c` is the unfinished work of a process that no longer runs.
pub fn abandoned(c: &Container) -> bool {
    c.labels
        .get(LABEL)
        .is_some_and(|pid| !pid.parse::<i32>().is_ok_and(pid_alive))
}

impl Client {
    /// Removes the pending label of container `id`: its task runs, it is done.
    pub async fn finish(&self, id: &str) -> Result<()> {
        let req = UpdateContainerRequest {
            container: Some(Container {
                id: id.to_string(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec![format!("labels.{LABEL}")],
            }),
        };
        ContainersClient::new(self.channel.clone())
            .update(with_namespace!(req, self.namespace))
            .await
            .with_context(|| format!("finish container {id}"))?;
        Ok(())
    }

    /// Discards container `c` and what was made for it: its task (killed first), its
    /// record and its snapshot. What is already absent is fine.
    pub async fn discard(&self, c: &Container) -> Result<()> {
        let kill = KillRequest {
            container_id: c.id.clone(),
            exec_id: String::new(),
            signal: SIGKILL,
            all: true,
        };
        // A task that never started, or is gone, refuses the kill: the delete decides.
        let _ = TasksClient::new(self.channel.clone())
            .kill(with_namespace!(kill, self.namespace))
            .await;
        crate::crashed::clear(self, crate::crashed::Shim::Unknown, &c.id).await?;
        let req = DeleteContainerRequest { id: c.id.clone() };
        match ContainersClient::new(self.channel.clone())
            .delete(with_namespace!(req, self.namespace))
            .await
        {
            Ok(_) => {}
            Err(s) if s.code() == Code::NotFound => {}
            Err(s) => anyhow::bail!("delete container {}: {}", c.id, s.message()),
        }
        let req = RemoveSnapshotRequest {
            snapshotter: c.snapshotter.clone(),
            key: c.snapshot_key.clone(),
        };
        match SnapshotsClient::new(self.channel.clone())
            .remove(with_namespace!(req, self.namespace))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => anyhow::bail!("remove snapshot {}: {}", c.snapshot_key, s.message()),
        }
    }

    /// Discards every container a dead fork or import left unfinished in this
    /// namespace; answers their ids.
    pub async fn discard_abandoned(&self) -> Result<Vec<String>> {
        let req = ListContainersRequest {
            filters: vec![format!("labels.\"{LABEL}\"")],
        };
        let containers = ContainersClient::new(self.channel.clone())
            .list(with_namespace!(req, self.namespace))
            .await
            .context("list pending containers")?
            .into_inner()
            .containers;
        let mut done = Vec::new();
        for c in containers.iter().filter(|c| abandoned(c)) {
            tracing::info!(id = %c.id, "discarding a container a dead crabctl left unfinished");
            self.discard(c)
                .await
                .with_context(|| format!("discard the unfinished container {}", c.id))?;
            done.push(c.id.clone());
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_only_the_work_of_a_dead_process_is_abandoned() {
        let mut c = Container::default();
        assert!(!abandoned(&c), "an unlabelled container is finished");
        mark(&mut c);
        assert!(!abandoned(&c), "this process runs");
        c.labels.insert(LABEL.into(), i32::MAX.to_string());
        assert!(abandoned(&c));
        c.labels.insert(LABEL.into(), "not a pid".into());
        assert!(abandoned(&c));
    }
}
