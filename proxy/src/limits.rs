//! What one client of the proxy may hold: the sandbox is hostile, and the
//! proxy is a host process outside its cgroup, so every resource a client can
//! make it hold has a bound. Connections are capped, a request head and body
//! must arrive in time, and buffers are small; together they bound the proxy's
//! memory (see docs/proxy.md, "Limits").

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::sync::oneshot;

use crate::journal::Hasher;

/// The bounds of one proxy, over all its listeners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Client connections served at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// A request head (request line and headers) must be whole this long
    /// after the connection started waiting for it (also bounds an idle
    /// keep-alive connection).
    pub header_timeout: Duration,
    /// A request body that sends nothing for this long, while the proxy
    /// waits for it, is cut (408).
    pub body_timeout: Duration,
    /// The largest request body passed upstream (413 beyond).
    pub max_body: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 64,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_body: 32 << 20,
        }
    }
}

/// The most a client connection's read buffer holds, hence the largest
/// request head (hyper's least is 8 KiB; its default, about 400 KiB, is what
/// a slow client could make the proxy hold per connection before).
pub(crate) const CLIENT_BUF: usize = 16 << 10;
/// The largest request head; beyond it the client gets 431.
pub(crate) const MAX_HEAD: usize = 12 << 10;
/// The most an upstream connection's buffers hold each way.
pub(crate) const UPSTREAM_BUF: usize = 64 << 10;

/// Why a [`GuardedBody`] was cut, if it was.
#[derive(Clone, Default)]
pub(crate) struct Cut(Arc<AtomicU8>);

impl Cut {
    const TIMEOUT: u8 = 1;
    const TOO_LARGE: u8 = 2;

    fn set(&self, why: u8) {
        self.0.store(why, Ordering::Relaxed);
    }

    /// The status and message for the client, when its body was cut.
    pub(crate) fn why(&self, limits: &Limits) -> Option<(http::StatusCode, String)> {
        match self.0.load(Ordering::Relaxed) {
            Self::TIMEOUT => Some((
                http::StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body sent nothing for {:?}",
                    limits.body_timeout
                ),
            )),
            Self::TOO_LARGE => Some((
                http::StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is over {} bytes", limits.max_body),
            )),
            _ => None,
        }
    }
}

/// Why a guarded body failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    /// Nothing came for the body timeout.
    #[error("the request body sent nothing for {0:?}")]
    Timeout(Duration),
    /// More than the limit came.
    #[error("the request body is over {0} bytes")]
    TooLarge(u64),
    /// The client's connection failed.
    #[error("reading the request body: {0}")]
    Read(#[from] hyper::Error),
}

/// A client's request body with the body timeout and size limit applied. The
/// timer runs only while the proxy waits for the client (not while the
/// upstream is slow to take what was read). Optionally digested as it passes
/// (the journal's key for the exchange).
pub(crate) struct GuardedBody {
    inner: Source,
    timeout: Duration,
    left: u64,
    max: u64,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    cut: Cut,
    digest: Option<(Hasher, oneshot::Sender<String>)>,
    /// Told when the body has come whole (dropped unsent if it never does).
    end: Option<oneshot::Sender<()>>,
}

/// Where a guarded body's bytes come from.
enum Source {
    /// Still arriving from the client.
    Live(Incoming),
    /// Already read whole (and checked) for a replay that did not match; the
    /// bytes are taken on the first poll.
    Whole(Option<Bytes>),
}

impl GuardedBody {
    pub(crate) fn new(inner: Incoming, limits: &Limits, cut: Cut) -> GuardedBody {
        GuardedBody::from_source(Source::Live(inner), limits, cut)
    }

    /// A body already read whole (within the limits when it was read).
    pub(crate) fn whole(bytes: Bytes, limits: &Limits, cut: Cut) -> GuardedBody {
        GuardedBody::from_source(Source::Whole(Some(bytes)), limits, cut)
    }

    fn from_source(inner: Source, limits: &Limits, cut: Cut) -> GuardedBody {
        GuardedBody {
            inner,
            timeout: limits.body_timeout,
            left: limits.max_body,
            max: limits.max_body,
            sleep: None,
            cut,
            digest: None,
            end: None,
        }
    }

    /// Digests the body as it passes, starting from `hasher`; the receiver gets
    /// the hex digest once the body has ended, and nothing (an error) if it
    /// failed or was dropped before its end.
    pub(crate) fn digesting(mut self, hasher: Hasher) -> (GuardedBody, oneshot::Receiver<String>) {
        let (tx, rx) = oneshot::channel();
        self.digest = Some((hasher, tx));
        (self, rx)
    }

    /// Tells the receiver when the body has come whole from the client; the
    /// receiver gets an error instead if the body fails or is dropped first.
    pub(crate) fn ending(mut self) -> (GuardedBody, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        self.end = Some(tx);
        (self, rx)
    }

    /// The body's end: the digest, if one is asked for, is complete.
    fn ended(&mut self) {
        if let Some((hasher, tx)) = self.digest.take() {
            let _ = tx.send(hasher.finish());
        }
        if let Some(tx) = self.end.take() {
            let _ = tx.send(());
        }
    }
}

impl Body for GuardedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        let inner = match &mut this.inner {
            Source::Live(inner) => inner,
            Source::Whole(bytes) => {
                let frame = bytes.take().map(|b| Ok(Frame::data(b)));
                if frame.is_none() {
                    this.ended();
                }
                return Poll::Ready(frame);
            }
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.sleep = None;
                let frame = match frame {
                    Some(Ok(f)) => f,
                    Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                    None => {
                        this.ended();
                        return Poll::Ready(None);
                    }
                };
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    if n > this.left {
                        this.cut.set(Cut::TOO_LARGE);
                        return Poll::Ready(Some(Err(BodyError::TooLarge(this.max))));
                    }
                    this.left -= n;
                    if let Some((hasher, _)) = &mut this.digest {
                        hasher.update(data);
                    }
                }
                // With a Content-Length, hyper stops at its last byte and
                // never polls for the end.
                if matches!(&this.inner, Source::Live(inner) if inner.is_end_stream()) {
                    this.ended();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                let timeout = this.timeout;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if sleep.as_mut().poll(cx).is_ready() {
                    this.cut.set(Cut::TIMEOUT);
                    return Poll::Ready(Some(Err(BodyError::Timeout(timeout))));
                }
                Poll::Pending
            }
        }
    }

    // Not claiming the end early when digesting or telling the end: either
    // happens only when a poll sees the end.
    fn is_end_stream(&self) -> bool {
        self.digest.is_none()
            && self.end.is_none()
            && match &self.inner {
                Source::Live(inner) => inner.is_end_stream(),
                Source::Whole(bytes) => bytes.is_none(),
            }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Source::Live(inner) => inner.size_hint(),
            Source::Whole(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Source::Whole(None) => SizeHint::with_exact(0),
        }
    }
}
