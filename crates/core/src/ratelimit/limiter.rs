//! Per-tenant limits: a request bucket and a token bucket per tenant, in a bounded map.
//!
//! Invariants:
//! - The map holds the configured tenants, at most `max_others` other tenants, and one shared
//!   `other` slot that every further tenant is charged to; an other tenant's slot is reused only
//!   once its buckets are full again (then it holds nothing worth keeping).
//! - Admission is all or nothing: a request refused by one bucket is charged to neither.
//! - A request is admitted while its tenant has one request and one token left; its prompt
//!   tokens, and later its output tokens, may drive the token bucket below zero.
//! - Every local charge is also added to the tenant slot's cumulative usage, which is what
//!   replicas tell each other ([`super::usage`]).
//! - A refund ([`Limiter::refund`]) gives back at most the prompt tokens its [`Ticket`] was
//!   charged, once (the ticket is consumed), to the very slot charged and only while that slot
//!   still exists (a slot reused by another tenant, or replaced by a reconfiguration with other
//!   limits, is not credited), never above the bucket's capacity; the request itself stays
//!   charged. So refunds cannot admit more than the limits: at most what the refunded requests
//!   took is given back.
//! - Reported usage stays cumulative (it never decreases): a refund of tokens not yet reported
//!   is taken off the report; one already reported becomes a credit that the slot's next charges
//!   use up before they are reported, so peers end up charged the net usage.

use super::bucket::{Bucket, BucketStatus};
use super::{Limits, TenantKey, OTHER_TENANT};
use crate::Millis;
use ahash::AHashMap;

/// The request period: limits are per second.
const REQUEST_PERIOD_MS: u64 = 1_000;
/// The token period: limits are per minute.
const TOKEN_PERIOD_MS: u64 = 60_000;

/// Both buckets of a tenant, as far as limits are set.
#[derive(Clone, Debug)]
struct Slot {
    limits: Limits,
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    /// Cumulative usage charged here by this replica: requests, tokens.
    used: (u64, u64),
    /// Tokens of `used` already told to peers (a refund cannot take those back).
    reported_tokens: u64,
    /// Refunded tokens peers were already told of: taken off the next charges' reports.
    credit: u64,
    /// Which slot this is, so that a ticket refunds only the slot that charged it.
    generation: u64,
}

impl Slot {
    fn new(limits: Limits, now: Millis) -> Slot {
        Slot {
            limits,
            requests: limits
                .requests_per_second
                .map(|r| Bucket::new(r, REQUEST_PERIOD_MS, limits.request_burst(), now)),
            tokens: limits
                .tokens_per_minute
                .map(|t| Bucket::new(t, TOKEN_PERIOD_MS, limits.token_burst(), now)),
            used: (0, 0),
            reported_tokens: 0,
            credit: 0,
            generation: 0,
        }
    }

    /// Adds `tokens` charged here to the usage reported to peers, after any credit.
    fn add_used_tokens(&mut self, tokens: u64) {
        let c = tokens.min(self.credit);
        self.credit -= c;
        self.used.1 += tokens - c;
    }

    fn is_idle(&mut self, now: Millis) -> bool {
        self.requests.as_mut().is_none_or(|b| b.is_full(now))
            && self.tokens.as_mut().is_none_or(|b| b.is_full(now))
    }

    fn charge(&mut self, now: Millis, requests: u64, tokens: u64) {
        if let Some(b) = self.requests.as_mut() {
            b.charge(now, requests);
        }
        if let Some(b) = self.tokens.as_mut() {
            b.charge(now, tokens);
        }
    }

    fn status(&mut self, now: Millis) -> RateStatus {
        RateStatus {
            requests: self.requests.as_mut().map(|b| b.status(now)),
            tokens: self.tokens.as_mut().map(|b| b.status(now)),
        }
    }
}

/// A tenant's buckets as a client sees them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateStatus {
    /// The request bucket, when limited.
    pub requests: Option<BucketStatus>,
    /// The token bucket, when limited.
    pub tokens: Option<BucketStatus>,
}

/// Which limit refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exceeded {
    /// Requests per second.
    Requests,
    /// Tokens per minute.
    Tokens,
}

impl Exceeded {
    /// Bounded label.
    pub fn as_str(self) -> &'static str {
        match self {
            Exceeded::Requests => "requests",
            Exceeded::Tokens => "tokens",
        }
    }
}

/// A refused request: which limit, how long until it would be admitted, and the buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Denied {
    /// The limit with the longest wait.
    pub limit: Exceeded,
    /// Milliseconds until both buckets would admit it.
    pub retry_after_ms: u64,
    /// The buckets now.
    pub status: RateStatus,
}

/// Where a tenant is charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Place {
    Configured(TenantKey),
    Other(TenantKey),
    Shared,
}

/// What one admission charged, to give its prompt tokens back if the request then fails
/// before any engine computed it ([`Limiter::refund`]). Not `Clone`: a charge is refunded once.
#[derive(Debug, PartialEq, Eq)]
pub struct Ticket {
    place: Place,
    generation: u64,
    tokens: u64,
    at: Millis,
}

/// An admitted request: the buckets after its charge, and the ticket to refund it.
#[derive(Debug, PartialEq, Eq)]
pub struct Admission {
    /// The tenant's buckets after the admission.
    pub status: RateStatus,
    /// What was charged.
    pub ticket: Ticket,
}

/// Every tenant's buckets, bounded.
#[derive(Debug)]
pub struct Limiter {
    defaults: Limits,
    max_others: usize,
    configured: AHashMap<TenantKey, Slot>,
    others: AHashMap<TenantKey, Slot>,
    shared: Slot,
    /// The last slot generation given out.
    generations: u64,
}

impl Limiter {
    /// A limiter applying `defaults` to every tenant not configured, with room for
    /// `max_others` of them before the rest share one slot.
    pub fn new(defaults: Limits, max_others: usize, now: Millis) -> Limiter {
        Limiter {
            defaults,
            max_others,
            configured: AHashMap::new(),
            others: AHashMap::new(),
            shared: Slot::new(defaults, now),
            generations: 0,
        }
    }

    /// A new slot with a generation of its own.
    fn new_slot(&mut self, limits: Limits, now: Millis) -> Slot {
        self.generations += 1;
        Slot {
            generation: self.generations,
            ..Slot::new(limits, now)
        }
    }

    /// Replaces the configured tenants and their limits; a tenant whose limits did not change
    /// keeps its buckets and usage.
    pub fn configure(
        &mut self,
        tenants: impl IntoIterator<Item = (TenantKey, Limits)>,
        now: Millis,
    ) {
        let mut old = std::mem::take(&mut self.configured);
        for (key, limits) in tenants {
            if key == OTHER_TENANT {
                continue;
            }
            let slot = match old.remove(&key).or_else(|| self.others.remove(&key)) {
                Some(s) if s.limits == limits => s,
                Some(s) => Slot {
                    used: s.used,
                    reported_tokens: s.reported_tokens,
                    credit: s.credit,
                    ..self.new_slot(limits, now)
                },
                None => self.new_slot(limits, now),
            };
            self.configured.insert(key, slot);
        }
    }

    /// Whether any tenant is limited at all.
    pub fn any_limit(&self) -> bool {
        self.defaults.is_limited() || self.configured.values().any(|s| s.limits.is_limited())
    }

    /// The limits `tenant` is held to.
    pub fn limits_of(&self, tenant: TenantKey) -> Limits {
        self.configured
            .get(&tenant)
            .map_or(self.defaults, |s| s.limits)
    }

    /// Whether `tenant` is a configured one (else it is counted as `other` in metrics).
    pub fn is_configured(&self, tenant: TenantKey) -> bool {
        self.configured.contains_key(&tenant)
    }

    fn place(&mut self, tenant: TenantKey, now: Millis) -> Option<Place> {
        if self.configured.contains_key(&tenant) {
            return Some(Place::Configured(tenant));
        }
        if !self.defaults.is_limited() {
            return None;
        }
        if tenant == OTHER_TENANT {
            return Some(Place::Shared);
        }
        if self.others.contains_key(&tenant) {
            return Some(Place::Other(tenant));
        }
        if self.others.len() >= self.max_others {
            // Reuse an idle slot: a full bucket remembers nothing. Its usage moves to the shared
            // slot, so what replicas were told stays monotonic.
            let idle = self
                .others
                .iter_mut()
                .find_map(|(k, s)| s.is_idle(now).then_some(*k));
            match idle {
                Some(k) => {
                    if let Some(s) = self.others.remove(&k) {
                        self.shared.used.0 += s.used.0;
                        self.shared.used.1 += s.used.1;
                    }
                }
                None => return Some(Place::Shared),
            }
        }
        let slot = self.new_slot(self.defaults, now);
        self.others.insert(tenant, slot);
        Some(Place::Other(tenant))
    }

    fn slot(&mut self, place: Place) -> Option<&mut Slot> {
        match place {
            Place::Configured(k) => self.configured.get_mut(&k),
            Place::Other(k) => self.others.get_mut(&k),
            Place::Shared => Some(&mut self.shared),
        }
    }

    /// Admits one request of `tenant` with `prompt_tokens` at `now`, charging both buckets, or
    /// refuses it charging nothing. `Ok(None)`: the tenant has no limits.
    pub fn admit(
        &mut self,
        tenant: TenantKey,
        prompt_tokens: u64,
        now: Millis,
    ) -> Result<Option<Admission>, Denied> {
        let Some(place) = self.place(tenant, now) else {
            return Ok(None);
        };
        let Some(slot) = self.slot(place) else {
            return Ok(None);
        };
        let req_wait = slot
            .requests
            .as_mut()
            .map_or(Ok(()), |b| b.check(now, 1))
            .err();
        let tok_wait = slot
            .tokens
            .as_mut()
            .map_or(Ok(()), |b| b.check(now, 1))
            .err();
        let denied = match (req_wait, tok_wait) {
            (None, None) => None,
            (Some(r), t) if t.is_none_or(|t| r >= t) => Some((Exceeded::Requests, r)),
            (_, Some(t)) => Some((Exceeded::Tokens, t)),
            (Some(r), None) => Some((Exceeded::Requests, r)),
        };
        if let Some((limit, retry_after_ms)) = denied {
            return Err(Denied {
                limit,
                retry_after_ms,
                status: slot.status(now),
            });
        }
        slot.charge(now, 1, prompt_tokens);
        slot.used.0 += 1;
        slot.add_used_tokens(prompt_tokens);
        Ok(Some(Admission {
            status: slot.status(now),
            ticket: Ticket {
                place,
                generation: slot.generation,
                tokens: prompt_tokens,
                at: now,
            },
        }))
    }

    /// Gives back the prompt tokens `ticket` charged, less what the token bucket refilled since
    /// (see [`Bucket::refund`]): its request failed before any engine computed it. The request
    /// stays charged (it still cost a round of routing, and keeps retry storms within the
    /// request rate). Returns the tokens given back (0 if the slot charged is gone or its
    /// limits changed).
    pub fn refund(&mut self, ticket: Ticket, now: Millis) -> u64 {
        let Some(slot) = self.slot(ticket.place) else {
            return 0;
        };
        if slot.generation != ticket.generation || ticket.tokens == 0 {
            return 0;
        }
        let back = match slot.tokens.as_mut() {
            Some(b) => b.refund(now, ticket.tokens, ticket.at),
            None => ticket.tokens,
        };
        // Take the refund off what peers have not been told yet; the rest is a credit.
        let unreported = slot.used.1.saturating_sub(slot.reported_tokens);
        let off = back.min(unreported);
        slot.used.1 -= off;
        slot.credit = slot.credit.saturating_add(back - off);
        back
    }

    /// Charges `tokens` more to `tenant` (output tokens as they stream), unconditionally.
    pub fn charge_tokens(&mut self, tenant: TenantKey, tokens: u64, now: Millis) {
        if tokens == 0 {
            return;
        }
        if let Some(slot) = self.place(tenant, now).and_then(|p| self.slot(p)) {
            slot.charge(now, 0, tokens);
            slot.add_used_tokens(tokens);
        }
    }

    /// Charges what a peer replica reports `tenant` used there (not added to own usage).
    pub fn charge_peer(&mut self, tenant: TenantKey, requests: u64, tokens: u64, now: Millis) {
        if let Some(slot) = self.place(tenant, now).and_then(|p| self.slot(p)) {
            slot.charge(now, requests, tokens);
        }
    }

    /// `tenant`'s buckets now (`None`: no limits).
    pub fn status(&mut self, tenant: TenantKey, now: Millis) -> Option<RateStatus> {
        let place = self.place(tenant, now)?;
        self.slot(place).map(|s| s.status(now))
    }

    /// This replica's cumulative usage per slot: `(tenant, requests, tokens)`; the shared slot
    /// is [`OTHER_TENANT`]. At most configured + `max_others` + 1 entries. What it returns counts
    /// as told to peers (a later refund cannot take it back, see [`Limiter::refund`]).
    pub fn usage(&mut self) -> Vec<(TenantKey, u64, u64)> {
        let all = self
            .configured
            .iter_mut()
            .chain(self.others.iter_mut())
            .map(|(k, s)| (*k, s));
        let shared = (OTHER_TENANT, &mut self.shared);
        all.chain(std::iter::once(shared))
            .filter_map(|(k, s)| {
                s.reported_tokens = s.used.1;
                (s.used.0 > 0 || s.used.1 > 0).then_some((k, s.used.0, s.used.1))
            })
            .collect()
    }

    /// Tenant slots held (configured + others + the shared one).
    pub fn len(&self) -> usize {
        self.configured.len() + self.others.len() + 1
    }

    /// Never true: the shared slot always exists.
    pub fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ratelimit::tenant_key;

    fn limits(rps: u64, tpm: u64) -> Limits {
        Limits {
            requests_per_second: Some(rps),
            tokens_per_minute: Some(tpm),
            ..Limits::default()
        }
    }

    #[test]
    fn refusal_charges_nothing_and_names_the_limit() {
        let a = tenant_key("a");
        let mut l = Limiter::new(Limits::default(), 4, 0);
        l.configure([(a, limits(2, 600))], 0);
        assert!(l.admit(a, 10, 0).unwrap().is_some());
        assert!(l.admit(a, 10, 0).is_ok());
        let d = l.admit(a, 10, 0).unwrap_err();
        assert_eq!((d.limit, d.retry_after_ms), (Exceeded::Requests, 500));
        assert_eq!(d.status.tokens.unwrap().remaining, 580);
        // Untouched by the refusal.
        assert_eq!(l.usage(), vec![(a, 2, 20)]);
    }

    #[test]
    fn a_refund_gives_back_the_prompt_tokens_once_but_not_the_request() {
        let a = tenant_key("a");
        let mut l = Limiter::new(Limits::default(), 4, 0);
        l.configure([(a, limits(2, 600))], 0);
        let t = l.admit(a, 500, 0).unwrap().unwrap().ticket;
        assert_eq!(l.refund(t, 0), 500);
        let s = l.status(a, 0).unwrap();
        assert_eq!(s.tokens.unwrap().remaining, 600, "tokens back");
        assert_eq!(
            s.requests.unwrap().remaining,
            1,
            "the request stays charged"
        );
        // Not reported yet, so peers never hear of the refunded tokens.
        assert_eq!(l.usage(), vec![(a, 1, 0)]);
    }

    #[test]
    fn a_refund_of_reported_tokens_is_credited_against_later_reports() {
        let a = tenant_key("a");
        let mut l = Limiter::new(Limits::default(), 4, 0);
        l.configure([(a, limits(100, 6_000))], 0);
        let t = l.admit(a, 500, 0).unwrap().unwrap().ticket;
        assert_eq!(l.usage(), vec![(a, 1, 500)], "told to peers");
        l.refund(t, 0);
        assert_eq!(l.usage(), vec![(a, 1, 500)], "reports never go down");
        l.admit(a, 300, 0).unwrap();
        assert_eq!(
            l.usage(),
            vec![(a, 2, 500)],
            "the credit absorbs the next 300"
        );
        l.charge_tokens(a, 400, 0);
        assert_eq!(l.usage(), vec![(a, 2, 700)], "then the net: 300 + 400");
    }

    #[test]
    fn a_refund_reaches_only_the_slot_that_charged_it() {
        let mut l = Limiter::new(limits(1, 1_000), 1, 0);
        let (x, y) = (tenant_key("x"), tenant_key("y"));
        let t = l.admit(x, 900, 0).unwrap().unwrap().ticket;
        // x's slot idles full again and is given to y.
        l.admit(y, 900, 60_000).unwrap();
        assert_eq!(l.refund(t, 60_000), 0, "not y's budget");
        assert_eq!(l.status(y, 60_000).unwrap().tokens.unwrap().remaining, 100);
        // Reconfigured with other limits: a fresh slot, not refunded either.
        let a = tenant_key("a");
        l.configure([(a, limits(5, 1_000))], 0);
        let t = l.admit(a, 900, 60_000).unwrap().unwrap().ticket;
        l.configure([(a, limits(6, 1_000))], 60_000);
        assert_eq!(l.refund(t, 60_000), 0);
    }

    #[test]
    fn token_debt_holds_the_next_request() {
        let a = tenant_key("a");
        let mut l = Limiter::new(Limits::default(), 4, 0);
        l.configure([(a, limits(100, 600))], 0);
        // Within budget, so admitted, then its output drives the bucket to -400.
        l.admit(a, 500, 0).unwrap();
        l.charge_tokens(a, 500, 0);
        let d = l.admit(a, 1, 0).unwrap_err();
        assert_eq!(d.limit, Exceeded::Tokens);
        // 401 tokens at 10 per second.
        assert_eq!(d.retry_after_ms, 40_100);
        assert!(l.admit(a, 1, 40_100).is_ok());
    }

    #[test]
    fn unlimited_without_defaults_or_config() {
        let mut l = Limiter::new(Limits::default(), 4, 0);
        assert_eq!(l.admit(tenant_key("x"), 1 << 40, 0), Ok(None));
        assert!(!l.any_limit());
        assert!(l.usage().is_empty());
    }

    #[test]
    fn others_are_bounded_and_then_shared() {
        let mut l = Limiter::new(limits(1, 1_000_000), 2, 0);
        for t in ["a", "b"] {
            l.admit(tenant_key(t), 1, 0).unwrap();
        }
        // Both others are busy: c and d share the one `other` slot.
        l.admit(tenant_key("c"), 1, 0).unwrap();
        assert!(l.admit(tenant_key("d"), 1, 0).is_err());
        assert_eq!(l.len(), 3);
        // Once a's bucket is full again its slot is reused.
        l.admit(tenant_key("e"), 1, 1_000).unwrap();
        assert_eq!(l.len(), 3);
        let total: u64 = l.usage().iter().map(|u| u.1).sum();
        assert_eq!(total, 4, "usage survives the reuse");
    }

    #[test]
    fn reconfigure_keeps_unchanged_buckets() {
        let a = tenant_key("a");
        let mut l = Limiter::new(Limits::default(), 4, 0);
        l.configure([(a, limits(1, 600))], 0);
        l.admit(a, 1, 0).unwrap();
        l.configure([(a, limits(1, 600))], 0);
        assert!(l.admit(a, 1, 0).is_err());
        l.configure([(a, limits(5, 600))], 0);
        assert!(l.admit(a, 1, 0).is_ok());
        l.configure([], 0);
        assert_eq!(l.admit(a, 1, 0), Ok(None));
    }
}
