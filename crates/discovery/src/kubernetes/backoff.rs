//! [`Backoff`]: capped exponential retry delays with jitter (sans-I/O: it only computes delays).
//!
//! Invariants: delays double from `initial` up to `max`; each is jittered down by up to a
//! quarter so that many replicas retrying after one API server outage spread out; `reset`
//! returns to `initial` after a success.

use std::time::Duration;

/// Retry delays of one watch.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Delays from `initial` doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.min(max);
        Self {
            initial,
            max,
            next: initial,
        }
    }

    /// The next delay (jittered) and doubles the one after.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        let jitter = rand::random::<f64>() * 0.25;
        base.mul_f64(1.0 - jitter)
    }

    /// After a success: the next failure waits `initial` again.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_with_bounded_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let d: Vec<_> = (0..4).map(|_| b.next_delay()).collect();
        let within = |d: Duration, ms: u64| {
            d <= Duration::from_millis(ms) && d >= Duration::from_millis(ms * 3 / 4)
        };
        assert!(within(d[0], 100) && within(d[1], 200), "{d:?}");
        assert!(within(d[2], 350) && within(d[3], 350), "{d:?}");
        b.reset();
        assert!(within(b.next_delay(), 100));
    }
}
