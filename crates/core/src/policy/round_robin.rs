//! `round_robin`: rotate through the candidates, ignoring cache and load.
//!
//! Invariant: over `n` consecutive decisions with the same `n` candidates each is chosen once.

use super::util::decision;
use super::{Candidate, Decision, Policy, Reason, RouteRequest};
use std::sync::atomic::{AtomicU64, Ordering};

/// Round-robin rotation with one shared counter.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicU64,
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }
    fn decide(&self, _req: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<Decision> {
        if candidates.is_empty() {
            return None;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let i = (n % candidates.len() as u64) as usize;
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
    fn rotates() {
        let p = RoundRobin::default();
        let cs: Vec<_> = (0..3).map(|i| cand(i, 0, 0, 0)).collect();
        let r = req(&[], b"", 1);
        let got: Vec<u32> = (0..6)
            .filter_map(|_| p.decide(&r, &cs))
            .map(|d| d.chosen.0)
            .collect();
        assert_eq!(got, vec![0, 1, 2, 0, 1, 2]);
        assert!(p.decide(&r, &[]).is_none());
    }
}
