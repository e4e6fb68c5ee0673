//! The KV placement index: which instances hold which blocks.
//!
//! Invariants:
//! - One API for every source: engine events ([`PlacementIndex::store`] / [`PlacementIndex::remove`] /
//!   [`PlacementIndex::clear_instance`]) and predictions with a time-to-live
//!   ([`PlacementIndex::predict`]) from this gateway's or a peer's routing decisions.
//! - Event-sourced copies are reference-counted per (block, instance): two physical copies need two
//!   removals. An event-sourced entry supersedes a prediction for the same (block, instance).
//! - [`PlacementIndex::match_prefix`] costs O(prompt blocks × holders per block), never O(fleet) or
//!   O(index size), and readers wait behind writers only for one shard's short critical section.
//! - Bounded: per-instance capacity (LRU eviction of predicted entries first), TTL expiry of
//!   predictions, and a global entry cap; memory per (block, instance) entry is measured and reported.
//! - Every engine-reported removal is told to the removal hook, if one is set, after the index
//!   applied it ([`PlacementIndex::set_on_remove`]: gossip forgets peers' pending checkpoints of
//!   what the engine evicted, so they are not materialized back as predictions).
//!
//! # Layout
//!
//! `shards` × `RwLock<HashMap<BlockHash, Holders>>` (ahash). A `Holders` value is 16 bytes: one
//! 16-byte entry inline (instance, expiry, per-tier copy counts, source, CLOCK bit) or a boxed
//! sorted vector of entries. Each instance has a slot with its entry count, its capacity and a
//! CLOCK ring of the hashes it gained.
//!
//! # Eviction (approximate LRU by CLOCK)
//!
//! When an instance exceeds its capacity, or the index its global cap, the instance's CLOCK hand
//! walks its ring from the oldest hash: stale hashes are dropped; expired predictions are evicted;
//! a referenced entry loses its bit and goes to the back (second chance); an unreferenced
//! prediction is evicted. Event-sourced entries are skipped for two full laps (the engine reports
//! its own evictions) and evicted only as a last resort, so the bound always holds. Re-predicting or
//! re-storing a block sets its bit again, which approximates least-recently-used order.
//!
//! Writes ([`PlacementIndex::store`], [`PlacementIndex::predict`], [`PlacementIndex::remove`],
//! [`PlacementIndex::retract`]) group a call's hashes by shard, stably, and take each shard's write
//! lock once per chunk of 256 hashes (as matching takes each read lock once per batch): the
//! result is the per-hash walk's (entries, counts under the shard lock, spill bytes, by-source
//! counters, and the CLOCK ring in the call's order, hence eviction), with a lock per shard rather
//! than per hash.
//!
//! Lock order: an instance's ring mutex may be held while taking a shard lock, never the reverse.

#[cfg(test)]
mod batched_tests;
mod evict;
mod holders;
mod matching;
mod slots;
mod sweep;
#[cfg(test)]
mod tests;

pub use slots::MAX_INSTANCES;

use crate::{BlockHash, InstanceId, Millis, Source, Tier};
use holders::{Entry, Holders};
use parking_lot::RwLock;
use slots::Slots;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Bounds and tuning of the index. Defaults live in the gateway's config.
#[derive(Clone, Debug)]
pub struct IndexConfig {
    /// Number of lock shards (rounded up to a power of two).
    pub shards: usize,
    /// Global cap on (block, instance) entries across all instances.
    pub max_entries: usize,
    /// Per-instance cap on entries when the engine's cache size is unknown.
    pub default_instance_capacity: usize,
}

/// How many leading blocks of a prompt one instance holds, split by tier.
///
/// "Leading" means the contiguous run from block 0: the first block the instance lacks ends it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InstanceMatch {
    /// The instance.
    pub instance: InstanceId,
    /// Leading blocks held in GPU memory.
    pub gpu: u32,
    /// Leading blocks held only in CPU offload.
    pub cpu: u32,
    /// Leading blocks held only on disk / remote offload.
    pub disk: u32,
    /// Leading blocks that a local prediction for this instance would not change: their entry
    /// is referenced (CLOCK bit set) and engine-reported, or a local prediction expiring at or
    /// after the threshold given to [`PlacementIndex::match_prefix_fresh`] (0 otherwise).
    pub fresh: u32,
}

impl InstanceMatch {
    /// Total leading blocks held in any tier.
    pub fn total(&self) -> u32 {
        self.gpu + self.cpu + self.disk
    }
}

/// Result buffer of [`PlacementIndex::match_prefix`]: one row per instance holding block 0.
/// Reused across requests to avoid allocation on the hot path.
#[derive(Clone, Debug, Default)]
pub struct PrefixMatches {
    /// Rows for instances with at least one leading block, in no particular order.
    pub rows: Vec<InstanceMatch>,
}

impl PrefixMatches {
    /// The row for `instance`, or an empty match.
    pub fn get(&self, instance: InstanceId) -> InstanceMatch {
        self.rows
            .iter()
            .copied()
            .find(|r| r.instance == instance)
            .unwrap_or(InstanceMatch {
                instance,
                ..Default::default()
            })
    }
    /// The longest leading run any instance holds.
    pub fn best(&self) -> u32 {
        self.rows
            .iter()
            .map(InstanceMatch::total)
            .max()
            .unwrap_or(0)
    }
}

/// Counters and sizes for `/admin/index` and metrics.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct IndexStats {
    /// Distinct block hashes present.
    pub blocks: usize,
    /// (block, instance) entries by source: event, local, peer.
    pub entries_by_source: [usize; 3],
    /// Entries per instance (index = instance id).
    pub entries_by_instance: Vec<usize>,
    /// Estimated heap bytes held by the index.
    pub memory_bytes: usize,
    /// Entries evicted for capacity since start.
    pub evicted: u64,
    /// Predicted entries expired by TTL since start.
    pub expired: u64,
}

/// The placement index. `Send + Sync`; share it behind an `Arc`.
pub struct PlacementIndex {
    cfg: IndexConfig,
    shards: Box<[RwLock<Shard>]>,
    shard_mask: u64,
    slots: Slots,
    total: AtomicUsize,
    by_source: [AtomicUsize; 3],
    evicted: AtomicU64,
    expired: AtomicU64,
    /// Latest `now` seen by a write; lets eviction recognise expired predictions.
    now_hint: AtomicU64,
    /// Told of every engine-reported removal, set once.
    on_remove: std::sync::OnceLock<RemoveHook>,
}

/// Receives `(instance, hashes)` of an engine-reported removal (one copy of each of `hashes` left
/// `instance`) after the index applied it. Runs on the event path: cheap, never blocking.
pub type RemoveHook = std::sync::Arc<dyn Fn(InstanceId, &[BlockHash]) + Send + Sync>;

/// One lock shard.
#[derive(Default)]
struct Shard {
    map: HashMap<BlockHash, Holders, ahash::RandomState>,
    /// Heap bytes of spilled holder vectors in this shard.
    spill_bytes: usize,
}

/// Upper bound on lock shards.
const MAX_SHARDS: usize = 1 << 16;

/// Hashes one write walk groups by shard at a time (a multiple of 64).
const WRITE_CHUNK: usize = 256;

/// Chunks shorter than this keep their order (runs of one shard still share a lock).
const GROUP_MIN: usize = 8;

/// Stale ring slots tolerated beyond 1.5 × the live count before compaction.
const RING_SLACK: usize = 1024;

impl PlacementIndex {
    /// An empty index.
    pub fn new(cfg: IndexConfig) -> Self {
        let n = cfg.shards.clamp(1, MAX_SHARDS).next_power_of_two();
        Self {
            shards: (0..n).map(|_| RwLock::new(Shard::default())).collect(),
            shard_mask: (n - 1) as u64,
            cfg,
            slots: Slots::default(),
            total: AtomicUsize::new(0),
            by_source: Default::default(),
            evicted: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            now_hint: AtomicU64::new(0),
            on_remove: std::sync::OnceLock::new(),
        }
    }

    /// Sets the removal hook; false (and the hook dropped) when one is already set.
    pub fn set_on_remove(&self, hook: RemoveHook) -> bool {
        self.on_remove.set(hook).is_ok()
    }

    fn shard(&self, h: BlockHash) -> &RwLock<Shard> {
        &self.shards[self.shard_index(h)]
    }

    fn shard_index(&self, h: BlockHash) -> usize {
        // Block hashes are uniformly distributed; the top bits pick the shard, independent of the
        // map's own hashing.
        ((h >> 40) & self.shard_mask) as usize
    }

    fn clock_hint(&self) -> Millis {
        self.now_hint.load(Ordering::Relaxed)
    }

    /// The configuration the index was built with.
    pub fn config(&self) -> &IndexConfig {
        &self.cfg
    }

    /// Live (block, instance) entries, all instances and sources.
    pub fn len(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    /// True when the index holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries currently attributed to `instance`.
    pub fn instance_entries(&self, instance: InstanceId) -> usize {
        self.slots
            .get(instance.0)
            .map_or(0, |s| s.count.load(Ordering::Relaxed))
    }

    /// Sets an instance's capacity in blocks (from config or the engine's reported cache size).
    pub fn set_instance_capacity(&self, instance: InstanceId, blocks: usize) {
        if let Some(slot) = self.slots.get_or_create(instance.0) {
            slot.capacity.store(blocks.max(1), Ordering::Relaxed);
        }
        self.evict_instance_over_capacity(instance.0);
    }

    /// Engine event: `instance` stored `hashes` (kvgate's own hashes) in `tier`.
    pub fn store(&self, instance: InstanceId, hashes: &[BlockHash], tier: Tier, now: Millis) {
        self.now_hint.fetch_max(now, Ordering::Relaxed);
        self.upsert(
            instance,
            hashes,
            |slot| match slot {
                Some(e) if e.source == Source::Event => {
                    e.add_copy(tier);
                    e.referenced = true;
                    None
                }
                Some(e) => {
                    let old = e.source;
                    *e = Entry::stored(e.instance, tier);
                    Some(old)
                }
                None => None,
            },
            |i| Entry::stored(i, tier),
        );
    }

    /// Engine event: `instance` removed one copy of each of `hashes` from `tier`.
    pub fn remove(&self, instance: InstanceId, hashes: &[BlockHash], tier: Tier) {
        self.drop_entries(
            instance,
            hashes,
            |e| {
                e.instance == instance.0
                    && (e.source != Source::Event || {
                        let mut probe = *e;
                        probe.remove_copy(tier)
                    })
            },
            |holders| {
                if let Some(e) = holders.get_mut(instance.0) {
                    e.remove_copy(tier);
                }
            },
        );
        if let Some(hook) = self.on_remove.get() {
            hook(instance, hashes);
        }
    }

    /// Takes back predictions from `source` that `instance` holds `hashes`: the request they were
    /// made for never reached it (its attempt failed). Event-sourced entries, and predictions from
    /// the other source, stay.
    pub fn retract(&self, instance: InstanceId, hashes: &[BlockHash], source: Source) {
        if source == Source::Event {
            return;
        }
        self.drop_entries(
            instance,
            hashes,
            |e| e.instance == instance.0 && e.source == source,
            |_| {},
        );
    }

    /// For each of `hashes`: drops the entries `drop` selects, or, when it selects none, lets
    /// `kept` change the holders; keeps the counts and the spill bytes right. Each shard's lock
    /// is taken once per chunk ([`PlacementIndex::for_each_by_shard`]).
    fn drop_entries(
        &self,
        instance: InstanceId,
        hashes: &[BlockHash],
        mut drop: impl FnMut(&Entry) -> bool,
        mut kept: impl FnMut(&mut Holders),
    ) {
        let slot = self.slots.get(instance.0);
        self.for_each_by_shard(hashes, |shard, h| {
            let Some(holders) = shard.map.get_mut(&h) else {
                return false;
            };
            let before = holders.heap_bytes();
            let mut gone = None;
            let keep = holders.retain(&mut drop, &mut |e| gone = Some(e.source));
            if gone.is_none() {
                kept(holders);
            }
            let after = if keep { holders.heap_bytes() } else { 0 };
            shard.spill_bytes = shard.spill_bytes + after - before;
            if !keep {
                shard.map.remove(&h);
            }
            if let Some(src) = gone {
                // Under the shard lock, as the insert path counts: a count never goes below
                // what the map holds.
                self.on_removed(slot, src);
            }
            false
        });
    }

    /// Calls `f` for each of `hashes` under its shard's write lock, taking each shard's lock once
    /// per chunk of [`WRITE_CHUNK`] hashes rather than once per hash; `f` returns whether to
    /// report the hash, and the reported hashes are pushed to the returned vector in the order of
    /// `hashes`.
    ///
    /// Equal to the per-hash walk in order: within a shard the hashes are visited in their order
    /// in `hashes` (the grouping is stable), and hashes of different shards touch different maps,
    /// so only the order of commutative counter updates changes. A chunk bounds how long one
    /// writer holds a shard (readers wait for at most a chunk's hashes of one shard).
    fn for_each_by_shard(
        &self,
        hashes: &[BlockHash],
        mut f: impl FnMut(&mut Shard, BlockHash) -> bool,
    ) -> Vec<BlockHash> {
        let mut reported = Vec::new();
        let mut shard_of = [0u32; WRITE_CHUNK];
        let mut order = [0u32; WRITE_CHUNK];
        for chunk in hashes.chunks(WRITE_CHUNK) {
            let n = chunk.len();
            for (s, &h) in shard_of.iter_mut().zip(chunk) {
                *s = self.shard_index(h) as u32;
            }
            if n < GROUP_MIN || self.shards.len() == 1 {
                // Too few to be worth sorting: runs of one shard still share its lock.
                for (i, o) in order[..n].iter_mut().enumerate() {
                    *o = i as u32;
                }
            } else {
                self.group_by_shard(&shard_of[..n], &mut order[..n]);
            }
            let mut report = [0u64; WRITE_CHUNK / 64];
            let mut k = 0;
            while k < n {
                let s = shard_of[order[k] as usize];
                let mut shard = self.shards[s as usize].write();
                while k < n && shard_of[order[k] as usize] == s {
                    let i = order[k] as usize;
                    if f(&mut shard, chunk[i]) {
                        report[i / 64] |= 1 << (i % 64);
                    }
                    k += 1;
                }
            }
            for (w, &bits) in report.iter().enumerate() {
                let mut bits = bits;
                while bits != 0 {
                    let i = w * 64 + bits.trailing_zeros() as usize;
                    reported.push(chunk[i]);
                    bits &= bits - 1;
                }
            }
        }
        reported
    }

    /// A routing decision (own or a peer's): `instance` will hold `hashes` soon.
    /// Expires at `now + ttl_ms` unless confirmed by an event or predicted again.
    ///
    /// `Source::Event` here is treated as [`PlacementIndex::store`] in GPU. A local prediction
    /// takes over a peer's for the same (block, instance); an event-sourced entry is never
    /// downgraded to a prediction.
    pub fn predict(
        &self,
        instance: InstanceId,
        hashes: &[BlockHash],
        source: Source,
        ttl_ms: u64,
        now: Millis,
    ) {
        if source == Source::Event {
            self.store(instance, hashes, Tier::Gpu, now);
            return;
        }
        self.now_hint.fetch_max(now, Ordering::Relaxed);
        let expires = now.saturating_add(ttl_ms);
        self.upsert(
            instance,
            hashes,
            |slot| match slot {
                Some(e) if e.source == Source::Event => {
                    e.referenced = true;
                    None
                }
                Some(e) => {
                    e.expires = e.expires.max(expires);
                    e.referenced = true;
                    if source == Source::Local && e.source == Source::Peer {
                        e.source = Source::Local;
                        return Some(Source::Peer);
                    }
                    None
                }
                None => None,
            },
            |i| Entry::predicted(i, source, expires),
        );
    }

    /// Shared insert path. `update` changes an existing entry and returns its previous source if
    /// that changed; `fresh` makes a new entry.
    fn upsert(
        &self,
        instance: InstanceId,
        hashes: &[BlockHash],
        mut update: impl FnMut(Option<&mut Entry>) -> Option<Source>,
        fresh: impl Fn(u32) -> Entry,
    ) {
        let Some(slot) = self.slots.get_or_create(instance.0) else {
            return;
        };
        let gained = self.for_each_by_shard(hashes, |shard, h| {
            match shard.map.get_mut(&h) {
                Some(holders) => {
                    let before = holders.heap_bytes();
                    let gained = match holders.get_mut(instance.0) {
                        Some(e) => {
                            let new_src = {
                                let changed = update(Some(&mut *e));
                                changed.map(|old| (old, e.source))
                            };
                            if let Some((old, new)) = new_src {
                                self.by_source[old as usize].fetch_sub(1, Ordering::Relaxed);
                                self.by_source[new as usize].fetch_add(1, Ordering::Relaxed);
                            }
                            false
                        }
                        None => {
                            let e = fresh(instance.0);
                            self.by_source[e.source as usize].fetch_add(1, Ordering::Relaxed);
                            holders.insert(e);
                            // Counted under the shard lock, so a racing removal never
                            // decrements before this increment.
                            slot.count.fetch_add(1, Ordering::Relaxed);
                            self.total.fetch_add(1, Ordering::Relaxed);
                            true
                        }
                    };
                    shard.spill_bytes = shard.spill_bytes + holders.heap_bytes() - before;
                    gained
                }
                None => {
                    let e = fresh(instance.0);
                    self.by_source[e.source as usize].fetch_add(1, Ordering::Relaxed);
                    shard.map.insert(h, Holders::One(e));
                    slot.count.fetch_add(1, Ordering::Relaxed);
                    self.total.fetch_add(1, Ordering::Relaxed);
                    true
                }
            }
        });
        if gained.is_empty() {
            return;
        }
        {
            let mut ring = slot.ring.lock();
            ring.extend(gained.iter().copied());
            let live = slot.count.load(Ordering::Relaxed);
            if ring.len() > live + live / 2 + RING_SLACK {
                self.compact_ring(instance.0, &mut ring);
            }
        }
        self.evict_instance_over_capacity(instance.0);
        self.evict_over_global_cap();
    }

    fn on_removed(&self, slot: Option<&slots::Slot>, source: Source) {
        if let Some(slot) = slot {
            slot.dec();
        }
        let _ = self
            .total
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c.saturating_sub(1))
            });
        let _ = self.by_source[source as usize].fetch_update(
            Ordering::Relaxed,
            Ordering::Relaxed,
            |c| Some(c.saturating_sub(1)),
        );
    }
}

const SOURCES: [Source; 3] = [Source::Event, Source::Local, Source::Peer];

/// Bytes of a hashbrown table with `capacity` usable slots of (BlockHash, Holders).
fn map_bytes(capacity: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = (capacity * 8 / 7).next_power_of_two();
    buckets * (std::mem::size_of::<(BlockHash, Holders)>() + 1) + 16
}
