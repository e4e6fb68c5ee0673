//! Expected output length per pool, learned from finished responses, for requests that do not say
//! how long they may run (`max_tokens` absent).
//!
//! An exponentially weighted mean (weight `1/OUTPUT_MEMORY` per observation, so roughly the last
//! thousand responses), started at a configured guess. The mean is what the decode-aware cost
//! needs: the expected decode time and the expected time a request shares its batch.
//!
//! Invariants: one slot per pool, fixed at construction; reads and writes are single atomic
//! loads/stores (a lost update between two racing writers only drops one observation); the
//! estimate is always finite and at least 1.

use std::sync::atomic::{AtomicU64, Ordering};

/// Observations an estimate roughly remembers.
const OUTPUT_MEMORY: f64 = 1000.0;

/// Largest output length an observation may report (bounds what one response can do to the mean).
const MAX_OBSERVED: f64 = 1_000_000.0;

/// Learned mean output tokens of each pool.
#[derive(Debug)]
pub struct OutputLengths {
    /// `f64` bits of each pool's mean.
    means: Box<[AtomicU64]>,
}

impl OutputLengths {
    /// `pools` estimates, each starting at `initial` tokens.
    pub fn new(pools: usize, initial: f64) -> Self {
        let start = sanitize(initial).to_bits();
        Self {
            means: (0..pools).map(|_| AtomicU64::new(start)).collect(),
        }
    }

    /// Expected output tokens of a request to `pool`: `max_tokens` when the request bounds it
    /// (the bound is the best single guess the router has, and load testers replaying traces set
    /// it to the true length), else the pool's learned mean.
    pub fn expected(&self, pool: usize, max_tokens: Option<u32>) -> u32 {
        match max_tokens {
            Some(m) => m.max(1),
            None => self.mean(pool).round() as u32,
        }
    }

    /// The learned mean of `pool` (1 for an unknown pool).
    pub fn mean(&self, pool: usize) -> f64 {
        self.means
            .get(pool)
            .map_or(1.0, |m| f64::from_bits(m.load(Ordering::Relaxed)))
    }

    /// Folds one finished response of `tokens` output tokens into `pool`'s mean.
    pub fn observe(&self, pool: usize, tokens: u32) {
        let Some(slot) = self.means.get(pool) else {
            return;
        };
        let old = f64::from_bits(slot.load(Ordering::Relaxed));
        let x = f64::from(tokens).min(MAX_OBSERVED);
        let new = sanitize(old + (x - old) / OUTPUT_MEMORY);
        slot.store(new.to_bits(), Ordering::Relaxed);
    }
}

fn sanitize(x: f64) -> f64 {
    if x.is_finite() {
        x.clamp(1.0, MAX_OBSERVED)
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_the_mean_and_prefers_the_request_s_bound() {
        let o = OutputLengths::new(2, 256.0);
        assert_eq!(o.expected(0, None), 256);
        for _ in 0..5000 {
            o.observe(0, 100);
        }
        assert!((o.mean(0) - 100.0).abs() < 2.0, "{}", o.mean(0));
        assert_eq!(o.expected(1, None), 256, "pools learn separately");
        assert_eq!(o.expected(0, Some(17)), 17);
        assert_eq!(o.expected(0, Some(0)), 1);
        // Unknown pools and absurd inputs stay harmless.
        o.observe(9, 5);
        assert_eq!(o.mean(9), 1.0);
        for _ in 0..10 {
            o.observe(1, u32::MAX);
        }
        assert!(o.mean(1).is_finite() && o.mean(1) <= MAX_OBSERVED);
        assert_eq!(OutputLengths::new(1, f64::NAN).mean(0), 1.0);
    }
}
