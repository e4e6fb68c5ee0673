//! Per-tenant rate limits: requests per second and tokens per minute, shared by replicas.
//!
//! - [`bucket::Bucket`]: one token bucket on virtual milliseconds, exact integer arithmetic,
//!   allowed to go into debt.
//! - [`limiter::Limiter`]: a request bucket and a token bucket per tenant in a bounded map
//!   (configured tenants, at most `max_others` others, then one shared `other` slot), all or
//!   nothing admission, and the cumulative usage a replica tells its peers.
//!   A request that fails before any engine computed it gets its prompt tokens back
//!   ([`limiter::Limiter::refund`]); the request itself stays charged.
//! - [`usage::PeerLedger`]: turns peers' cumulative reports into the deltas charged here, so
//!   that N replicas enforce one budget.
//!
//! Invariants:
//! - Pure: no clock (callers pass `now` in ms), no I/O, no locks; the gateway serializes access.
//! - On one replica a tenant is never admitted more than `burst + rate × t` requests in any
//!   window of `t`; its tokens overshoot that only by what requests admitted within budget
//!   charge after their admission (property-tested in `tests`).
//! - Tenants are named across processes by [`tenant_key`] (XXH3-64 of the name, fixed seed).

pub mod bucket;
pub mod limiter;
pub mod usage;

#[cfg(test)]
mod tests;

pub use bucket::{Bucket, BucketStatus};
pub use limiter::{Admission, Denied, Exceeded, Limiter, RateStatus, Ticket};
pub use usage::PeerLedger;

use serde::{Deserialize, Serialize};

/// A tenant's name across processes.
pub type TenantKey = u64;

/// The key of the slot that tenants beyond the map's bound share.
pub const OTHER_TENANT: TenantKey = 0;

/// Seed of [`tenant_key`] (fixed: every replica must compute the same key).
const TENANT_SEED: u64 = 0x6b76_6761_7465_5254;

/// A tenant's name as replicas exchange it. Never [`OTHER_TENANT`].
pub fn tenant_key(name: &str) -> TenantKey {
    xxhash_rust::xxh3::xxh3_64_with_seed(name.as_bytes(), TENANT_SEED).max(1)
}

/// One tenant's limits; a limit left unset does not apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Requests per second.
    pub requests_per_second: Option<u64>,
    /// Tokens (prompt + output) per minute.
    pub tokens_per_minute: Option<u64>,
    /// Requests that may arrive at once; unset: one second's worth.
    pub burst_requests: Option<u64>,
    /// Tokens that may be spent at once; unset: one minute's worth.
    pub burst_tokens: Option<u64>,
}

impl Limits {
    /// Whether any limit is set.
    pub fn is_limited(&self) -> bool {
        self.requests_per_second.is_some() || self.tokens_per_minute.is_some()
    }

    /// The request bucket's capacity.
    pub fn request_burst(&self) -> u64 {
        self.burst_requests
            .or(self.requests_per_second)
            .unwrap_or(1)
            .max(1)
    }

    /// The token bucket's capacity.
    pub fn token_burst(&self) -> u64 {
        self.burst_tokens
            .or(self.tokens_per_minute)
            .unwrap_or(1)
            .max(1)
    }

    /// `self`, with every unset field taken from `base`.
    pub fn or(self, base: Limits) -> Limits {
        Limits {
            requests_per_second: self.requests_per_second.or(base.requests_per_second),
            tokens_per_minute: self.tokens_per_minute.or(base.tokens_per_minute),
            burst_requests: self.burst_requests.or(base.burst_requests),
            burst_tokens: self.burst_tokens.or(base.burst_tokens),
        }
    }

    /// The first field out of range, with what it must be.
    pub fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        for (key, v) in [
            ("requests_per_second", self.requests_per_second),
            ("tokens_per_minute", self.tokens_per_minute),
            ("burst_requests", self.burst_requests),
            ("burst_tokens", self.burst_tokens),
        ] {
            if v.is_some_and(|v| v == 0 || v > MAX_LIMIT) {
                return Err((key, "must be between 1 and 1000000000000"));
            }
        }
        Ok(())
    }
}

/// The largest value of any limit (keeps the buckets' arithmetic far from overflow).
pub const MAX_LIMIT: u64 = 1_000_000_000_000;
