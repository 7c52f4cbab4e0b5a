//! `crabctl turn`: the end of an agent's turn, through the semantic policy.

use crab_runtime::checkpoint::bounded;
use crab_runtime::checkpoint::history::Entry;
use crab_runtime::checkpoint::ops::CheckpointRequest;
use crab_runtime::checkpoint::Kind;
use crab_runtime::config::PolicyMode;
use crab_runtime::inspect::{self, Classification};

use crate::control::check_dumpable;
use crate::error::ShimResult;
use crate::task::{blocking, TaskService};

impl TaskService {
    /// Classifies the container's turn and, unless `dry_run`, takes the
    /// checkpoint it needs: nothing but a manifest entry for a skip, a snapshot
    /// for fs-only, a dump for process-only, both for full.
    pub async fn crab_turn(
        &self,
        id: &str,
        dry_run: bool,
    ) -> ShimResult<(Classification, Option<Entry>)> {
        let state = self.state.lock().await;
        let inst = state.get(id)?;
        check_dumpable(inst, id)?;
        let (c, config) = (inst.container.clone(), inst.config.clone());
        let (class, entry) = blocking(move || {
            let class = match config.policy.mode {
                PolicyMode::Adaptive => {
                    let insp = inspect::inspector(&config)?;
                    inspect::classify(&c, &config, &insp)?
                }
                PolicyMode::Full => inspect::Classification::full("policy mode is full"),
            };
            if dry_run {
                return Ok((class, None));
            }
            let req = CheckpointRequest {
                kind: class.kind,
                name: None,
                mark: false,
            };
            let entry = if class.kind == Kind::Skip {
                c.take_checkpoint(&config, req)?
            } else {
                bounded(&config, || c.take_checkpoint(&config, req))?
            };
            Ok::<_, crab_runtime::Error>((class, Some(entry)))
        })
        .await?;
        tracing::info!(%id, kind = ?class.kind, reasons = ?class.reasons,
            classify_us = class.elapsed_us, "turn");
        Ok((class, entry))
    }
}
