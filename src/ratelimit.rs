//! Per-tenant rate limits at the gateway: the core's [`Limiter`] behind one lock, fed by the
//! keys file's tenants, the request path and (with gossip) the peers' usage.
//!
//! Invariants:
//! - Off (one atomic load per request) until some tenant, or the `[rate_limits]` defaults, has
//!   a limit; the keys file's tenants are re-read only when its generation changes.
//! - The lock is held only for bounded in-memory work: the limiter's map is bounded by the keys
//!   file's tenants plus `rate_limits.max_other_tenants` plus one.
//! - Without keys every request is the tenant [`ANONYMOUS`]: a client-chosen header must not be
//!   a way around a limit.
//! - What clients see follows OpenAI's headers: `x-ratelimit-{limit,remaining,reset}-{requests,
//!   tokens}`, the limit being the bucket's capacity and the reset the time until it is full.
//! - A request's prompt tokens are given back ([`Charge`]) when it fails while no engine holds
//!   it: refused by every engine it was tried on (connect error, 502/503, the attempts the
//!   router takes back), no usable instance, refused or timed out by admission control, or the
//!   client gone before it was dispatched. Once an engine holds it (sent, not refused) it stays
//!   charged whatever follows (timeouts, broken streams, the client leaving): the engine may be
//!   computing it. The request count is never given back.

use crate::auth::Keys;
use crate::clock::Clock;
use crate::config::RateLimitsConfig;
use crate::error::GatewayError;
use http::{HeaderName, HeaderValue};
use kvgate_core::ratelimit::{
    tenant_key, BucketStatus, Limiter, PeerLedger, RateStatus, TenantKey, Ticket,
};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The tenant of every request while auth is off.
pub const ANONYMOUS: &str = "anonymous";

/// Peers whose usage reports are remembered (gossip's own peer-table bound).
const MAX_PEERS: usize = 1024;

/// A request admitted under a limit: whom to charge its output to, and what to tell the client.
#[derive(Debug)]
pub struct Admitted {
    /// The tenant charged.
    pub tenant: TenantKey,
    /// Its metric label.
    pub label: Arc<str>,
    /// The buckets after the admission.
    pub status: RateStatus,
}

struct Inner {
    limiter: Limiter,
    peers: PeerLedger,
    /// Keys generation the configured tenants were taken from.
    generation: u64,
}

/// The gateway's rate limits.
pub struct RateLimits {
    cfg: RateLimitsConfig,
    keys: Arc<Keys>,
    clock: Clock,
    active: AtomicBool,
    generation: AtomicU64,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for RateLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimits")
            .field("active", &self.active.load(Ordering::Relaxed))
            .finish()
    }
}

impl RateLimits {
    /// Limits from `cfg` and `keys`' tenants.
    pub fn new(cfg: &RateLimitsConfig, keys: Arc<Keys>, clock: Clock) -> RateLimits {
        let now = clock.now_ms();
        let generation = keys.generation();
        let r = RateLimits {
            cfg: cfg.clone(),
            inner: Mutex::new(Inner {
                limiter: Limiter::new(cfg.defaults(), cfg.max_other_tenants, now),
                peers: PeerLedger::new(MAX_PEERS),
                generation,
            }),
            keys,
            clock,
            active: AtomicBool::new(false),
            generation: AtomicU64::new(generation),
        };
        r.reconfigure(&mut r.inner.lock(), now);
        r
    }

    fn reconfigure(&self, inner: &mut Inner, now: kvgate_core::Millis) {
        let defaults = self.cfg.defaults();
        let tenants = self.keys.tenants();
        inner.limiter.configure(
            tenants
                .iter()
                .map(|(name, l)| (tenant_key(name), l.or(defaults))),
            now,
        );
        self.active
            .store(inner.limiter.any_limit(), Ordering::Release);
    }

    /// Re-reads the keys' tenants if the keys file was reloaded.
    fn refresh(&self) {
        let g = self.keys.generation();
        if g == self.generation.load(Ordering::Acquire) {
            return;
        }
        let mut inner = self.inner.lock();
        if inner.generation != g {
            inner.generation = g;
            self.reconfigure(&mut inner, self.clock.now_ms());
        }
        self.generation.store(g, Ordering::Release);
    }

    /// Whether any limit applies.
    pub fn active(&self) -> bool {
        self.refresh();
        self.active.load(Ordering::Acquire)
    }

    /// Admits one request of `label` (the key's tenant, or [`ANONYMOUS`] without keys) with
    /// `prompt_tokens`, or refuses it (429). The [`Charge`] gives the prompt tokens back if it
    /// is dropped while no engine holds the request.
    pub fn admit(
        &self,
        label: &Arc<str>,
        prompt_tokens: u64,
    ) -> Result<(Option<Admitted>, Charge<'_>), GatewayError> {
        if !self.active() {
            return Ok((None, Charge::none()));
        }
        let tenant = tenant_key(label);
        let now = self.clock.now_ms();
        let result = self.inner.lock().limiter.admit(tenant, prompt_tokens, now);
        match result {
            Ok(Some(adm)) => {
                crate::metrics::record_tenant_tokens(label, "prompt", prompt_tokens);
                let charge = Charge {
                    held: Some((self, adm.ticket, label.clone())),
                    at_engine: false,
                };
                let admitted = Admitted {
                    tenant,
                    label: label.clone(),
                    status: adm.status,
                };
                Ok((Some(admitted), charge))
            }
            Ok(None) => Ok((None, Charge::none())),
            Err(d) => Err(GatewayError::RateLimited(Box::new(Refused {
                limit: d.limit.as_str(),
                retry_after_ms: d.retry_after_ms,
                status: d.status,
            }))),
        }
    }

    /// Gives back what `ticket` charged (see [`Charge`]).
    fn refund(&self, ticket: Ticket, label: &str) {
        let now = self.clock.now_ms();
        let back = self.inner.lock().limiter.refund(ticket, now);
        crate::metrics::record_tenant_tokens(label, "refunded", back);
    }

    /// Charges `tokens` of output to `tenant` (metric label `label`).
    pub fn charge_output(&self, tenant: TenantKey, label: &str, tokens: u64) {
        if tokens == 0 {
            return;
        }
        crate::metrics::record_tenant_tokens(label, "output", tokens);
        let now = self.clock.now_ms();
        self.inner.lock().limiter.charge_tokens(tenant, tokens, now);
    }

    /// This replica's cumulative usage per tenant, for its peers.
    pub fn usage(&self) -> Vec<(TenantKey, u64, u64)> {
        self.inner.lock().limiter.usage()
    }

    /// A peer's cumulative usage report: what is new in it is charged here.
    pub fn peer_report(&self, peer: u64, report: &[(TenantKey, u64, u64)]) {
        let now = self.clock.now_ms();
        let mut inner = self.inner.lock();
        let Inner { limiter, peers, .. } = &mut *inner;
        for (tenant, requests, tokens) in peers.observe(peer, report, now) {
            limiter.charge_peer(tenant, requests, tokens, now);
        }
    }

    /// A peer left: its reports are forgotten (a restart reports under a new id).
    pub fn peer_gone(&self, peer: u64) {
        self.inner.lock().peers.forget(peer);
    }

    /// `tenant`'s buckets now, if it is limited.
    pub fn status(&self, tenant: TenantKey) -> Option<RateStatus> {
        let now = self.clock.now_ms();
        self.inner.lock().limiter.status(tenant, now)
    }
}

/// An admitted request's prompt charge while it is being routed: given back when dropped
/// while no engine holds the request (see the module invariants). Mark every dispatch with
/// [`Charge::at_engine`]`(true)` before sending and every refused attempt with `false`.
#[derive(Debug)]
pub struct Charge<'a> {
    held: Option<(&'a RateLimits, Ticket, Arc<str>)>,
    at_engine: bool,
}

impl Charge<'_> {
    /// No charge (the tenant is not limited).
    pub fn none() -> Self {
        Charge {
            held: None,
            at_engine: false,
        }
    }

    /// Whether an engine now holds the request: sent to it (`true`), or refused by it and not
    /// (yet) sent elsewhere (`false`).
    pub fn at_engine(&mut self, yes: bool) {
        self.at_engine = yes;
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        if self.at_engine {
            return;
        }
        if let Some((limits, ticket, label)) = self.held.take() {
            limits.refund(ticket, &label);
        }
    }
}

/// A request over its tenant's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    /// `requests` or `tokens`: the limit with the longest wait.
    pub limit: &'static str,
    /// Milliseconds until it would be admitted.
    pub retry_after_ms: u64,
    /// The tenant's buckets.
    pub status: RateStatus,
}

impl Refused {
    /// `Retry-After`, whole seconds rounded up (at least 1).
    pub fn retry_after_s(&self) -> u64 {
        self.retry_after_ms.div_ceil(1000).max(1)
    }
}

const LIMIT_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-limit-requests");
const REMAINING_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-requests");
const RESET_REQUESTS: HeaderName = HeaderName::from_static("x-ratelimit-reset-requests");
const LIMIT_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-limit-tokens");
const REMAINING_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-remaining-tokens");
const RESET_TOKENS: HeaderName = HeaderName::from_static("x-ratelimit-reset-tokens");

/// The `x-ratelimit-*` fields for `status`, passed to `set` one by one.
pub fn headers(status: &RateStatus, mut set: impl FnMut(HeaderName, HeaderValue)) {
    let mut one = |b: &Option<BucketStatus>, names: [HeaderName; 3]| {
        if let Some(b) = b {
            let [limit, remaining, reset] = names;
            set(limit, HeaderValue::from(b.limit));
            set(remaining, HeaderValue::from(b.remaining));
            if let Ok(v) = HeaderValue::from_str(&duration(b.reset_ms)) {
                set(reset, v);
            }
        }
    };
    one(
        &status.requests,
        [LIMIT_REQUESTS, REMAINING_REQUESTS, RESET_REQUESTS],
    );
    one(
        &status.tokens,
        [LIMIT_TOKENS, REMAINING_TOKENS, RESET_TOKENS],
    );
}

/// Tells gossip peers this replica's usage every `rate_limits.gossip_interval_ms` (while any
/// limit applies) and charges theirs here, so replicas enforce one budget.
pub async fn share_usage(
    limits: Arc<RateLimits>,
    gossip: kvgate_gossip::Gossip,
    token: tokio_util::sync::CancellationToken,
) {
    let sink = limits.clone();
    gossip.on_usage(Arc::new(move |peer, report| sink.peer_report(peer, report)));
    let every = std::time::Duration::from_millis(limits.cfg.gossip_interval_ms);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        if !limits.active() {
            continue;
        }
        let usage = limits.usage();
        if !usage.is_empty() {
            gossip.publish_usage(&usage).await;
        }
    }
}

/// A duration as OpenAI writes it (Go's format): `0s`, `120ms`, `1s`, `1.5s`, `6m0s`, `1h2m3s`.
pub fn duration(ms: u64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, frac) = (rest / 1000, rest % 1000);
    let secs = if frac == 0 {
        format!("{s}s")
    } else {
        let f = format!("{frac:03}");
        format!("{s}.{}s", f.trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => secs,
        (0, m) => format!("{m}m{secs}"),
        (h, m) => format!("{h}h{m}m{secs}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_openai_headers() {
        for (ms, s) in [
            (0, "0s"),
            (12, "12ms"),
            (1000, "1s"),
            (1500, "1.5s"),
            (1020, "1.02s"),
            (360_000, "6m0s"),
            (61_250, "1m1.25s"),
            (3_723_000, "1h2m3s"),
        ] {
            assert_eq!(duration(ms), s);
        }
    }

    #[test]
    fn retry_after_rounds_up() {
        let r = |ms| Refused {
            limit: "requests",
            retry_after_ms: ms,
            status: RateStatus::default(),
        };
        assert_eq!(r(1).retry_after_s(), 1);
        assert_eq!(r(1000).retry_after_s(), 1);
        assert_eq!(r(1001).retry_after_s(), 2);
        assert_eq!(r(0).retry_after_s(), 1);
    }
}
