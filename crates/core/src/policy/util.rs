//! Shared helpers of the policies: seeded mixing, seeded tie-breaking, decision assembly.
//!
//! Invariants:
//! - Every "random" choice derives from the request's seed through [`mix`], so a decision is a pure
//!   function of its inputs (reproducible in the offline simulator).
//! - Ties are broken by [`tie_key`] (a hash of seed and instance id), never by slice position.

use super::{Candidate, CandidateScore, Decision, Reason};
use crate::InstanceId;

/// SplitMix64 finaliser: a fast, well-distributed 64-bit mix.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Per-request, per-instance ordering key for breaking ties.
pub fn tie_key(seed: u64, id: InstanceId) -> u64 {
    mix(seed ^ mix(u64::from(id.0) ^ 0x7469_6562_7265_616b))
}

/// A uniform float in `[0, 1)` from a 64-bit value.
pub fn unit_f64(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// Index of the lowest score; scores within `eps` of the minimum tie and the tie goes to the
/// lowest [`tie_key`]. `None` for an empty slice. NaN scores never win.
pub fn argmin_seeded(
    candidates: &[Candidate],
    scores: &[f64],
    eps: f64,
    seed: u64,
) -> Option<usize> {
    let min = scores
        .iter()
        .copied()
        .filter(|s| !s.is_nan())
        .fold(f64::INFINITY, f64::min);
    if candidates.is_empty() {
        return None;
    }
    let mut best: Option<(u64, usize)> = None;
    for (i, (c, &s)) in candidates.iter().zip(scores).enumerate() {
        // With no finite/NaN-free score at all, every candidate ties.
        let tied = if min.is_finite() {
            s <= min + eps
        } else {
            true
        };
        if tied {
            let k = tie_key(seed, c.id);
            if best.is_none_or(|(bk, _)| k < bk) {
                best = Some((k, i));
            }
        }
    }
    best.map(|(_, i)| i)
}

/// Index of the highest score, ties (within `eps`) broken by [`tie_key`].
pub fn argmax_seeded(
    candidates: &[Candidate],
    scores: &[f64],
    eps: f64,
    seed: u64,
) -> Option<usize> {
    let neg: Vec<f64> = scores.iter().map(|s| -s).collect();
    argmin_seeded(candidates, &neg, eps, seed)
}

/// Builds a [`Decision`] choosing `candidates[chosen]`, with `scores` listed in candidate order.
pub fn decision(
    candidates: &[Candidate],
    chosen: usize,
    scores: &[f64],
    predicted_cost_ms: f64,
    reason: Reason,
) -> Decision {
    let reason = if candidates.len() == 1 {
        Reason::OnlyCandidate
    } else {
        reason
    };
    Decision {
        chosen: candidates[chosen].id,
        matched_blocks: candidates[chosen].matched.total(),
        predicted_cost_ms,
        reason,
        scores: candidates
            .iter()
            .zip(scores)
            .map(|(c, &score)| CandidateScore {
                id: c.id,
                score,
                matched_blocks: c.matched.total(),
            })
            .collect(),
    }
}

/// Router-tracked requests still waiting for their first token.
pub fn prefilling(c: &Candidate) -> u32 {
    c.load.in_flight.saturating_sub(c.load.decoding)
}

#[cfg(test)]
pub(crate) mod testing {
    //! Candidate builders for policy unit tests.
    use crate::index::InstanceMatch;
    use crate::load::{DecodeRates, InstanceRates, RouterLoad};
    use crate::policy::{Candidate, RouteRequest};
    use crate::InstanceId;

    pub fn cand(id: u32, gpu_blocks: u32, pending: u64, in_flight: u32) -> Candidate {
        Candidate {
            id: InstanceId(id),
            matched: InstanceMatch {
                instance: InstanceId(id),
                gpu: gpu_blocks,
                cpu: 0,
                disk: 0,
                fresh: 0,
            },
            load: RouterLoad {
                in_flight,
                pending_prefill_tokens: pending,
                decoding: 0,
                ..RouterLoad::default()
            },
            engine: None,
            rates: InstanceRates {
                prefill_tokens_per_s: 10_000.0,
                decode_interference_ms: 1.0,
            },
            decode: DecodeRates {
                step_ms: 10.0,
                per_seq_ms: 0.1,
                per_kctx_ms: 0.05,
            },
            cache_capacity_blocks: None,
        }
    }

    pub fn req<'a>(hashes: &'a [u64], text: &'a [u8], seed: u64) -> RouteRequest<'a> {
        RouteRequest {
            hashes,
            tokens_per_block: 16,
            prompt_tokens: (hashes.len() as u32) * 16,
            expected_output_tokens: 100,
            kv_block_tokens: 16,
            text,
            seed,
            concurrent_decisions: 0.0,
            now: 0,
        }
    }
}
