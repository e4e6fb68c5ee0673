//! Whole-index maintenance: clearing an instance, TTL sweeps, snapshots and statistics.
//!
//! Invariants: each walks the shards one at a time, holding one shard lock at a time for a bounded
//! scan of that shard, so routing waits at most one shard's sweep; counters are adjusted after
//! the shard lock is released.

use super::{map_bytes, IndexStats, PlacementIndex, Shard, SOURCES};
use crate::{BlockHash, InstanceId, Millis, Source};
use parking_lot::RwLock;
use std::sync::atomic::Ordering;

impl Shard {
    /// Drops every entry matching `drop` (reporting each to `removed`) and every block left
    /// without holders, keeping `spill_bytes` exact.
    fn drop_entries(
        &mut self,
        mut drop: impl FnMut(&super::Entry) -> bool,
        mut removed: impl FnMut(super::Entry),
    ) {
        let mut spill_delta: isize = 0;
        self.map.retain(|_, holders| {
            let before = holders.heap_bytes() as isize;
            let keep = holders.retain(&mut drop, &mut removed);
            let after = if keep {
                holders.heap_bytes() as isize
            } else {
                0
            };
            spill_delta += after - before;
            keep
        });
        self.spill_bytes = (self.spill_bytes as isize + spill_delta).max(0) as usize;
    }
}

impl PlacementIndex {
    /// Drops every entry of `instance` that came from one of `sources`
    /// (engine cleared its cache, restarted, or an event stream broke).
    pub fn clear_instance(&self, instance: InstanceId, sources: &[Source]) {
        let slot = self.slots.get(instance.0);
        if slot.is_none() {
            return;
        }
        for shard in self.shards.iter() {
            let mut removed = [0usize; 3];
            {
                shard.write().drop_entries(
                    |e| e.instance == instance.0 && sources.contains(&e.source),
                    |e| removed[e.source as usize] += 1,
                );
            }
            for (src, n) in removed.iter().enumerate() {
                for _ in 0..*n {
                    self.on_removed(slot, SOURCES[src]);
                }
            }
        }
        if let Some(slot) = slot {
            if slot.count.load(Ordering::Relaxed) == 0 {
                let mut ring = slot.ring.lock();
                ring.clear();
                ring.shrink_to_fit();
            }
        }
    }

    /// Forgets `instance` entirely (it left the fleet and its id may be given to a new one):
    /// every entry of every source, and its capacity back to the configured default.
    pub fn forget_instance(&self, instance: InstanceId) {
        self.clear_instance(instance, &SOURCES);
        if let Some(slot) = self.slots.get(instance.0) {
            slot.capacity.store(0, Ordering::Relaxed);
        }
    }

    /// Removes expired predictions; returns how many. Call periodically, off the request path.
    pub fn expire(&self, now: Millis) -> usize {
        self.now_hint.fetch_max(now, Ordering::Relaxed);
        let mut total = 0;
        for shard in self.shards.iter() {
            let mut removed: Vec<(u32, Source)> = Vec::new();
            {
                shard
                    .write()
                    .drop_entries(|e| !e.live(now), |e| removed.push((e.instance, e.source)));
            }
            total += removed.len();
            for (inst, src) in removed {
                self.on_removed(self.slots.get(inst), src);
            }
        }
        self.expired.fetch_add(total as u64, Ordering::Relaxed);
        total
    }

    /// Visits every live prediction from `source` as (instance, hash, expires_at).
    /// Used to hand a joining gossip peer a snapshot of this replica's placements.
    ///
    /// Visits one shard at a time under its read lock: `visit` must not call back into the index.
    pub fn for_each_prediction(
        &self,
        source: Source,
        now: Millis,
        visit: &mut dyn FnMut(InstanceId, BlockHash, Millis),
    ) {
        for shard in self.shards.iter() {
            let shard = shard.read();
            for (&h, holders) in shard.map.iter() {
                for e in holders.as_slice() {
                    if e.source == source && source != Source::Event && e.live(now) {
                        visit(InstanceId(e.instance), h, e.expires);
                    }
                }
            }
        }
    }

    /// Current counters and memory estimate.
    ///
    /// `memory_bytes` counts map buckets (hashbrown: key, value and one control byte per bucket),
    /// spilled holder vectors, per-instance slots and CLOCK rings.
    pub fn stats(&self) -> IndexStats {
        let mut blocks = 0;
        let mut memory =
            std::mem::size_of::<Self>() + self.shards.len() * std::mem::size_of::<RwLock<Shard>>();
        for shard in self.shards.iter() {
            let shard = shard.read();
            blocks += shard.map.len();
            memory += map_bytes(shard.map.capacity()) + shard.spill_bytes;
        }
        memory += self.slots.heap_bytes();
        let high = self.slots.high();
        IndexStats {
            blocks,
            entries_by_source: [0, 1, 2].map(|i| self.by_source[i].load(Ordering::Relaxed)),
            entries_by_instance: (0..high as u32)
                .map(|i| self.instance_entries(InstanceId(i)))
                .collect(),
            memory_bytes: memory,
            evicted: self.evicted.load(Ordering::Relaxed),
            expired: self.expired.load(Ordering::Relaxed),
        }
    }
}
