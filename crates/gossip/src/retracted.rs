//! Retractions remembered by the receiver, so that a peer's decision that arrives *after* the
//! retraction taking it back (a delta batch lost, then resent to fill the gap, behind the later
//! batch carrying the retraction) is not applied.
//!
//! Each replica numbers its delta batches, and within a batch entries keep the order in which the
//! decisions and retractions were made; this store makes the receiver honour that order across
//! batches too: per sender, for each (instance, block), a decision entry from batch `s` is
//! skipped when a retraction from a batch numbered above `s` was already applied. A decision
//! from a later batch (the same prompt routed there again) is applied as usual.
//!
//! Invariants:
//! - Bounded: at most `MAX_TOMBSTONES` (sender, instance, block) entries; the oldest go first, and
//!   each lives `keep_ms` (a batch arriving later than that is past repair by resend anyway:
//!   the snapshot path, which carries the sender's current own predictions, covers it).
//! - Never consulted for snapshots (no sequence number; a snapshot is the sender's present state).
//! - Empty (one length check per entry) while nothing was retracted.

use ahash::AHashMap;
use kvgate_core::{BlockHash, InstanceId, Millis};
use std::collections::VecDeque;

/// Bound on remembered (sender, instance, block) retractions (~48 bytes each).
pub(crate) const MAX_TOMBSTONES: usize = 16_384;

type Key = (u64, InstanceId, BlockHash);

/// Recent retractions per sender: (sender, instance, block) → (batch seq, expiry).
pub(crate) struct Retracted {
    keep_ms: u64,
    map: AHashMap<Key, (u64, Millis)>,
    /// Insertion order, for eviction: (key, expiry at insertion).
    order: VecDeque<(Key, Millis)>,
}

impl Retracted {
    /// A store whose entries live `keep_ms`.
    pub fn new(keep_ms: u64) -> Self {
        Self {
            keep_ms,
            map: AHashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Number of remembered retractions.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Remembers that `sender` retracted `hashes` on `instance` in batch `seq`.
    pub fn note(
        &mut self,
        sender: u64,
        instance: InstanceId,
        hashes: &[BlockHash],
        seq: u64,
        now: Millis,
    ) {
        self.expire(now);
        let expires = now.saturating_add(self.keep_ms);
        for &h in hashes {
            let key = (sender, instance, h);
            let e = self.map.entry(key).or_insert((seq, expires));
            *e = (e.0.max(seq), expires);
            self.order.push_back((key, expires));
        }
        while self.map.len() > MAX_TOMBSTONES || self.order.len() > 2 * MAX_TOMBSTONES {
            let Some((key, at)) = self.order.pop_front() else {
                break;
            };
            // Only the newest record of a key removes it (re-noted keys have several).
            if self.map.get(&key).is_some_and(|&(_, e)| e == at) {
                self.map.remove(&key);
            }
        }
    }

    /// Keeps the hashes of a decision from `sender`'s batch `seq` that no later retraction took
    /// back; returns how many were dropped.
    pub fn filter(
        &self,
        sender: u64,
        instance: InstanceId,
        seq: u64,
        hashes: &mut Vec<BlockHash>,
        now: Millis,
    ) -> usize {
        if self.map.is_empty() {
            return 0;
        }
        let before = hashes.len();
        hashes.retain(|&h| {
            !self
                .map
                .get(&(sender, instance, h))
                .is_some_and(|&(s, e)| s > seq && e > now)
        });
        before - hashes.len()
    }

    /// Drops expired entries.
    fn expire(&mut self, now: Millis) {
        while let Some(&(key, at)) = self.order.front() {
            if at > now {
                break;
            }
            self.order.pop_front();
            if self.map.get(&key).is_some_and(|&(_, e)| e <= now) {
                self.map.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u64 = 7;
    const I: InstanceId = InstanceId(1);

    #[test]
    fn an_older_decision_is_filtered_a_newer_one_is_not() {
        let mut r = Retracted::new(1_000);
        r.note(A, I, &[1, 2, 3], 5, 0);
        let mut older = vec![1, 2, 3, 4];
        assert_eq!(r.filter(A, I, 4, &mut older, 10), 3);
        assert_eq!(older, vec![4]);
        let mut same = vec![1, 2];
        assert_eq!(r.filter(A, I, 5, &mut same, 10), 0, "same batch: in order");
        let mut newer = vec![1, 2];
        assert_eq!(r.filter(A, I, 6, &mut newer, 10), 0);
        let mut other_sender = vec![1, 2];
        assert_eq!(r.filter(A + 1, I, 0, &mut other_sender, 10), 0);
        let mut other_instance = vec![1, 2];
        assert_eq!(r.filter(A, InstanceId(2), 0, &mut other_instance, 10), 0);
        let mut expired = vec![1, 2];
        assert_eq!(r.filter(A, I, 0, &mut expired, 1_000), 0);
    }

    #[test]
    fn bounded_and_expiring() {
        let mut r = Retracted::new(100);
        let hashes: Vec<u64> = (0..(MAX_TOMBSTONES as u64 * 3)).collect();
        r.note(A, I, &hashes, 1, 0);
        assert!(r.len() <= MAX_TOMBSTONES, "{}", r.len());
        assert!(r.order.len() <= 2 * MAX_TOMBSTONES);
        // The newest survive eviction.
        let mut last = vec![*hashes.last().unwrap()];
        assert_eq!(r.filter(A, I, 0, &mut last, 50), 1);
        r.note(A, I, &[1], 2, 200);
        assert_eq!(r.len(), 1, "the expired ones went at the next note");
    }
}
