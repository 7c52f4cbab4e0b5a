//! Where connections come from: the listener in the sandbox's network namespace
//! (TCP), and the host-side door, a unix socket per sandbox that orchestrators on
//! the host (an agent acting on the sandbox from outside) reach without entering
//! the sandbox's namespace. Both are served by the same [`Proxy`]: the same turns,
//! the same agent API (token and all), the same connection cap. Who may connect to
//! the host-side door is the caller's check ([`Proxy::serve_unix`]).

use std::future::Future;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::turn::TurnContext;
use crate::{Proxy, Result};

/// A listener the proxy serves.
pub(crate) trait Door: Send + 'static {
    /// One accepted connection.
    type Conn: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;

    /// The next connection, and where it came from (for TCP: the peer's and
    /// the listener's addresses, which name the agent's socket to the shim).
    fn accept(&self) -> impl Future<Output = std::io::Result<(Self::Conn, TurnContext)>> + Send;

    /// Writes `answer` without waiting (the socket's buffer takes it, or the
    /// client gets a reset); the connection is closed when dropped.
    fn answer(conn: &Self::Conn, answer: &[u8]);
}

impl Door for TcpListener {
    type Conn = TcpStream;

    async fn accept(&self) -> std::io::Result<(TcpStream, TurnContext)> {
        let (stream, peer) = TcpListener::accept(self).await?;
        // Answers stream back chunk by chunk: no Nagle delay between them.
        let _ = stream.set_nodelay(true);
        let ctx = TurnContext {
            peer: Some(peer),
            local: stream.local_addr().ok(),
            outside: false,
        };
        Ok((stream, ctx))
    }

    fn answer(conn: &TcpStream, answer: &[u8]) {
        let _ = conn.try_write(answer);
    }
}

impl Door for UnixListener {
    type Conn = UnixStream;

    async fn accept(&self) -> std::io::Result<(UnixStream, TurnContext)> {
        // A host-side caller is no agent socket in the sandbox: no addresses.
        let ctx = TurnContext {
            outside: true,
            ..TurnContext::default()
        };
        Ok((UnixListener::accept(self).await?.0, ctx))
    }

    fn answer(conn: &UnixStream, answer: &[u8]) {
        let _ = conn.try_write(answer);
    }
}

impl Proxy {
    /// Serves the host-side door `listener` until it is unusable. `admit` decides
    /// from the connection (its peer's credentials) whether the caller may use it;
    /// one it refuses gets a 403 and is closed.
    pub async fn serve_unix(
        self: Arc<Self>,
        listener: UnixListener,
        admit: impl Fn(&UnixStream) -> std::result::Result<(), String> + Send + 'static,
    ) -> Result<()> {
        self.serve_door(listener, admit).await
    }
}
