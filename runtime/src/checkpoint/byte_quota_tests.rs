use super::*;
use crate::checkpoint::history::tests::entry;
use crate::checkpoint::Kind;

const MB: u64 = 1 << 20;

fn history(sizes: &[(u64, bool)]) -> (tempfile::TempDir, History) {
    let key = ContainerKey::new("ns", "c").unwrap();
    let t = tempfile::tempdir().unwrap();
    let mut h = History::load(t.path(), &key).unwrap();
    for (i, (bytes, marked)) in sizes.iter().enumerate() {
        let mut e = entry(i as u64 + 1, *marked);
        e.process_bytes = *bytes;
        h.entries.push(e);
    }
    h.next_seq = sizes.len() as u64 + 1;
    (t, h)
}

fn config(sandbox: &str, host: &str) -> Config {
    let mut c = Config::default();
    c.quota.sandbox_checkpoint_bytes = sandbox.into();
    c.quota.host_checkpoint_bytes = host.into();
    c
}

fn seqs(entries: &[Entry]) -> Vec<u64> {
    entries.iter().map(|e| e.seq).collect()
}

#[test]
fn an_image_shared_by_a_skipped_turn_counts_once() {
    let (_t, mut h) = history(&[(10 * MB, false)]);
    let mut skip = entry(2, false);
    (skip.kind, skip.process_image, skip.process_bytes) = (Kind::Skip, Some(1), 0);
    h.entries.push(skip);
    assert_eq!(image_bytes(&h, &|_| unreachable!()), 10 * MB);
}

#[test]
fn an_image_whose_entry_is_gone_is_measured() {
    let (_t, mut h) = history(&[]);
    let mut skip = entry(5, false);
    skip.process_image = Some(4);
    h.entries.push(skip);
    assert_eq!(image_bytes(&h, &|seq| seq * MB), 4 * MB);
}

#[test]
fn retention_by_bytes_drops_the_oldest_unmarked_first_and_never_the_newest() {
    let (_t, mut h) = history(&[
        (30 * MB, false),
        (30 * MB, true),
        (30 * MB, false),
        (50 * MB, false),
    ]);
    let dropped = retain_bytes(&mut h, 100 * MB, &|_| 0);
    assert_eq!(seqs(&dropped), vec![1, 3]);
    assert_eq!(seqs(&h.entries), vec![2, 4]);
    assert_eq!(seqs(&h.uncollected), vec![1, 3]);
    // Over the limit with only the marked and the newest left: they stay.
    let dropped = retain_bytes(&mut h, 10 * MB, &|_| 0);
    assert!(dropped.is_empty());
    assert_eq!(seqs(&h.entries), vec![2, 4]);
}

#[test]
fn a_checkpoint_larger_than_the_sandbox_quota_is_refused() {
    let (t, h) = history(&[(10 * MB, false)]);
    let key = ContainerKey::new("ns", "c").unwrap();
    let c = config("64M", "none");
    admit(&h, &c, &key, t.path(), 60 * MB, false).unwrap();
    let e = admit(&h, &c, &key, t.path(), 65 * MB, false).unwrap_err();
    assert_eq!(e.kind(), crate::error::ErrorKind::ResourceExhausted);
    assert!(
        e.to_string().contains("quota.sandbox_checkpoint_bytes"),
        "{e}"
    );
}

#[test]
fn marked_checkpoints_count_against_the_sandbox_quota() {
    let (t, h) = history(&[(40 * MB, true)]);
    let key = ContainerKey::new("ns", "c").unwrap();
    let c = config("64M", "none");
    admit(&h, &c, &key, t.path(), 20 * MB, false).unwrap();
    assert!(admit(&h, &c, &key, t.path(), 30 * MB, false).is_err());
}

#[test]
fn the_host_quota_counts_the_other_sandboxes_histories() {
    let store = tempfile::tempdir().unwrap();
    let mut c = config("none", "100M");
    c.checkpoint.store = store.path().to_path_buf();
    let other = ContainerKey::new("ns", "other").unwrap();
    let (_t, mut h_other) = history(&[(70 * MB, false)]);
    h_other.id = "other".into();
    h_other.save(&history::dir(&c, &other)).unwrap();
    let key = ContainerKey::new("ns", "c").unwrap();
    let dir = history::dir(&c, &key);
    let (_t, h) = history(&[]);
    admit(&h, &c, &key, &dir, 30 * MB, false).unwrap();
    let e = admit(&h, &c, &key, &dir, 31 * MB, false).unwrap_err();
    assert!(e.to_string().contains("quota.host_checkpoint_bytes"), "{e}");
    // Its own earlier images are not counted twice.
    h.save(&dir).unwrap();
    admit(&h, &c, &key, &dir, 30 * MB, false).unwrap();
}
