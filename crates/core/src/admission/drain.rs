//! How fast a pool drains its queue, and the `Retry-After` that implies.
//!
//! The rate is learned from the queue's own service: the tokens of the entries admitted from it
//! per second, measured in windows while it is backlogged (a window that the queue empties during
//! is discarded, since idle time would understate the rate), folded into an EWMA.
//!
//! Invariants:
//! - Pure; time is passed in.
//! - The rate, once known, is finite and > 0.

use crate::Millis;

/// Length of one measuring window, ms.
const WINDOW_MS: Millis = 1_000;
/// Weight of a new window's rate.
const ALPHA: f64 = 0.3;
/// Bounds of a `Retry-After`, seconds.
pub const RETRY_AFTER_RANGE: (u64, u64) = (1, 3_600);

/// The learned drain rate of one queue.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DrainRate {
    /// Start of the open window, if one is open.
    start: Option<Millis>,
    /// Tokens admitted in the open window.
    tokens: u64,
    /// Tokens per second, once a window has closed.
    rate: Option<f64>,
}

impl DrainRate {
    /// An entry of `cost` tokens left the queue, admitted, at `now`.
    pub fn served(&mut self, now: Millis, cost: u64) {
        let start = *self.start.get_or_insert(now);
        self.tokens = self.tokens.saturating_add(cost);
        let span = now.saturating_sub(start);
        if span >= WINDOW_MS {
            let sample = self.tokens as f64 * 1_000.0 / span as f64;
            if sample.is_finite() && sample > 0.0 {
                self.rate = Some(match self.rate {
                    Some(r) => r + ALPHA * (sample - r),
                    None => sample,
                });
            }
            self.start = Some(now);
            self.tokens = 0;
        }
    }

    /// The queue emptied: the open window's idle remainder would understate the rate.
    pub fn idle(&mut self) {
        self.start = None;
        self.tokens = 0;
    }

    /// Tokens per second, once measured.
    pub fn tokens_per_s(&self) -> Option<f64> {
        self.rate
    }
}

/// Seconds a rejected client should wait: the time to drain `queued_tokens` at `rate` tokens/s
/// when the rate is known, else `fallback_ms` (the best instance's predicted time to first
/// token), rounded up and kept within [`RETRY_AFTER_RANGE`].
pub fn retry_after_secs(queued_tokens: u64, rate: Option<f64>, fallback_ms: f64) -> u64 {
    let secs = match rate {
        Some(r) if r > 0.0 => queued_tokens as f64 / r,
        _ => fallback_ms / 1_000.0,
    };
    let (lo, hi) = RETRY_AFTER_RANGE;
    if !secs.is_finite() {
        return hi;
    }
    (secs.ceil() as u64).clamp(lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_learned_from_windows_of_service() {
        let mut d = DrainRate::default();
        assert_eq!(d.tokens_per_s(), None);
        // 500 tokens every 100 ms: 5000 tokens/s.
        for i in 0..=30 {
            d.served(i * 100, 500);
        }
        let r = d.tokens_per_s().unwrap();
        assert!((r - 5_000.0).abs() < 600.0, "{r}");
        // An idle gap is not measured.
        d.idle();
        d.served(100_000, 500);
        d.served(101_000, 500);
        assert!(d.tokens_per_s().unwrap() > 800.0);
    }

    #[test]
    fn retry_after_follows_the_drain_time() {
        assert_eq!(retry_after_secs(50_000, Some(10_000.0), 0.0), 5);
        assert_eq!(retry_after_secs(50_001, Some(10_000.0), 0.0), 6);
        assert_eq!(retry_after_secs(10, Some(10_000.0), 0.0), 1);
        assert_eq!(retry_after_secs(10, None, 2_500.0), 3);
        assert_eq!(retry_after_secs(u64::MAX, Some(1e-300), 0.0), 3_600);
        assert_eq!(retry_after_secs(0, None, f64::NAN), 3_600);
    }
}
