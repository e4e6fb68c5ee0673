//! Capacity eviction of the placement index: per-instance CLOCK over each instance's ring.
//!
//! Invariants:
//! - After an insert returns, the inserting instance holds at most its capacity and the index at
//!   most `max_entries` (up to concurrent inserts racing past the counters).
//! - Predictions go first; event-sourced entries only when a bounded scan found nothing else:
//!   after two full laps, or after [`EVICT_SCAN_BUDGET`] entries beyond those asked for. The bound
//!   keeps an insert into a full instance O(1) amortised: an instance whose engine reports more
//!   blocks than its configured capacity (e.g. a CPU offload tier) is full of event entries, and an
//!   unbounded search for a prediction would rescan its whole ring on every insert, stalling the
//!   request path and event ingestion.
//! - Expired predictions are evicted regardless of their reference bit.

use super::{PlacementIndex, Source};
use crate::{BlockHash, InstanceId};
use ahash::AHashSet;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

/// Fraction of the global cap freed at once when it is exceeded, so that the O(instances) victim
/// search is amortised over many inserts.
const GLOBAL_SLACK_DIVISOR: usize = 256;

/// Entries one eviction call may pass over (referenced, or event-sourced) before it evicts the
/// next entry regardless.
pub(super) const EVICT_SCAN_BUDGET: usize = 64;

impl PlacementIndex {
    /// The capacity of `instance` in entries.
    pub(super) fn capacity_of(&self, instance: u32) -> usize {
        match self
            .slots
            .get(instance)
            .map(|s| s.capacity.load(Ordering::Relaxed))
        {
            Some(c) if c > 0 => c,
            _ => self.cfg.default_instance_capacity.max(1),
        }
    }

    pub(super) fn evict_instance_over_capacity(&self, instance: u32) {
        let Some(slot) = self.slots.get(instance) else {
            return;
        };
        let cap = self.capacity_of(instance);
        let count = slot.count.load(Ordering::Relaxed);
        if count > cap {
            self.evict_from(instance, count - cap);
        }
    }

    pub(super) fn evict_over_global_cap(&self) {
        let max = self.cfg.max_entries.max(1);
        let total = self.total.load(Ordering::Relaxed);
        if total <= max {
            return;
        }
        let mut need = total - max + max / GLOBAL_SLACK_DIVISOR;
        // Take from the largest instances: they have the most to lose and the least marginal value.
        while need > 0 {
            let victim = (0..self.slots.high() as u32)
                .map(|i| (self.instance_entries(InstanceId(i)), i))
                .max();
            let Some((count, inst)) = victim else { return };
            if count == 0 {
                return;
            }
            let n = need.min(count.div_ceil(8).max(1));
            let freed = self.evict_from(inst, n);
            if freed == 0 {
                return;
            }
            need = need.saturating_sub(freed);
        }
    }

    /// Evicts up to `n` entries of `instance` by CLOCK; returns how many were evicted.
    pub(super) fn evict_from(&self, instance: u32, n: usize) -> usize {
        let Some(slot) = self.slots.get(instance) else {
            return 0;
        };
        let mut ring = slot.ring.lock();
        let lap = ring.len();
        let mut steps = 0usize;
        let mut freed = 0usize;
        while freed < n {
            let Some(h) = ring.pop_front() else { break };
            steps += 1;
            let last_resort = steps > 2 * lap || steps > n.saturating_add(EVICT_SCAN_BUDGET);
            let mut shard = self.shard(h).write();
            let shard = &mut *shard;
            let Some(holders) = shard.map.get_mut(&h) else {
                continue;
            };
            let Some(e) = holders.get_mut(instance) else {
                continue;
            };
            let expired = e.source != Source::Event && !e.live(self.clock_hint());
            let evict = if expired {
                true
            } else if e.source == Source::Event && !last_resort {
                false
            } else if e.referenced && !last_resort {
                e.referenced = false;
                false
            } else {
                true
            };
            if !evict {
                ring.push_back(h);
                continue;
            }
            let before = holders.heap_bytes();
            let mut src = None;
            let keep = holders.retain(|x| x.instance == instance, &mut |x| src = Some(x.source));
            let after = if keep { holders.heap_bytes() } else { 0 };
            shard.spill_bytes = shard.spill_bytes + after - before;
            if !keep {
                shard.map.remove(&h);
            }
            if let Some(src) = src {
                self.on_removed(Some(slot), src);
                self.evicted.fetch_add(1, Ordering::Relaxed);
                freed += 1;
            }
        }
        let len = ring.len();
        if ring.capacity() > len + len / 2 + 1024 {
            ring.shrink_to(len + len / 4);
        }
        freed
    }

    /// Rebuilds `instance`'s ring keeping, once each and in order, the hashes it still holds.
    pub(super) fn compact_ring(&self, instance: u32, ring: &mut VecDeque<BlockHash>) {
        let mut seen = AHashSet::with_capacity(ring.len());
        ring.retain(|&h| {
            let held = self
                .shard(h)
                .read()
                .map
                .get(&h)
                .is_some_and(|hs| hs.as_slice().iter().any(|e| e.instance == instance));
            held && seen.insert(h)
        });
        let len = ring.len();
        ring.shrink_to(len + len / 4);
    }
}
