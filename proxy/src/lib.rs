//! Crab's turn proxy: an HTTP reverse proxy between an agent and its LLM API.
//!
//! Each request to an LLM endpoint (OpenAI's `/v1/chat/completions` and
//! `/v1/responses`, Anthropic's `/v1/messages`) is a turn boundary: the proxy
//! tells its [`Boundary`] (which starts the turn's checkpoint) and sends the
//! request upstream at once, so the checkpoint runs while the LLM thinks. When
//! the answer arrives before the checkpoint is durable, the answer is held until
//! it is, then streamed to the agent chunk by chunk. Every other path passes
//! through untouched, except the reserved prefix `/.crab/`: there the agent
//! reaches its own sandbox (checkpoint, rollback, fork; REST and MCP) through
//! the caller's [`Sandbox`]. With a [`Journal`], each exchange is kept on disk,
//! and a restored agent's repeated requests are answered from it.
//!
//! The listening socket is made inside the container's network namespace (by
//! the caller); the proxy itself runs on the host and connects
//! upstream from there. One [`Proxy`] can serve several such listeners (a
//! rolled-back container lives in a new namespace). This crate knows HTTP
//! only: what a turn boundary or a sandbox call does is the caller's.

mod ratelimit;

mod api;
mod door;
mod journal;
mod limits;
pub mod logfile;
mod mcp;
mod server;
pub mod target;
mod turn;
mod upstream;

pub use api::Sandbox;
pub use journal::{Journal, REPLAY_PLAN};
pub use limits::Limits;
pub use ratelimit::LogLimit;
pub use server::Proxy;
pub use turn::{Boundary, Gate, GateResult, TurnContext};
pub use upstream::Upstream;

/// What can go wrong setting the proxy up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The upstream address is not usable.
    #[error("bad upstream {0:?}: expected http://host:port or https://host[:port]")]
    BadUpstream(String),
    /// A journal file is not usable.
    #[error("journal {path}: {reason}")]
    Journal {
        /// The file.
        path: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// The CA file for an HTTPS upstream is not usable.
    #[error("CA file {path}: {reason}")]
    CaFile {
        /// The file given.
        path: String,
        /// Why it cannot be used.
        reason: String,
    },
}

/// Result of this crate's calls.
pub type Result<T> = std::result::Result<T, Error>;

/// Whether `path` is an LLM API call that ends an agent's turn.
pub fn is_turn_boundary(method: &http::Method, path: &str) -> bool {
    method == http::Method::POST
        && matches!(
            path.split('?').next().unwrap_or(""),
            "/v1/chat/completions" | "/v1/responses" | "/v1/messages"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_llm_posts_are_turn_boundaries() {
        assert!(is_turn_boundary(
            &http::Method::POST,
            "/v1/chat/completions"
        ));
        assert!(is_turn_boundary(&http::Method::POST, "/v1/messages?beta=1"));
        assert!(is_turn_boundary(&http::Method::POST, "/v1/responses"));
        assert!(!is_turn_boundary(&http::Method::GET, "/v1/models"));
        assert!(!is_turn_boundary(&http::Method::POST, "/v1/embeddings"));
    }
}
