//! The limits on a connection hyper serves: a wrapper of its socket that enforces the idle,
//! header and write deadlines, and a wrapper of its service that tells the socket when requests
//! begin and end.
//!
//! Why in the IO: hyper's own `header_read_timeout` runs from the end of the previous answer, so
//! it would cut idle keep-alive connections at the header timeout; here, as on kvgate's own
//! loop, the idle timeout runs until a request's first byte and the header timeout from there.
//! hyper's own timer is kept as a backstop at their sum.
//!
//! Invariants:
//! - A wait for a request begins when no request is open and one ended since the last wait (or
//!   at hand-off); it ends when a request is dispatched. Only reads during a wait have a
//!   deadline: while a request is open its body has the handler's body timeout and its answer
//!   may take as long as the upstream does.
//! - HTTP/2: only the idle timeout applies (any frame may arrive between streams, and a head is
//!   one frame); the wait is for the next stream.
//! - A read or write that fails a deadline returns `TimedOut`, which ends hyper's connection.
//! - HTTP/2: a client that stops reading shuts its window rather than stalling writes, so each
//!   answer carries the write timeout itself ([`Counted::stall`]): not polled again within it
//!   after a frame, the answer is dropped (its upstream cancelled) and the stream reset.
//! - The connection's place under the cap is idle during a wait before any byte of a head (on
//!   HTTP/2: the whole wait), busy otherwise. Evicted while idle, reads return end of file, which
//!   ends hyper's connection as a client's close would. Evicted as a request's first bytes
//!   arrive, the request is served and the connection ends at its next wait: a request is never
//!   cut by an eviction once hyper has read a byte of it.

use super::ConnectionPermit;
use crate::metrics::{self, CloseReason};
use crate::proxy::body::GatewayBody;
use crate::proxy::service::GatewayService;
use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use pin_project_lite::pin_project;
use std::convert::Infallible;
use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Requests of one connection: dispatched and finished (answer body done or dropped).
#[derive(Default)]
pub struct Requests {
    started: AtomicUsize,
    ended: AtomicUsize,
}

/// Counts a request open until dropped.
struct Open(Arc<Requests>);

impl Open {
    fn new(r: &Arc<Requests>) -> Self {
        r.started.fetch_add(1, Ordering::Relaxed);
        Open(r.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.ended.fetch_add(1, Ordering::Relaxed);
    }
}

/// The deadlines a [`Guarded`] enforces.
#[derive(Clone, Copy)]
pub struct Deadlines {
    /// Idle: wait start to first byte.
    pub idle: Duration,
    /// First byte to dispatch.
    pub header: Duration,
    /// Longest write stall.
    pub write: Duration,
}

/// A wait for the next request.
struct Wait {
    deadline: Instant,
    /// A byte of the head arrived (the deadline is the header one).
    begun: bool,
}

/// A connection's IO with the idle, header and write deadlines.
pub struct Guarded<T> {
    inner: T,
    requests: Arc<Requests>,
    limits: Deadlines,
    /// HTTP/2 with prior knowledge: no header deadline.
    h2: bool,
    /// `ended` when the current wait began.
    seen_ended: usize,
    wait: Option<Wait>,
    read_timer: Option<Pin<Box<Sleep>>>,
    write_timer: Option<Pin<Box<Sleep>>>,
    /// A write is pending since the write timer was set.
    stalled: bool,
    /// The connection's place under the cap.
    place: ConnectionPermit,
    /// The place was evicted: reads return end of file.
    evicted: bool,
}

impl<T> Guarded<T> {
    /// Guards `inner`, whose requests `requests` counts. `head_deadline`: the header deadline of
    /// a head already begun before the hand-off.
    pub fn new(
        inner: T,
        requests: Arc<Requests>,
        limits: Deadlines,
        h2: bool,
        head_deadline: Option<Instant>,
        place: ConnectionPermit,
    ) -> Self {
        Self {
            inner,
            requests,
            limits,
            h2,
            seen_ended: 0,
            wait: head_deadline.map(|deadline| Wait {
                deadline,
                begun: true,
            }),
            read_timer: None,
            write_timer: None,
            stalled: false,
            place,
            evicted: false,
        }
    }

    /// Updates the wait from the request counts.
    fn track(&mut self) {
        let started = self.requests.started.load(Ordering::Relaxed);
        let ended = self.requests.ended.load(Ordering::Relaxed);
        if started != ended {
            self.wait = None;
            // Evicted as this request arrived: it is served, and the connection closes at
            // its next wait (below).
            let _ = self.place.busy();
        } else if self.wait.is_none() || ended != self.seen_ended {
            self.seen_ended = ended;
            let now = Instant::now();
            self.wait = Some(Wait {
                deadline: now + self.limits.idle,
                begun: false,
            });
            if !self.place.idle(now, ended > 0) {
                self.evicted = true;
            }
        }
    }

    /// Whether the current wait is an idle one (no byte of a head yet, or HTTP/2).
    fn idle(&self) -> bool {
        self.wait.as_ref().is_some_and(|w| !w.begun)
    }

    /// A write returned `r`: a pending one starts or continues a stall.
    fn stall<R>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if r.is_ready() {
            self.stalled = false;
            return r;
        }
        let deadline = Instant::now() + self.limits.write;
        let timer = self
            .write_timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if !self.stalled {
            self.stalled = true;
            timer.as_mut().reset(deadline);
        }
        if timer.as_mut().poll(cx).is_ready() {
            metrics::record_connection_closed(CloseReason::WriteTimeout);
            return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.track();
        if this.evicted || (this.idle() && this.place.poll_evicted(cx).is_ready()) {
            this.evicted = true;
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if let Some(w) = this.wait.as_mut() {
                    if !w.begun && !this.h2 && buf.filled().len() > before {
                        w.begun = true;
                        w.deadline = Instant::now() + this.limits.header;
                        // Evicted as the byte arrived: the request is served, and the
                        // connection closes at its next wait.
                        let _ = this.place.busy();
                    }
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                let Some(w) = &this.wait else {
                    return Poll::Pending;
                };
                let deadline = w.deadline;
                let reason = if w.begun {
                    CloseReason::HeaderTimeout
                } else {
                    CloseReason::IdleTimeout
                };
                let timer = this
                    .read_timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                ready!(timer.as_mut().poll(cx));
                metrics::record_connection_closed(reason);
                Poll::Ready(Err(io::ErrorKind::TimedOut.into()))
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.stall(cx, r)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.stall(cx, r)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.stall(cx, r)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// [`GatewayService`] counting its requests for the connection's [`Guarded`] IO.
#[derive(Clone)]
pub struct Counted {
    /// The service.
    pub inner: GatewayService,
    /// The connection's requests.
    pub requests: Arc<Requests>,
    /// HTTP/2: the write timeout, enforced per answer (`Stall`). A client that stops reading
    /// an HTTP/2 stream closes its flow-control window instead of stalling the socket's writes,
    /// which [`Guarded`] would see.
    pub stall: Option<Duration>,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<CountedBody>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for Counted {
    type Response = Response<CountedBody>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, req: Request<Incoming>) -> Answer {
        let open = Open::new(&self.requests);
        let answer = self.inner.call(req);
        let stall = self.stall;
        Box::pin(async move {
            let resp = answer.await?;
            Ok(resp.map(|body| CountedBody {
                body: match stall {
                    None => Watched::Plain { body },
                    Some(limit) => Watched::Stall {
                        stall: Stall::new(body, limit),
                    },
                },
                _open: open,
            }))
        })
    }
}

pin_project! {
    /// An answer's body as hyper polls it.
    #[project = WatchedProj]
    enum Watched {
        Plain { #[pin] body: GatewayBody },
        Stall { stall: Stall },
    }
}

/// An HTTP/2 answer's body under the write timeout: hyper polls it for a frame only when the
/// stream has room in the client's flow-control window, so a frame handed to hyper and not
/// followed by another poll for the write timeout means the client stopped reading. A watchdog
/// task then drops the body (which cancels the upstream request, as a cut connection does on
/// HTTP/1.1) and counts a `write_timeout`; hyper's next poll, if any, gets an error and resets
/// the stream. A poll that finds no frame ready (the upstream is slow) is not a stall.
struct Stall {
    shared: Arc<StallState>,
    watchdog: tokio::task::AbortHandle,
}

struct StallState {
    body: parking_lot::Mutex<Slot>,
    /// When a frame was last handed to hyper, if hyper has not polled since.
    handed: parking_lot::Mutex<Option<Instant>>,
    /// Tells the watchdog a frame was handed.
    handed_one: tokio::sync::Notify,
}

/// Where a watched body stands.
enum Slot {
    Live(Pin<Box<GatewayBody>>),
    /// It ended (or failed) as hyper polled it.
    Ended,
    /// The watchdog dropped it.
    Cut,
}

impl Stall {
    fn new(body: GatewayBody, limit: Duration) -> Self {
        let shared = Arc::new(StallState {
            body: parking_lot::Mutex::new(Slot::Live(Box::pin(body))),
            handed: parking_lot::Mutex::new(None),
            handed_one: tokio::sync::Notify::new(),
        });
        let s = shared.clone();
        let watchdog = tokio::spawn(async move {
            loop {
                let since = *s.handed.lock();
                let Some(at) = since else {
                    s.handed_one.notified().await;
                    continue;
                };
                tokio::time::sleep_until(at + limit).await;
                if *s.handed.lock() != Some(at) {
                    continue;
                }
                let cut = std::mem::replace(&mut *s.body.lock(), Slot::Cut);
                if let Slot::Live(body) = cut {
                    metrics::record_connection_closed(CloseReason::WriteTimeout);
                    drop(body);
                }
                return;
            }
        })
        .abort_handle();
        Self { shared, watchdog }
    }

    fn poll_frame(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, crate::proxy::body::BoxError>>> {
        *self.shared.handed.lock() = None;
        let mut slot = self.shared.body.lock();
        let body = match &mut *slot {
            Slot::Live(b) => b,
            Slot::Ended => return Poll::Ready(None),
            Slot::Cut => {
                return Poll::Ready(Some(Err(io::Error::from(io::ErrorKind::TimedOut).into())))
            }
        };
        let r = body.as_mut().poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(_))) => {
                *self.shared.handed.lock() = Some(Instant::now());
                self.shared.handed_one.notify_one();
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                *slot = Slot::Ended;
                self.watchdog.abort();
            }
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        match &*self.shared.body.lock() {
            Slot::Live(b) => b.is_end_stream(),
            Slot::Ended => true,
            // Not a clean end: hyper must poll, and get the error.
            Slot::Cut => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &*self.shared.body.lock() {
            Slot::Live(b) => b.size_hint(),
            Slot::Ended => SizeHint::with_exact(0),
            Slot::Cut => SizeHint::default(),
        }
    }
}

impl Drop for Stall {
    fn drop(&mut self) {
        self.watchdog.abort();
    }
}

pin_project! {
    /// An answer's body; its request stays open until it is done or dropped.
    pub struct CountedBody {
        #[pin]
        body: Watched,
        _open: Open,
    }
}

impl Body for CountedBody {
    type Data = Bytes;
    type Error = <GatewayBody as Body>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().body.project() {
            WatchedProj::Plain { body } => body.poll_frame(cx),
            WatchedProj::Stall { stall } => stall.poll_frame(cx),
        }
    }
    fn is_end_stream(&self) -> bool {
        match &self.body {
            Watched::Plain { body } => body.is_end_stream(),
            Watched::Stall { stall } => stall.is_end_stream(),
        }
    }
    fn size_hint(&self) -> SizeHint {
        match &self.body {
            Watched::Plain { body } => body.size_hint(),
            Watched::Stall { stall } => stall.size_hint(),
        }
    }
}
