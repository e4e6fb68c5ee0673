//! Faults injected on demand (`POST /admin/faults`, or CLI flags at start).
//!
//! Invariants: all probabilities are clamped to 0..=1 and the slow factor to 1..=1000 when set;
//! `restart` is an action, not a state (it is performed once and not stored); a hanging
//! `/metrics` (`metrics_hang`) answers once the fault is cleared or after [`METRICS_HANG_MAX`],
//! never later.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Longest a `/metrics` request waits under `metrics_hang` (wall time, not scaled).
pub const METRICS_HANG_MAX: Duration = Duration::from_secs(60);

/// Fault settings of one engine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// Every step takes this many times longer (1 = normal).
    pub slow_factor: f64,
    /// Probability that a completion request is answered with a 500.
    pub error_rate: f64,
    /// Answer every completion request with a 500.
    pub always_5xx: bool,
    /// Probability that a response's connection is dropped after its first token.
    pub drop_rate: f64,
    /// Stop publishing KV events (batches are discarded, seq does not advance).
    pub stop_events: bool,
    /// `/metrics` answers nothing until this is cleared (or [`METRICS_HANG_MAX`] passes), like
    /// an engine whose metrics endpoint is stuck.
    pub metrics_hang: bool,
    /// Restart now: cache cleared, in-flight requests cut, event seq back to 0, counters reset,
    /// and no `AllBlocksCleared` (what a real engine restart looks like).
    pub restart: bool,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            slow_factor: 1.0,
            error_rate: 0.0,
            always_5xx: false,
            drop_rate: 0.0,
            stop_events: false,
            metrics_hang: false,
            restart: false,
        }
    }
}

impl Faults {
    /// Clamps values into their ranges (NaN becomes the neutral value).
    pub fn sanitised(mut self) -> Self {
        let p = |x: f64| if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) };
        self.error_rate = p(self.error_rate);
        self.drop_rate = p(self.drop_rate);
        self.slow_factor = if self.slow_factor.is_nan() {
            1.0
        } else {
            self.slow_factor.clamp(1.0, 1000.0)
        };
        self
    }
}
