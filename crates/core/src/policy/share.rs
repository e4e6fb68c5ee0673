//! The request-share bound of the `kvgate` policy: a price, inside the cost model, that keeps
//! every instance's share of the requests offered to it within `max_share` times the mean.
//!
//! # Why a bound, and why a price
//!
//! Minimising each request's own cost sorts requests by size onto instances (short prompts go
//! where the prefill queue drains fastest, long ones where few sequences decode): good for the
//! mean, but one instance can end up with half of a pool's requests, and with it half of the
//! blast radius of its failure, a decode batch that slows every sequence on it, and per-pod
//! request metrics (autoscalers, dashboards) that read as a broken balancer. An override
//! (round robin past a threshold) would throw away everything the cost model knows; a price lets
//! the cost model choose which requests move: those for which another instance costs least
//! more.
//!
//! # Model
//!
//! One virtual queue per instance (the drift-plus-penalty method for time-average constraints)
//! counts the requests it took beyond its allowance. For every decision with `N` candidates
//! and the chosen one `c`, for every candidate `k` (`r_k` its learned prefill rate):
//!
//! ```text
//! Q_k ← max(0, Q_k + [k = c] − max_share × r_k / Σ r)
//! share_k = best × (e^(share_price × Q_k) − 1)   (best: the lowest cost of the decision
//!                                                 before this term)
//! ```
//!
//! With `max_share > 1` a decision hands out more allowance than the one request it places, so
//! queues drain while the shares are within the bound; `Q_k` grows only while `k` takes more than
//! `max_share` times its share of the fleet's capacity, and its price grows with it until `k`
//! stops being the cheapest often enough. On one hardware class the capacity share is the mean
//! share `1 / N` (up to learning noise); on a mixed fleet an instance three times as fast is
//! allowed three times the requests, since an even request share there would queue the slow
//! half (a uniform `max_share / N` cost up to 1.4× mean end-to-end latency on mixed fleets,
//! docs/offline-simulator.md). An instance within its share pays nothing. The price is
//! relative to the decision's best cost, so it means the same on a fleet whose first tokens take
//! 100 ms as on one where they take 20 s, and exponential in the excess, so an instance that is
//! `r` times cheaper than the next needs only `ln(1 + r) / share_price` excess requests to be
//! outpriced: the bound is reached within tens of requests whether the instances' costs differ
//! by 10 % or by 100×.
//!
//! With `share_window = W > 0` every queue first keeps `1 − 1/W` of itself at each decision:
//! a run of consecutive picks of one instance is priced at once and forgotten once the others
//! have taken their turns, and a steady excess `e` per decision settles near `e × W` instead of
//! growing, so the bound answers bursts and caps a sustained skew only softly.
//!
//! Invariants: every `Q_k` is finite and `>= 0`; the state is one `f64` per instance id seen
//! (ids are the fleet's bounded slots); `max_share = 0` switches the term off and keeps no
//! state. Several replicas each bound their own decisions, so their union is bounded too.

use std::sync::Mutex;

use super::Candidate;

/// Virtual queues of the request-share bound, by instance id.
#[derive(Debug, Default)]
pub struct ShareLedger {
    /// `Q_k`, indexed by instance id.
    queues: Mutex<Vec<f64>>,
}

impl Clone for ShareLedger {
    /// A clone starts with the same queues (a policy rebuilt from the same state).
    fn clone(&self) -> Self {
        Self {
            queues: Mutex::new(self.lock().clone()),
        }
    }
}

impl ShareLedger {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<f64>> {
        // A panic elsewhere while the lock was held leaves plain numbers behind: keep them.
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes each candidate's `Q_k` into `out` (in candidate order).
    pub fn queues(&self, candidates: &[Candidate], out: &mut Vec<f64>) {
        let q = self.lock();
        out.clear();
        out.extend(
            candidates
                .iter()
                .map(|c| q.get(c.id.index()).copied().unwrap_or(0.0)),
        );
    }

    /// Records that `chosen` (an index into `candidates`) took the request: its queue gains the
    /// request, every candidate's drains by its allowance, `max_share` times its share of the
    /// candidates' learned prefill rates (the mean share `1 / N` when a rate is unknown).
    ///
    /// With a `window` of `W > 0` decisions every queue first keeps `1 − 1/W` of itself (at
    /// least 0), so what it holds is the recent excess rather than the whole history's.
    pub fn record(&self, candidates: &[Candidate], chosen: usize, max_share: f64, window: f64) {
        if candidates.is_empty() || !(max_share.is_finite() && max_share > 0.0) {
            return;
        }
        let keep = if window.is_finite() && window > 0.0 {
            (1.0 - 1.0 / window).max(0.0)
        } else {
            1.0
        };
        let total: f64 = candidates.iter().map(capacity).sum();
        let mut q = self.lock();
        for (i, c) in candidates.iter().enumerate() {
            let k = c.id.index();
            if q.len() <= k {
                q.resize(k + 1, 0.0);
            }
            let taken = if i == chosen { 1.0 } else { 0.0 };
            let allowance = max_share * capacity_share(capacity(c), total, candidates.len());
            q[k] = (q[k] * keep + taken - allowance).max(0.0);
        }
    }

    /// Drops `instance`'s queue (it left the fleet; its id may be reused).
    pub fn forget(&self, instance: crate::InstanceId) {
        if let Some(q) = self.lock().get_mut(instance.index()) {
            *q = 0.0;
        }
    }
}

/// What a candidate's allowance is proportional to: its learned prefill speed, the rate the cost
/// model itself prices its work at. A fleet of one hardware class (rates equal up to learning
/// noise) gets the mean share `1 / N` each; an instance that computes three times as fast is
/// allowed three times the requests of a slower one.
fn capacity(c: &Candidate) -> f64 {
    let r = c.rates.prefill_tokens_per_s;
    if r.is_finite() && r > 0.0 {
        r
    } else {
        0.0
    }
}

/// A candidate's share of the candidates' capacity, from its own (`own`, its [`capacity`]) and
/// their sum (`total`); the mean share `1 / n` when its rate is unknown (0) or the total is not
/// positive and finite.
fn capacity_share(own: f64, total: f64, n: usize) -> f64 {
    if total.is_finite() && total > 0.0 && own > 0.0 {
        own / total
    } else {
        1.0 / n as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::util::testing::cand;

    fn fleet(n: u32) -> Vec<Candidate> {
        (0..n).map(|i| cand(i, 0, 0, 0)).collect()
    }

    #[test]
    fn within_the_bound_no_queue_builds() {
        let ledger = ShareLedger::default();
        let cs = fleet(4);
        let mut q = Vec::new();
        // Round robin is exactly the mean share: under a bound of 1.3 nothing accumulates.
        for r in 0..1000 {
            ledger.record(&cs, r % 4, 1.3, 0.0);
            ledger.queues(&cs, &mut q);
            assert!(q.iter().all(|&x| x < 1.0), "{q:?}");
        }
    }

    #[test]
    fn an_instance_over_its_share_accumulates_at_its_excess_rate() {
        let ledger = ShareLedger::default();
        let cs = fleet(4);
        let mut q = Vec::new();
        // Instance 0 takes half the requests: its excess is 0.5 − 1.3/4 = 0.175 per request.
        for r in 0..400 {
            ledger.record(&cs, if r % 2 == 0 { 0 } else { 1 + r % 3 }, 1.3, 0.0);
        }
        ledger.queues(&cs, &mut q);
        assert!((q[0] - 400.0 * 0.175).abs() < 2.0, "{q:?}");
        assert!(q[1..].iter().all(|&x| x < 1.0), "{q:?}");
        // Forgotten instances start again from nothing.
        ledger.forget(crate::InstanceId(0));
        ledger.queues(&cs, &mut q);
        assert_eq!(q[0], 0.0);
    }

    #[test]
    fn off_keeps_no_state() {
        let ledger = ShareLedger::default();
        let cs = fleet(3);
        ledger.record(&cs, 0, 0.0, 0.0);
        ledger.record(&cs, 0, f64::NAN, 10.0);
        assert!(ledger.lock().is_empty());
    }

    #[test]
    fn queues_stay_finite_and_non_negative() {
        let ledger = ShareLedger::default();
        let cs = fleet(8);
        let mut q = Vec::new();
        let mut x = 12345u64;
        for _ in 0..10_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let chosen = (x >> 33) as usize % if x.is_multiple_of(3) { 1 } else { 8 };
            ledger.record(&cs, chosen, 1.3, 0.0);
        }
        ledger.queues(&cs, &mut q);
        assert!(q.iter().all(|x| x.is_finite() && *x >= 0.0), "{q:?}");
    }

    #[test]
    fn a_faster_instance_is_allowed_its_share_of_the_capacity() {
        let ledger = ShareLedger::default();
        // Four instances prefilling three times as fast as the other four: the fast ones hold
        // 3/16 of the capacity each, the slow ones 1/16.
        let mut cs = fleet(8);
        for c in &mut cs[..4] {
            c.rates.prefill_tokens_per_s *= 3.0;
        }
        let mut q = Vec::new();
        // Proportional to capacity (12 of every 16 requests to the fast half, 3 each), well
        // above the mean share 1/8: within a bound of 1.3, nothing accumulates.
        let order: Vec<usize> = (0..3).flat_map(|_| 0..4).chain(4..8).collect();
        for r in 0..1600 {
            ledger.record(&cs, order[r % order.len()], 1.3, 0.0);
            ledger.queues(&cs, &mut q);
            assert!(q.iter().all(|&x| x < 2.0), "{q:?}");
        }
        // A slow instance taking the mean share (1/8, twice its 1/16 of the capacity) is over
        // its bound of 1.3/16: it accumulates 1/8 − 1.3/16 per request.
        let ledger = ShareLedger::default();
        for r in 0..1600 {
            ledger.record(&cs, r % 8, 1.3, 0.0);
        }
        ledger.queues(&cs, &mut q);
        let excess = 1600.0 * (1.0 / 8.0 - 1.3 / 16.0);
        assert!(q[4..].iter().all(|&x| (x - excess).abs() < 2.0), "{q:?}");
        assert!(q[..4].iter().all(|&x| x < 1.0), "{q:?}");
    }

    #[test]
    fn unknown_rates_fall_back_to_the_mean_share() {
        let mut cs = fleet(4);
        for c in &mut cs {
            c.rates.prefill_tokens_per_s = f64::NAN;
        }
        let total: f64 = cs.iter().map(capacity).sum();
        assert_eq!(total, 0.0);
        assert!(cs
            .iter()
            .all(|c| capacity_share(capacity(c), total, 4) == 0.25));
        // One unknown among known rates: the unknown one gets the mean share.
        let mut cs = fleet(4);
        cs[0].rates.prefill_tokens_per_s = 0.0;
        let total: f64 = cs.iter().map(capacity).sum();
        assert_eq!(capacity_share(capacity(&cs[0]), total, 4), 0.25);
        assert!((capacity_share(capacity(&cs[1]), total, 4) - 1.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn a_window_prices_a_burst_but_forgets_it() {
        let cs = fleet(8);
        let mut q = Vec::new();
        // Ten consecutive picks of instance 0 build a queue with or without a window.
        let (forever, windowed) = (ShareLedger::default(), ShareLedger::default());
        for _ in 0..10 {
            forever.record(&cs, 0, 1.3, 0.0);
            windowed.record(&cs, 0, 1.3, 10.0);
        }
        windowed.queues(&cs, &mut q);
        assert!(q[0] > 4.0, "{q:?}");
        // Then the others take their turns: the windowed queue empties, the other one keeps
        // the whole excess until the allowance pays it off.
        for r in 0..20 {
            forever.record(&cs, 1 + r % 7, 1.3, 0.0);
            windowed.record(&cs, 1 + r % 7, 1.3, 10.0);
        }
        windowed.queues(&cs, &mut q);
        assert_eq!(q[0], 0.0, "{q:?}");
        forever.queues(&cs, &mut q);
        assert!(q[0] > 2.0, "{q:?}");
        // A steady excess settles near excess × window instead of growing without bound.
        let steady = ShareLedger::default();
        for r in 0..2000 {
            steady.record(&cs, if r % 2 == 0 { 0 } else { 1 + r % 7 }, 1.3, 10.0);
        }
        steady.queues(&cs, &mut q);
        let excess = 0.5 - 1.3 / 8.0;
        assert!(
            q[0] < 2.0 * excess * 10.0 && q[0] > 0.5 * excess * 10.0,
            "{q:?}"
        );
    }
}
