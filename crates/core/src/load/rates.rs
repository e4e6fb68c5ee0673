//! Per-instance prefill rate and decode interference, learned from observed time to first token.
//!
//! Model: `ttft_ms ≈ a · work_ktok + b · decoding`, where `work_ktok` is the prefill tokens the
//! instance had to compute before this request's first token (queued ahead of it plus its own
//! uncached tokens, in thousands), `a = 10⁶ / prefill_tokens_per_s` (ms per thousand tokens) and
//! `b` the decode interference in ms per running sequence.
//!
//! Each observation moves `(a, b)` by one normalised-LMS step (`gain` × error × feature / ‖feature‖²),
//! then bounds it: neither parameter moves by more than `max_step` of its value in one observation
//! (so one outlier, e.g. a network stall, cannot wreck an estimate), and both stay in configured
//! sane ranges. Estimates start at the configured values, so an instance with no history is
//! scored as configured.
//!
//! Invariants: pure (no clock); bounded (one entry per instance, ids beyond
//! [`crate::index::MAX_INSTANCES`] ignored); rates always finite and inside their ranges.

use super::InstanceRates;
use crate::InstanceId;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

/// Starting values and bounds of the estimator.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateConfig {
    /// Configured prefill throughput, tokens/s: the estimate's starting point. Default 8 000.
    pub prefill_tokens_per_s: f64,
    /// Configured decode interference, ms per decoding sequence: starting point. Default 0.5.
    pub decode_interference_ms: f64,
    /// Normalised-LMS gain in (0, 1]: the fraction of an observation's error corrected at once.
    /// Default 0.1.
    pub gain: f64,
    /// Largest relative change of either parameter per observation. Default 0.2.
    pub max_step: f64,
    /// Lower bound of the prefill rate, tokens/s. Default 100.
    pub min_prefill_tokens_per_s: f64,
    /// Upper bound of the prefill rate, tokens/s. Default 1 000 000.
    pub max_prefill_tokens_per_s: f64,
    /// Upper bound of the decode interference, ms. Default 100.
    pub max_decode_interference_ms: f64,
    /// Observations with fewer prefill tokens of work than this are ignored (fixed overheads
    /// dominate them). Default 64.
    pub min_work_tokens: u64,
}

impl Default for RateConfig {
    fn default() -> Self {
        Self {
            prefill_tokens_per_s: 8_000.0,
            decode_interference_ms: 0.5,
            gain: 0.1,
            max_step: 0.2,
            min_prefill_tokens_per_s: 100.0,
            max_prefill_tokens_per_s: 1_000_000.0,
            max_decode_interference_ms: 100.0,
            min_work_tokens: 64,
        }
    }
}

impl RateConfig {
    /// The starting rates, clamped into the configured ranges.
    pub fn initial(&self) -> InstanceRates {
        InstanceRates {
            prefill_tokens_per_s: clamp(
                self.prefill_tokens_per_s,
                self.min_prefill_tokens_per_s,
                self.max_prefill_tokens_per_s,
            ),
            decode_interference_ms: clamp(
                self.decode_interference_ms,
                0.0,
                self.max_decode_interference_ms,
            ),
        }
    }
}

fn clamp(x: f64, lo: f64, hi: f64) -> f64 {
    let lo = if lo.is_finite() { lo } else { 0.0 };
    let hi = if hi.is_finite() && hi >= lo { hi } else { lo };
    if x.is_nan() {
        lo
    } else {
        x.clamp(lo, hi)
    }
}

/// Learned rates of a fleet. `Send + Sync`.
#[derive(Debug)]
pub struct RateEstimator {
    cfg: RateConfig,
    rates: RwLock<Vec<InstanceRates>>,
}

/// Scale of the decoding feature, so both features have similar magnitudes (thousands of tokens
/// of work versus tens of decoding sequences).
const DECODE_SCALE: f64 = 8.0;

impl RateEstimator {
    /// Estimates for `instances` instances, all at the configured values.
    pub fn new(cfg: RateConfig, instances: usize) -> Self {
        let init = cfg.initial();
        Self {
            rates: RwLock::new(vec![init; instances.min(crate::index::MAX_INSTANCES)]),
            cfg,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RateConfig {
        &self.cfg
    }

    /// Current estimate of `instance` (the configured values for unknown instances).
    pub fn rates(&self, instance: InstanceId) -> InstanceRates {
        self.rates
            .read()
            .get(instance.index())
            .copied()
            .unwrap_or_else(|| self.cfg.initial())
    }

    /// Every instance's estimate, by id.
    pub fn snapshot(&self) -> Vec<InstanceRates> {
        self.rates.read().clone()
    }

    /// Grows the fleet to at least `instances` (new ones start at the configured values).
    pub fn ensure_len(&self, instances: usize) {
        let n = instances.min(crate::index::MAX_INSTANCES);
        let mut r = self.rates.write();
        if r.len() < n {
            let init = self.cfg.initial();
            r.resize(n, init);
        }
    }

    /// Forgets what was learned about `instance` (e.g. it restarted on different hardware).
    pub fn reset(&self, instance: InstanceId) {
        if let Some(r) = self.rates.write().get_mut(instance.index()) {
            *r = self.cfg.initial();
        }
    }

    /// Learns from one request: it had `uncached_tokens` to prefill, `queued_prefill_tokens_ahead`
    /// were queued before it on the instance at dispatch, `decoding_seqs` were decoding, and its
    /// first token came after `ttft_ms`. Returns the updated estimate.
    pub fn observe(
        &self,
        instance: InstanceId,
        uncached_tokens: u64,
        ttft_ms: f64,
        queued_prefill_tokens_ahead: u64,
        decoding_seqs: u32,
    ) -> InstanceRates {
        let work = uncached_tokens.saturating_add(queued_prefill_tokens_ahead);
        if !ttft_ms.is_finite() || ttft_ms <= 0.0 || work < self.cfg.min_work_tokens {
            return self.rates(instance);
        }
        let mut all = self.rates.write();
        let Some(r) = all.get_mut(instance.index()) else {
            return self.cfg.initial();
        };
        *r = self.step(
            *r,
            work as f64 / 1000.0,
            f64::from(decoding_seqs) / DECODE_SCALE,
            ttft_ms,
        );
        *r
    }

    fn step(&self, r: InstanceRates, x1: f64, x2: f64, ttft_ms: f64) -> InstanceRates {
        let c = &self.cfg;
        let a = 1e6 / r.prefill_tokens_per_s;
        let b = r.decode_interference_ms * DECODE_SCALE;
        let err = ttft_ms - (a * x1 + b * x2);
        let norm = x1 * x1 + x2 * x2;
        if norm <= 0.0 || !err.is_finite() {
            return r;
        }
        let g = clamp(c.gain, 0.0, 1.0);
        let s = clamp(c.max_step, 0.0, 1.0);
        let a_new = clamp(a + g * err * x1 / norm, a * (1.0 - s), a * (1.0 + s));
        // b may be 0: allow its step to scale with a floor of 1 ms-equivalent.
        let b_room = s * b.max(DECODE_SCALE);
        let b_new = clamp(b + g * err * x2 / norm, b - b_room, b + b_room);
        InstanceRates {
            prefill_tokens_per_s: clamp(
                1e6 / a_new,
                c.min_prefill_tokens_per_s,
                c.max_prefill_tokens_per_s,
            ),
            decode_interference_ms: clamp(b_new / DECODE_SCALE, 0.0, c.max_decode_interference_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::util::mix;

    fn drive(est: &RateEstimator, true_rate: f64, true_interf: f64, n: u64) {
        for k in 0..n {
            let uncached = 200 + mix(k) % 4000;
            let ahead = mix(k ^ 77) % 6000;
            let dec = (mix(k ^ 5) % 40) as u32;
            let ttft =
                (uncached + ahead) as f64 / true_rate * 1000.0 + true_interf * f64::from(dec);
            est.observe(InstanceId(0), uncached, ttft, ahead, dec);
        }
    }

    #[test]
    fn converges_to_the_true_rates() {
        let est = RateEstimator::new(RateConfig::default(), 2);
        drive(&est, 3_000.0, 2.0, 3000);
        let r = est.rates(InstanceId(0));
        assert!((r.prefill_tokens_per_s - 3_000.0).abs() < 150.0, "{r:?}");
        assert!((r.decode_interference_ms - 2.0).abs() < 0.3, "{r:?}");
        // The other instance is untouched.
        assert_eq!(est.rates(InstanceId(1)), RateConfig::default().initial());
    }

    #[test]
    fn bounded_steps_and_ranges() {
        let est = RateEstimator::new(RateConfig::default(), 1);
        let before = est.rates(InstanceId(0));
        // A 60 s stall on a small request moves the estimate by at most 20 %.
        let after = est.observe(InstanceId(0), 1000, 60_000.0, 0, 0);
        assert!(
            after.prefill_tokens_per_s >= before.prefill_tokens_per_s / 1.2 - 1e-9,
            "{after:?}"
        );
        for _ in 0..1000 {
            est.observe(InstanceId(0), 1000, 1e9, 0, 50);
        }
        let r = est.rates(InstanceId(0));
        assert!(
            r.prefill_tokens_per_s >= 100.0 && r.decode_interference_ms <= 100.0,
            "{r:?}"
        );
        // Garbage observations are ignored.
        let r0 = est.rates(InstanceId(0));
        assert_eq!(est.observe(InstanceId(0), 1000, f64::NAN, 0, 0), r0);
        assert_eq!(est.observe(InstanceId(0), 10, 5.0, 0, 0), r0);
        assert_eq!(
            est.observe(InstanceId(9), 1000, 5.0, 0, 0),
            RateConfig::default().initial()
        );
        est.reset(InstanceId(0));
        assert_eq!(est.rates(InstanceId(0)), RateConfig::default().initial());
    }
}
