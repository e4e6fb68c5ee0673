//! `power_of_two`: sample two distinct candidates by seed, keep the less loaded one.

use super::least_load::load_key;
use super::util::{decision, mix, tie_key};
use super::{Candidate, Decision, Policy, Reason, RouteRequest};

/// Power-of-two-choices on router-tracked in-flight load.
#[derive(Debug, Default)]
pub struct PowerOfTwo;

impl Policy for PowerOfTwo {
    fn reads_text(&self) -> bool {
        false
    }
    fn name(&self) -> &'static str {
        "power_of_two"
    }
    fn decide(&self, req: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<Decision> {
        let n = candidates.len() as u64;
        if n == 0 {
            return None;
        }
        let a = (mix(req.seed) % n) as usize;
        let b = if n == 1 {
            a
        } else {
            ((a as u64 + 1 + mix(req.seed ^ 0x5eed) % (n - 1)) % n) as usize
        };
        let (ka, kb) = (load_key(&candidates[a]), load_key(&candidates[b]));
        let i = if ka < kb
            || (ka == kb
                && tie_key(req.seed, candidates[a].id) <= tie_key(req.seed, candidates[b].id))
        {
            a
        } else {
            b
        };
        let scores: Vec<f64> = candidates.iter().map(load_key).collect();
        Some(decision(candidates, i, &scores, 0.0, Reason::LeastLoaded))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::util::testing::{cand, req};

    #[test]
    fn never_picks_the_most_loaded_of_two() {
        let cs = vec![cand(0, 0, 0, 5), cand(1, 0, 0, 1)];
        for seed in 0..32 {
            assert_eq!(
                PowerOfTwo
                    .decide(&req(&[], b"", seed), &cs)
                    .map(|d| d.chosen.0),
                Some(1)
            );
        }
        let one = vec![cand(4, 0, 0, 0)];
        assert_eq!(
            PowerOfTwo
                .decide(&req(&[], b"", 3), &one)
                .map(|d| d.chosen.0),
            Some(4)
        );
    }
}
