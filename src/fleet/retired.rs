//! Names of instances freed from the fleet, so that `/metrics` stops showing their series.
//!
//! The Prometheus recorder has no way to delete a series, so a freed instance's counters,
//! histograms and gauges would stay in every scrape for the process's life (a stale
//! `kvgate_in_flight_requests` and `kvgate_instance_healthy` among them). The fleet remembers
//! which names it freed and the scrape leaves their series out.
//!
//! Invariants:
//! - A name is held only while no instance of that name is in the fleet: adding one with the
//!   name takes it out again (its series show again, continuing where they were).
//! - At most [`MAX_RETIRED`] names are held, oldest forgotten first (a forgotten name's series
//!   reappear in scrapes, at the values they stopped at).

use parking_lot::Mutex;
use std::collections::{HashSet, VecDeque};

/// Retired names remembered at most.
pub const MAX_RETIRED: usize = 4096;

/// The retired names, bounded.
#[derive(Default)]
pub struct RetiredNames {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    set: HashSet<String>,
    order: VecDeque<String>,
}

impl RetiredNames {
    /// `name` was freed and no instance of that name remains.
    pub fn retire(&self, name: &str) {
        let mut g = self.inner.lock();
        if !g.set.insert(name.to_string()) {
            return;
        }
        g.order.push_back(name.to_string());
        while g.order.len() > MAX_RETIRED {
            if let Some(old) = g.order.pop_front() {
                g.set.remove(&old);
            }
        }
    }

    /// An instance named `name` joined the fleet.
    pub fn revive(&self, name: &str) {
        let mut g = self.inner.lock();
        if g.set.remove(name) {
            g.order.retain(|n| n != name);
        }
    }

    /// Whether nothing is retired (a scrape then needs no filtering).
    pub fn is_empty(&self) -> bool {
        self.inner.lock().set.is_empty()
    }

    /// Calls `f` with the retired names held under the lock.
    pub fn with<R>(&self, f: impl FnOnce(&HashSet<String>) -> R) -> R {
        f(&self.inner.lock().set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retires_revives_and_stays_bounded() {
        let r = RetiredNames::default();
        assert!(r.is_empty());
        r.retire("a");
        r.retire("a");
        r.retire("b");
        assert!(r.with(|s| s.contains("a") && s.contains("b") && s.len() == 2));
        r.revive("a");
        assert!(r.with(|s| !s.contains("a") && s.len() == 1));
        for i in 0..MAX_RETIRED + 10 {
            r.retire(&format!("pod-{i}"));
        }
        assert!(r.with(|s| s.len() == MAX_RETIRED && !s.contains("b") && !s.contains("pod-0")));
        assert!(r.with(|s| s.contains(&format!("pod-{}", MAX_RETIRED + 9))));
    }
}
