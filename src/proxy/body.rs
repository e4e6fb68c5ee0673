//! The response body relayed to the client: upstream frames passed through one by one.
//!
//! Invariants:
//! - No buffering: each upstream frame is yielded as soon as it arrives (SSE stays live).
//! - The first data frame marks time to first token and advances the load guard; the end of the
//!   body, an upstream error, an idle timeout or the client going away (the body is dropped)
//!   finishes the request exactly once: load released, metrics recorded.
//! - Dropping this body drops the upstream response, which closes the upstream connection if it was
//!   mid-body — that is how a client disconnect stops the engine's generation.
//! - A successful streamed answer (SSE) that the instance breaks off (a body error or the idle
//!   timeout) ends with an SSE error event, `data: {"error": {...}}`, after a blank line that closes
//!   any event the break cut; then the body ends cleanly. OpenAI clients raise that as an API
//!   error instead of hanging on, or guessing at, a truncated stream. Any other answer is cut.

use crate::app::AppState;
use crate::client::body::UpstreamBody;
use crate::fleet::Instance;
use crate::metrics;
use crate::routing::Learning;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use kvgate_core::load::LoadGuard;
use kvgate_core::router::BatchSample;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Boxed error type of the relayed body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Error yielded when the upstream goes silent for longer than the idle timeout.
#[derive(Debug, thiserror::Error)]
#[error("upstream idle for more than {0:?}")]
pub struct IdleTimeout(Duration);

/// How a relayed response ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Complete,
    UpstreamError,
    Idle,
    ClientGone,
}

/// Per-request accounting carried by the body; finishes on end or drop.
pub struct Tracker {
    state: AppState,
    /// The answering instance, held even if it is removed from the fleet meanwhile.
    instance: Arc<Instance>,
    route: usize,
    guard: Option<LoadGuard>,
    /// Arrival: user-felt times (metrics) count from here, admission queueing included.
    started: Instant,
    /// Dispatch of the answering attempt: what the instance itself took counts from here
    /// (learned rates, the instance's average).
    sent: Instant,
    /// The pool whose admission place this response holds (released when it ends).
    admitted: Option<usize>,
    stream: bool,
    learning: Learning,
    status: u16,
    first_seen: bool,
    finished: bool,
    /// A stream's first data: when, and the decode batch it joined.
    first: Option<(Instant, BatchSample)>,
    /// SSE events seen in a stream (one per token for vLLM's and SGLang's default stream
    /// interval; a usage chunk makes it over-count by one).
    events: Events,
    /// The tenant whose token budget this response's output is charged to, if limited.
    rate_tenant: Option<(kvgate_core::ratelimit::TenantKey, std::sync::Arc<str>)>,
    /// Output tokens charged so far.
    charged: u64,
    /// The answer's own `completion_tokens`, when it reports one (charged at the end, if more).
    usage: crate::proxy::usage::CompletionTokens,
    /// Whether its times teach the learned rates: not when another instance than the one the
    /// decision predicted for answered (its dispatch-time load and cache match are not known).
    learn: bool,
}

impl Tracker {
    /// Starts accounting for a response from `instance` (in-flight gauge goes up now).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        state: AppState,
        instance: Arc<Instance>,
        route: usize,
        guard: LoadGuard,
        started: Instant,
        stream: bool,
        learning: Learning,
        status: u16,
    ) -> Self {
        Self {
            state,
            instance,
            route,
            guard: Some(guard),
            started,
            sent: started,
            admitted: None,
            stream,
            learning,
            status,
            first_seen: false,
            finished: false,
            first: None,
            events: Events::default(),
            rate_tenant: None,
            charged: 0,
            usage: Default::default(),
            learn: true,
        }
    }

    /// Its times are not to teach the learned rates (see the field).
    pub fn without_learning(&mut self) {
        self.learn = false;
    }

    /// A data frame of the response passed on to the client: the first marks time to first
    /// token; each is charged to the tenant's budget and counted for the decode step model.
    /// The one observation step of both doors (the relayed body here, the endpoint picker's
    /// response body messages).
    pub fn observe(&mut self, data: &[u8]) {
        if !self.first_seen {
            self.on_first_data();
        }
        self.on_data(data);
    }

    /// The response ended complete: load released, learned rates and metrics recorded (once).
    pub fn complete(&mut self) {
        self.finish(End::Complete);
    }

    /// The response broke off upstream (once; a later end changes nothing).
    pub fn broke(&mut self) {
        self.finish(End::UpstreamError);
    }

    /// Charges this response's output tokens to `tenant`'s rate limit as they stream.
    pub fn charge_to(
        &mut self,
        tenant: kvgate_core::ratelimit::TenantKey,
        label: std::sync::Arc<str>,
    ) {
        self.rate_tenant = Some((tenant, label));
    }

    /// A data frame of the response passed: charges what it carried to the tenant's budget.
    fn on_data(&mut self, data: &[u8]) {
        if self.stream {
            self.events.feed(data);
        }
        let Some((tenant, label)) = &self.rate_tenant else {
            return;
        };
        self.usage.feed(data);
        if self.stream {
            let seen = u64::from(self.events.tokens());
            if seen > self.charged {
                self.state
                    .rate_limits
                    .charge_output(*tenant, label, seen - self.charged);
                self.charged = seen;
            }
        }
    }

    /// The end: what the answer reported beyond what was counted is charged too.
    fn settle_charge(&mut self) {
        let (Some((tenant, label)), Some(reported)) = (&self.rate_tenant, self.usage.found())
        else {
            return;
        };
        if reported > self.charged {
            self.state
                .rate_limits
                .charge_output(*tenant, label, reported - self.charged);
            self.charged = reported;
        }
    }

    /// The answering attempt was sent at `sent`; `admitted`: the pool whose admission place the
    /// response holds.
    pub fn dispatched(&mut self, sent: Instant, admitted: Option<usize>) {
        self.sent = sent;
        self.admitted = admitted;
    }

    fn on_first_data(&mut self) {
        self.first_seen = true;
        if let Some(g) = self.guard.as_mut() {
            g.first_token();
        }
        if self.stream {
            let inst = &self.instance;
            inst.metrics.ttft(self.started.elapsed().as_secs_f64());
            // The instance's own share: from dispatch, without admission queueing or earlier
            // attempts.
            let ms = self.sent.elapsed().as_secs_f64() * 1e3;
            inst.ttft.observe(ms);
            if self.learn {
                let batch = self.state.routing.observe_ttft(inst, &self.learning, ms);
                self.first = Some((Instant::now(), batch));
            }
        }
    }

    /// A complete stream teaches the decode step model: its events after the first, over the
    /// time since the first.
    fn observe_decode(&self) {
        let Some((at, batch)) = self.first else {
            return;
        };
        let tokens = self.events.tokens();
        let ms = at.elapsed().as_secs_f64() * 1e3;
        self.state
            .routing
            .observe_decode(&self.instance, &self.learning, tokens, ms, batch);
    }

    fn finish(&mut self, end: End) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.settle_charge();
        if end == End::Complete && self.stream {
            // Sampled before the guard is dropped: the batch still includes this sequence.
            self.observe_decode();
        }
        drop(self.guard.take());
        // After the load is dropped: the next waiter is judged against it.
        if let Some(pool) = self.admitted.take() {
            self.state.admission.release(pool);
        }
        let inst = &self.instance;
        let class = match end {
            End::ClientGone => metrics::CANCELLED,
            _ => metrics::class_index(self.status),
        };
        match end {
            End::UpstreamError => metrics::record_upstream_error(&inst.name, "body"),
            End::Idle => metrics::record_upstream_error(&inst.name, "idle_timeout"),
            End::ClientGone => {
                tracing::debug!(instance = %inst.name, "client went away; upstream request dropped")
            }
            End::Complete => {}
        }
        inst.metrics
            .finish(self.route, class, self.started.elapsed().as_secs_f64());
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.finish(End::ClientGone);
    }
}

pin_project! {
    /// The relayed body.
    pub struct ProxyBody {
        #[pin]
        inner: UpstreamBody,
        // Armed the first time the upstream makes us wait: most non-streaming answers arrive
        // whole with their head and never need a timer.
        idle: Option<Pin<Box<tokio::time::Sleep>>>,
        idle_after: Duration,
        tracker: Tracker,
        // Whether a break is reported as an SSE error event; once it was, the body has ended.
        sse: bool,
        ended: bool,
    }
}

impl ProxyBody {
    /// Relays `inner`, failing if it stays silent longer than `idle_after`.
    pub fn new(inner: UpstreamBody, idle_after: Duration, mut tracker: Tracker) -> Self {
        if inner.is_end_stream() {
            tracker.finish(End::Complete);
        }
        let sse = tracker.stream && (200..300).contains(&tracker.status);
        Self {
            inner,
            idle: None,
            idle_after,
            tracker,
            sse,
            ended: false,
        }
    }
}

/// The SSE event closing a stream the instance broke off: a blank line first, so that an event the
/// break cut is closed before this one starts.
fn sse_error_event(message: &str) -> Bytes {
    let body = serde_json::json!({
        "error": {
            "message": message,
            "type": "upstream_error",
            "code": "upstream_stream_broken",
        }
    });
    Bytes::from(format!("\n\ndata: {body}\n\n"))
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let ended = this.inner.is_end_stream();
                if let Some(data) = frame.data_ref() {
                    this.tracker.observe(data);
                    // After the last frame there is nothing left to time (and re-arming a timer
                    // takes the timer driver's lock twice: to insert it and to drop it).
                    if !ended {
                        if let Some(idle) = this.idle.as_mut() {
                            idle.as_mut()
                                .reset(tokio::time::Instant::now() + *this.idle_after);
                        }
                    }
                }
                // With a known length the server stops polling after the last frame.
                if ended {
                    this.tracker.finish(End::Complete);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.tracker.finish(End::UpstreamError);
                if *this.sse {
                    *this.ended = true;
                    let msg = format!("the instance's stream broke off: {e}");
                    return Poll::Ready(Some(Ok(Frame::data(sse_error_event(&msg)))));
                }
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Ready(None) => {
                this.tracker.finish(End::Complete);
                Poll::Ready(None)
            }
            Poll::Pending => {
                let idle = this
                    .idle
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(*this.idle_after)));
                if idle.as_mut().poll(cx).is_ready() {
                    this.tracker.finish(End::Idle);
                    let e = IdleTimeout(*this.idle_after);
                    if *this.sse {
                        *this.ended = true;
                        let msg = format!("the instance's stream broke off: {e}");
                        return Poll::Ready(Some(Ok(Frame::data(sse_error_event(&msg)))));
                    }
                    return Poll::Ready(Some(Err(Box::new(e))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        // A stream that may end with an error event has no exact size.
        if self.sse {
            let mut h = SizeHint::new();
            h.set_lower(self.inner.size_hint().lower());
            return h;
        }
        self.inner.size_hint()
    }
}

pin_project! {
    /// The body of any response the gateway sends: a relayed upstream body, or one the gateway
    /// made (errors, admin pages). An enum rather than a boxed body, so relaying costs no dynamic
    /// dispatch.
    #[project = GatewayBodyProj]
    pub enum GatewayBody {
        /// Relayed from an instance.
        Relay {
            #[pin]
            body: ProxyBody,
        },
        /// Made by the gateway.
        Plain {
            body: axum::body::Body,
        },
    }
}

impl GatewayBody {
    /// A body made by the gateway.
    pub fn plain(body: axum::body::Body) -> Self {
        GatewayBody::Plain { body }
    }
}

impl Body for GatewayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project() {
            GatewayBodyProj::Relay { body } => body.poll_frame(cx),
            GatewayBodyProj::Plain { body } => Pin::new(body).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            GatewayBody::Relay { body } => body.is_end_stream(),
            GatewayBody::Plain { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            GatewayBody::Relay { body } => body.size_hint(),
            GatewayBody::Plain { body } => body.size_hint(),
        }
    }
}

/// Counts SSE events in a stream's bytes as they pass: each event starts with `data:` at the
/// start of a line, and `data: [DONE]` is not an event. Frames may split anywhere, so the scan is
/// a byte-at-a-time state machine carried across frames; nothing is buffered.
#[derive(Clone, Copy, Debug, Default)]
pub struct Events {
    /// Events seen, `[DONE]` excluded.
    count: u32,
    /// Where the scan is.
    at: Scan,
    /// Whether any byte was seen (the stream's first line starts without a newline).
    started: bool,
}

/// The scanner's position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scan {
    /// Matched this many bytes of `\ndata:`.
    Mark(u8),
    /// After `data:`: whether its optional space was skipped, and how much of `[DONE]` matched.
    Payload { spaced: bool, done: u8 },
}

impl Default for Scan {
    fn default() -> Self {
        Scan::Mark(0)
    }
}

impl Events {
    const MARK: &'static [u8] = b"\ndata:";
    const DONE: &'static [u8] = b"[DONE]";

    /// Scans the next bytes of the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        if !self.started && !bytes.is_empty() {
            self.started = true;
            self.at = Scan::Mark(1);
        }
        for &b in bytes {
            self.at = match self.at {
                Scan::Mark(m) => {
                    let matched = usize::from(m);
                    if b == Self::MARK[matched] {
                        if matched + 1 == Self::MARK.len() {
                            Scan::Payload {
                                spaced: false,
                                done: 0,
                            }
                        } else {
                            Scan::Mark(matched as u8 + 1)
                        }
                    } else {
                        Self::restart(b)
                    }
                }
                Scan::Payload { spaced, done } => {
                    if b == b' ' && !spaced && done == 0 {
                        Scan::Payload { spaced: true, done }
                    } else if b == Self::DONE[usize::from(done)] {
                        if usize::from(done) + 1 == Self::DONE.len() {
                            Scan::Mark(0)
                        } else {
                            Scan::Payload {
                                spaced,
                                done: done + 1,
                            }
                        }
                    } else {
                        self.count = self.count.saturating_add(1);
                        Self::restart(b)
                    }
                }
            };
        }
    }

    /// The scan state after a byte that does not continue a match.
    fn restart(b: u8) -> Scan {
        if b == b'\n' {
            Scan::Mark(1)
        } else {
            Scan::Mark(0)
        }
    }

    /// Output tokens the stream carried, as counted.
    pub fn tokens(&self) -> u32 {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::Events;

    #[test]
    fn events_are_counted_across_any_frame_split() {
        let stream =
            b"data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata:{\"b\":\"data: x\"}\n\ndata: [DONE]\n\n";
        for split in 0..stream.len() {
            let mut e = Events::default();
            e.feed(&stream[..split]);
            e.feed(&stream[split..]);
            assert_eq!(e.tokens(), 3, "split at {split}");
        }
        let mut bytewise = Events::default();
        for b in stream.iter() {
            bytewise.feed(std::slice::from_ref(b));
        }
        assert_eq!(bytewise.tokens(), 3);
        let mut none = Events::default();
        none.feed(b": comment\n\nevent: x\n");
        assert_eq!(none.tokens(), 0);
    }
}
