//! The journal of LLM exchanges, and the fast-forward of a restored agent.
//!
//! Each turn whose checkpoint was recorded (seq S) and whose answer reached the
//! agent leaves `<S>.exchange` in the journal directory: one JSON header line
//! (digest of the request, path, status, content type), then the answer's body
//! bytes exactly as the agent got them. After a restore, the runtime writes
//! `replay.json` (`{"from": J, "to": P}`); the agent, back as it was at J,
//! re-sends its requests, and each one whose digest matches a journaled
//! exchange of J..=P is answered from the file, without a checkpoint and
//! without the LLM. The first request that matches none ends the replay: from
//! there the agent is live again.

mod record;
mod replay;

use std::io::{BufRead, Read};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tokio::sync::watch;

use crate::{Error, Result};

pub(crate) use record::Recording;
pub(crate) use replay::{prepare, Prepared};

/// The replay plan's name in the journal directory (written by the runtime).
pub const REPLAY_PLAN: &str = "replay.json";

/// The exchange files' format version.
const VERSION: u32 = 1;

/// A live turn waits at most this long for earlier answers to be durable.
const BARRIER_WAIT: Duration = Duration::from_secs(5);

/// The longest header line read back (the path is in it, so it is bounded
/// by the request head's size).
const MAX_HEADER: u64 = 64 << 10;

/// SHA-256 of a request as the journal knows it: its path (without query),
/// `\n`, its body bytes. Fed as the body streams, never holding it.
pub(crate) struct Hasher(Sha256);

impl Hasher {
    /// Starts a digest of a request to `path` (its query is not part of it).
    pub(crate) fn new(path: &str) -> Hasher {
        let mut h = Sha256::new();
        h.update(path.split('?').next().unwrap_or("").as_bytes());
        h.update(b"\n");
        Hasher(h)
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The digest, in lowercase hex.
    pub(crate) fn finish(self) -> String {
        self.0
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// An exchange file's first line.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    version: u32,
    digest: String,
    path: String,
    status: u16,
    content_type: String,
}

/// `replay.json`: replay the journaled exchanges of seqs `from..=to`.
#[derive(Debug, Deserialize)]
struct PlanFile {
    from: u64,
    to: u64,
}

/// A journaled exchange the restored agent is expected to ask for again.
#[derive(Debug)]
struct Expected {
    seq: u64,
    digest: String,
}

/// The replay under way: what is left of it, in seq order.
struct Plan {
    expected: Vec<Expected>,
    replayed: u64,
    /// When each answer was replayed, from when the plan was loaded: the gaps
    /// are what each recovered turn took (the agent re-running its tools).
    loaded: Instant,
    at: Vec<Duration>,
}

impl Plan {
    /// "N answers replayed in T ms (per turn: median M ms, p95 P ms)".
    fn summary(&self) -> String {
        let mut gaps: Vec<Duration> = self
            .at
            .iter()
            .scan(Duration::ZERO, |prev, &t| {
                let gap = t.saturating_sub(*prev);
                *prev = t;
                Some(gap)
            })
            .collect();
        gaps.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let pick = |q: f64| {
            gaps.get(((gaps.len() as f64 - 1.0) * q).round() as usize)
                .map_or(0.0, |d| ms(*d))
        };
        format!(
            "{} answers replayed in {:.0} ms (per turn: median {:.0} ms, p95 {:.0} ms)",
            self.replayed,
            self.at.last().map_or(0.0, |d| ms(*d)),
            pick(0.5),
            pick(0.95)
        )
    }
}

/// What to do with a turn-boundary request read whole during a replay.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// Answer it from the exchange of this seq.
    Replay(u64),
    /// No replay (any more): serve it live.
    Live,
}

/// The journal directory of one proxy, and its replay plan, if any.
pub struct Journal {
    dir: PathBuf,
    /// Exchanges whose answer has ended but that are not yet durable: what a
    /// live turn waits for before its checkpoint.
    settling: watch::Sender<usize>,
    plan: Mutex<Option<Plan>>,
    replayed: AtomicU64,
    diverged: AtomicU64,
}

impl Journal {
    /// Opens the journal in `dir` (made, mode 0700, if missing), drops the
    /// partial files of a proxy that died while writing, and loads the
    /// replay plan if there is one (a bad plan is logged and dropped).
    pub fn open(dir: impl Into<PathBuf>) -> Result<Journal> {
        let dir = dir.into();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| Error::Io {
                what: format!("create the journal directory {}", dir.display()),
                source,
            })?;
        let entries = std::fs::read_dir(&dir).map_err(|source| Error::Io {
            what: format!("read the journal directory {}", dir.display()),
            source,
        })?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && name.ends_with(".partial") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let journal = Journal {
            dir,
            settling: watch::Sender::new(0),
            plan: Mutex::new(None),
            replayed: AtomicU64::new(0),
            diverged: AtomicU64::new(0),
        };
        if let Err(e) = journal.load_plan() {
            tracing::warn!(error = %e, "fast-forward: the replay plan was dropped");
        }
        Ok(journal)
    }

    /// The journal's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the exchange of the turn whose checkpoint is `seq` is kept.
    pub fn exchange_file(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq}.exchange"))
    }

    /// Loads `replay.json` if it is there, and removes it (a plan is used
    /// once); replaces any plan under way. Returns how many journaled
    /// exchanges are now expected (0: no plan, or nothing journaled in it).
    pub fn load_plan(&self) -> Result<usize> {
        let path = self.dir.join(REPLAY_PLAN);
        let io = |what: &str, source| Error::Io {
            what: format!("{what} {}", path.display()),
            source,
        };
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io("read", e)),
        };
        // Removed even when bad: it would fail again on every SIGHUP.
        std::fs::remove_file(&path).map_err(|e| io("remove", e))?;
        let plan: PlanFile = serde_json::from_slice(&text).map_err(|e| Error::Journal {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        let expected = self.scan(plan.from, plan.to)?;
        let n = expected.len();
        tracing::info!(
            from = plan.from,
            to = plan.to,
            exchanges = n,
            "fast-forward: replay plan loaded"
        );
        *self.lock_plan() = (n > 0).then_some(Plan {
            expected,
            replayed: 0,
            loaded: Instant::now(),
            at: Vec::new(),
        });
        Ok(n)
    }

    /// Answers replayed from the journal, over the proxy's life.
    pub fn replayed(&self) -> u64 {
        self.replayed.load(Ordering::Relaxed)
    }

    /// Replays that ended on a request matching no journaled one.
    pub fn diverged(&self) -> u64 {
        self.diverged.load(Ordering::Relaxed)
    }

    fn lock_plan(&self) -> std::sync::MutexGuard<'_, Option<Plan>> {
        self.plan.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The journaled exchanges of `from..=to`, in seq order, with their digests.
    fn scan(&self, from: u64, to: u64) -> Result<Vec<Expected>> {
        let entries = std::fs::read_dir(&self.dir).map_err(|source| Error::Io {
            what: format!("read the journal directory {}", self.dir.display()),
            source,
        })?;
        let mut seqs: Vec<u64> = entries
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_suffix(".exchange")?
                    .parse()
                    .ok()
            })
            .filter(|s| (from..=to).contains(s))
            .collect();
        seqs.sort_unstable();
        let mut expected = Vec::with_capacity(seqs.len());
        for seq in seqs {
            match self.read_header(seq) {
                Ok(h) => expected.push(Expected {
                    seq,
                    digest: h.digest,
                }),
                // Then the agent's request for it diverges, and goes live.
                Err(e) => tracing::warn!(seq, error = %e, "fast-forward: exchange unusable"),
            }
        }
        Ok(expected)
    }

    fn read_header(&self, seq: u64) -> std::result::Result<Header, String> {
        let path = self.exchange_file(seq);
        let file = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut line = Vec::new();
        std::io::BufReader::new(file)
            .take(MAX_HEADER)
            .read_until(b'\n', &mut line)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        parse_header(&line).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Whether a replay is under way (a turn-boundary request is then read
    /// whole and looked up).
    pub(crate) fn replaying(&self) -> bool {
        self.lock_plan().is_some()
    }

    /// Takes the exchange a request with `digest` (to `path`, for the log)
    /// replays, if any; a request that matches none ends the replay.
    pub(crate) fn lookup(&self, digest: &str, path: &str) -> Lookup {
        let mut guard = self.lock_plan();
        let Some(plan) = guard.as_mut() else {
            return Lookup::Live;
        };
        // Not only the first: concurrent requests may come in any order. The
        // same request twice takes the earliest.
        let Some(i) = plan.expected.iter().position(|e| e.digest == digest) else {
            let expected = plan.expected[0].seq;
            self.diverged.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%path, expected_seq = expected, "fast-forward: the request matches no journaled one");
            tracing::info!(
                replayed = plan.replayed,
                "fast-forward: {}, diverged at seq {expected}, then live",
                plan.summary()
            );
            *guard = None;
            return Lookup::Live;
        };
        let seq = plan.expected.remove(i).seq;
        plan.replayed += 1;
        plan.at.push(plan.loaded.elapsed());
        self.replayed.fetch_add(1, Ordering::Relaxed);
        if plan.expected.is_empty() {
            tracing::info!(
                replayed = plan.replayed,
                "fast-forward: {}, then live",
                plan.summary()
            );
            *guard = None;
        }
        Lookup::Replay(seq)
    }

    /// Waits (a bounded time) until every exchange whose answer has ended is
    /// durable, so the journal holds answer k before the checkpoint of request
    /// k+1 is recorded: a restore to that checkpoint can then replay answer k.
    pub(crate) async fn barrier(&self) {
        let mut rx = self.settling.subscribe();
        let wait = tokio::time::timeout(BARRIER_WAIT, rx.wait_for(|n| *n == 0));
        if wait.await.is_err() {
            tracing::warn!(
                "journal: an earlier answer is not durable after {BARRIER_WAIT:?}; the turn goes on"
            );
        }
    }

    /// Counts an ended answer as not yet durable until the guard is dropped.
    fn settling(self: &Arc<Self>) -> Settling {
        self.settling.send_modify(|n| *n += 1);
        Settling(self.clone())
    }
}

/// An ended exchange not yet durable (see [`Journal::barrier`]).
struct Settling(Arc<Journal>);

impl Drop for Settling {
    fn drop(&mut self) {
        self.0.settling.send_modify(|n| *n -= 1);
    }
}

fn parse_header(line: &[u8]) -> std::result::Result<Header, String> {
    let Some(line) = line.strip_suffix(b"\n") else {
        return Err("no header line".into());
    };
    let h: Header = serde_json::from_slice(line).map_err(|e| format!("bad header: {e}"))?;
    if h.version != VERSION {
        return Err(format!("version {} (expected {VERSION})", h.version));
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_gives_each_recovered_turns_time() {
        let plan = Plan {
            expected: Vec::new(),
            replayed: 4,
            loaded: Instant::now(),
            at: [10, 30, 40, 140].map(Duration::from_millis).to_vec(),
        };
        // Gaps 10, 20, 10, 100 ms.
        assert_eq!(
            plan.summary(),
            "4 answers replayed in 140 ms (per turn: median 20 ms, p95 100 ms)"
        );
    }

    #[test]
    fn the_digest_is_of_the_path_without_query_and_the_body() {
        let mut h = Hasher::new("/v1/messages?beta=1");
        h.update(b"{\"a\":");
        h.update(b"1}");
        let whole: String = Sha256::digest(b"/v1/messages\n{\"a\":1}")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(h.finish(), whole);
    }

    #[test]
    fn a_plan_expects_the_journaled_exchanges_in_its_range_once() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path().join("j")).unwrap();
        for seq in [3u64, 5, 9] {
            let header = format!(
                "{{\"version\":1,\"digest\":\"d{seq}\",\"path\":\"/v1/messages\",\"status\":200,\"content_type\":\"\"}}\n"
            );
            std::fs::write(j.exchange_file(seq), header).unwrap();
        }
        std::fs::write(j.dir().join(REPLAY_PLAN), r#"{"from":4,"to":9}"#).unwrap();
        assert_eq!(j.load_plan().unwrap(), 2);
        assert!(!j.dir().join(REPLAY_PLAN).exists(), "a plan is used once");
        assert_eq!(j.load_plan().unwrap(), 0);
        assert!(
            j.replaying(),
            "a missing plan file leaves the plan under way"
        );
        assert_eq!(j.lookup("d9", "/v1/messages"), Lookup::Replay(9));
        assert_eq!(j.lookup("d3", "/v1/messages"), Lookup::Live, "out of range");
        assert_eq!((j.replayed(), j.diverged()), (1, 1));
        assert!(!j.replaying(), "a divergence ends the replay");
    }
}
