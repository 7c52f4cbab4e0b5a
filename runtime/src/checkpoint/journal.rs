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

/// Leaves the plan of a restore of `entry`, an entry of container `src`'s
/// history, for the proxy of container `dst`, when the agent is fast-forwarded
/// (`src`'s journal exists). `dst` is `src` after a rollback or a restore, or a
/// fork: then the exchanges of the plan are linked into the fork's own journal
/// first, so that the fork's agent comes back to the entry without asking its
/// LLM again, and goes its own way from there. The plan is written whole
/// (temporary file, rename), before the restored processes run.
pub fn plan_replay(
    config: &Config,
    src: &ContainerKey,
    dst: &ContainerKey,
    entry: &Entry,
) -> Result<()> {
    if entry.process_image.is_none() || !config.agent.fast_forward || !dir(config, src).is_dir() {
        return Ok(());
    }
    let locked = HistoryStore::open(config, src)?;
    let Some(plan) = replayable(locked.history(), src, entry) else {
        return Ok(());
    };
    let dir = dir(config, dst);
    if src != dst {
        // Under `src`'s history lock: its retention cannot prune them meanwhile.
        link_exchanges(config, src, &dir, plan)?;
    }
    drop(locked);
    write_plan(&dir, plan)?;
    tracing::info!(%src, %dst, from = plan.from, to = plan.to, "agent fast-forward planned");
    Ok(())
}

/// The plan of a restore of `entry` of `history` (container `key`'s), if one
/// may replay. Running a turn's tools again is right only if that turn changed
/// nothing but the agent's own state (a skip). A turn between that took the
/// files without the processes (its requester was not found as the agent, so
/// it was not made full) would have its tools run twice on files that have
/// their effect: no replay then, the agent asks its LLM again.
pub fn replayable(history: &history::History, key: &ContainerKey, entry: &Entry) -> Option<Plan> {
    let from = entry.process_image?;
    if let Some(e) = history
        .entries
        .iter()
        .find(|e| e.seq > from && e.seq <= entry.seq && e.kind != Kind::Skip)
    {
        tracing::warn!(%key, from, to = entry.seq, seq = e.seq, kind = ?e.kind,
            "no agent fast-forward: a turn to replay was no skip");
        return None;
    }
    Some(Plan {
        from,
        to: entry.seq,
    })
}

/// Writes `plan` into journal `dir`, whole (temporary file, rename).
fn write_plan(dir: &Path, plan: Plan) -> Result<()> {
    let path = dir.join(PLAN);
    let tmp = dir.join(format!(".{PLAN}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec(&plan).expect("plan serializes"))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(Error::io(format!("write {}", path.display())))?;
    Ok(())
}

/// Where an archive holds an exported agent's exchanges.
pub const ARCHIVE_DIR: &str = "journal";

/// The exchanges of `plan` in the journal of container `key`, to export with
/// its checkpoint: (file name, path).
pub fn exchanges(config: &Config, key: &ContainerKey, plan: Plan) -> Vec<(String, PathBuf)> {
    let dir = dir(config, key);
    (plan.from..=plan.to)
        .map(|seq| format!("{seq}.exchange"))
        .map(|name| (dir.join(&name), name))
        .filter(|(path, _)| path.is_file())
        .map(|(path, name)| (name, path))
        .collect()
}

/// Adopts an imported agent's exchanges (`unpacked`, an archive's
/// [`ARCHIVE_DIR`]) into the journal of container `key` and leaves its proxy
/// `plan`, when the agent is fast-forwarded here. The archive is another host's:
/// only names of exchanges inside the plan's range are taken.
pub fn adopt(config: &Config, key: &ContainerKey, unpacked: &Path, plan: Plan) -> Result<()> {
    if !config.agent.fast_forward || !unpacked.is_dir() || plan.from > plan.to {
        return Ok(());
    }
    let dir = dir(config, key);
    make_dir(&dir)?;
    let files =
        std::fs::read_dir(unpacked).map_err(Error::io(format!("read {}", unpacked.display())))?;
    for f in files.flatten() {
        let name = f.file_name();
        let Some(name) = name.to_str() else { continue };
        let wanted = !name.starts_with('.')
            && exchange_seq(name).is_some_and(|seq| plan.from <= seq && seq <= plan.to);
        if wanted && f.file_type().is_ok_and(|t| t.is_file()) {
            let to = dir.join(name);
            std::fs::rename(f.path(), &to)
                .or_else(|_| std::fs::copy(f.path(), &to).map(drop))
                .map_err(Error::io(format!("adopt {}", to.display())))?;
        }
    }
    write_plan(&dir, plan)?;
    tracing::info!(%key, from = plan.from, to = plan.to, "agent fast-forward planned from an archive");
    Ok(())
}

/// Links the exchanges of `plan` in container `src`'s journal into journal
/// `dst`, replacing files of those names. Exchanges are never written again
/// once whole, so a link is a copy.
fn link_exchanges(config: &Config, src: &ContainerKey, dst: &Path, plan: Plan) -> Result<()> {
    make_dir(dst)?;
    for (name, a) in exchanges(config, src, plan) {
        let b = dst.join(&name);
        let _ = std::fs::remove_file(&b);
        std::fs::hard_link(&a, &b)
            .or_else(|_| std::fs::copy(&a, &b).map(drop))
            .map_err(Error::io(format!(
                "link {} to {}",
                a.display(),
                b.display()
            )))?;
    }
    Ok(())
}

/// Makes journal directory `dir` (mode 0700, as the proxy makes it).
fn make_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(Error::io(format!("create {}", dir.display())))
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

        plan_replay(&config, &key, &key, &entry(6, Some(4))).unwrap();
        let got: Plan = serde_json::from_slice(&std::fs::read(&plan).unwrap()).unwrap();
        assert_eq!(got, Plan { from: 4, to: 6 });
        std::fs::remove_file(&plan).unwrap();

        // Turn 5 took the files alone: its tools must not run again.
        h.entries[1].kind = Kind::FsOnly;
        h.save(&history::dir(&config, &key)).unwrap();
        plan_replay(&config, &key, &key, &entry(6, Some(4))).unwrap();
        assert!(!plan.exists());
        // Without fast-forward, never.
        h.entries[1].kind = Kind::Skip;
        h.save(&history::dir(&config, &key)).unwrap();
        config.agent.fast_forward = false;
        plan_replay(&config, &key, &key, &entry(6, Some(4))).unwrap();
        assert!(!plan.exists());
    }

    #[test]
    fn a_forks_plan_links_the_exchanges_it_replays_into_its_own_journal() {
        let d = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.checkpoint.store = d.path().to_path_buf();
        let (src, fork) = (
            ContainerKey::new("ns", "c").unwrap(),
            ContainerKey::new("ns", "fork").unwrap(),
        );
        std::fs::create_dir_all(dir(&config, &src)).unwrap();
        for seq in 3..=7 {
            std::fs::write(
                dir(&config, &src).join(format!("{seq}.exchange")),
                [seq as u8],
            )
            .unwrap();
        }
        let mut h = History::load(&history::dir(&config, &src), &src).unwrap();
        h.entries = vec![entry(4, Some(4)), entry(5, Some(4)), entry(6, Some(4))];
        h.next_seq = 7;
        h.save(&history::dir(&config, &src)).unwrap();

        plan_replay(&config, &src, &fork, &entry(6, Some(4))).unwrap();
        let forked = dir(&config, &fork);
        let plan: Plan =
            serde_json::from_slice(&std::fs::read(forked.join(PLAN)).unwrap()).unwrap();
        assert_eq!(plan, Plan { from: 4, to: 6 });
        let mut names: Vec<String> = std::fs::read_dir(&forked)
            .unwrap()
            .map(|f| f.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["4.exchange", "5.exchange", "6.exchange", PLAN]);
        assert_eq!(std::fs::read(forked.join("5.exchange")).unwrap(), [5]);
        // The source keeps its journal, and no plan of its own.
        assert!(dir(&config, &src).join("7.exchange").exists());
        assert!(!dir(&config, &src).join(PLAN).exists());
    }

    #[test]
    fn an_archives_exchanges_are_adopted_only_inside_the_plans_range() {
        let d = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.checkpoint.store = d.path().join("store");
        let key = ContainerKey::new("ns", "imported").unwrap();
        let unpacked = d.path().join(ARCHIVE_DIR);
        std::fs::create_dir_all(unpacked.join("9.exchange.d")).unwrap();
        for f in [
            "2.exchange",
            "3.exchange",
            "4.exchange",
            "9.exchange",
            ".3.partial",
            PLAN,
            "x",
        ] {
            std::fs::write(unpacked.join(f), f).unwrap();
        }
        let plan = Plan { from: 2, to: 3 };
        adopt(&config, &key, &unpacked, plan).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(dir(&config, &key))
            .unwrap()
            .map(|f| f.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["2.exchange", "3.exchange", PLAN]);
        let got: Plan =
            serde_json::from_slice(&std::fs::read(dir(&config, &key).join(PLAN)).unwrap()).unwrap();
        assert_eq!(got, plan, "the archive's own replay.json is not taken");
        // A plan running backwards, or fast-forward off here: nothing.
        let other = ContainerKey::new("ns", "other").unwrap();
        adopt(&config, &other, &unpacked, Plan { from: 4, to: 2 }).unwrap();
        config.agent.fast_forward = false;
        adopt(&config, &other, &unpacked, plan).unwrap();
        assert!(!dir(&config, &other).exists());
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
