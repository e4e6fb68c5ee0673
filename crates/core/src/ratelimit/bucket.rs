//! One token bucket on virtual milliseconds, in exact integer arithmetic.
//!
//! Invariants:
//! - The level is kept in units × `period_ms`, so refilling `elapsed` ms adds exactly
//!   `elapsed × per_period` and no fraction of a unit is ever lost or invented.
//! - The level never exceeds the capacity; it may go below zero (a charge after admission, or
//!   usage reported by a peer), and then every admission waits until it has refilled.
//! - Time only moves forward: a `now` earlier than the last one seen refills nothing.

use crate::Millis;

/// A bucket refilling `per_period` units every `period_ms`, holding at most `capacity` units.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    per_period: u64,
    period_ms: u64,
    capacity: u64,
    /// Units × `period_ms`.
    level: i128,
    last: Millis,
}

/// What a bucket shows a client (the `x-ratelimit-*` headers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketStatus {
    /// The capacity, units.
    pub limit: u64,
    /// Whole units left now (0 when in debt).
    pub remaining: u64,
    /// Milliseconds until the bucket is full again.
    pub reset_ms: u64,
}

impl Bucket {
    /// A full bucket at `now`. `per_period` and `period_ms` are at least 1 (clamped).
    pub fn new(per_period: u64, period_ms: u64, capacity: u64, now: Millis) -> Bucket {
        let period_ms = period_ms.max(1);
        let capacity = capacity.max(1);
        Bucket {
            per_period: per_period.max(1),
            period_ms,
            capacity,
            level: i128::from(capacity) * i128::from(period_ms),
            last: now,
        }
    }

    /// The same rate, period and capacity.
    pub fn same_shape(&self, other: &Bucket) -> bool {
        self.per_period == other.per_period
            && self.period_ms == other.period_ms
            && self.capacity == other.capacity
    }

    fn scaled(&self, units: u64) -> i128 {
        i128::from(units) * i128::from(self.period_ms)
    }

    fn refill(&mut self, now: Millis) {
        if now <= self.last {
            return;
        }
        let add = i128::from(now - self.last) * i128::from(self.per_period);
        self.level = (self.level + add).min(self.scaled(self.capacity));
        self.last = now;
    }

    /// Milliseconds until the level reaches `units` (0 if it has).
    fn wait_for(&self, units: u64) -> u64 {
        let missing = self.scaled(units) - self.level;
        if missing <= 0 {
            return 0;
        }
        let per = i128::from(self.per_period);
        u64::try_from((missing + per - 1) / per).unwrap_or(u64::MAX)
    }

    /// Whether `units` are available at `now`; if not, the milliseconds until they are.
    pub fn check(&mut self, now: Millis, units: u64) -> Result<(), u64> {
        self.refill(now);
        match self.wait_for(units) {
            0 => Ok(()),
            ms => Err(ms),
        }
    }

    /// Takes `units` unconditionally (the level may go negative).
    pub fn charge(&mut self, now: Millis, units: u64) {
        self.refill(now);
        self.level = self.level.saturating_sub(self.scaled(units));
    }

    /// Gives back `units` charged at `charged_at`, less what the bucket refilled since then, and
    /// never above the capacity; returns the whole units given back. Less the refill, because
    /// without the charge the bucket would have been that much fuller and may have lost up to
    /// that refill to its cap: a refund never leaves it fuller than if the charge had not been
    /// made.
    pub fn refund(&mut self, now: Millis, units: u64, charged_at: Millis) -> u64 {
        self.refill(now);
        let refilled = i128::from(now.saturating_sub(charged_at)) * i128::from(self.per_period);
        let back = (self.scaled(units) - refilled).max(0);
        let before = self.level;
        self.level = (self.level + back).min(self.scaled(self.capacity));
        u64::try_from((self.level - before) / i128::from(self.period_ms)).unwrap_or(0)
    }

    /// Whether the bucket is full at `now` (holds no state worth keeping).
    pub fn is_full(&mut self, now: Millis) -> bool {
        self.refill(now);
        self.level >= self.scaled(self.capacity)
    }

    /// Whole units left at `now`, possibly negative.
    pub fn level(&mut self, now: Millis) -> i128 {
        self.refill(now);
        self.level.div_euclid(i128::from(self.period_ms))
    }

    /// Limit, remaining and reset at `now`.
    pub fn status(&mut self, now: Millis) -> BucketStatus {
        self.refill(now);
        let whole = self.level.div_euclid(i128::from(self.period_ms));
        BucketStatus {
            limit: self.capacity,
            remaining: u64::try_from(whole.max(0)).unwrap_or(u64::MAX),
            reset_ms: self.wait_for(self.capacity),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refills_exactly_and_caps() {
        // 5 per second, burst 5.
        let mut b = Bucket::new(5, 1000, 5, 0);
        for _ in 0..5 {
            b.check(0, 1).unwrap();
            b.charge(0, 1);
        }
        assert_eq!(b.check(0, 1), Err(200));
        assert_eq!(b.check(199, 1), Err(1));
        assert_eq!(b.check(200, 1), Ok(()));
        assert_eq!(b.status(200).remaining, 1);
        assert!(b.is_full(10_000));
        assert_eq!(b.status(10_000).remaining, 5);
    }

    #[test]
    fn debt_delays_the_next_admission() {
        // 600 tokens per minute = 10 per second, burst 600.
        let mut b = Bucket::new(600, 60_000, 600, 0);
        b.charge(0, 1200);
        assert_eq!(b.level(0), -600);
        // 601 tokens to get back to one: 601 × 100 ms.
        assert_eq!(b.check(0, 1), Err(60_100));
        let s = b.status(0);
        assert_eq!((s.remaining, s.reset_ms), (0, 120_000));
    }

    #[test]
    fn a_refund_gives_back_at_most_up_to_the_capacity() {
        let mut b = Bucket::new(600, 60_000, 600, 0);
        b.charge(0, 1000);
        assert_eq!(b.refund(0, 1000, 0), 1000);
        assert_eq!(b.level(0), 600);
        b.charge(0, 100);
        assert_eq!(b.refund(0, 1_000_000, 0), 100);
        assert_eq!(b.level(0), 600, "capped");
        // Charged 1,000 at 0 (level -400); 2 s later 20 tokens have refilled (-380), and
        // without the charge the bucket would have been at 600 all along: 980 come back.
        b.charge(0, 1000);
        assert_eq!(b.refund(2_000, 1000, 0), 980);
        assert_eq!(b.level(2_000), 600);
        b.charge(2_000, 100);
        assert_eq!(b.refund(20_000, 100, 2_000), 0, "refilled long since");
    }

    #[test]
    fn time_going_back_refills_nothing() {
        let mut b = Bucket::new(1, 1000, 1, 5_000);
        b.charge(5_000, 1);
        assert!(b.check(1_000, 1).is_err());
        assert_eq!(b.check(6_000, 1), Ok(()));
    }
}
