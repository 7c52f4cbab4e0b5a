//! End-to-end time at density: N sandboxes at once, fault-free under runc's
//! shim, under Crab's runtime without checkpoints, with Crab, and with Crab and
//! one crash each.

use std::sync::Arc;
use std::time::Duration;

use crate::report::{correct, mean, Results};
use crate::run::{run, Env, Outcome};
use crate::strategy::Strategy;
use crate::trajectory::Trajectory;

/// End-to-end times with `n` sandboxes at once.
#[derive(Debug, Clone)]
pub struct Density {
    /// Sandboxes at once.
    pub n: usize,
    /// Mean time of a fault-free run without Crab.
    pub plain: Duration,
    /// Mean time of a fault-free run under Crab's runtime, no checkpoints.
    pub crab_plain: Duration,
    /// Mean time of a fault-free run with Crab.
    pub crab: Duration,
    /// Mean time of a Crab run with one crash (mid-trajectory).
    pub crab_crash: Duration,
    /// Crab runs with a crash that ended correct, of `n`.
    pub correct: usize,
}

/// `n` sandboxes at once: fault-free without Crab, under Crab's runtime without
/// checkpoints, with Crab, then with Crab and one crash each, halfway through.
pub async fn density(env: &Env, results: &Results, n: usize) -> Density {
    let pick: Vec<Arc<Trajectory>> = results
        .references
        .iter()
        .map(|r| r.trajectory.clone())
        .cycle()
        .take(n)
        .collect();
    let batch = |s: Strategy, crash: bool| {
        let pick = pick.clone();
        let env = env.clone();
        async move {
            let mut set = tokio::task::JoinSet::new();
            for t in pick {
                let env = env.clone();
                let k = crash.then_some(t.turns.len() / 2);
                set.spawn(async move { run(&env, t, s, k).await });
            }
            let mut out = Vec::new();
            while let Some(o) = set.join_next().await {
                if let Ok(o) = o {
                    out.push(o);
                }
            }
            out
        }
    };
    let plain = batch(Strategy::Plain, false).await;
    let crab_plain = batch(Strategy::CrabPlain, false).await;
    let crab = batch(Strategy::Crab, false).await;
    let crashed = batch(Strategy::Crab, true).await;
    let correct_n = crashed
        .iter()
        .filter(|o| {
            results
                .reference(&o.trajectory)
                .is_some_and(|r| correct(o, &r.plain))
        })
        .count();
    let times = |v: &[Outcome]| mean(&v.iter().map(|o| o.elapsed).collect::<Vec<_>>());
    Density {
        n,
        plain: times(&plain),
        crab_plain: times(&crab_plain),
        crab: times(&crab),
        crab_crash: times(&crashed),
        correct: correct_n,
    }
}
