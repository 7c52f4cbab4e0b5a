//! The fuzz corpora (`proxy/fuzz/corpus/`), and random mutations of them, fed
//! through the same functions as the fuzz targets, on stable Rust: a request
//! target or a whole request the proxy panicked on once stays a test.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use crab_proxy::target::{check_raw, TargetError};
use crab_proxy::{Limits, Proxy, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn corpus(name: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(name);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} is empty", dir.display());
    files
        .into_iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect()
}

/// xorshift64*: random enough to mutate inputs, and repeatable from its seed.
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let seed = std::env::var("CRAB_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        println!("seed {seed} (CRAB_FUZZ_SEED={seed} repeats this run)");
        Rng(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Bytes that matter to a URI or a request head.
const INTERESTING: &[u8] = b":/?#[]@%*. \r\n\t\0\x7f\xff0123456789Hhttp:";

/// A few random edits of `input`: replace, insert, delete, duplicate.
fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(v.len() + 1);
        let byte = if rng.below(2) == 0 {
            INTERESTING[rng.below(INTERESTING.len())]
        } else {
            rng.next() as u8
        };
        match rng.below(4) {
            0 if at < v.len() => v[at] = byte,
            1 => v.insert(at, byte),
            2 if at < v.len() => {
                v.remove(at);
            }
            _ => {
                let tail = v[at..].to_vec();
                v.extend_from_slice(&tail[..tail.len().min(64)]);
            }
        }
    }
    v
}

#[test]
fn every_corpus_target_is_taken_or_refused_without_a_panic() {
    for (name, data) in corpus("request_target") {
        let got = check_raw(&data);
        println!("{name}: {got:?}");
        if name == "absolute-no-path" {
            assert!(
                matches!(got, Some(Err(TargetError::Absolute(_)))),
                "{got:?}"
            );
        }
        if name == "origin-query" {
            assert_eq!(got.unwrap().unwrap().as_str(), "/v1/messages?beta=1");
        }
    }
}

#[test]
fn random_targets_never_panic() {
    let seeds = corpus("request_target");
    let mut rng = Rng::seeded();
    let (mut taken, mut refused, mut unparsed) = (0, 0, 0);
    for _ in 0..200_000 {
        let (_, seed) = &seeds[rng.below(seeds.len())];
        match check_raw(&mutate(&mut rng, seed)) {
            Some(Ok(_)) => taken += 1,
            Some(Err(_)) => refused += 1,
            None => unparsed += 1,
        }
    }
    println!("taken {taken}, refused {refused}, not a URI {unparsed}");
}

/// The fuzz target `request`'s proxy: a closed upstream, short limits.
fn fuzz_proxy() -> Arc<Proxy> {
    let upstream = Upstream::parse("http://127.0.0.1:9").unwrap();
    Arc::new(
        Proxy::new(upstream, TestBoundary::new(GateKind::Open), true)
            .with_sandbox(Arc::new(TestSandbox::default()), API_TOKEN)
            .with_limits(Limits {
                header_timeout: Duration::from_millis(200),
                body_timeout: Duration::from_millis(200),
                max_body: 4096,
                ..Limits::default()
            }),
    )
}

/// What the proxy answers to `data` on one in-memory connection, read until
/// the proxy closes it (at the latest at the header timeout, once it waits for
/// the next request); panics when the connection's task panicked or hung.
/// The tests run on a paused clock, so the timeouts take no real time. The
/// client never shuts its side: hyper would drop the request unanswered.
async fn answer(proxy: &Arc<Proxy>, data: &[u8]) -> Vec<u8> {
    let (mut client, server) = tokio::io::duplex(64 << 10);
    let served = tokio::spawn(proxy.clone().serve_connection(server));
    let _ = client.write_all(data).await;
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), client.read_to_end(&mut got))
        .await
        .expect("the proxy neither answered nor closed")
        .unwrap();
    drop(client);
    served.await.expect("the connection's task panicked");
    got
}

/// The corpus's requests carry the fuzz target's token; the tests' is another.
fn with_test_token(data: &[u8]) -> Vec<u8> {
    let fuzz = b"0123456789abcdef0123456789abcdef-fuzz";
    match data.windows(fuzz.len()).position(|w| w == fuzz) {
        Some(i) => [&data[..i], API_TOKEN.as_bytes(), &data[i + fuzz.len()..]].concat(),
        None => data.to_vec(),
    }
}

#[tokio::test(start_paused = true)]
async fn every_corpus_request_gets_an_answer_or_a_close() {
    let proxy = fuzz_proxy();
    for (name, data) in corpus("request") {
        let got = answer(&proxy, &with_test_token(&data)).await;
        let first = String::from_utf8_lossy(&got);
        let first = first.lines().next().unwrap_or("(closed)");
        println!("{name}: {first}");
        assert!(
            got.is_empty() || got.starts_with(b"HTTP/1."),
            "{name}: {first}"
        );
        if name == "absolute-no-path" {
            assert!(first.starts_with("HTTP/1.1 400"), "{first}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn random_requests_never_panic() {
    let proxy = fuzz_proxy();
    let seeds = corpus("request");
    let mut rng = Rng::seeded();
    for _ in 0..2000 {
        let (_, seed) = &seeds[rng.below(seeds.len())];
        let input = mutate(&mut rng, &with_test_token(seed));
        let got = answer(&proxy, &input).await;
        assert!(
            got.is_empty() || got.starts_with(b"HTTP/1."),
            "{:?} -> {:?}",
            String::from_utf8_lossy(&input),
            String::from_utf8_lossy(&got)
        );
    }
}
