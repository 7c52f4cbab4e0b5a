//! What a run records: how it ended, its figures, and the turn it resumed at,
//! held to the turn its strategy promises.

use std::time::Duration;

use crate::state::Ending;
use crate::strategy::Strategy;

/// Checkpoint kinds of a Crab run's turns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kinds {
    /// Nothing to save.
    pub skip: u32,
    /// Files only.
    pub fs_only: u32,
    /// Processes only.
    pub process_only: u32,
    /// Both.
    pub full: u32,
}

/// How a run went.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The trajectory.
    pub trajectory: String,
    /// Its category.
    pub category: String,
    /// The strategy.
    pub strategy: Strategy,
    /// The turn after whose tool call the crash came.
    pub crash_at: Option<usize>,
    /// The task's check and the state digest, or why the run failed.
    pub ending: std::result::Result<Ending, String>,
    /// Start to the end of the last turn.
    pub elapsed: Duration,
    /// Crash to the agent's next request.
    pub recovery: Option<Duration>,
    /// Turn checkpoints by kind (Crab runs).
    pub kinds: Kinds,
    /// Each checkpoint's latency, ms (Crab: the history's timings; runc: the
    /// `ctr` command).
    pub checkpoint_ms: Vec<f64>,
    /// How long answers were held for checkpoints: (p50, p99) ms (Crab).
    pub gating_ms: Option<(f64, f64)>,
    /// Bytes of checkpoint images written.
    pub bytes: u64,
    /// runc: checkpoints containerd wrote without their process image.
    pub incomplete: u32,
    /// The turn the agent resumed at after the crash.
    pub resumed_at: Option<usize>,
}

impl Outcome {
    /// The turn its strategy promises to resume at after its crash.
    pub fn promised_resume(&self) -> Option<usize> {
        self.strategy.promised_resume(self.crash_at?)
    }

    /// Fails the run when it recovered at another turn than its strategy
    /// promises: a recovery that goes further back, or forward, than it says
    /// it does is not the strategy measured.
    pub fn check_resume(&mut self) {
        let (Some(resumed), Some(promised)) = (self.resumed_at, self.promised_resume()) else {
            return;
        };
        if resumed != promised && self.ending.is_ok() {
            self.ending = Err(format!(
                "resumed at turn {resumed} after the crash at turn {}, but {} promises turn \
                 {promised}",
                self.crash_at.unwrap_or_default(),
                self.strategy
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Reference, Results};
    use crate::trajectory::Trajectory;
    use std::sync::Arc;

    fn outcome(strategy: Strategy, crash_at: usize, resumed_at: usize) -> Outcome {
        Outcome {
            trajectory: "t".into(),
            category: "build".into(),
            strategy,
            crash_at: Some(crash_at),
            ending: Ok(Ending {
                verified: true,
                digest: "d".into(),
            }),
            elapsed: Duration::from_secs(1),
            recovery: Some(Duration::from_millis(10)),
            kinds: Kinds::default(),
            checkpoint_ms: Vec::new(),
            gating_ms: None,
            bytes: 0,
            incomplete: 0,
            resumed_at: Some(resumed_at),
        }
    }

    #[test]
    fn test_a_run_resumed_at_another_turn_than_promised_fails() {
        // runc-full promises the turn after the crash; an older checkpoint fails.
        let mut stale = outcome(Strategy::RuncFull, 12, 0);
        stale.check_resume();
        let e = stale.ending.expect_err("a stale restore passed");
        assert!(
            e.contains("resumed at turn 0") && e.contains("promises turn 13"),
            "{e}"
        );
        let mut kept = outcome(Strategy::RuncFull, 12, 13);
        kept.check_resume();
        assert!(kept.ending.is_ok());
        let mut crab = outcome(Strategy::Crab, 5, 5);
        crab.check_resume();
        assert!(crab.ending.is_err(), "crab lost a turn unnoticed");
        let mut crab = outcome(Strategy::Crab, 5, 6);
        crab.check_resume();
        assert!(crab.ending.is_ok());
    }

    #[test]
    fn test_the_report_counts_a_wrong_resume_as_a_failure() {
        let t: Trajectory = serde_json::from_value(serde_json::json!({"format": 1,
            "name": "t", "title": "x", "category": "build", "image": "i", "workdir": "/w",
            "turns": [], "verify": "true", "state": {"paths": []}}))
        .unwrap();
        let fault_free = |s| Outcome {
            crash_at: None,
            resumed_at: None,
            ..outcome(s, 0, 0)
        };
        let mut results = Results::default();
        let mut stale = outcome(Strategy::RuncFull, 12, 0);
        stale.check_resume();
        let mut right = outcome(Strategy::RuncFull, 12, 13);
        right.check_resume();
        results.add(
            Reference {
                trajectory: Arc::new(t),
                plain: fault_free(Strategy::Plain),
                crab_plain: fault_free(Strategy::CrabPlain),
                crab: fault_free(Strategy::Crab),
            },
            vec![stale, right],
        );
        let md = results.markdown();
        assert!(md.contains("| runc-full | 1 | 2 | 50% | 1 |"), "{md}");
        assert!(
            md.contains("| t | runc-full | 12 | 0 | resumed at turn 0"),
            "{md}"
        );
    }
}
