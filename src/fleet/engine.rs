//! The last load an engine reported, readable on every routing decision without writing shared
//! memory.
//!
//! Invariants:
//! - A sequence lock: a reader never writes, so the decisions of every serving thread read the
//!   same cache lines without taking them from one another; only a scrape (once per interval)
//!   writes.
//! - A read returns one whole report, never fields of two (it retries while a write is under way).
//! - Writers are serialized by their own mutex, which readers never touch.

use kvgate_core::load::EngineLoad;
use kvgate_core::Millis;
use parking_lot::Mutex;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// An instance's last engine-reported load, if any.
#[derive(Default)]
pub struct EngineCell {
    /// Odd while a write is under way; bumped twice per write.
    seq: AtomicU64,
    /// `running << 32 | waiting`.
    counts: AtomicU64,
    /// `kv_usage` as `f32` bits.
    usage: AtomicU32,
    /// Scrape time plus one; 0 = nothing reported yet.
    at_plus_one: AtomicU64,
    /// `tracked_in_flight` plus one; 0 = not recorded.
    tracked_plus_one: AtomicU64,
    write: Mutex<()>,
}

impl EngineCell {
    /// Records a report (its `stale` flag is the reader's to compute, so it is not kept).
    pub fn set(&self, load: EngineLoad) {
        let _writer = self.write.lock();
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        // The odd count must be visible before any field changes.
        fence(Ordering::Release);
        self.counts.store(
            (u64::from(load.running) << 32) | u64::from(load.waiting),
            Ordering::Relaxed,
        );
        self.usage.store(load.kv_usage.to_bits(), Ordering::Relaxed);
        self.at_plus_one
            .store(load.at.saturating_add(1), Ordering::Relaxed);
        self.tracked_plus_one.store(
            load.tracked_in_flight.map_or(0, |n| u64::from(n) + 1),
            Ordering::Relaxed,
        );
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// The last report, marked stale when older than `stale_after_ms` at `now`.
    pub fn get(&self, now: Millis, stale_after_ms: Millis) -> Option<EngineLoad> {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let counts = self.counts.load(Ordering::Relaxed);
            let usage = self.usage.load(Ordering::Relaxed);
            let at_plus_one = self.at_plus_one.load(Ordering::Relaxed);
            let tracked_plus_one = self.tracked_plus_one.load(Ordering::Relaxed);
            // The field loads must complete before the count is read again.
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) != before {
                continue;
            }
            let at = at_plus_one.checked_sub(1)?;
            return Some(EngineLoad {
                running: (counts >> 32) as u32,
                waiting: counts as u32,
                kv_usage: f32::from_bits(usage),
                at,
                stale: now.saturating_sub(at) > stale_after_ms,
                tracked_in_flight: tracked_plus_one
                    .checked_sub(1)
                    .and_then(|n| u32::try_from(n).ok()),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn load(n: u32, at: Millis) -> EngineLoad {
        EngineLoad {
            running: n,
            waiting: n + 1,
            kv_usage: n as f32 / 1000.0,
            at,
            stale: false,
            tracked_in_flight: n.checked_sub(1),
        }
    }

    #[test]
    fn empty_until_set_then_the_last_report_with_staleness() {
        let c = EngineCell::default();
        assert_eq!(c.get(10, 5), None);
        c.set(load(3, 0));
        assert_eq!(c.get(5, 5), Some(load(3, 0)));
        c.set(load(7, 100));
        assert_eq!(c.get(100, 5), Some(load(7, 100)));
        let stale = c.get(106, 5).unwrap();
        assert!(stale.stale);
        assert_eq!(stale.running, 7);
    }

    #[test]
    fn readers_never_see_fields_of_two_reports() {
        let c = Arc::new(EngineCell::default());
        c.set(load(0, 0));
        let writer = {
            let c = c.clone();
            std::thread::spawn(move || {
                for n in 1..20_000u32 {
                    c.set(load(n, u64::from(n)));
                }
            })
        };
        let mut reads = 0u32;
        while !writer.is_finished() || reads < 1000 {
            let l = c.get(0, u64::MAX).unwrap();
            // Every field of one report derives from the same n.
            assert_eq!(l.waiting, l.running + 1);
            assert_eq!(l.at, u64::from(l.running));
            assert_eq!(l.kv_usage, l.running as f32 / 1000.0);
            assert_eq!(l.tracked_in_flight, l.running.checked_sub(1));
            reads += 1;
        }
        writer.join().unwrap();
    }
}
