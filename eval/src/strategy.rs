//! Recovery strategies: how a sandbox runs, and how it comes back after a crash.

use std::fmt;

/// A way to run a sandbox and to recover it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Strategy {
    /// runc's shim, no checkpoints: the fault-free reference (no crash).
    Plain,
    /// Crab's runtime without the turn proxy, hence without checkpoints: the
    /// reference for Crab's overhead on its own runtime. It cannot recover, so
    /// it runs fault-free only, as [`Strategy::Plain`] does.
    CrabPlain,
    /// Crab: the turn proxy and the adaptive policy; restore of the latest
    /// checkpoint, processes and files, and the agent's chat rewound to it.
    Crab,
    /// A fresh sandbox; the agent keeps its whole chat.
    ChatOnly,
    /// The latest file-system snapshot only (Crab's, without its processes);
    /// the chat rewound to it.
    ChatFs,
    /// A fresh sandbox and a fresh chat: the task from the start.
    Scratch,
    /// runc's shim with a full checkpoint (`ctr container checkpoint --task
    /// --rw`) at every turn; restore of the latest.
    RuncFull,
}

impl Strategy {
    /// Every strategy recovering from a crash.
    pub const RECOVERING: [Strategy; 5] = [
        Strategy::Crab,
        Strategy::ChatOnly,
        Strategy::ChatFs,
        Strategy::Scratch,
        Strategy::RuncFull,
    ];

    /// Whether its sandbox runs under Crab's runtime.
    pub fn crab_runtime(self) -> bool {
        matches!(
            self,
            Strategy::Crab | Strategy::ChatFs | Strategy::CrabPlain
        )
    }

    /// Whether its sandbox runs under Crab's runtime with the turn proxy, which
    /// takes a checkpoint at every LLM request.
    pub fn crab(self) -> bool {
        matches!(self, Strategy::Crab | Strategy::ChatFs)
    }

    /// Whether it recovers from a crash at all (the others run fault-free only).
    pub fn recovers(self) -> bool {
        !matches!(self, Strategy::Plain | Strategy::CrabPlain)
    }

    /// The turn the agent resumes at after a crash following the tool call of
    /// turn `crash_at` (None: the strategy does not recover).
    ///
    /// The crash comes once the checkpoint at the request for turn
    /// `crash_at + 1` is written (the last completed turn's), so the
    /// checkpointing strategies lose no turn; `chat-only` keeps the whole chat.
    pub fn promised_resume(self, crash_at: usize) -> Option<usize> {
        match self {
            Strategy::Plain | Strategy::CrabPlain => None,
            Strategy::Crab | Strategy::ChatFs | Strategy::ChatOnly | Strategy::RuncFull => {
                Some(crash_at + 1)
            }
            Strategy::Scratch => Some(0),
        }
    }

    /// Its name in tables and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Plain => "plain",
            Strategy::CrabPlain => "crab-plain",
            Strategy::Crab => "crab",
            Strategy::ChatOnly => "chat-only",
            Strategy::ChatFs => "chat+fs",
            Strategy::Scratch => "scratch",
            Strategy::RuncFull => "runc-full",
        }
    }

    /// Parses [`Strategy::name`].
    pub fn parse(s: &str) -> Option<Strategy> {
        [
            Strategy::Plain,
            Strategy::CrabPlain,
            Strategy::Crab,
            Strategy::ChatOnly,
            Strategy::ChatFs,
            Strategy::Scratch,
            Strategy::RuncFull,
        ]
        .into_iter()
        .find(|x| x.name() == s)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_each_strategy_promises_its_resume_turn() {
        assert_eq!(Strategy::Crab.promised_resume(7), Some(8));
        assert_eq!(Strategy::ChatFs.promised_resume(7), Some(8));
        assert_eq!(Strategy::ChatOnly.promised_resume(7), Some(8));
        assert_eq!(Strategy::Scratch.promised_resume(7), Some(0));
        assert_eq!(Strategy::RuncFull.promised_resume(7), Some(8));
        assert_eq!(Strategy::Plain.promised_resume(7), None);
        assert_eq!(Strategy::CrabPlain.promised_resume(7), None);
        for s in Strategy::RECOVERING {
            assert!(s.recovers());
            assert_eq!(Strategy::parse(s.name()), Some(s));
        }
        assert_eq!(Strategy::parse("crab-plain"), Some(Strategy::CrabPlain));
        assert!(Strategy::CrabPlain.crab_runtime() && !Strategy::CrabPlain.crab());
    }
}
