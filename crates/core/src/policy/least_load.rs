//! `least_load`: the candidate with the fewest router-tracked in-flight requests.
//!
//! Ties on in-flight count are broken by outstanding prefill tokens, then by the request's seed.

use super::util::{argmin_seeded, decision};
use super::{Candidate, Decision, Policy, Reason, RouteRequest};

/// Least in-flight requests wins.
#[derive(Debug, Default)]
pub struct LeastLoad;

/// Load key: in-flight requests, with pending prefill tokens as a fractional tiebreaker.
pub(crate) fn load_key(c: &Candidate) -> f64 {
    f64::from(c.load.in_flight) + (c.load.pending_prefill_tokens as f64 / 1e12).min(0.5)
}

impl Policy for LeastLoad {
    fn reads_text(&self) -> bool {
        false
    }
    fn name(&self) -> &'static str {
        "least_load"
    }
    fn decide(&self, req: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<Decision> {
        let scores: Vec<f64> = candidates.iter().map(load_key).collect();
        let i = argmin_seeded(candidates, &scores, 0.0, req.seed)?;
        Some(decision(candidates, i, &scores, 0.0, Reason::LeastLoaded))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::util::testing::{cand, req};

    #[test]
    fn picks_least_and_spreads_ties() {
        let cs = vec![cand(0, 0, 0, 3), cand(1, 0, 0, 1), cand(2, 0, 0, 2)];
        assert_eq!(
            LeastLoad.decide(&req(&[], b"", 9), &cs).map(|d| d.chosen.0),
            Some(1)
        );
        let tied: Vec<_> = (0..3).map(|i| cand(i, 0, 0, 0)).collect();
        let mut seen = [false; 3];
        for seed in 0..64 {
            if let Some(d) = LeastLoad.decide(&req(&[], b"", seed), &tied) {
                seen[d.chosen.index()] = true;
            }
        }
        assert_eq!(seen, [true; 3]);
    }
}
