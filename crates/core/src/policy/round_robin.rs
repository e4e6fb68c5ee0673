//! `round_robin`: rotate through the candidates, ignoring cache and load.
//!
//! Invariant: over `n` consecutive decisions with the same `n` candidates each is chosen once.

use super::util::decision;
use super::{Candidate, CandidateScore, Decision, Policy, Reason, RouteRequest};
use std::sync::atomic::{AtomicU64, Ordering};

/// Round-robin rotation with one shared counter.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicU64,
}

impl Policy for RoundRobin {
    fn reads_text(&self) -> bool {
        false
    }
    fn name(&self) -> &'static str {
        "round_robin"
    }
    fn decide(&self, _req: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<Decision> {
        if candidates.is_empty() {
            return None;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let i = (n % candidates.len() as u64) as usize;
        // Scores mark the chosen one; no buffer of them is built on this, the cheapest path.
        let mut d = decision(candidates, i, &[], 0.0, Reason::Spread);
        d.scores = candidates
            .iter()
            .enumerate()
            .map(|(k, c)| CandidateScore {
                id: c.id,
                score: if k == i { 1.0 } else { 0.0 },
                matched_blocks: c.matched.total(),
            })
            .collect();
        Some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::util::testing::{cand, req};

    #[test]
    fn rotates() {
        let p = RoundRobin::default();
        let cs: Vec<_> = (0..3).map(|i| cand(i, 0, 0, 0)).collect();
        let r = req(&[], b"", 1);
        let got: Vec<u32> = (0..6)
            .filter_map(|_| p.decide(&r, &cs))
            .map(|d| d.chosen.0)
            .collect();
        assert_eq!(got, vec![0, 1, 2, 0, 1, 2]);
        let d = p.decide(&r, &cs).unwrap();
        let scores: Vec<(u32, f64)> = d.scores.iter().map(|s| (s.id.0, s.score)).collect();
        assert_eq!(scores, vec![(0, 1.0), (1, 0.0), (2, 0.0)]);
        assert!(p.decide(&r, &[]).is_none());
    }
}
