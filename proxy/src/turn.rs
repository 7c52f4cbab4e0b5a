//! Turn boundaries: what the caller does when the agent's turn ends ([`Boundary`]),
//! and the [`Gate`] that holds the LLM's answer until that work is durable.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

/// What a gate resolves to: the seq of the history entry the turn recorded
/// (none when it recorded nothing, say a dry run), or why it failed.
pub type GateResult = std::result::Result<Option<u64>, String>;

type GateFuture = Pin<Box<dyn Future<Output = GateResult> + Send>>;

/// Where a turn's LLM request came from: the connection it came on. Both
/// addresses are known for the TCP listener in the sandbox, neither for the
/// host-side door or an in-memory stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TurnContext {
    /// The client's address: the agent socket's own.
    pub peer: Option<SocketAddr>,
    /// The listener's address the client connected to.
    pub local: Option<SocketAddr>,
    /// It came through the host-side door: from an agent outside the
    /// sandbox, which no restore brings back. Its exchanges are neither
    /// journaled nor answered from the journal.
    pub outside: bool,
}

/// Resolves when what a turn boundary started is durable (or failed, with why),
/// telling the seq of the checkpoint it recorded.
pub struct Gate {
    fut: GateFuture,
    promote: Option<Box<dyn FnOnce() + Send>>,
}

impl Gate {
    /// A gate on `f`, which must already be running (spawned) so that it
    /// overlaps with the upstream request.
    pub fn new(f: impl Future<Output = GateResult> + Send + 'static) -> Gate {
        Gate {
            fut: Box::pin(f),
            promote: None,
        }
    }

    /// A gate that is open at once, with no checkpoint recorded.
    pub fn open() -> Gate {
        Gate::new(async { Ok(None) })
    }

    /// Calls `promote` when the LLM's answer is there and the gate is still
    /// closed: from then on the agent is waiting on the checkpoint, so the
    /// caller may want to move it ahead of background work. Called at most
    /// once, and not at all when the gate opened before the answer came.
    pub fn on_promote(mut self, promote: impl FnOnce() + Send + 'static) -> Gate {
        self.promote = Some(Box::new(promote));
        self
    }

    /// Waits for the gate once the answer's head is there: promotes it if it
    /// is still closed, and says how long the answer was held.
    pub(crate) async fn hold(mut self) -> (GateResult, Duration) {
        let start = Instant::now();
        // One poll tells whether the gate is already open, without waiting.
        let first = std::future::poll_fn(|cx| Poll::Ready(self.fut.as_mut().poll(cx))).await;
        let result = match first {
            Poll::Ready(r) => r,
            Poll::Pending => {
                if let Some(promote) = self.promote.take() {
                    promote();
                }
                self.fut.await
            }
        };
        (result, start.elapsed())
    }
}

/// What a turn boundary does: start the turn's checkpoint, and say when it is
/// durable. Called once per LLM request, before the request goes upstream.
pub trait Boundary: Send + Sync + 'static {
    /// The agent's turn ended, its request having come on `ctx`'s connection:
    /// start the checkpoint and return its gate.
    fn turn(&self, ctx: &TurnContext) -> Gate;

    /// How long the LLM's answer was held waiting for the gate (zero when the
    /// gate was open on the answer's arrival): the latency the checkpoint
    /// added to the agent. Called once per turn that got an answer head from
    /// upstream, after the gate resolved (either way).
    fn gated(&self, _held: Duration) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn an_open_gate_is_not_promoted() {
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        let (r, held) = Gate::open()
            .on_promote(move || {
                m.fetch_add(1, Ordering::SeqCst);
            })
            .hold()
            .await;
        assert_eq!(r, Ok(None));
        assert_eq!(n.load(Ordering::SeqCst), 0);
        assert!(held < Duration::from_millis(50));
    }

    #[tokio::test]
    async fn a_closed_gate_is_promoted_once() {
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let gate = Gate::new(async move { rx.await.map(|()| Some(7)).map_err(|e| e.to_string()) })
            .on_promote(move || {
                m.fetch_add(1, Ordering::SeqCst);
            });
        let held = tokio::spawn(gate.hold());
        tokio::time::sleep(Duration::from_millis(30)).await;
        tx.send(()).unwrap();
        let (r, held) = held.await.unwrap();
        assert_eq!(r, Ok(Some(7)), "the gate tells the checkpoint's seq");
        assert_eq!(n.load(Ordering::SeqCst), 1);
        assert!(held >= Duration::from_millis(20), "held {held:?}");
    }
}
