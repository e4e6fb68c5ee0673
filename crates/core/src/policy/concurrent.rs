//! Choosing while peers choose: what `k` concurrent decisions by other replicas do to a choice.
//!
//! `k` other replicas deciding on the same view as this one cannot see each other's choices, and
//! a deterministic choice would be the same everywhere: a burst split across replicas would pile
//! onto the cheapest instance, where a single gateway fills the cheapest instances one request
//! after another, each seeing the queue the previous ones made (and, under its tie rule, sending
//! near-ties to the instance with the fewest requests in flight, which evens out decode batches).
//!
//! So the decision emulates that single gateway. The peers' requests are, as far as this replica
//! knows, *cold*: they want an instance for its load, not for this request's cache. A [`Burst`]
//! places `k` of them one after another on the candidates' cold costs (this request's cost were
//! its prefix held nowhere beyond what every candidate holds), each adding a cold prefill to the
//! queue and one request in flight where it goes, under the policy's own tie rule. Then:
//!
//! - a cold request is one of the burst: it is placed with the others and takes one of the
//!   burst's `k + 1` places at random (it does not know its position in the burst; its peers draw
//!   theirs the same way), so the burst spreads as a single gateway would have spread it;
//! - a request that some candidate serves better from cache (a conversation's next turn) takes
//!   the cheapest once the burst's queue is added: its peers' requests do not want its prefix
//!   holder more than any other instance, so what they add there is their share, not a herd.
//!
//! A fractional `k` is rounded at random (up with probability its fraction), so a replica alone
//! in its window mostly decides as alone.
//!
//! Invariants: a burst only grows costs and counts; at most a bounded number of requests is
//! placed per decision (the caller's bound).

/// A burst of cold requests placed one after another on the candidates.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Burst {
    /// Each candidate's cost for the next cold request, ms.
    pub cold: Vec<f64>,
    /// What one cold request adds to a candidate's queue, ms (≥ 0).
    pub steps: Vec<f64>,
    /// Requests in flight on each candidate, the burst's placed ones included.
    pub in_flight: Vec<u32>,
    /// Queue the burst's placed requests add on each candidate, ms.
    pub added: Vec<f64>,
}

impl Burst {
    /// A burst not placed yet: costs, steps (negative ones taken as 0) and requests in flight per
    /// candidate, in candidate order.
    pub fn new(cold: Vec<f64>, steps: Vec<f64>, in_flight: Vec<u32>) -> Self {
        let added = vec![0.0; cold.len()];
        Burst {
            cold,
            steps: steps.into_iter().map(|s| s.max(0.0)).collect(),
            in_flight,
            added,
        }
    }

    /// One cold request placed on candidate `i` (ignored when out of range).
    pub fn place(&mut self, i: usize) {
        let (Some(cost), Some(&step), Some(n), Some(added)) = (
            self.cold.get_mut(i),
            self.steps.get(i),
            self.in_flight.get_mut(i),
            self.added.get_mut(i),
        ) else {
            return;
        };
        *cost += step;
        *added += step;
        *n = n.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placed_request_adds_its_step_and_one_in_flight_where_it_goes() {
        let mut b = Burst::new(vec![10.0, 12.0], vec![5.0, -1.0], vec![0, 3]);
        b.place(0);
        b.place(1);
        b.place(7);
        assert_eq!(b.cold, vec![15.0, 12.0]);
        assert_eq!(b.added, vec![5.0, 0.0]);
        assert_eq!(b.in_flight, vec![1, 4]);
    }
}
