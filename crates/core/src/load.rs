//! Per-instance load: what the router tracks itself, what engines report, and learned rates.
//!
//! Invariants:
//! - Router-tracked counters change only through [`LoadGuard`]: taken at dispatch, advanced at the
//!   first token, released on drop (response finished, failed or the client went away), so counters
//!   can never leak or go negative.
//! - Engine-reported load is a snapshot with its age; the caller marks it stale, routing never waits
//!   for it.
//! - Rate estimates start at configured values and move by bounded EWMA steps from observations.

use crate::{InstanceId, Millis};
use std::sync::Arc;

/// Router-tracked load of one instance at a point in time.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct RouterLoad {
    /// Requests dispatched and not yet finished.
    pub in_flight: u32,
    /// Uncached prompt tokens of requests that have not produced their first token yet.
    pub pending_prefill_tokens: u64,
    /// Requests past their first token (decoding).
    pub decoding: u32,
}

/// Load scraped from the engine (`/metrics` or SGLang `/v1/loads`).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct EngineLoad {
    /// Requests running in the engine's batch.
    pub running: u32,
    /// Requests waiting in the engine's queue.
    pub waiting: u32,
    /// KV cache utilisation, 0..1.
    pub kv_usage: f32,
    /// When this was scraped.
    pub at: Millis,
    /// True when older than the configured staleness bound; scorers then ignore it.
    pub stale: bool,
}

/// Router-tracked load counters for a fixed-size fleet. Lock-free.
pub struct LoadTracker {
    _private: (),
}

impl LoadTracker {
    /// Counters for `instances` instances, all zero.
    pub fn new(instances: usize) -> Self {
        let _ = instances;
        todo!()
    }
    /// Number of instances tracked.
    pub fn len(&self) -> usize {
        todo!()
    }
    /// True when tracking no instance.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Current counters of `instance`.
    pub fn snapshot(&self, instance: InstanceId) -> RouterLoad {
        let _ = instance;
        todo!()
    }
    /// Records a dispatch of a request with `uncached_prefill_tokens` to compute; the returned
    /// guard undoes it when dropped.
    pub fn dispatch(self: &Arc<Self>, instance: InstanceId, uncached_prefill_tokens: u64) -> LoadGuard {
        let _ = (instance, uncached_prefill_tokens);
        todo!()
    }
}

/// RAII handle on one dispatched request's share of an instance's load.
pub struct LoadGuard {
    _private: (),
}

impl LoadGuard {
    /// The request produced its first token: its prefill is no longer pending; it now decodes.
    /// Idempotent.
    pub fn first_token(&mut self) {
        todo!()
    }
    /// The instance this guard accounts against.
    pub fn instance(&self) -> InstanceId {
        todo!()
    }
}

/// Learned speed of one instance, from observed time to first token versus uncached prompt tokens.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct InstanceRates {
    /// Prefill throughput in tokens per second.
    pub prefill_tokens_per_s: f64,
    /// Added time to first token per concurrently decoding sequence, in milliseconds.
    pub decode_interference_ms: f64,
}
