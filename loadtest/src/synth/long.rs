//! Mostly unrelated long prompts with mixed output lengths, and a little reuse that grows.
//!
//! The shape on which cache-aware routing has least to gain and most to lose: prompts are long
//! (heavy-tailed, mean ~12K tokens), most of them share nothing, and outputs range from a token to
//! several hundred, so prefill time dominates and decode batches are uneven. A small and growing
//! fraction of requests does reuse an earlier prompt, either by continuing it (the earlier prompt,
//! its answer and a follow-up: a second turn) or by putting a new question after its document
//! (the earlier prompt's first segment). The reuse fraction goes linearly from `reuse_start` at
//! the first request to `reuse_end` at the last.
//!
//! Lengths are truncated lognormals (drawn again while above the maximum, so there is no spike at
//! the bound): inputs with median `input_median_tokens` and shape `input_sigma` below
//! `input_max_tokens`, outputs with median `output_median_tokens` and shape `output_sigma` below
//! `output_max_tokens`, both at least 1. With the defaults the fresh prompts' mean is ~12.0K
//! tokens (the untruncated mean `median · e^(σ²/2)` is 12.5K; truncation at 130K removes 0.3 % of
//! draws and ~4 % of the mean), the outputs' median ~168 and mean ~210 tokens.
//!
//! Invariants: requests arrive as a Poisson process at `rate`, in order; a reusing request only
//! refers to one of the `reuse_window` requests before it, so its shared prefix was seen earlier;
//! no prompt exceeds `input_max_tokens` (a reuse that would is drawn again from another earlier
//! request, and after [`REUSE_TRIES`] misses the request is a fresh one); the whole trace is a
//! pure function of the parameters and the seed.

use std::collections::VecDeque;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::{around, check_rate, next_arrival, Draft, SegIds, Segment, SynthError};

/// Earlier requests tried for a reuse before the request is made a fresh one.
pub const REUSE_TRIES: usize = 8;
/// Draws of a truncated lognormal before falling back to the bound itself.
const TRUNCATED_TRIES: usize = 64;

/// Parameters (lengths in tokens).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LongParams {
    /// Number of requests.
    pub requests: usize,
    /// Arrival rate, requests per second (Poisson).
    pub rate: f64,
    /// Median prompt length of a fresh request (the lognormal's `e^μ`).
    pub input_median_tokens: u32,
    /// Shape of the prompt-length lognormal (σ of its logarithm).
    pub input_sigma: f64,
    /// Longest prompt; the default leaves room for the longest output within the presets'
    /// 131,072-token `max_model_len`, so no request is refused for its length.
    pub input_max_tokens: u32,
    /// Median output length (before truncation).
    pub output_median_tokens: u32,
    /// Shape of the output-length lognormal.
    pub output_sigma: f64,
    /// Longest output.
    pub output_max_tokens: u32,
    /// Fraction of requests reusing an earlier prompt, at the first request.
    pub reuse_start: f64,
    /// Fraction of requests reusing an earlier prompt, at the last request.
    pub reuse_end: f64,
    /// Of the reusing requests, the fraction that continue an earlier prompt (the rest put a new
    /// question after an earlier prompt's document).
    pub continue_share: f64,
    /// Mean follow-up appended by a continuation (uniform in `[mean/2, 3·mean/2]`).
    pub followup_tokens: u32,
    /// Mean question put after a shared document (uniform in `[mean/2, 3·mean/2]`).
    pub question_tokens: u32,
    /// A reusing request picks uniformly among this many requests before it.
    pub reuse_window: usize,
}

impl Default for LongParams {
    fn default() -> Self {
        LongParams {
            requests: 1000,
            rate: 3.0,
            input_median_tokens: 7_200,
            input_sigma: 1.05,
            input_max_tokens: 130_000,
            output_median_tokens: 170,
            output_sigma: 0.75,
            output_max_tokens: 850,
            reuse_start: 0.10,
            reuse_end: 0.30,
            continue_share: 0.5,
            followup_tokens: 600,
            question_tokens: 300,
            reuse_window: 300,
        }
    }
}

/// What the generator remembers of an earlier request.
struct Earlier {
    segments: Vec<Segment>,
    answer: Segment,
}

impl LongParams {
    fn validate(&self) -> Result<(), SynthError> {
        check_rate(self.rate)?;
        let bad = |m: String| Err(SynthError::Parameter(m));
        for (name, s) in [
            ("input_sigma", self.input_sigma),
            ("output_sigma", self.output_sigma),
        ] {
            if !(s.is_finite() && (0.0..=5.0).contains(&s)) {
                return bad(format!("{name} must be in [0, 5], got {s}"));
            }
        }
        for (name, f) in [
            ("reuse_start", self.reuse_start),
            ("reuse_end", self.reuse_end),
            ("continue_share", self.continue_share),
        ] {
            if !(f.is_finite() && (0.0..=1.0).contains(&f)) {
                return bad(format!("{name} must be in [0, 1], got {f}"));
            }
        }
        for (name, v) in [
            ("input_median_tokens", self.input_median_tokens),
            ("input_max_tokens", self.input_max_tokens),
            ("output_median_tokens", self.output_median_tokens),
            ("output_max_tokens", self.output_max_tokens),
        ] {
            if v == 0 {
                return bad(format!("{name} must be at least 1"));
            }
        }
        if self.input_max_tokens > super::MAX_PROMPT_TOKENS {
            return bad(format!(
                "input_max_tokens must be at most {}",
                super::MAX_PROMPT_TOKENS
            ));
        }
        if self.reuse_window == 0 {
            return bad("reuse_window must be at least 1".into());
        }
        Ok(())
    }

    /// Reuse fraction at request `i` of `n`.
    fn reuse_at(&self, i: usize, n: usize) -> f64 {
        if n <= 1 {
            return self.reuse_start;
        }
        let x = i as f64 / (n - 1) as f64;
        self.reuse_start + (self.reuse_end - self.reuse_start) * x
    }

    pub(crate) fn drafts(&self, seed: u64, ns: u8) -> Result<Vec<Draft>, SynthError> {
        self.validate()?;
        let n = self.requests.min(super::MAX_REQUESTS + 1);
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut ids = SegIds::new(ns);
        // Only the window a reuse can pick from is kept.
        let mut earlier: VecDeque<Earlier> = VecDeque::with_capacity(self.reuse_window.min(n));
        let mut out = Vec::with_capacity(n);
        let mut t = 0.0;
        for i in 0..n {
            t = next_arrival(&mut rng, t, self.rate);
            let output = truncated_lognormal(
                &mut rng,
                self.output_median_tokens,
                self.output_sigma,
                self.output_max_tokens,
            );
            let reuse = !earlier.is_empty() && rng.gen::<f64>() < self.reuse_at(i, n);
            let segments = if reuse {
                self.reuse(&mut rng, &mut ids, &earlier)
            } else {
                None
            }
            .unwrap_or_else(|| {
                let len = truncated_lognormal(
                    &mut rng,
                    self.input_median_tokens,
                    self.input_sigma,
                    self.input_max_tokens,
                );
                vec![(ids.fresh(), len)]
            });
            if earlier.len() == self.reuse_window {
                earlier.pop_front();
            }
            earlier.push_back(Earlier {
                segments: segments.clone(),
                answer: (ids.fresh(), output),
            });
            out.push(Draft {
                timestamp_ms: t as u64,
                segments,
                output_length: output,
            });
        }
        Ok(out)
    }

    /// Segments of a request reusing one of the `earlier` requests (the last `reuse_window`,
    /// at least one), or `None` when every try would exceed the longest prompt.
    fn reuse(
        &self,
        rng: &mut SmallRng,
        ids: &mut SegIds,
        earlier: &VecDeque<Earlier>,
    ) -> Option<Vec<Segment>> {
        let continues = rng.gen::<f64>() < self.continue_share;
        for _ in 0..REUSE_TRIES {
            let parent = earlier.get(rng.gen_range(0..earlier.len()))?;
            let segments = if continues {
                let mut s = parent.segments.clone();
                s.push(parent.answer);
                s.push((ids.fresh(), around(rng, self.followup_tokens)));
                s
            } else {
                // A prompt's first segment is its document (a fresh prompt is all document).
                let doc = *parent.segments.first()?;
                vec![doc, (ids.fresh(), around(rng, self.question_tokens))]
            };
            if total(&segments) <= self.input_max_tokens {
                return Some(segments);
            }
        }
        None
    }
}

fn total(segments: &[Segment]) -> u32 {
    segments
        .iter()
        .map(|s| s.1)
        .fold(0u32, |a, b| a.saturating_add(b))
}

/// A lognormal length with median `median` and shape `sigma`, drawn again while above `max`
/// (after [`TRUNCATED_TRIES`] draws, `max` itself), at least 1.
fn truncated_lognormal(rng: &mut SmallRng, median: u32, sigma: f64, max: u32) -> u32 {
    let mu = f64::from(median.max(1)).ln();
    for _ in 0..TRUNCATED_TRIES {
        let x = (mu + sigma * standard_normal(rng)).exp().round();
        if x <= f64::from(max) {
            return (x as u32).max(1);
        }
    }
    max.max(1)
}

/// One standard normal draw (Box–Muller; `1 - u` keeps the logarithm finite).
fn standard_normal(rng: &mut SmallRng) -> f64 {
    let u1: f64 = 1.0 - rng.gen::<f64>();
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::Workload;
    use crate::trace::Trace;

    fn generate(p: &LongParams, seed: u64) -> Trace {
        Workload::Long(p.clone())
            .generate(seed, 512)
            .expect("valid parameters")
    }

    /// Which requests share a leading full block with an earlier request.
    fn reusing(t: &Trace) -> Vec<bool> {
        let mut seen = ahash::AHashSet::new();
        t.requests
            .iter()
            .map(|r| {
                let hit = r.full_blocks(t.block_tokens) > 0 && seen.contains(&r.hash_ids[0]);
                seen.extend(r.hash_ids.iter().copied());
                hit
            })
            .collect()
    }

    fn fraction(v: &[bool]) -> f64 {
        v.iter().filter(|&&b| b).count() as f64 / v.len().max(1) as f64
    }

    fn median(mut v: Vec<u32>) -> u32 {
        v.sort_unstable();
        v[v.len() / 2]
    }

    /// Checks the distribution against the documented targets. Tolerances are about three
    /// standard errors at `n` requests (input mean ±4 % per 1,000 requests → ±10 %; medians
    /// ±3–4 % → ±10–12 %; reuse fractions ±1.3–1.9 points → ±4–5 points), scaled by √(1000/n).
    fn check_shape(t: &Trace, n: usize) {
        let s = t.stats();
        assert_eq!(s.requests, n);
        let k = (1000.0 / n as f64).sqrt();
        let inputs: Vec<u32> = t.requests.iter().map(|r| r.input_length).collect();
        let outputs: Vec<u32> = t.requests.iter().map(|r| r.output_length).collect();
        let near = |v: f64, target: f64, tol: f64| (v / target - 1.0).abs() <= tol * k;
        assert!(
            near(s.input_mean, 12_000.0, 0.10),
            "input mean {}",
            s.input_mean
        );
        let m_in = median(inputs.clone());
        assert!(near(f64::from(m_in), 7_300.0, 0.12), "input median {m_in}");
        let max_in = inputs.iter().copied().max().unwrap_or(0);
        assert!((100_000..=130_000).contains(&max_in), "input max {max_in}");
        let m_out = median(outputs.clone());
        assert!(near(f64::from(m_out), 168.0, 0.10), "output median {m_out}");
        let (min_out, max_out) = (
            outputs.iter().copied().min().unwrap_or(0),
            outputs.iter().copied().max().unwrap_or(0),
        );
        assert!((1..=40).contains(&min_out), "output min {min_out}");
        assert!((700..=850).contains(&max_out), "output max {max_out}");
        // Reuse: 10 % → 30 %, so 15 % expected over the first half and 25 % over the second;
        // a few reuses share less than a block (parents under 512 tokens) or fall back to fresh.
        let r = reusing(t);
        let (early, late) = r.split_at(n / 2);
        let (all, e, l) = (fraction(&r), fraction(early), fraction(late));
        assert!((all - 0.195).abs() <= 0.04 * k, "reuse {all}");
        assert!((e - 0.145).abs() <= 0.05 * k, "early reuse {e}");
        assert!((l - 0.245).abs() <= 0.05 * k, "late reuse {l}");
        assert!(l > e, "reuse grows: {e} → {l}");
        // Poisson arrivals at 3/s.
        let rate = s.mean_rate;
        assert!((rate / 3.0 - 1.0).abs() <= 0.1 * k, "rate {rate}");
    }

    #[test]
    fn defaults_have_the_documented_shape() {
        let p = LongParams::default();
        let t = generate(&p, 1);
        check_shape(&t, p.requests);
        assert_eq!(t, generate(&p, 1), "same seed, same trace");
        assert_ne!(t, generate(&p, 2));
    }

    #[test]
    fn other_seeds_have_the_same_shape() {
        let p = LongParams {
            requests: 4000,
            ..LongParams::default()
        };
        for seed in [2, 3, 17, 12_345] {
            check_shape(&generate(&p, seed), p.requests);
        }
    }

    #[test]
    fn continuations_carry_the_whole_earlier_prompt() {
        let p = LongParams {
            requests: 400,
            reuse_start: 0.5,
            reuse_end: 0.5,
            continue_share: 1.0,
            ..LongParams::default()
        };
        let t = generate(&p, 5);
        let r = reusing(&t);
        assert!(fraction(&r) > 0.4, "{}", fraction(&r));
        for (i, req) in t.requests.iter().enumerate().filter(|(i, _)| r[*i]) {
            // Some earlier request's full blocks are all a prefix of this one.
            let parent_full = t.requests[..i].iter().any(|e| {
                let full = e.full_blocks(t.block_tokens);
                full > 0 && req.hash_ids.len() > full && req.hash_ids[..full] == e.hash_ids[..full]
            });
            assert!(parent_full, "request {i} does not extend an earlier prompt");
            assert!(req.input_length <= p.input_max_tokens);
        }
    }

    #[test]
    fn no_reuse_means_unrelated_prompts() {
        let p = LongParams {
            requests: 300,
            reuse_start: 0.0,
            reuse_end: 0.0,
            ..LongParams::default()
        };
        let t = generate(&p, 9);
        assert_eq!(fraction(&reusing(&t)), 0.0);
        assert_eq!(t.stats().infinite_hit_ratio_tokens, 0.0);
    }

    #[test]
    fn bad_parameters_are_refused() {
        for p in [
            LongParams {
                reuse_end: 1.5,
                ..LongParams::default()
            },
            LongParams {
                input_sigma: f64::NAN,
                ..LongParams::default()
            },
            LongParams {
                output_max_tokens: 0,
                ..LongParams::default()
            },
            LongParams {
                rate: 0.0,
                ..LongParams::default()
            },
            LongParams {
                reuse_window: 0,
                ..LongParams::default()
            },
        ] {
            assert!(Workload::Long(p).generate(1, 512).is_err());
        }
        let parsed: Result<Workload, _> =
            serde_json::from_str(r#"{"kind":"long","requests":10,"reuse_ends":0.2}"#);
        assert!(parsed.is_err(), "unknown fields are refused");
        let parsed: Workload =
            serde_json::from_str(r#"{"kind":"long","requests":10,"rate":5}"#).expect("json");
        assert_eq!(parsed.generate(1, 512).expect("trace").requests.len(), 10);
    }
}
