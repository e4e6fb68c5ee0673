//! `llmd_weighted`: llm-d endpoint picker. Weighted sum of `[0, 1]` scorers; highest wins.
//!
//! - prefix: leading blocks held / prompt blocks;
//! - queue: `(max_q − q) / (max_q − min_q)` over the candidates (1 for all when equal), where `q`
//!   is the engine's fresh waiting queue, else router-tracked requests waiting for a first token;
//! - KV utilisation: `1 − kv_usage` from fresh engine metrics (1 when unknown).
//!
//! Default weights prefix 3, queue 2, KV 2. Ties go to a seeded pick, as llm-d picks randomly
//! among the top scores.

use super::config::LlmdParams;
use super::util::{argmax_seeded, decision, prefilling};
use super::{Candidate, Decision, Policy, Reason, RouteRequest};

/// llm-d-style weighted scorer.
#[derive(Clone, Debug, Default)]
pub struct LlmdWeighted {
    params: LlmdParams,
}

impl LlmdWeighted {
    /// A policy with these parameters.
    pub fn new(params: LlmdParams) -> Self {
        Self { params }
    }
}

fn queue(c: &Candidate) -> f64 {
    match c.engine.filter(|e| !e.stale) {
        Some(e) => f64::from(e.waiting),
        None => f64::from(prefilling(c)),
    }
}

impl Policy for LlmdWeighted {
    fn reads_text(&self) -> bool {
        false
    }
    fn name(&self) -> &'static str {
        "llmd_weighted"
    }
    fn decide(&self, req: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<Decision> {
        if candidates.is_empty() {
            return None;
        }
        let p = &self.params;
        let blocks = req.hashes.len().max(1) as f64;
        let min_q = candidates.iter().map(queue).fold(f64::INFINITY, f64::min);
        let max_q = candidates
            .iter()
            .map(queue)
            .fold(f64::NEG_INFINITY, f64::max);
        let scores: Vec<f64> = candidates
            .iter()
            .map(|c| {
                let prefix = (f64::from(c.matched.total()) / blocks).min(1.0);
                let q = if max_q > min_q {
                    (max_q - queue(c)) / (max_q - min_q)
                } else {
                    1.0
                };
                let kv = c
                    .engine
                    .filter(|e| !e.stale)
                    .map_or(1.0, |e| 1.0 - f64::from(e.kv_usage.clamp(0.0, 1.0)));
                p.prefix_weight * prefix + p.queue_weight * q + p.kv_weight * kv
            })
            .collect();
        let i = argmax_seeded(candidates, &scores, 1e-9, req.seed)?;
        let reason = if candidates[i].matched.total() > 0 {
            Reason::CacheMatch
        } else {
            Reason::LeastLoaded
        };
        Some(decision(candidates, i, &scores, 0.0, reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::util::testing::{cand, req};

    #[test]
    fn prefix_vs_queue() {
        let p = LlmdWeighted::default();
        let h = [1u64; 10];
        // Full match (3) + worst queue (0) = 5 vs no match (0) + best queue (2) + kv 2 = 4.
        let cs = vec![cand(0, 10, 0, 5), cand(1, 0, 0, 0)];
        assert_eq!(p.decide(&req(&h, b"", 1), &cs).map(|d| d.chosen.0), Some(0));
        // Half match (1.5) + worst queue = 3.5 < 4.
        let cs = vec![cand(0, 5, 0, 5), cand(1, 0, 0, 0)];
        assert_eq!(p.decide(&req(&h, b"", 1), &cs).map(|d| d.chosen.0), Some(1));
    }
}
