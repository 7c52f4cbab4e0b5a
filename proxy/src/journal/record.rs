//! Recording an exchange: the answer's body is copied to `.<S>.partial` chunk
//! by chunk, each chunk written before the agent gets it, and made
//! `<S>.exchange` (fsynced, renamed, the directory fsynced) once it has ended.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use hyper::body::{Body as _, Frame, Incoming};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

use super::{Header, Journal, VERSION};
use crate::server::{Body, BoxError};

/// How long the answer may wait for its request's digest: the request body has
/// normally ended long before the answer comes.
const DIGEST_WAIT: Duration = Duration::from_secs(5);

/// What is known of an exchange when its answer is released to the agent.
pub(crate) struct Recording {
    /// The seq of the turn's checkpoint.
    pub seq: u64,
    /// The request's path (without query).
    pub path: String,
    pub status: StatusCode,
    pub content_type: String,
    /// The request's digest, once its body has ended.
    pub digest: oneshot::Receiver<String>,
}

/// A body fed by a task, frame by frame.
pub(crate) struct ChannelBody(pub mpsc::Receiver<Result<Frame<Bytes>, BoxError>>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.0.poll_recv(cx)
    }
}

/// An exchange being written.
struct Partial {
    file: tokio::fs::File,
    tmp: PathBuf,
    seq: u64,
}

impl Journal {
    /// The agent's view of `body`, recorded on the way as `rec`'s exchange.
    pub(crate) fn record(self: &Arc<Self>, rec: Recording, body: Incoming) -> Body {
        // One frame in flight: the bounds on what a slow agent makes the
        // proxy hold stay as they were.
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(self.clone().copy(rec, body, tx));
        BodyExt::boxed(ChannelBody(rx))
    }

    async fn copy(
        self: Arc<Self>,
        rec: Recording,
        mut body: Incoming,
        tx: mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
    ) {
        let seq = rec.seq;
        let mut out = self.start(rec).await;
        let mut settling = None;
        loop {
            // An agent that hangs up is noticed at once, not at the next
            // chunk (an SSE stream may idle for long).
            let next = tokio::select! {
                next = body.frame() => next,
                () = tx.closed() => {
                    discard(out.take(), "the agent dropped the answer").await;
                    return;
                }
            };
            let frame = match next {
                None => break,
                Some(Err(e)) => {
                    discard(out.take(), "the upstream's answer failed").await;
                    let _ = tx.send(Err(e.into())).await;
                    return;
                }
                Some(Ok(f)) => f,
            };
            if let (Some(data), Some(p)) = (frame.data_ref(), out.as_mut()) {
                let written = async {
                    p.file.write_all(data).await?;
                    p.file.flush().await
                };
                if let Err(e) = written.await {
                    tracing::warn!(seq, error = %e, "journal: cannot write the answer; not journaled");
                    discard(out.take(), "").await;
                }
            }
            // With a Content-Length, this frame completes the agent's answer:
            // count it before the agent can send its next request.
            if out.is_some() && body.is_end_stream() && settling.is_none() {
                settling = Some(self.settling());
            }
            if tx.send(Ok(frame)).await.is_err() {
                discard(out.take(), "the agent dropped the answer").await;
                return;
            }
        }
        let Some(p) = out else { return };
        let _settling = settling.unwrap_or_else(|| self.settling());
        // A chunked answer ends for the agent only now, after it is counted.
        drop(tx);
        if let Err(e) = self.commit(p).await {
            tracing::warn!(seq, error = %e, "journal: cannot make the exchange durable");
        }
    }

    /// Opens the partial file and writes the header, once the request's digest
    /// is known; none (the exchange is not journaled) if it cannot be.
    async fn start(&self, rec: Recording) -> Option<Partial> {
        let seq = rec.seq;
        let digest = match tokio::time::timeout(DIGEST_WAIT, rec.digest).await {
            Ok(Ok(d)) => d,
            _ => {
                tracing::warn!(seq, "journal: the request body did not end; not journaled");
                return None;
            }
        };
        let header = Header {
            version: VERSION,
            digest,
            path: rec.path,
            status: rec.status.as_u16(),
            content_type: rec.content_type,
        };
        let tmp = self.dir.join(format!(".{seq}.partial"));
        let opened = async {
            let mut line = serde_json::to_vec(&header).map_err(std::io::Error::other)?;
            line.push(b'\n');
            let mut file = tokio::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .await?;
            file.write_all(&line).await?;
            std::io::Result::Ok(file)
        };
        match opened.await {
            Ok(file) => Some(Partial { file, tmp, seq }),
            Err(e) => {
                tracing::warn!(seq, error = %e, path = %tmp.display(), "journal: cannot start the exchange; not journaled");
                let _ = tokio::fs::remove_file(&tmp).await;
                None
            }
        }
    }

    /// Makes a whole exchange durable under its final name.
    async fn commit(&self, mut p: Partial) -> std::io::Result<()> {
        p.file.flush().await?;
        p.file.sync_all().await?;
        drop(p.file);
        let done = self.exchange_file(p.seq);
        if let Err(e) = tokio::fs::rename(&p.tmp, &done).await {
            let _ = tokio::fs::remove_file(&p.tmp).await;
            return Err(e);
        }
        // The rename is durable only once the directory is.
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || std::fs::File::open(dir)?.sync_all())
            .await
            .map_err(std::io::Error::other)??;
        tracing::debug!(seq = p.seq, "journal: exchange recorded");
        Ok(())
    }
}

/// Drops an exchange that did not reach its end: no half answer is replayed.
async fn discard(p: Option<Partial>, why: &str) {
    let Some(p) = p else { return };
    drop(p.file);
    if !why.is_empty() {
        tracing::info!(seq = p.seq, %why, "journal: exchange not recorded");
    }
    let _ = tokio::fs::remove_file(&p.tmp).await;
}
