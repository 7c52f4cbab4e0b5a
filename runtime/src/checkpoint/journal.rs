//! The runtime's side of the LLM journal of a fast-forwarded agent
//! (`[agent] fast_forward`, docs/agents.md): where it lives, the replay plan a
//! restore leaves for the proxy, and its pruning with the checkpoints.
//!
//! The proxy writes the journal: one file per exchange, `<seq>.exchange`, the
//! answer the agent got to the LLM request whose turn recorded checkpoint
//! `<seq>` (written as `.<seq>.partial`, renamed when whole and fsync-ed). A
//! restore of entry `p`, whose processes come from the image of entry `j`, brings
//! the agent back as it was at `j`: it sends its requests of turns `j..=p`
//! again. The plan `replay.json` (`{"from": j, "to": p}`) tells the proxy which
//! exchanges answer them; it reads the plan when it starts or is told (SIGHUP)
//! that the container was restored, and removes it.
//!
//! Every turn between `j` and `p` was a skip (with fast-forward a turn that takes
//! anything takes the agent too, so it is full), so nothing the agent did in
//! them changed the sandbox beyond its own state; running them again gives the
//! same sandbox.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::history::{self, Entry};
use super::history_store::HistoryStore;
use super::Kind;
use crate::config::Config;
use crate::storage::ContainerKey;
use crate::{Error, Result};

/// The journal's directory, beside the container's checkpoints.
pub fn dir(config: &Config, key: &ContainerKey) -> PathBuf {
    history::dir(config, key).join("journal")
}

/// The replay plan's file name.
pub const PLAN: &str = "replay.json";

/// The turns whose exchanges answer a restored agent's repeated requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The entry whose process image was restored.
    pub from: u64,
    /// The entry restored.
    pub to: u64,
}

/// Leaves the plan of a restore of `entry` for the proxy of container `key`,
/// when its agent is fast-forwarded (the journal exists). Written whole
/// (temporary file, rename), before the restored processes run.
pub fn plan_replay(config: &Config, key: &ContainerKey, entry: &Entry) -> Result<()> {
    let dir = dir(config, key);
    let Some(from) = entry.process_image else {
        return Ok(());
    };
    if !config.agent.fast_forward || !dir.is_dir() {
        return Ok(());
    }
    // Running a turn's tools again is right only if that turn changed nothing
    // but the agent's own state (a skip). A turn between that took the files
    // without the processes (its requester was not found as the agent, so it
    // was not made full) would have its tools run twice on files that have
    // their effect: no replay then, the agent asks its LLM again.
    let locked = HistoryStore::open(config, key)?;
    if let Some(e) = locked
        .history()
        .entries
        .iter()
        .find(|e| e.seq > from && e.seq <= entry.seq && e.kind != Kind::Skip)
    {
        tracing::warn!(%key, from, to = entry.seq, seq = e.seq, kind = ?e.kind,
            "no agent fast-forward: a turn to replay was no skip");
        return Ok(());
    }
    let plan = Plan {
        from,
        to: entry.seq,
    };
    let path = dir.join(PLAN);
    let tmp = dir.join(format!(".{PLAN}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec(&plan).expect("plan serializes"))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(Error::io(format!("write {}", path.display())))?;
    tracing::info!(%key, from, to = entry.seq, "agent fast-forward planned");
    Ok(())
}

/// The seq an exchange file (or a partial one) was recorded for.
fn exchange_seq(name: &str) -> Option<u64> {
    let name = name.strip_prefix('.').unwrap_or(name);
    let (seq, ext) = name.split_once('.')?;
    matches!(ext, "exchange" | "partial")
        .then(|| seq.parse().ok())
        .flatten()
}

/// Deletes the exchanges no restore can replay: a restore of entry `p` whose
/// image is entry `j`'s replays `j..=p`, so only the seqs in such a range of
/// an entry still in `entries` are kept (an old marked checkpoint keeps its
/// own range, not every turn after it). Runs after retention dropped entries;
/// a crash before it leaves files the next pruning removes.
pub fn prune(dir: &Path, entries: &[Entry]) {
    let Ok(files) = std::fs::read_dir(dir) else {
        return;
    };
    let ranges: Vec<(u64, u64)> = entries
        .iter()
        .filter_map(|e| e.process_image.map(|j| (j, e.seq)))
        .collect();
    for f in files.flatten() {
        let name = f.file_name();
        let Some(seq) = name.to_str().and_then(exchange_seq) else {
            continue;
        };
        if !ranges.iter().any(|&(j, p)| j <= seq && seq <= p) {
            let _ = std::fs::remove_file(f.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::history::History;

    fn entry(seq: u64, image: Option<u64>) -> Entry {
        Entry {
            seq,
            name: seq.to_string(),
            parent: None,
            kind: Kind::Skip,
            fs_snapshot: None,
            process_image: image,
            created_ms: 0,
            process_bytes: 0,
            timings: Default::default(),
            marked: false,
        }
    }

    #[test]
    fn a_plan_is_left_only_over_skipped_turns() {
        let d = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.checkpoint.store = d.path().to_path_buf();
        let key = ContainerKey::new("ns", "c").unwrap();
        std::fs::create_dir_all(dir(&config, &key)).unwrap();
        let full = Entry {
            kind: Kind::Full,
            ..entry(4, Some(4))
        };
        let mut h = History::load(&history::dir(&config, &key), &key).unwrap();
        h.entries = vec![full, entry(5, Some(4)), entry(6, Some(4))];
        h.next_seq = 7;
        h.save(&history::dir(&config, &key)).unwrap();
        let plan = dir(&config, &key).join(PLAN);

        plan_replay(&config, &key, &entry(6, Some(4))).unwrap();
        let got: Plan = serde_json::from_slice(&std::fs::read(&plan).unwrap()).unwrap();
        assert_eq!(got, Plan { from: 4, to: 6 });
        std::fs::remove_file(&plan).unwrap();

        // Turn 5 took the files alone: its tools must not run again.
        h.entries[1].kind = Kind::FsOnly;
        h.save(&history::dir(&config, &key)).unwrap();
        plan_replay(&config, &key, &entry(6, Some(4))).unwrap();
        assert!(!plan.exists());
        // Without fast-forward, never.
        h.entries[1].kind = Kind::Skip;
        h.save(&history::dir(&config, &key)).unwrap();
        config.agent.fast_forward = false;
        plan_replay(&config, &key, &entry(6, Some(4))).unwrap();
        assert!(!plan.exists());
    }

    #[test]
    fn exchange_names_give_their_seq_and_nothing_else_does() {
        assert_eq!(exchange_seq("12.exchange"), Some(12));
        assert_eq!(exchange_seq(".12.partial"), Some(12));
        assert_eq!(exchange_seq(PLAN), None);
        assert_eq!(exchange_seq("12.exchange.tmp"), None);
        assert_eq!(exchange_seq("x.exchange"), None);
    }

    #[test]
    fn pruning_keeps_the_exchanges_from_the_oldest_process_image_on() {
        let d = tempfile::tempdir().unwrap();
        for f in ["3.exchange", "4.exchange", ".5.partial", "6.exchange", PLAN] {
            std::fs::write(d.path().join(f), b"x").unwrap();
        }
        prune(
            d.path(),
            &[entry(4, Some(4)), entry(5, Some(4)), entry(6, Some(6))],
        );
        let mut left: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|f| f.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, [".5.partial", "4.exchange", "6.exchange", PLAN]);
    }

    #[test]
    fn an_old_marked_checkpoint_keeps_its_own_replay_not_every_turn_after_it() {
        let d = tempfile::tempdir().unwrap();
        for seq in 2..=11 {
            std::fs::write(d.path().join(format!("{seq}.exchange")), b"x").unwrap();
        }
        // Entry 3 (marked, image 2) and the newest two (image 9).
        prune(
            d.path(),
            &[entry(3, Some(2)), entry(10, Some(9)), entry(11, Some(9))],
        );
        let mut left: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|f| f.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "10.exchange",
                "11.exchange",
                "2.exchange",
                "3.exchange",
                "9.exchange"
            ]
        );
    }
}
