//! Per-instance decode speed, learned from the inter-token timing of streamed responses.
//!
//! Model: one decode step produces a token for every decoding sequence, and its duration is
//!
//! ```text
//! tpot_ms ≈ step_ms + per_seq_ms · seqs + per_kctx_ms · context_ktok
//! ```
//!
//! where `seqs` is the number of sequences decoding on the instance and `context_ktok` their total
//! context in thousands of tokens: a step reads the weights once (`step_ms`), does per-sequence
//! work, and reads every sequence's KV cache (memory-bandwidth-bound, so proportional to the
//! context). This is what a request's arrival does to the sequences already decoding there: each
//! of their steps grows by `per_seq_ms + per_kctx_ms · its own context`.
//!
//! Fit: the same regression as the prefill rates ([`super::fit`]): least squares with exponential
//! forgetting, clipped residuals, per-instance fits anchored on a fleet-wide one (`pool_weight`),
//! so hardware that decodes slower departs from the fleet as its own evidence accumulates. One
//! observation per finished stream: its mean inter-token time against the batch it decoded in,
//! after the caller has taken out the prefill stalls it sat through (the router's own prefills on
//! the instance meanwhile, at the learned prefill rate: `Router::observe_finish`). The model is of
//! decode steps alone; what a prefill does to the sequences beside it is priced per prefill.
//!
//! Invariants: pure (no clock); bounded (one entry per instance, ids beyond
//! [`crate::index::MAX_INSTANCES`] ignored); rates always finite, non-negative and bounded.

use super::fit::{clamp, Fit, Fits, Learning, Shape};
use crate::InstanceId;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

/// Starting values and bounds of the decode-rate estimator (`[routing.decode_rates]`).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DecodeRateConfig {
    /// Starting fixed cost of one decode step, ms (weights read once, launch). Default 10.
    pub step_ms: f64,
    /// Starting cost per decoding sequence per step, ms. Default 0.1.
    pub per_seq_ms: f64,
    /// Starting cost per thousand context tokens of the decoding sequences per step, ms
    /// (reading their KV cache). Default 0.05.
    pub per_kctx_ms: f64,
    /// Forgetting factor in (0.5, 1]: the weight an observation keeps per newer one. Default
    /// 0.998 (about the last 500 streams).
    pub forgetting: f64,
    /// Residuals beyond this many running mean absolute residuals are clipped. Default 3.
    pub outlier_clip: f64,
    /// Weight, in observations, of the fleet-wide estimate in each instance's own. Default 100.
    pub pool_weight: f64,
    /// Streams with fewer output tokens than this are not observed (too few gaps to time).
    /// Default 4.
    pub min_output_tokens: u32,
    /// Upper bound of the step cost, ms. Default 10 000.
    pub max_step_ms: f64,
    /// Upper bound of the per-sequence cost, ms. Default 1 000.
    pub max_per_seq_ms: f64,
    /// Upper bound of the per-thousand-context-tokens cost, ms. Default 100.
    pub max_per_kctx_ms: f64,
}

impl Default for DecodeRateConfig {
    fn default() -> Self {
        Self {
            step_ms: 10.0,
            per_seq_ms: 0.1,
            per_kctx_ms: 0.05,
            forgetting: 0.998,
            outlier_clip: 3.0,
            pool_weight: 100.0,
            min_output_tokens: 4,
            max_step_ms: 10_000.0,
            max_per_seq_ms: 1_000.0,
            max_per_kctx_ms: 100.0,
        }
    }
}

/// An invalid `[routing.decode_rates]` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("routing.decode_rates.{field} {requirement}")]
pub struct InvalidDecodeRate {
    /// The field.
    pub field: &'static str,
    /// What it must be.
    pub requirement: &'static str,
}

impl DecodeRateConfig {
    /// Checks every value is finite and in range.
    pub fn validate(&self) -> Result<(), InvalidDecodeRate> {
        let non_negative = [
            ("step_ms", self.step_ms),
            ("per_seq_ms", self.per_seq_ms),
            ("per_kctx_ms", self.per_kctx_ms),
            ("outlier_clip", self.outlier_clip),
            ("pool_weight", self.pool_weight),
            ("max_step_ms", self.max_step_ms),
            ("max_per_seq_ms", self.max_per_seq_ms),
            ("max_per_kctx_ms", self.max_per_kctx_ms),
        ];
        for (field, v) in non_negative {
            if !(v.is_finite() && v >= 0.0) {
                return Err(InvalidDecodeRate {
                    field,
                    requirement: "must be finite and >= 0",
                });
            }
        }
        if !(self.forgetting > 0.5 && self.forgetting <= 1.0) {
            return Err(InvalidDecodeRate {
                field: "forgetting",
                requirement: "must be in (0.5, 1]",
            });
        }
        Ok(())
    }

    fn shape(&self) -> Shape {
        Shape {
            prior_feature_scale: [1.0, 1.0, 1.0],
            lo: [0.0; 3],
            hi: [
                self.max_step_ms,
                self.max_per_seq_ms * SEQ_SCALE,
                self.max_per_kctx_ms * KCTX_SCALE,
            ],
        }
    }

    fn configured_theta(&self) -> [f64; 3] {
        let s = self.shape();
        [
            clamp(self.step_ms, 0.0, s.hi[0]),
            clamp(self.per_seq_ms * SEQ_SCALE, 0.0, s.hi[1]),
            clamp(self.per_kctx_ms * KCTX_SCALE, 0.0, s.hi[2]),
        ]
    }

    /// The starting rates, clamped into range.
    pub fn initial(&self) -> DecodeRates {
        rates_of(&self.configured_theta())
    }
}

/// Scale of the sequence feature (sequences / 8), so the features have similar magnitudes.
const SEQ_SCALE: f64 = 8.0;
/// Scale of the context feature (tokens / 64K).
const KCTX_SCALE: f64 = 64.0;

fn rates_of(theta: &[f64; 3]) -> DecodeRates {
    DecodeRates {
        step_ms: theta[0].max(0.0),
        per_seq_ms: (theta[1] / SEQ_SCALE).max(0.0),
        per_kctx_ms: (theta[2] / KCTX_SCALE).max(0.0),
    }
}

/// Decode speed of one instance.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct DecodeRates {
    /// Fixed cost of one decode step, ms.
    pub step_ms: f64,
    /// Cost per decoding sequence per step, ms.
    pub per_seq_ms: f64,
    /// Cost per thousand context tokens of the decoding sequences per step, ms.
    pub per_kctx_ms: f64,
}

impl Default for DecodeRates {
    fn default() -> Self {
        DecodeRateConfig::default().initial()
    }
}

impl DecodeRates {
    /// Predicted time per output token with `seqs` sequences of `context_tokens` in total
    /// decoding, ms.
    pub fn tpot_ms(&self, seqs: f64, context_tokens: f64) -> f64 {
        self.step_ms
            + self.per_seq_ms * seqs.max(0.0)
            + self.per_kctx_ms * context_tokens.max(0.0) / 1000.0
    }

    /// What one more sequence of `context_tokens` adds to every decode step, ms.
    pub fn added_per_step_ms(&self, context_tokens: f64) -> f64 {
        self.per_seq_ms + self.per_kctx_ms * context_tokens.max(0.0) / 1000.0
    }
}

/// One finished stream's decode, as the router saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DecodeObservation {
    /// Output tokens (or stream events) after the first.
    pub gaps: u32,
    /// Time from the first to the last token, ms.
    pub decode_ms: f64,
    /// Mean number of sequences decoding on the instance while it decoded (itself included).
    pub seqs: f64,
    /// Mean total context of those sequences, tokens.
    pub context_tokens: f64,
}

/// A read-locked view of a [`DecodeEstimator`]'s estimates.
pub struct DecodeView<'a> {
    state: parking_lot::RwLockReadGuard<'a, Fits>,
}

impl DecodeView<'_> {
    /// Current estimate of `instance` (the pool's for unknown instances).
    pub fn rates(&self, instance: InstanceId) -> DecodeRates {
        rates_of(&self.state.get(instance.index()).theta)
    }
}

/// Learned decode speeds of a fleet. `Send + Sync`.
#[derive(Debug)]
pub struct DecodeEstimator {
    cfg: DecodeRateConfig,
    state: RwLock<Fits>,
}

impl DecodeEstimator {
    /// Estimates for `instances` instances, all at the configured values.
    pub fn new(cfg: DecodeRateConfig, instances: usize) -> Self {
        let theta = cfg.configured_theta();
        let pool = Fit::prior(theta, &cfg.shape(), theta[0].max(1.0));
        let n = instances.min(crate::index::MAX_INSTANCES);
        Self {
            state: RwLock::new(Fits::new(pool, n)),
            cfg,
        }
    }

    /// Current estimate of `instance` (the pool's for unknown instances).
    pub fn rates(&self, instance: InstanceId) -> DecodeRates {
        rates_of(&self.state.read().get(instance.index()).theta)
    }

    /// The estimates as they stand, for several reads under one lock acquisition (a routing
    /// decision reads every candidate's). Observations wait while a view is held.
    pub fn view(&self) -> DecodeView<'_> {
        DecodeView {
            state: self.state.read(),
        }
    }

    /// Forgets what was learned about `instance`: it starts again from the pool's estimate.
    pub fn reset(&self, instance: InstanceId) {
        self.state.write().reset(instance.index());
    }

    /// Learns from one finished stream on `instance`. Returns the updated estimate.
    pub fn observe(&self, instance: InstanceId, o: DecodeObservation) -> DecodeRates {
        let cfg = &self.cfg;
        if o.gaps + 1 < cfg.min_output_tokens.max(2)
            || !o.decode_ms.is_finite()
            || o.decode_ms <= 0.0
            || !o.seqs.is_finite()
            || !o.context_tokens.is_finite()
        {
            return self.rates(instance);
        }
        let tpot = o.decode_ms / f64::from(o.gaps.max(1));
        let x = [
            1.0,
            o.seqs.max(1.0) / SEQ_SCALE,
            o.context_tokens.max(0.0) / 1000.0 / KCTX_SCALE,
        ];
        let learning = Learning {
            shape: cfg.shape(),
            configured: cfg.configured_theta(),
            forgetting: cfg.forgetting,
            outlier_clip: cfg.outlier_clip,
            pool_weight: cfg.pool_weight,
        };
        let mut fits = self.state.write();
        match fits.learn(instance.index(), &learning, x, tpot) {
            Some(f) => rates_of(&f.theta),
            None => cfg.initial(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::util::mix;

    /// Streams on an instance whose true step model is `truth`, with ±`noise` multiplicative
    /// noise, over batches of 1–48 sequences of 1K–40K context each.
    fn drive(est: &DecodeEstimator, id: u32, truth: DecodeRates, n: u64, seed: u64, noise: f64) {
        for k in 0..n {
            let h = mix(k ^ seed.rotate_left(23));
            let seqs = 1 + (h % 48) as u32;
            let per_seq_ctx = 1000 + mix(h ^ 7) % 39_000;
            let ctx = f64::from(seqs) * per_seq_ctx as f64;
            let gaps = 10 + (mix(h ^ 11) % 500) as u32;
            let jitter = 1.0 + noise * ((mix(h ^ 13) % 1001) as f64 / 500.0 - 1.0);
            let tpot = truth.tpot_ms(f64::from(seqs), ctx) * jitter;
            est.observe(
                InstanceId(id),
                DecodeObservation {
                    gaps,
                    decode_ms: tpot * f64::from(gaps),
                    seqs: f64::from(seqs),
                    context_tokens: ctx,
                },
            );
        }
    }

    fn near(a: f64, b: f64, rel: f64) -> bool {
        (a / b - 1.0).abs() < rel
    }

    #[test]
    fn converges_to_the_true_step_model() {
        let truth = DecodeRates {
            step_ms: 9.0,
            per_seq_ms: 0.1,
            per_kctx_ms: 0.065,
        };
        let est = DecodeEstimator::new(DecodeRateConfig::default(), 2);
        drive(&est, 0, truth, 3000, 1, 0.05);
        let r = est.rates(InstanceId(0));
        assert!(near(r.step_ms, 9.0, 0.1), "{r:?}");
        assert!(near(r.per_kctx_ms, 0.065, 0.1), "{r:?}");
        // A predicted step of a busy batch is right within a few percent.
        assert!(near(
            r.tpot_ms(32.0, 400_000.0),
            truth.tpot_ms(32.0, 400_000.0),
            0.05
        ));
        // The other instance, with no history, is scored like the fleet.
        let other = est.rates(InstanceId(1));
        assert!(near(
            other.tpot_ms(32.0, 400_000.0),
            truth.tpot_ms(32.0, 400_000.0),
            0.15
        ));
    }

    #[test]
    fn slower_hardware_is_told_apart() {
        let fast = DecodeRates {
            step_ms: 9.0,
            per_seq_ms: 0.1,
            per_kctx_ms: 0.065,
        };
        let slow = DecodeRates {
            step_ms: 18.0,
            per_seq_ms: 0.2,
            per_kctx_ms: 0.13,
        };
        let est = DecodeEstimator::new(DecodeRateConfig::default(), 2);
        for round in 0..4 {
            drive(&est, 0, fast, 300, 10 + round, 0.1);
            drive(&est, 1, slow, 300, 20 + round, 0.1);
        }
        let f = est.rates(InstanceId(0)).tpot_ms(16.0, 200_000.0);
        let s = est.rates(InstanceId(1)).tpot_ms(16.0, 200_000.0);
        assert!(near(f, fast.tpot_ms(16.0, 200_000.0), 0.15), "{f}");
        assert!(near(s, slow.tpot_ms(16.0, 200_000.0), 0.15), "{s}");
    }

    #[test]
    fn garbage_is_ignored_and_estimates_stay_bounded() {
        let est = DecodeEstimator::new(DecodeRateConfig::default(), 1);
        let r0 = est.rates(InstanceId(0));
        let bad = [
            DecodeObservation {
                gaps: 1,
                decode_ms: 10.0,
                seqs: 1.0,
                context_tokens: 10.0,
            },
            DecodeObservation {
                gaps: 100,
                decode_ms: f64::NAN,
                seqs: 1.0,
                context_tokens: 10.0,
            },
            DecodeObservation {
                gaps: 100,
                decode_ms: 1000.0,
                seqs: f64::INFINITY,
                context_tokens: 10.0,
            },
        ];
        for o in bad {
            assert_eq!(est.observe(InstanceId(0), o), r0);
        }
        for _ in 0..2000 {
            est.observe(
                InstanceId(0),
                DecodeObservation {
                    gaps: 100,
                    decode_ms: 1e12,
                    seqs: 3.0,
                    context_tokens: 5000.0,
                },
            );
        }
        let r = est.rates(InstanceId(0));
        let cfg = DecodeRateConfig::default();
        assert!(
            r.step_ms <= cfg.max_step_ms && r.per_seq_ms <= cfg.max_per_seq_ms,
            "{r:?}"
        );
        assert!(
            r.per_kctx_ms <= cfg.max_per_kctx_ms && r.per_kctx_ms >= 0.0,
            "{r:?}"
        );
        // Unknown instances read the pool's estimate and learn nothing.
        let fresh = DecodeEstimator::new(cfg.clone(), 1);
        assert_eq!(fresh.rates(InstanceId(5)), cfg.initial());
        assert!(cfg.validate().is_ok());
        let bad = DecodeRateConfig {
            forgetting: 0.2,
            ..cfg
        };
        assert_eq!(bad.validate().map_err(|e| e.field), Err("forgetting"));
    }
}
