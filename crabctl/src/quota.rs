//! The agents' quotas (the host configuration's `[quota]`): forks and checkpoints an
//! agent asks for through the agent API. The operator's own `crabctl` is not bounded.
//!
//! Forks are counted per lineage: a sandbox and every fork made from it or from its
//! forks, marked with the containerd label [`LINEAGE_LABEL`] (the root's id). The
//! count comes from containerd itself (the lineage's containers, and those created
//! in the last minute), so it holds across proxies and restarts and needs no state
//! of its own.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use containerd_client::services::v1::Container;
use crab_runtime::api_token::AGENT_API_ANNOTATION;
use crab_runtime::config::Quota;
use crab_runtime::error::{ErrorKind, Failure};

use crate::containerd::Client;

/// The containerd label naming a fork's lineage (the id of the sandbox it descends
/// from).
pub const LINEAGE_LABEL: &str = "io.crab.lineage";

const MINUTE: Duration = Duration::from_secs(60);

/// The lineage of container `c`: its label, or its own id for a root.
pub fn lineage_of(c: &Container) -> String {
    c.labels
        .get(LINEAGE_LABEL)
        .cloned()
        .unwrap_or_else(|| c.id.clone())
}

/// Admits `count` more agent forks of `src`'s lineage, or refuses (resource
/// exhausted) naming the quota.
pub async fn admit_forks(
    client: &Client,
    quota: &Quota,
    src: &Container,
    count: usize,
) -> Result<(), Failure> {
    let lineage = lineage_of(src);
    let forks = client
        .containers_labelled(LINEAGE_LABEL, &lineage)
        .await
        .map_err(|e| Failure::new(ErrorKind::Unavailable, format!("{e:#}")))?;
    let alive = forks.len();
    if alive + count > quota.agent_forks_alive as usize {
        return Err(exhausted(format!(
            "{alive} forks of {lineage} exist and {count} more would pass \
             quota.agent_forks_alive = {}",
            quota.agent_forks_alive
        )));
    }
    let recent = forks.iter().filter(|c| created_within(c, MINUTE)).count();
    if recent + count > quota.agent_forks_per_minute as usize {
        return Err(exhausted(format!(
            "{recent} forks of {lineage} made in the last minute and {count} more \
             would pass quota.agent_forks_per_minute = {}",
            quota.agent_forks_per_minute
        )));
    }
    Ok(())
}

/// `src` as an agent's fork is made from it: in its lineage, and without the agent
/// API unless the quota allows it.
pub fn agent_fork_template(quota: &Quota, src: &Container) -> anyhow::Result<Container> {
    let mut c = src.clone();
    c.labels.insert(LINEAGE_LABEL.into(), lineage_of(src));
    if !quota.agent_forks_get_agent_api {
        let spec = c
            .spec
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!("container {} has no spec", src.id))?;
        let mut json: serde_json::Value = serde_json::from_slice(&spec.value)?;
        let annotations = json
            .as_object_mut()
            .ok_or_else(|| anyhow::anyhow!("container {}'s spec is not an object", src.id))?
            .entry("annotations")
            .or_insert_with(|| serde_json::json!({}));
        annotations[AGENT_API_ANNOTATION] = "false".into();
        spec.value = serde_json::to_vec(&json)?;
    }
    Ok(c)
}

fn created_within(c: &Container, window: Duration) -> bool {
    let Some(t) = &c.created_at else {
        return true; // unknown: counted, the safe side
    };
    let created = SystemTime::UNIX_EPOCH + Duration::new(t.seconds.max(0) as u64, 0);
    SystemTime::now()
        .duration_since(created)
        .map_or(true, |age| age < window)
}

fn exhausted(message: String) -> Failure {
    Failure::new(ErrorKind::ResourceExhausted, format!("quota: {message}"))
}

/// A sliding one-minute window of the checkpoints an agent asked for.
#[derive(Debug, Default)]
pub struct PerMinute(Mutex<VecDeque<Instant>>);

impl PerMinute {
    /// Takes one of `limit` per minute, or refuses naming `quota`.
    pub fn take(&self, limit: u32, quota: &str) -> Result<(), Failure> {
        let mut times = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        while times
            .front()
            .is_some_and(|t| now.duration_since(*t) >= MINUTE)
        {
            times.pop_front();
        }
        if times.len() >= limit as usize {
            return Err(exhausted(format!(
                "{} in the last minute; {quota} = {limit}",
                times.len()
            )));
        }
        times.push_back(now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_refuses_past_its_limit_with_resource_exhausted() {
        let w = PerMinute::default();
        for _ in 0..3 {
            w.take(3, "quota.x").unwrap();
        }
        let e = w.take(3, "quota.x").unwrap_err();
        assert_eq!(e.kind, ErrorKind::ResourceExhausted);
        assert!(e.message.contains("quota.x = 3"), "{e}");
    }

    #[test]
    fn an_agent_fork_is_in_its_roots_lineage_and_has_no_agent_api() {
        let spec = serde_json::json!({"ociVersion": "1.0.2", "annotations": {"a": "b"}});
        let root = Container {
            id: "root".into(),
            spec: Some(prost_types::Any {
                type_url: "types.containerd.io/opencontainers/runtime-spec/1/Spec".into(),
                value: serde_json::to_vec(&spec).unwrap(),
            }),
            ..Default::default()
        };
        let fork = agent_fork_template(&Quota::default(), &root).unwrap();
        assert_eq!(fork.labels[LINEAGE_LABEL], "root");
        let json: serde_json::Value = serde_json::from_slice(&fork.spec.unwrap().value).unwrap();
        assert_eq!(json["annotations"][AGENT_API_ANNOTATION], "false");
        assert_eq!(json["annotations"]["a"], "b");
        // A fork of the fork stays in the root's lineage.
        let mut grandchild = root.clone();
        grandchild.id = "root-fork-1".into();
        grandchild
            .labels
            .insert(LINEAGE_LABEL.into(), "root".into());
        assert_eq!(lineage_of(&grandchild), "root");
    }
}
