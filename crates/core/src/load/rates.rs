//! Per-instance prefill rate and decode interference, learned from observed time to first token.
//!
//! Model: `ttft_ms ≈ c + a · work_ktok + b · decoding / 8`, where `work_ktok` is the prefill tokens
//! the instance had to compute before this request's first token (queued ahead of it plus its own
//! uncached tokens, in thousands), `a = 10⁶ / prefill_tokens_per_s` (ms per thousand tokens), `b`
//! the decode interference and `c` a fixed per-request overhead (the engine step the request waits
//! to join, sampling, the network). The intercept matters: without it, an instance that mostly
//! serves cache hits (little work, so TTFT dominated by `c`) looks several times slower than an
//! identical instance that serves cold prompts, and a cache-aware policy then steers traffic away
//! from exactly the instances holding the cache.
//!
//! Fit: least squares with exponential forgetting (each fit remembers roughly the last
//! `1 / (1 − forgetting)` observations). A fleet-wide fit over every instance's observations
//! starts from the configured values; each instance's own fit is pulled towards the fleet-wide
//! one by `pool_weight` observations' worth, so an instance with no or little history is scored
//! like the fleet, and a genuinely different one (other hardware) departs from it as its own
//! evidence accumulates. Residuals are clipped at `outlier_clip` times their running mean absolute
//! value, so one stall (a network hiccup, a preemption) moves the estimate only a bounded amount.
//!
//! Invariants: pure (no clock); bounded (one entry per instance, ids beyond
//! [`crate::index::MAX_INSTANCES`] ignored); rates always finite and inside their ranges.

use super::fit::{clamp, Fit, Fits, Learning, Shape};
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
    /// Configured fixed overhead per request before its first token, ms: starting point.
    /// Default 20.
    pub overhead_ms: f64,
    /// Forgetting factor in (0.5, 1]: the weight an observation keeps per newer observation.
    /// 0.998 remembers about the last 500. Default 0.998.
    pub forgetting: f64,
    /// Residuals beyond this many running mean absolute residuals are clipped (outliers move
    /// the estimate only a bounded amount). Default 3.
    pub outlier_clip: f64,
    /// Lower bound of the prefill rate, tokens/s. Default 100.
    pub min_prefill_tokens_per_s: f64,
    /// Upper bound of the prefill rate, tokens/s. Default 1 000 000.
    pub max_prefill_tokens_per_s: f64,
    /// Upper bound of the decode interference, ms. Default 100.
    pub max_decode_interference_ms: f64,
    /// Upper bound of the fixed overhead, ms. Default 10 000.
    pub max_overhead_ms: f64,
    /// Observations with fewer prefill tokens of work than this are ignored. Default 16.
    pub min_work_tokens: u64,
    /// Whether the decode interference is learned too. Default false: from time to first token
    /// alone it cannot be told apart from waiting for KV memory on a busy instance (which grows
    /// with the number of decoding sequences too), and a learned value then prices every decoding
    /// sequence at tens of milliseconds, far beyond what it adds to a prefill step.
    pub learn_decode_interference: bool,
    /// Weight, in observations, of the fleet-wide estimate in each instance's own: an instance
    /// with little traffic is scored like the fleet (a few slow first requests cannot mark it
    /// slow and starve it of the traffic that would correct that), while one with hundreds of
    /// observations is scored mostly on its own speed. 0 fits every instance independently.
    /// Default 100: early observations (a burst of simultaneous first requests queueing in ways
    /// the router cannot see) scatter identical instances' fits by tens of percent, enough to
    /// starve the ones that look slow.
    pub pool_weight: f64,
}

impl Default for RateConfig {
    fn default() -> Self {
        Self {
            prefill_tokens_per_s: 8_000.0,
            decode_interference_ms: 0.5,
            overhead_ms: 20.0,
            forgetting: 0.998,
            outlier_clip: 3.0,
            min_prefill_tokens_per_s: 100.0,
            max_prefill_tokens_per_s: 1_000_000.0,
            max_decode_interference_ms: 100.0,
            max_overhead_ms: 10_000.0,
            min_work_tokens: 16,
            pool_weight: 100.0,
            learn_decode_interference: false,
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

    /// The configured values as `[c, a, b]` (see [`Fit::theta`]).
    fn configured_theta(&self) -> [f64; 3] {
        let r = self.initial();
        [
            clamp(self.overhead_ms, 0.0, self.max_overhead_ms),
            1e6 / r.prefill_tokens_per_s,
            r.decode_interference_ms * DECODE_SCALE,
        ]
    }

    fn initial_fit(&self) -> Fit {
        let theta = self.configured_theta();
        Fit::prior(theta, &self.shape(), (theta[0] + theta[1]).max(1.0))
    }

    /// The parameters' bounds: a rate inside its range, no negative costs.
    fn shape(&self) -> Shape {
        Shape {
            prior_feature_scale: PRIOR_FEATURE_SCALE,
            lo: [0.0, 1e6 / self.max_prefill_tokens_per_s.max(1e-9), 0.0],
            hi: [
                self.max_overhead_ms,
                1e6 / self.min_prefill_tokens_per_s.max(1e-9),
                self.max_decode_interference_ms * DECODE_SCALE,
            ],
        }
    }

    fn learning(&self) -> Learning {
        Learning {
            shape: self.shape(),
            configured: self.configured_theta(),
            forgetting: self.forgetting,
            outlier_clip: self.outlier_clip,
            pool_weight: self.pool_weight,
        }
    }

    fn rates_of(&self, fit: &Fit) -> InstanceRates {
        InstanceRates {
            prefill_tokens_per_s: clamp(
                1e6 / fit.theta[1].max(1e-9),
                self.min_prefill_tokens_per_s,
                self.max_prefill_tokens_per_s,
            ),
            decode_interference_ms: clamp(
                fit.theta[2] / DECODE_SCALE,
                0.0,
                self.max_decode_interference_ms,
            ),
        }
    }
}

/// Typical magnitude of each feature (1, thousands of tokens of work, decoding sequences / 8),
/// which sizes the pseudo-observations. `theta` is `[c, a, b]`: overhead ms, ms per thousand
/// tokens, ms per `DECODE_SCALE` decoding sequences.
const PRIOR_FEATURE_SCALE: [f64; 3] = [1.0, 2.0, 1.0];

/// Learned rates of a fleet. `Send + Sync`.
#[derive(Debug)]
pub struct RateEstimator {
    cfg: RateConfig,
    state: RwLock<Fits>,
}

/// Scale of the decoding feature, so both features have similar magnitudes (thousands of tokens
/// of work versus tens of decoding sequences).
const DECODE_SCALE: f64 = 8.0;

/// A read-locked view of a [`RateEstimator`]'s estimates.
pub struct RatesView<'a> {
    state: parking_lot::RwLockReadGuard<'a, Fits>,
    cfg: &'a RateConfig,
}

impl RatesView<'_> {
    /// Current estimate of `instance` (the pool's for unknown instances).
    pub fn rates(&self, instance: InstanceId) -> InstanceRates {
        let fit = self.state.get(instance.index());
        self.cfg.rates_of(fit)
    }
}

impl RateEstimator {
    /// Estimates for `instances` instances, all at the configured values.
    pub fn new(cfg: RateConfig, instances: usize) -> Self {
        let pool = cfg.initial_fit();
        let n = instances.min(crate::index::MAX_INSTANCES);
        Self {
            state: RwLock::new(Fits::new(pool, n)),
            cfg,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RateConfig {
        &self.cfg
    }

    /// Current estimate of `instance` (the pool's for unknown instances).
    pub fn rates(&self, instance: InstanceId) -> InstanceRates {
        self.view().rates(instance)
    }

    /// The estimates as they stand, for several reads under one lock acquisition (a routing
    /// decision reads every candidate's; each acquisition writes the lock's shared cache line).
    /// Observations wait while a view is held: drop it promptly.
    pub fn view(&self) -> RatesView<'_> {
        RatesView {
            state: self.state.read(),
            cfg: &self.cfg,
        }
    }

    /// Current estimate of `instance`'s fixed overhead per request, ms.
    pub fn overhead_ms(&self, instance: InstanceId) -> f64 {
        self.state.read().get(instance.index()).theta[0]
    }

    /// Every instance's estimate, by id.
    pub fn snapshot(&self) -> Vec<InstanceRates> {
        let st = self.state.read();
        st.instances.iter().map(|f| self.cfg.rates_of(f)).collect()
    }

    /// Grows the fleet to at least `instances` (new ones start at the pool's estimate).
    pub fn ensure_len(&self, instances: usize) {
        let n = instances.min(crate::index::MAX_INSTANCES);
        self.state.write().ensure_len(n);
    }

    /// Forgets what was learned about `instance` (e.g. it restarted on different hardware): it
    /// starts again from the pool's estimate.
    pub fn reset(&self, instance: InstanceId) {
        self.state.write().reset(instance.index());
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
        let cfg = &self.cfg;
        let decoding = f64::from(decoding_seqs);
        let (x2, y) = if cfg.learn_decode_interference {
            (decoding / DECODE_SCALE, ttft_ms)
        } else {
            // Fixed at the configured value: take its share out and leave the feature empty,
            // so the fit of that parameter keeps its anchor.
            let fixed = cfg.initial().decode_interference_ms * decoding;
            (0.0, (ttft_ms - fixed).max(1e-3))
        };
        let x = [1.0, work as f64 / 1000.0, x2];
        let ttft_ms = y;
        let learning = cfg.learning();
        let mut fits = self.state.write();
        match fits.learn(instance.index(), &learning, x, ttft_ms) {
            Some(f) => cfg.rates_of(f),
            None => cfg.initial(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::util::mix;

    /// Observations of an instance whose true model is `overhead + work / rate + interf × dec`,
    /// with ±`noise` multiplicative noise; `max_uncached` sets the mix (small = mostly cache hits).
    fn drive(
        est: &RateEstimator,
        id: u32,
        truth: (f64, f64, f64),
        max_uncached: u64,
        n: u64,
        seed: u64,
        noise: f64,
    ) {
        let (rate, interf, overhead) = truth;
        for k in 0..n {
            let h = mix(k ^ seed.rotate_left(17));
            let uncached = 16 + h % max_uncached;
            let ahead = if mix(h ^ 3).is_multiple_of(4) {
                mix(h ^ 77) % 6000
            } else {
                0
            };
            let dec = (mix(h ^ 5) % 40) as u32;
            let noise = 1.0 + noise * ((mix(h ^ 9) % 1001) as f64 / 500.0 - 1.0);
            let ttft =
                (overhead + (uncached + ahead) as f64 / rate * 1000.0 + interf * f64::from(dec))
                    * noise;
            est.observe(InstanceId(id), uncached, ttft, ahead, dec);
        }
    }

    fn learning_all() -> RateConfig {
        RateConfig {
            learn_decode_interference: true,
            ..RateConfig::default()
        }
    }

    #[test]
    fn converges_to_the_true_rates() {
        let est = RateEstimator::new(learning_all(), 2);
        drive(&est, 0, (3_000.0, 2.0, 15.0), 4000, 3000, 1, 0.05);
        let r = est.rates(InstanceId(0));
        assert!((r.prefill_tokens_per_s - 3_000.0).abs() < 150.0, "{r:?}");
        assert!((r.decode_interference_ms - 2.0).abs() < 0.4, "{r:?}");
        let c = est.overhead_ms(InstanceId(0));
        assert!((c - 15.0).abs() < 10.0, "{c}");
        // The other instance, with no history of its own, is scored like the fleet.
        let other = est.rates(InstanceId(1));
        assert!(
            (other.prefill_tokens_per_s - 3_000.0).abs() < 300.0,
            "{other:?}"
        );
    }

    #[test]
    fn identical_instances_agree_whatever_their_cache_hit_mix() {
        // Same hardware; instance 0 serves mostly cache hits (a few hundred uncached tokens),
        // instance 1 cold prompts. A model without the fixed overhead rates the first several
        // times slower than the second.
        let truth = (20_000.0, 0.1, 30.0);
        let est = RateEstimator::new(RateConfig::default(), 2);
        drive(&est, 0, truth, 400, 2000, 2, 0.2);
        drive(&est, 1, truth, 8000, 2000, 3, 0.2);
        let hot = est.rates(InstanceId(0)).prefill_tokens_per_s;
        let cold = est.rates(InstanceId(1)).prefill_tokens_per_s;
        assert!(
            (hot / cold - 1.0).abs() < 0.35,
            "hot {hot:.0} vs cold {cold:.0} tokens/s"
        );
        assert!((cold / 20_000.0 - 1.0).abs() < 0.2, "cold {cold:.0}");
    }

    #[test]
    fn outliers_move_the_estimate_a_bounded_amount() {
        let est = RateEstimator::new(RateConfig::default(), 1);
        drive(&est, 0, (10_000.0, 0.5, 20.0), 4000, 1000, 4, 0.2);
        let before = est.rates(InstanceId(0)).prefill_tokens_per_s;
        // A 60 s stall on an ordinary request.
        est.observe(InstanceId(0), 2000, 60_000.0, 0, 0);
        let after = est.rates(InstanceId(0)).prefill_tokens_per_s;
        assert!(after > before * 0.8, "{before:.0} → {after:.0}");
    }

    #[test]
    fn estimates_stay_in_range_and_ignore_garbage() {
        let est = RateEstimator::new(RateConfig::default(), 1);
        for _ in 0..1000 {
            est.observe(InstanceId(0), 1000, 1e9, 0, 50);
        }
        let r = est.rates(InstanceId(0));
        assert!(
            r.prefill_tokens_per_s >= 100.0 && r.decode_interference_ms <= 100.0,
            "{r:?}"
        );
        for _ in 0..1000 {
            est.observe(InstanceId(0), 100_000, 1e-6, 0, 0);
        }
        let r = est.rates(InstanceId(0));
        assert!(r.prefill_tokens_per_s <= 1_000_000.0, "{r:?}");
        assert!(r.prefill_tokens_per_s.is_finite() && r.decode_interference_ms >= 0.0);
        let r0 = est.rates(InstanceId(0));
        assert_eq!(est.observe(InstanceId(0), 1000, f64::NAN, 0, 0), r0);
        assert_eq!(est.observe(InstanceId(0), 10, 5.0, 0, 0), r0);
        assert_eq!(
            est.observe(InstanceId(9), 1000, 5.0, 0, 0),
            RateConfig::default().initial()
        );
        est.reset(InstanceId(0));
        let fresh = RateEstimator::new(RateConfig::default(), 1);
        assert_eq!(fresh.rates(InstanceId(0)), RateConfig::default().initial());
    }

    #[test]
    fn decode_interference_stays_as_configured_unless_learned() {
        let est = RateEstimator::new(RateConfig::default(), 1);
        drive(&est, 0, (3_000.0, 2.0, 15.0), 4000, 2000, 5, 0.05);
        let r = est.rates(InstanceId(0));
        assert_eq!(r.decode_interference_ms, 0.5);
        // The prefill rate is still learned (the decode share it mis-attributes is small).
        assert!(
            (r.prefill_tokens_per_s / 3_000.0 - 1.0).abs() < 0.1,
            "{r:?}"
        );
    }

    #[test]
    fn different_hardware_is_told_apart() {
        let est = RateEstimator::new(RateConfig::default(), 2);
        for round in 0..4 {
            drive(&est, 0, (20_000.0, 0.2, 20.0), 6000, 300, 10 + round, 0.1);
            drive(&est, 1, (5_000.0, 0.5, 20.0), 6000, 300, 20 + round, 0.1);
        }
        let fast = est.rates(InstanceId(0)).prefill_tokens_per_s;
        let slow = est.rates(InstanceId(1)).prefill_tokens_per_s;
        assert!((fast / 20_000.0 - 1.0).abs() < 0.25, "fast {fast:.0}");
        assert!((slow / 5_000.0 - 1.0).abs() < 0.25, "slow {slow:.0}");
    }

    #[test]
    fn a_few_slow_first_requests_do_not_mark_an_instance_slow() {
        let est = RateEstimator::new(RateConfig::default(), 3);
        drive(&est, 0, (20_000.0, 0.2, 20.0), 6000, 500, 30, 0.1);
        drive(&est, 1, (20_000.0, 0.2, 20.0), 6000, 500, 31, 0.1);
        // Instance 2's first three requests waited behind work the router did not see.
        for _ in 0..3 {
            est.observe(InstanceId(2), 2000, 900.0, 0, 0);
        }
        let fleet = est.rates(InstanceId(0)).prefill_tokens_per_s;
        let unlucky = est.rates(InstanceId(2)).prefill_tokens_per_s;
        assert!(unlucky > 0.6 * fleet, "{unlucky:.0} vs fleet {fleet:.0}");
        // Independent fits (pool_weight 0) would have condemned it.
        let solo = RateEstimator::new(
            RateConfig {
                pool_weight: 0.0,
                ..RateConfig::default()
            },
            1,
        );
        for _ in 0..3 {
            solo.observe(InstanceId(0), 2000, 900.0, 0, 0);
        }
        assert!(solo.rates(InstanceId(0)).prefill_tokens_per_s < 0.6 * fleet);
    }
}
