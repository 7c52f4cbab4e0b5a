//! The turn-boundary side of the journal: a request is digested as it goes
//! upstream; during a replay it is read whole first, and answered from the
//! journal when it matches.

use std::sync::Arc;

use bytes::BytesMut;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Frame;
use tokio::io::{AsyncBufReadExt, AsyncReadExt};
use tokio::sync::{mpsc, oneshot};

use super::record::ChannelBody;
use super::{parse_header, Hasher, Journal, Lookup, MAX_HEADER};
use crate::limits::{Cut, GuardedBody, Limits};
use crate::server::{refusal, Body};

/// The size of the chunks a replayed answer is read in.
const CHUNK: usize = 16 << 10;

/// A turn-boundary request, readied by the journal.
// Returned once per request and taken apart at once: boxing the large
// variant would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Prepared {
    /// Answered (from the journal, or refused while reading it).
    Answer(Response<Body>),
    /// To be served live; the receiver gets the request's digest.
    Live(Request<GuardedBody>, oneshot::Receiver<String>),
}

/// Readies a turn-boundary request to `path`: during a replay it is read whole
/// and looked up; otherwise (or when it did not match) it goes live, digested.
pub(crate) async fn prepare(
    journal: &Arc<Journal>,
    req: Request<GuardedBody>,
    path: &str,
    cut: &Cut,
    limits: &Limits,
) -> Prepared {
    let (parts, body) = req.into_parts();
    let mut hasher = Hasher::new(path);
    if !journal.replaying() {
        let (body, digest) = body.digesting(hasher);
        return Prepared::Live(Request::from_parts(parts, body), digest);
    }
    // Within max_body, as the guarded body enforces.
    let bytes = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            let (status, msg) = cut
                .why(limits)
                .unwrap_or((StatusCode::BAD_REQUEST, e.to_string()));
            return Prepared::Answer(refusal(status, format!("crab proxy: {msg}\n")));
        }
    };
    hasher.update(&bytes);
    let digest = hasher.finish();
    if let Lookup::Replay(seq) = journal.lookup(&digest, path) {
        match journal.answer(seq).await {
            Ok(answer) => return Prepared::Answer(answer),
            // Live instead; the agent's next request will tell whether the
            // replay can go on.
            Err(e) => tracing::warn!(seq, %path, error = %e, "fast-forward: cannot replay; live"),
        }
    }
    let (tx, rx) = oneshot::channel();
    let _ = tx.send(digest);
    let body = GuardedBody::whole(bytes, limits, cut.clone());
    Prepared::Live(Request::from_parts(parts, body), rx)
}

impl Journal {
    /// The answer journaled as `seq`: its status, content type and body bytes.
    async fn answer(&self, seq: u64) -> Result<Response<Body>, String> {
        let path = self.exchange_file(seq);
        let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        let file = tokio::fs::File::open(&path).await.map_err(|e| err(&e))?;
        let mut reader = tokio::io::BufReader::new(file);
        let mut line = Vec::new();
        (&mut reader)
            .take(MAX_HEADER)
            .read_until(b'\n', &mut line)
            .await
            .map_err(|e| err(&e))?;
        let header = parse_header(&line).map_err(|e| err(&e))?;
        let status = StatusCode::from_u16(header.status).map_err(|e| err(&e))?;
        // Streamed from the file: an answer may be large.
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(async move {
            loop {
                let mut buf = BytesMut::with_capacity(CHUNK);
                match reader.read_buf(&mut buf).await {
                    Ok(0) => break,
                    Ok(_) => {
                        if tx.send(Ok(Frame::data(buf.freeze()))).await.is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e.into())).await;
                        break;
                    }
                }
            }
        });
        let mut response = Response::new(BodyExt::boxed(ChannelBody(rx)));
        *response.status_mut() = status;
        if let Ok(v) = header.content_type.parse() {
            if !header.content_type.is_empty() {
                response.headers_mut().insert(http::header::CONTENT_TYPE, v);
            }
        }
        tracing::debug!(seq, path = %header.path, "fast-forward: answer replayed");
        Ok(response)
    }
}
