//! `consistent_hash`: rendezvous (highest-random-weight) hashing on the prompt's first blocks.
//!
//! The key is the chain hash of block `min(prefix_blocks, blocks) − 1`, which already covers every
//! earlier block; prompts shorter than one block hash their first bytes instead. Each candidate
//! scores `mix(key, instance)`; the highest wins. Removing an instance moves only the keys it won;
//! adding one takes only the keys it now wins.

use super::config::ConsistentHashParams;
use super::util::{decision, mix};
use super::{Candidate, Decision, Policy, Reason, RouteRequest};
use crate::hash::HASH_SEED;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Rendezvous hashing on the prompt prefix.
#[derive(Clone, Debug, Default)]
pub struct ConsistentHash {
    params: ConsistentHashParams,
}

impl ConsistentHash {
    /// A policy with these parameters.
    pub fn new(params: ConsistentHashParams) -> Self {
        Self { params }
    }
    fn key(&self, req: &RouteRequest<'_>) -> u64 {
        let k = self.params.prefix_blocks.max(1).min(req.hashes.len());
        if k > 0 {
            req.hashes[k - 1]
        } else {
            let n = req.text.len().min(self.params.short_prompt_bytes);
            xxh3_64_with_seed(&req.text[..n], HASH_SEED)
        }
    }
}

impl Policy for ConsistentHash {
    fn name(&self) -> &'static str {
        "consistent_hash"
    }
    fn decide(&self, req: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<Decision> {
        if candidates.is_empty() {
            return None;
        }
        let key = self.key(req);
        let weights: Vec<u64> = candidates
            .iter()
            .map(|c| mix(key ^ mix(u64::from(c.id.0))))
            .collect();
        let i = weights
            .iter()
            .enumerate()
            .max_by_key(|(_, w)| **w)
            .map_or(0, |(i, _)| i);
        let scores: Vec<f64> = weights
            .iter()
            .map(|&w| w as f64 / u64::MAX as f64)
            .collect();
        Some(decision(candidates, i, &scores, 0.0, Reason::Spread))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::util::testing::{cand, req};

    #[test]
    fn removal_moves_only_the_removed_share() {
        let p = ConsistentHash::default();
        let all: Vec<_> = (0..5).map(|i| cand(i, 0, 0, 0)).collect();
        let without2: Vec<_> = all.iter().copied().filter(|c| c.id.0 != 2).collect();
        let mut moved = 0;
        let mut on2 = 0;
        for k in 0..2000u64 {
            let h = [mix(k)];
            let a = p.decide(&req(&h, b"", k), &all).map(|d| d.chosen.0);
            let b = p
                .decide(&req(&h, b"", k + 1), &without2)
                .map(|d| d.chosen.0);
            if a == Some(2) {
                on2 += 1;
            } else if a != b {
                moved += 1;
            }
        }
        assert_eq!(moved, 0);
        assert!((300..500).contains(&on2), "{on2}");
    }
}
