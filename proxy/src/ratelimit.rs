//! Log lines that a sandbox can trigger (a failing upstream, a refused
//! connection, an agent API call) are rate-limited per call site: a flood of
//! requests must not become a flood of writes to the host's log.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lines let through per window and call site.
const BURST: u32 = 10;
/// The window.
const WINDOW: Duration = Duration::from_secs(10);

/// One call site's budget.
pub struct LogLimit(Mutex<State>);

struct State {
    since: Option<Instant>,
    lines: u32,
    dropped: u64,
}

impl LogLimit {
    /// A fresh budget (for a `static`).
    pub const fn new() -> LogLimit {
        LogLimit(Mutex::new(State {
            since: None,
            lines: 0,
            dropped: 0,
        }))
    }

    /// Whether a line may be written now; if so, how many were dropped since
    /// the last one written (to log with it).
    pub fn allow(&self) -> Option<u64> {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if s.since.is_none_or(|t| now.duration_since(t) >= WINDOW) {
            s.since = Some(now);
            s.lines = 0;
        }
        if s.lines >= BURST {
            s.dropped += 1;
            return None;
        }
        s.lines += 1;
        Some(std::mem::take(&mut s.dropped))
    }
}

impl Default for LogLimit {
    fn default() -> Self {
        LogLimit::new()
    }
}

/// `limited!(warn, field = x, "message")`: a `tracing` event at that level,
/// with a `dropped` field, at most [`BURST`] per [`WINDOW`] from this site.
macro_rules! limited {
    ($level:ident, $($arg:tt)+) => {{
        static LIMIT: $crate::ratelimit::LogLimit = $crate::ratelimit::LogLimit::new();
        if let Some(dropped) = LIMIT.allow() {
            tracing::$level!(dropped, $($arg)+);
        }
    }};
}
pub(crate) use limited;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_cut_to_the_burst_and_the_drops_are_counted() {
        let l = LogLimit::new();
        let allowed = (0..1000).filter(|_| l.allow().is_some()).count();
        assert_eq!(allowed, BURST as usize);
        // The next window's first line says how many were dropped.
        l.0.lock().unwrap().since = Some(Instant::now() - WINDOW);
        assert_eq!(l.allow(), Some(1000 - BURST as u64));
        assert_eq!(l.allow(), Some(0));
    }
}
