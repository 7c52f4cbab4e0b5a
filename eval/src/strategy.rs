//! Recovery strategies: how a sandbox runs, and how it comes back after a crash.

use std::fmt;

/// A way to run a sandbox and to recover it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Strategy {
    /// runc's shim, no checkpoints: the fault-free reference (no crash).
    Plain,
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

    /// Whether its sandbox runs under Crab's runtime, with the turn proxy.
    pub fn crab(self) -> bool {
        matches!(self, Strategy::Crab | Strategy::ChatFs)
    }

    /// Its name in tables and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Plain => "plain",
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
