//! `random`: a uniform choice derived from the request's seed (reproducible).

use super::util::{decision, mix};
use super::{Candidate, Decision, Policy, Reason, RouteRequest};

/// Uniform choice by seed.
#[derive(Debug, Default)]
pub struct Random;

impl Policy for Random {
    fn reads_text(&self) -> bool {
        false
    }
    fn name(&self) -> &'static str {
        "random"
    }
    fn decide(&self, req: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<Decision> {
        if candidates.is_empty() {
            return None;
        }
        let i = (mix(req.seed) % candidates.len() as u64) as usize;
        let scores: Vec<f64> = (0..candidates.len())
            .map(|k| if k == i { 1.0 } else { 0.0 })
            .collect();
        Some(decision(candidates, i, &scores, 0.0, Reason::Spread))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::util::testing::{cand, req};

    #[test]
    fn uniform_and_reproducible() {
        let cs: Vec<_> = (0..4).map(|i| cand(i, 0, 0, 0)).collect();
        let mut counts = [0u32; 4];
        for seed in 0..4000u64 {
            let d = Random.decide(&req(&[], b"", seed), &cs);
            let again = Random.decide(&req(&[], b"", seed), &cs);
            let (d, again) = (d.map(|d| d.chosen), again.map(|d| d.chosen));
            assert_eq!(d, again);
            counts[d.map_or(0, |c| c.index())] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }
}
