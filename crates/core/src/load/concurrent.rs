//! Decisions peers take on the view this replica decides on: the expected number of them.
//!
//! A replica sees a peer's dispatch only once the peer's report of it arrives (within the *unseen
//! window*: the measured gossip convergence lag when load changes are pushed, two load intervals
//! when they wait for the tick; [`crate::router::Peers::unseen_window_ms`]). Requests that arrive
//! together — a client's burst split across replicas by the load balancer in front — are decided
//! by several replicas at once on the same view, and a deterministic choice sends them all to the
//! same instance (the one a single gateway would give the first of them, and then route the rest
//! around).
//!
//! This replica cannot see the peers' arrivals, but it sees its own: with requests spread evenly
//! over `n` replicas (what a Service in front does), a request of a burst of `b` finds on average
//! `(b − 1)/n` of the others at this replica and `(b − 1)(n − 1)/n` at its peers. So the peers'
//! decisions concurrent with one of ours are `(n − 1)` times our own decisions concurrent with it.
//! Our own within the unseen window *before* a decision are on average half of those around it
//! (the other half follow it), hence
//!
//! ```text
//! concurrent = peers × 2 × mean(own decisions in the unseen window before each decision)
//! ```
//!
//! the mean taken as an exponentially weighted average over decisions (a single decision's count is
//! 0 most of the time even in bursts, so it must be averaged). Poisson arrivals at rate `λ` per
//! replica give `peers × 2λW`: small for sparse traffic, but not for a busy fleet (36 requests/s
//! over 8 replicas with a 100 ms window gives ~6), where steady traffic counts as concurrent too
//! (measured in docs/gossip.md).
//!
//! Invariants: bounded (the last [`RECENT`] decision times); `concurrent` is finite, ≥ 0 and 0
//! without peers; no clock of its own (callers pass `now`).

use parking_lot::Mutex;

use crate::Millis;

/// Own decision times remembered; a count within the window saturates here.
pub const RECENT: usize = 64;

/// Weight of one decision in the running mean (a burst is a handful of decisions per replica).
const ALPHA: f64 = 1.0 / 16.0;

/// Running estimate of the decisions peers take concurrently with this replica's.
#[derive(Debug, Default)]
pub struct ConcurrentDecisions {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The last [`RECENT`] decision times, oldest first (a ring).
    times: [Millis; RECENT],
    /// Next slot of `times` to write.
    next: usize,
    /// Slots written so far (≤ RECENT).
    len: usize,
    /// Running mean of own decisions in the window before a decision.
    mean_before: f64,
}

impl Default for State {
    fn default() -> Self {
        State {
            times: [0; RECENT],
            next: 0,
            len: 0,
            mean_before: 0.0,
        }
    }
}

impl ConcurrentDecisions {
    /// Counts a decision at `now` and returns the peers' decisions expected on the same view:
    /// `peers` live peers, each unseen for up to `window_ms`. 0 when `peers` is 0 (nothing is
    /// counted then, so a replica alone pays nothing).
    pub fn observe(&self, now: Millis, window_ms: Millis, peers: u32) -> f64 {
        if peers == 0 {
            return 0.0;
        }
        let mut s = self.state.lock();
        let from = now.saturating_sub(window_ms);
        let before = s.times[..s.len]
            .iter()
            .filter(|&&t| t >= from && t <= now)
            .count();
        s.mean_before += ALPHA * (before as f64 - s.mean_before);
        let slot = s.next;
        s.times[slot] = now;
        s.next = (slot + 1) % RECENT;
        s.len = (s.len + 1).min(RECENT);
        f64::from(peers) * 2.0 * s.mean_before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alone_it_is_zero_and_counts_nothing() {
        let c = ConcurrentDecisions::default();
        for t in 0..100 {
            assert_eq!(c.observe(t, 50, 0), 0.0);
        }
        // Nothing was counted: the first decision with a peer finds no earlier one.
        assert_eq!(c.observe(100, 50, 1), 0.0);
    }

    #[test]
    fn sparse_decisions_expect_no_concurrent_ones() {
        let c = ConcurrentDecisions::default();
        let mut last = 0.0;
        for i in 0..200 {
            last = c.observe(i * 1_000, 50, 7);
        }
        assert_eq!(last, 0.0);
    }

    #[test]
    fn bursts_split_over_replicas_are_expected_from_peers() {
        // Bursts split over 8 replicas: this replica gets two of every other burst and one of the
        // rest, so a third of its decisions find one own decision before them: 7 × 2/3 ≈ 4.7.
        let c = ConcurrentDecisions::default();
        let mut last = 0.0;
        for burst in 0..400u64 {
            let at = burst * 1_000;
            last = c.observe(at, 50, 7);
            if burst % 2 == 0 {
                last = c.observe(at + 1, 50, 7);
            }
        }
        assert!((3.5..=6.0).contains(&last), "{last}");
        // Then steady, sparse traffic: the estimate decays.
        for i in 0..200u64 {
            last = c.observe(1_000_000 + i * 1_000, 50, 7);
        }
        assert!(last < 0.01, "{last}");
    }

    #[test]
    fn the_count_saturates_at_the_memory() {
        let c = ConcurrentDecisions::default();
        let mut last = 0.0;
        for _ in 0..10_000 {
            last = c.observe(5, 50, 1);
        }
        assert!(last.is_finite() && last <= 2.0 * RECENT as f64, "{last}");
    }
}
