//! The `runc-full` baseline: runc's shim with a full checkpoint (`ctr container
//! checkpoint --task --rw`) at every LLM request, and `ctr container restore
//! --live --rw` of the newest after a crash.
//!
//! containerd 1.7 holds at most one restorable checkpoint image per container:
//! the task's checkpoint writes the container's spec into the content store,
//! and while an earlier image holds that blob (the spec does not change) the
//! write fails with "already exists", which `Container.Checkpoint` ignores:
//! the image comes out with the rw layer only, no process image (measured
//! here). So the previous image goes (and is collected) just before the next
//! checkpoint, and each image is checked for its process image afterwards.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::Value;

use crate::replay::Gate;
use crate::sandbox::Ctr;

/// A run's checkpoints: the newest image, and the figures.
#[derive(Default)]
pub struct Checkpoints {
    /// The newest image: the turn whose request took it, its reference, and
    /// whether it holds a process image (None until checked).
    newest: Option<(usize, String, Option<bool>)>,
    /// Each checkpoint command's time, ms.
    pub ms: Vec<f64>,
    /// Bytes of the images.
    pub bytes: u64,
    /// Checkpoints that came out without a process image.
    pub incomplete: u32,
    /// The check of the newest image, still running.
    pending: Option<tokio::task::JoinHandle<()>>,
}

/// A run's checkpoints, shared by its gate and its recovery.
pub type Shared = Arc<Mutex<Checkpoints>>;

fn lock(c: &Shared) -> std::sync::MutexGuard<'_, Checkpoints> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

impl Checkpoints {
    /// Waits for the check of the newest image.
    pub async fn settled(c: &Shared) {
        let pending = lock(c).pending.take();
        if let Some(p) = pending {
            let _ = p.await;
        }
    }

    /// The newest image that holds a process image, once its check is done:
    /// the turn whose request took it, and its reference.
    pub async fn restorable(c: &Shared) -> Option<(usize, String)> {
        Checkpoints::settled(c).await;
        match &lock(c).newest {
            Some((turn, reference, Some(true))) => Some((*turn, reference.clone())),
            _ => None,
        }
    }

    /// Removes the newest image (after its check), if any.
    pub async fn remove_newest(c: &Shared, ctr: &Ctr) {
        Checkpoints::settled(c).await;
        let newest = lock(c).newest.take();
        if let Some((_, reference, _)) = newest {
            // --sync: the blobs go now, or the next checkpoint would find them.
            let _ = ctr.ok(&["images", "rm", "--sync", &reference]).await;
        }
    }
}

/// The gate: at each request, the previous image goes, then a full checkpoint,
/// overlapped with the think time. The check of the new image runs beside the
/// next turn; the next checkpoint and a recovery wait for it.
pub fn gate(ctr: &Ctr, id: &str, checkpoints: Shared) -> Gate {
    let (ctr, id) = (ctr.clone(), id.to_string());
    Arc::new(move |index| {
        let (ctr, id, checkpoints) = (ctr.clone(), id.clone(), checkpoints.clone());
        Box::pin(async move {
            Checkpoints::remove_newest(&checkpoints, &ctr).await;
            let reference = format!("crab.eval/{id}:{index}");
            let t = Instant::now();
            let made = ctr
                .ok(&["container", "checkpoint", "--task", "--rw", &id, &reference])
                .await;
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            if let Err(e) = made {
                tracing::warn!(id, index, error = %format!("{e:#}"), "runc checkpoint failed");
                return;
            }
            lock(&checkpoints).newest = Some((index, reference.clone(), None));
            let book = checkpoints.clone();
            let check = tokio::spawn(async move {
                let (bytes, complete) = image_bytes(&ctr, &reference).await;
                let mut c = lock(&book);
                c.ms.push(ms);
                c.bytes += bytes;
                if !complete {
                    c.incomplete += 1;
                    tracing::warn!(reference, "runc checkpoint without a process image");
                }
                c.newest = Some((index, reference, Some(complete)));
            });
            lock(&checkpoints).pending = Some(check);
        })
    })
}

/// Restores container `id` from `reference` after a crash; its loopback up.
pub async fn restore(ctr: &Ctr, id: &str, reference: &str) -> Result<()> {
    let args = ["container", "restore", "--live", "--rw", id, reference];
    let mut restored = ctr.ok(&args).await;
    for _ in 0..5 {
        // containerd forgets a task whose shim was killed a little after the
        // kill: until then its id is taken.
        match &restored {
            Err(e) if e.to_string().contains("already exists") => {
                ctr.remove(id).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
                restored = ctr.ok(&args).await;
            }
            _ => break,
        }
    }
    if let Err(e) = restored {
        let images = ctr.ok(&["images", "ls"]).await.unwrap_or_default();
        let line = images.lines().find(|l| l.contains(reference)).unwrap_or("");
        bail!("{e:#} (image: {line})");
    }
    let pid = ctr.pid(id).await?;
    crate::sandbox::loopback_up(pid)?;
    Ok(())
}

/// Bytes a checkpoint image lists, and whether it holds a process image.
async fn image_bytes(ctr: &Ctr, reference: &str) -> (u64, bool) {
    let Ok(images) = ctr.ok(&["images", "ls"]).await else {
        return (0, false);
    };
    let Some(digest) = image_digest(&images, reference) else {
        return (0, false);
    };
    let index = ctr
        .ok(&["content", "get", digest])
        .await
        .unwrap_or_default();
    checkpoint_parts(&index)
}

/// The digest of image `reference` in the output of `ctr images ls`.
pub fn image_digest<'a>(images_ls: &'a str, reference: &str) -> Option<&'a str> {
    images_ls
        .lines()
        .find(|l| l.split_whitespace().next() == Some(reference))
        .and_then(|l| l.split_whitespace().find(|w| w.starts_with("sha256:")))
}

/// What a checkpoint image's index lists: its parts' bytes, and whether a
/// process image (CRIU's blob) is among them.
pub fn checkpoint_parts(index_json: &str) -> (u64, bool) {
    let index: Value = serde_json::from_str(index_json).unwrap_or_default();
    let manifests = index["manifests"].as_array().cloned().unwrap_or_default();
    let bytes = manifests.iter().filter_map(|d| d["size"].as_u64()).sum();
    let complete = manifests.iter().any(|d| {
        d["mediaType"]
            .as_str()
            .is_some_and(|m| m.contains("criu.checkpoint"))
    });
    (bytes, complete)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_checkpoint_image_is_complete_only_with_its_process_image() {
        let ls = "REF TYPE DIGEST SIZE\n\
                  crab.eval/a:1 application/vnd.oci.image.index.v1+json sha256:aa 1.0 KiB\n\
                  crab.eval/a:2 application/vnd.oci.image.index.v1+json sha256:bb 1.0 KiB\n";
        assert_eq!(image_digest(ls, "crab.eval/a:2"), Some("sha256:bb"));
        assert_eq!(image_digest(ls, "crab.eval/a:3"), None);
        let full = r#"{"manifests": [
            {"mediaType": "application/vnd.containerd.container.criu.checkpoint.criu.tar", "size": 100},
            {"mediaType": "application/vnd.containerd.container.checkpoint.config.v1+proto", "size": 20}]}"#;
        assert_eq!(checkpoint_parts(full), (120, true));
        let rw_only = r#"{"manifests": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "size": 32}]}"#;
        assert_eq!(checkpoint_parts(rw_only), (32, false));
        assert_eq!(checkpoint_parts("not json"), (0, false));
    }

    #[tokio::test]
    async fn test_only_a_checked_complete_image_is_restorable() {
        let c: Shared = Arc::default();
        assert_eq!(Checkpoints::restorable(&c).await, None);
        lock(&c).newest = Some((3, "r3".into(), None));
        assert_eq!(Checkpoints::restorable(&c).await, None, "not checked yet");
        let book = c.clone();
        let check = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            lock(&book).newest = Some((3, "r3".into(), Some(true)));
        });
        lock(&c).pending = Some(check);
        // A recovery waits for the check of the newest image.
        assert_eq!(
            Checkpoints::restorable(&c).await,
            Some((3, "r3".to_string()))
        );
        lock(&c).newest = Some((4, "r4".into(), Some(false)));
        assert_eq!(Checkpoints::restorable(&c).await, None);
    }
}
