//! A sandbox's checkpoint moved to another host: the archive `crabctl export`
//! writes, read under the history's lock.

use std::path::Path;

use super::Sandbox;
use crate::checkpoint::archive::{self, ContainerRecord, ExportReport};
use crate::checkpoint::archive_sign::ArchiveKey;
use crate::checkpoint::history::Entry;
use crate::checkpoint::history_store::HistoryStore;
use crate::config::Config;
use crate::storage::{ContainerKey, ImageSource};
use crate::Result;

impl Sandbox {
    /// Writes checkpoint `name` of `key` (its processes, and its files as a delta
    /// against `image`) with `record` into the archive `out`, signed with `signer`.
    /// The history stays locked throughout: a retention cannot delete what the
    /// export reads. Works with or without a shim (a crashed sandbox's checkpoints
    /// move too).
    pub fn export(
        config: &Config,
        key: &ContainerKey,
        name: &str,
        image: &ImageSource,
        record: &ContainerRecord,
        out: &Path,
        signer: &ArchiveKey,
    ) -> Result<(Entry, ExportReport)> {
        let history = HistoryStore::open(config, key)?;
        let entry = history.find(name)?.clone();
        // A fast-forwarded agent's exchanges travel with it, so that the
        // imported agent comes back to the entry without asking its LLM again.
        let replay = config
            .agent
            .fast_forward
            .then(|| crate::checkpoint::journal::replayable(history.history(), key, &entry))
            .flatten();
        let report = archive::export(config, key, &entry, replay, image, record, out, signer)?;
        drop(history);
        Ok((entry, report))
    }
}
