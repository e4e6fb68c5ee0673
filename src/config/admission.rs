//! `[admission]`: holding requests at the gateway while a pool is saturated, by priority and
//! tenant fair share, instead of piling them into the engines' queues.

use serde::{Deserialize, Serialize};

/// `[admission]` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// Whether requests wait in a per-pool queue while every usable instance is saturated
    /// (off: they are forwarded anyway, and only a pool with no usable instance answers 503).
    pub enabled: bool,
    /// An instance with requests in flight is saturated once the policy predicts a time to first
    /// token above this, ms.
    pub max_predicted_ttft_ms: u64,
    /// An instance is saturated once it has this many requests in flight (fleet-wide, gossip
    /// peers included); 0 = no count bound, the predicted time to first token alone decides.
    pub max_inflight_per_instance: u32,
    /// An instance is saturated once its engine reports this many requests waiting (vLLM's
    /// `num_requests_waiting`, SGLang's `num_queue_reqs`, in the last fresh `[load]` scrape): it
    /// is at its running capacity (sequences or KV memory) and queues what it gets; 0 = not used.
    pub max_engine_waiting: u32,
    /// Requests waiting per pool at most; beyond it arrivals are rejected (or evict a
    /// lower-priority waiter).
    pub max_queue_entries: usize,
    /// Tokens (prompt plus expected output) waiting per pool at most.
    pub max_queued_tokens: u64,
    /// Longest a request waits in the queue before it is rejected, ms.
    pub max_wait_ms: u64,
    /// Request header naming the tenant for fair share; requests without it share one default
    /// tenant.
    pub tenant_header: String,
    /// Weights of named tenants (1 to 1000; unnamed tenants weigh 1): while backlogged, a tenant
    /// of weight w is served w times the tokens of a tenant of weight 1.
    pub tenant_weights: std::collections::BTreeMap<String, u32>,
}

/// Most tenants `tenant_weights` may name.
pub const MAX_WEIGHTED_TENANTS: usize = 10_000;

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            max_predicted_ttft_ms: 10_000,
            max_inflight_per_instance: 0,
            max_engine_waiting: 8,
            max_queue_entries: 1_024,
            max_queued_tokens: 4_000_000,
            max_wait_ms: 15_000,
            tenant_header: "x-kvgate-tenant".to_string(),
            tenant_weights: Default::default(),
        }
    }
}

impl AdmissionConfig {
    /// The first invalid value: its key under `admission.` and what is wrong.
    pub fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        for (key, v) in [
            ("max_predicted_ttft_ms", self.max_predicted_ttft_ms),
            ("max_queue_entries", self.max_queue_entries as u64),
            ("max_queued_tokens", self.max_queued_tokens),
            ("max_wait_ms", self.max_wait_ms),
        ] {
            if v == 0 {
                return Err((key, "must be > 0"));
            }
        }
        if self.max_queue_entries > 1_000_000 {
            return Err(("max_queue_entries", "must be <= 1000000"));
        }
        if self.max_wait_ms > 3_600_000 {
            return Err(("max_wait_ms", "must be <= 3600000 (one hour)"));
        }
        if http::HeaderName::from_bytes(self.tenant_header.as_bytes()).is_err() {
            return Err(("tenant_header", "not a valid HTTP header name"));
        }
        if self.tenant_weights.len() > MAX_WEIGHTED_TENANTS {
            return Err(("tenant_weights", "names more than 10000 tenants"));
        }
        if self
            .tenant_weights
            .values()
            .any(|w| !(1..=1000).contains(w))
        {
            return Err(("tenant_weights", "every weight must be between 1 and 1000"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_bad_values_name_the_key() {
        AdmissionConfig::default().validate().unwrap();
        let c = AdmissionConfig {
            max_wait_ms: 0,
            ..AdmissionConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().0, "max_wait_ms");
        let c = AdmissionConfig {
            tenant_header: "bad header".into(),
            ..AdmissionConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().0, "tenant_header");
        for w in [0, 1001] {
            let c = AdmissionConfig {
                tenant_weights: [("a".to_string(), w)].into(),
                ..AdmissionConfig::default()
            };
            assert_eq!(c.validate().unwrap_err().0, "tenant_weights");
        }
    }
}
