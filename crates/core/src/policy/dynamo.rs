//! `dynamo_cost`: NVIDIA Dynamo's KV-router cost, in KV blocks; lowest wins.
//!
//! ```text
//! cost_c = prefill_load_scale × (queued_blocks_c + max(request_blocks − overlap_credits_c, 0))
//!          + decode_blocks_c
//! overlap_credits_c = gpu·1.0 + cpu·0.75 + disk·0.25       (configurable)
//! ```
//!
//! `queued_blocks_c` is the router-tracked pending prefill in blocks; `decode_blocks_c` is the
//! engine's KV usage × capacity when fresh and known, else decoding sequences ×
//! `blocks_per_decoding_seq`. Temperature 0 takes the argmin (seeded ties); above 0, costs are
//! min–max normalised and an instance is sampled from `softmax(−normalised / temperature)` with the
//! request's seed.

use super::config::DynamoParams;
use super::util::{argmin_seeded, decision, mix, unit_f64};
use super::{Candidate, Decision, Policy, Reason, RouteRequest};

/// Dynamo-style block cost.
#[derive(Clone, Debug, Default)]
pub struct DynamoCost {
    params: DynamoParams,
}

impl DynamoCost {
    /// A policy with these parameters.
    pub fn new(params: DynamoParams) -> Self {
        Self { params }
    }

    fn cost(&self, req: &RouteRequest<'_>, c: &Candidate) -> f64 {
        let p = &self.params;
        let tpb = f64::from(req.tokens_per_block.max(1));
        let request_blocks = (f64::from(req.prompt_tokens) / tpb).ceil();
        let credits = f64::from(c.matched.gpu) * p.gpu_credit
            + f64::from(c.matched.cpu) * p.cpu_credit
            + f64::from(c.matched.disk) * p.disk_credit;
        let queued_blocks = c.load.pending_prefill_tokens as f64 / tpb;
        let decode_blocks = match (c.engine.filter(|e| !e.stale), c.cache_capacity_blocks) {
            (Some(e), Some(cap)) => f64::from(e.kv_usage.clamp(0.0, 1.0)) * cap as f64,
            _ => f64::from(c.load.decoding) * p.blocks_per_decoding_seq,
        };
        p.prefill_load_scale * (queued_blocks + (request_blocks - credits).max(0.0)) + decode_blocks
    }
}

impl Policy for DynamoCost {
    fn reads_text(&self) -> bool {
        false
    }
    fn name(&self) -> &'static str {
        "dynamo_cost"
    }
    fn decide(&self, req: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<Decision> {
        if candidates.is_empty() {
            return None;
        }
        let scores: Vec<f64> = candidates.iter().map(|c| self.cost(req, c)).collect();
        let t = self.params.temperature;
        let i = if t > 0.0 {
            sample_softmax(&scores, t, req.seed)
        } else {
            argmin_seeded(candidates, &scores, 1e-9, req.seed)?
        };
        let reason = if candidates[i].matched.total() > 0 {
            Reason::CacheMatch
        } else {
            Reason::LowestCost
        };
        Some(decision(candidates, i, &scores, 0.0, reason))
    }
}

/// Samples an index from `softmax(−normalised_cost / temperature)` using `seed`.
fn sample_softmax(costs: &[f64], temperature: f64, seed: u64) -> usize {
    let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
    let max = costs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let span = if max > min { max - min } else { 1.0 };
    let weights: Vec<f64> = costs
        .iter()
        .map(|c| (-((c - min) / span) / temperature).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut x = unit_f64(mix(seed ^ 0xd1a0)) * total;
    for (i, w) in weights.iter().enumerate() {
        if x < *w {
            return i;
        }
        x -= w;
    }
    costs.len() - 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::util::testing::{cand, req};

    #[test]
    fn overlap_credit_and_load() {
        let p = DynamoCost::default();
        let h = [1u64; 10];
        // 10-block request: instance 0 holds 8 blocks but has 16 blocks queued; instance 1 empty.
        let cs = vec![cand(0, 8, 16 * 16, 1), cand(1, 0, 0, 0)];
        let d = p.decide(&req(&h, b"", 1), &cs);
        assert_eq!(d.as_ref().map(|d| d.chosen.0), Some(1));
        assert_eq!(d.map(|d| d.scores[0].score), Some(16.0 + 2.0));
        let cs = vec![cand(0, 8, 4 * 16, 1), cand(1, 0, 0, 0)];
        assert_eq!(p.decide(&req(&h, b"", 1), &cs).map(|d| d.chosen.0), Some(0));
    }

    #[test]
    fn temperature_samples_by_seed() {
        let p = DynamoCost::new(DynamoParams {
            temperature: 1.0,
            ..Default::default()
        });
        let h = [1u64; 10];
        let cs = vec![cand(0, 10, 0, 0), cand(1, 0, 0, 0)];
        let picks: Vec<u32> = (0..400)
            .filter_map(|s| p.decide(&req(&h, b"", s), &cs))
            .map(|d| d.chosen.0)
            .collect();
        let zeros = picks.iter().filter(|&&c| c == 0).count();
        // softmax([0, -1]) = [0.73, 0.27]
        assert!((230..350).contains(&zeros), "{zeros}");
        let again: Vec<u32> = (0..400)
            .filter_map(|s| p.decide(&req(&h, b"", s), &cs))
            .map(|d| d.chosen.0)
            .collect();
        assert_eq!(picks, again);
    }
}
