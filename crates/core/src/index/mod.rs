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

use crate::{BlockHash, InstanceId, Millis, Source, Tier};

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
            .unwrap_or(InstanceMatch { instance, ..Default::default() })
    }
    /// The longest leading run any instance holds.
    pub fn best(&self) -> u32 {
        self.rows.iter().map(InstanceMatch::total).max().unwrap_or(0)
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
    _private: (),
}

impl PlacementIndex {
    /// An empty index.
    pub fn new(cfg: IndexConfig) -> Self {
        let _ = cfg;
        todo!("kvgate-core: PlacementIndex::new")
    }

    /// Sets an instance's capacity in blocks (from config or the engine's reported cache size).
    pub fn set_instance_capacity(&self, instance: InstanceId, blocks: usize) {
        let _ = (instance, blocks);
        todo!()
    }

    /// Engine event: `instance` stored `hashes` (kvgate's own hashes) in `tier`.
    pub fn store(&self, instance: InstanceId, hashes: &[BlockHash], tier: Tier, now: Millis) {
        let _ = (instance, hashes, tier, now);
        todo!()
    }

    /// Engine event: `instance` removed one copy of each of `hashes` from `tier`.
    pub fn remove(&self, instance: InstanceId, hashes: &[BlockHash], tier: Tier) {
        let _ = (instance, hashes, tier);
        todo!()
    }

    /// Drops every entry of `instance` that came from one of `sources`
    /// (engine cleared its cache, restarted, or an event stream broke).
    pub fn clear_instance(&self, instance: InstanceId, sources: &[Source]) {
        let _ = (instance, sources);
        todo!()
    }

    /// A routing decision (own or a peer's): `instance` will hold `hashes` soon.
    /// Expires at `now + ttl_ms` unless confirmed by an event or predicted again.
    pub fn predict(
        &self,
        instance: InstanceId,
        hashes: &[BlockHash],
        source: Source,
        ttl_ms: u64,
        now: Millis,
    ) {
        let _ = (instance, hashes, source, ttl_ms, now);
        todo!()
    }

    /// For `hashes` (a prompt's chain), the leading run each instance holds, by tier.
    /// Expired predictions do not count. Clears and fills `out`.
    pub fn match_prefix(&self, hashes: &[BlockHash], now: Millis, out: &mut PrefixMatches) {
        let _ = (hashes, now, out);
        todo!()
    }

    /// Removes expired predictions; returns how many. Call periodically, off the request path.
    pub fn expire(&self, now: Millis) -> usize {
        let _ = now;
        todo!()
    }

    /// Visits every live prediction from `source` as (instance, hash, expires_at).
    /// Used to hand a joining gossip peer a snapshot of this replica's placements.
    pub fn for_each_prediction(
        &self,
        source: Source,
        now: Millis,
        visit: &mut dyn FnMut(InstanceId, BlockHash, Millis),
    ) {
        let _ = (source, now, visit);
        todo!()
    }

    /// Current counters and memory estimate.
    pub fn stats(&self) -> IndexStats {
        todo!()
    }
}
