//! A bounded log of recent entries that every serving thread appends to without sharing a lock.
//!
//! Invariants:
//! - Each thread appends to one shard (picked once per thread); readers lock shards one at a time.
//!   A single shared log would have every serving thread take one lock and write one buffer per
//!   request, passing their cache lines back and forth.
//! - Each shard keeps its newest `cap` entries, so [`ShardedLog::recent`] returns exactly the
//!   newest `cap` over all shards; memory is at most [`MAX_SHARDS`] × `cap` entries.
//! - Entries read newest last, ordered by their time; entries of one thread keep their order.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Most shards of one log.
pub const MAX_SHARDS: usize = 4;

/// Threads that have appended to some log so far: spreads threads over shards.
static THREADS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's number, drawn from [`THREADS`] on its first append.
    static THREAD: usize = THREADS.fetch_add(1, Ordering::Relaxed);
}

/// One thread's entries with their times, oldest first.
type Shard<T> = Mutex<VecDeque<(u64, T)>>;

/// The log. `T` is kept with the time it was appended at (milliseconds, any epoch).
pub struct ShardedLog<T> {
    shards: Box<[Shard<T>]>,
    cap: usize,
}

impl<T> ShardedLog<T> {
    /// A log returning the newest `cap` entries (0 keeps nothing), with one shard per serving
    /// thread up to [`MAX_SHARDS`].
    pub fn new(cap: usize, threads: usize) -> Self {
        let shards = threads.clamp(1, MAX_SHARDS);
        ShardedLog {
            shards: (0..shards)
                .map(|_| Mutex::new(VecDeque::with_capacity(cap.min(1024))))
                .collect(),
            cap,
        }
    }

    /// Whether appends are kept at all.
    pub fn enabled(&self) -> bool {
        self.cap > 0
    }

    /// Appends `entry`, made at `at_ms`, dropping the shard's oldest when it is full.
    pub fn push(&self, at_ms: u64, entry: T) {
        if self.cap == 0 {
            return;
        }
        let shard = THREAD.with(|t| *t) % self.shards.len();
        let mut log = self.shards[shard].lock();
        if log.len() >= self.cap {
            log.pop_front();
        }
        log.push_back((at_ms, entry));
    }

    /// The newest `cap` entries, newest last, each passed through `read`.
    pub fn recent<R>(&self, mut read: impl FnMut(u64, &T) -> R) -> Vec<(u64, R)> {
        let mut all = Vec::new();
        for shard in self.shards.iter() {
            all.extend(shard.lock().iter().map(|(at, e)| (*at, read(*at, e))));
        }
        // Stable: a thread's entries with equal times keep their order.
        all.sort_by_key(|(at, _)| *at);
        let skip = all.len().saturating_sub(self.cap);
        all.drain(..skip);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn keeps_the_newest_cap_in_time_order() {
        let log = ShardedLog::new(3, 2);
        for (at, v) in [(1, "a"), (2, "b"), (3, "c"), (4, "d")] {
            log.push(at, v);
        }
        let got: Vec<_> = log.recent(|_, v| *v).into_iter().map(|(_, v)| v).collect();
        assert_eq!(got, ["b", "c", "d"]);
    }

    #[test]
    fn zero_cap_keeps_nothing() {
        let log = ShardedLog::new(0, 2);
        assert!(!log.enabled());
        log.push(1, 1u32);
        assert!(log.recent(|_, v| *v).is_empty());
    }

    #[test]
    fn merges_threads_and_stays_bounded() {
        let log = Arc::new(ShardedLog::new(50, 4));
        // One thread after another, each logging 100 entries at later times than the last.
        for t in 0..4u64 {
            let log = log.clone();
            std::thread::spawn(move || {
                for i in 0..100u64 {
                    log.push(100 * t + i, (t, i));
                }
            })
            .join()
            .unwrap();
        }
        let got = log.recent(|_, v| *v);
        let times: Vec<u64> = got.iter().map(|(at, _)| *at).collect();
        assert_eq!(times, (350..400).collect::<Vec<_>>());
        let kept: usize = log.shards.iter().map(|s| s.lock().len()).sum();
        assert!(kept <= MAX_SHARDS * 50, "{kept}");
        // Entries from several threads merge by time.
        let log = Arc::new(ShardedLog::new(10, 4));
        for t in 0..2u64 {
            let log = log.clone();
            std::thread::spawn(move || {
                for i in 0..5u64 {
                    log.push(2 * i + t, 2 * i + t);
                }
            })
            .join()
            .unwrap();
        }
        let merged: Vec<u64> = log.recent(|_, v| *v).into_iter().map(|(_, v)| v).collect();
        assert_eq!(merged, (0..10).collect::<Vec<_>>());
    }
}
