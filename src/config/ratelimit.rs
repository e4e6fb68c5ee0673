//! `[rate_limits]`: the default per-tenant rate limits and the tenant map's bound.
//!
//! Invariant: every limit is unset by default, and unset means off; a tenant's own limits (keys
//! file `[[tenants]]` or key entries) override these field by field.

use kvgate_core::ratelimit::Limits;
use serde::{Deserialize, Serialize};

/// Default rate limits per tenant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimitsConfig {
    /// Requests per second per tenant; unset: no request limit.
    pub requests_per_second: Option<u64>,
    /// Tokens (prompt + output) per minute per tenant; unset: no token limit.
    pub tokens_per_minute: Option<u64>,
    /// Requests a tenant may send at once; unset: one second's worth.
    pub burst_requests: Option<u64>,
    /// Tokens a tenant may spend at once; unset: one minute's worth.
    pub burst_tokens: Option<u64>,
    /// Tenants not named by any key that get buckets of their own; the rest share one.
    pub max_other_tenants: usize,
    /// How often this replica tells its gossip peers its usage per tenant, milliseconds.
    pub gossip_interval_ms: u64,
}

impl Default for RateLimitsConfig {
    fn default() -> Self {
        Self {
            requests_per_second: None,
            tokens_per_minute: None,
            burst_requests: None,
            burst_tokens: None,
            max_other_tenants: 1024,
            gossip_interval_ms: 100,
        }
    }
}

impl RateLimitsConfig {
    /// The limits every tenant gets unless it has its own.
    pub fn defaults(&self) -> Limits {
        Limits {
            requests_per_second: self.requests_per_second,
            tokens_per_minute: self.tokens_per_minute,
            burst_requests: self.burst_requests,
            burst_tokens: self.burst_tokens,
        }
    }

    /// The first invalid value: `(key within the section, what it must be)`.
    pub fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        self.defaults().validate()?;
        if self.max_other_tenants > 1 << 20 {
            return Err(("max_other_tenants", "must be <= 1048576"));
        }
        if !(10..=60_000).contains(&self.gossip_interval_ms) {
            return Err(("gossip_interval_ms", "must be between 10 and 60000"));
        }
        Ok(())
    }
}
