//! The batched write walk (each shard's lock once per chunk) leaves the index exactly as the
//! per-hash walk does: same entries, counts, sources, spill bytes, CLOCK rings and eviction.

use super::*;
use proptest::prelude::*;

/// Every observable piece of an index's state, independent of how it is sharded.
#[derive(Debug, PartialEq)]
struct State {
    entries: Vec<(BlockHash, Vec<Entry>)>,
    spill_bytes: usize,
    total: usize,
    by_source: [usize; 3],
    counts: Vec<usize>,
    rings: Vec<Vec<BlockHash>>,
    evicted: u64,
    expired: u64,
}

fn state(ix: &PlacementIndex) -> State {
    let mut entries = Vec::new();
    let mut spill_bytes = 0;
    for shard in ix.shards.iter() {
        let shard = shard.read();
        spill_bytes += shard.spill_bytes;
        entries.extend(shard.map.iter().map(|(&h, v)| (h, v.as_slice().to_vec())));
    }
    entries.sort_by_key(|e| e.0);
    State {
        entries,
        spill_bytes,
        total: ix.len(),
        by_source: ix.by_source.each_ref().map(|c| c.load(Ordering::Relaxed)),
        counts: (0..INSTANCES)
            .map(|i| ix.instance_entries(InstanceId(i)))
            .collect(),
        rings: (0..INSTANCES)
            .map(|i| {
                ix.slots
                    .get(i)
                    .map_or_else(Vec::new, |s| s.ring.lock().iter().copied().collect())
            })
            .collect(),
        evicted: ix.evicted.load(Ordering::Relaxed),
        expired: ix.expired.load(Ordering::Relaxed),
    }
}

const INSTANCES: u32 = 4;

#[derive(Clone, Debug)]
enum Op {
    Store(u32, Vec<BlockHash>, Tier),
    Predict(u32, Vec<BlockHash>, Source, u64),
    Remove(u32, Vec<BlockHash>, Tier),
    Retract(u32, Vec<BlockHash>, Source),
}

fn apply(ix: &PlacementIndex, op: &Op, now: Millis) {
    match op {
        Op::Store(i, h, t) => ix.store(InstanceId(*i), h, *t, now),
        Op::Predict(i, h, s, ttl) => ix.predict(InstanceId(*i), h, *s, *ttl, now),
        Op::Remove(i, h, t) => ix.remove(InstanceId(*i), h, *t),
        Op::Retract(i, h, s) => ix.retract(InstanceId(*i), h, *s),
    }
}

/// The walk the index did before writes were batched: one call, so one shard lock, per hash.
fn apply_per_hash(ix: &PlacementIndex, op: &Op, now: Millis) {
    let (Op::Store(_, h, _) | Op::Predict(_, h, _, _) | Op::Remove(_, h, _) | Op::Retract(_, h, _)) =
        op;
    for &one in h {
        let single = match op {
            Op::Store(i, _, t) => Op::Store(*i, vec![one], *t),
            Op::Predict(i, _, s, ttl) => Op::Predict(*i, vec![one], *s, *ttl),
            Op::Remove(i, _, t) => Op::Remove(*i, vec![one], *t),
            Op::Retract(i, _, s) => Op::Retract(*i, vec![one], *s),
        };
        apply(ix, &single, now);
    }
}

/// Hashes spread over every shard (the top bits pick it) from a small universe, so one
/// operation repeats hashes and operations overlap.
fn hashes(max_len: usize) -> impl Strategy<Value = Vec<BlockHash>> {
    proptest::collection::vec(0u64..600, 0..max_len).prop_map(|v| {
        v.into_iter()
            .map(|x| x.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
            .collect()
    })
}

fn tier() -> impl Strategy<Value = Tier> {
    prop_oneof![Just(Tier::Gpu), Just(Tier::Cpu), Just(Tier::Disk)]
}

fn op(max_len: usize) -> impl Strategy<Value = Op> {
    let inst = 0..INSTANCES;
    let pred = prop_oneof![Just(Source::Local), Just(Source::Peer), Just(Source::Event)];
    let pred2 = prop_oneof![Just(Source::Local), Just(Source::Peer)];
    prop_oneof![
        (inst.clone(), hashes(max_len), tier()).prop_map(|(i, h, t)| Op::Store(i, h, t)),
        (inst.clone(), hashes(max_len), pred, 1u64..50)
            .prop_map(|(i, h, s, ttl)| Op::Predict(i, h, s, ttl)),
        (inst.clone(), hashes(max_len), tier()).prop_map(|(i, h, t)| Op::Remove(i, h, t)),
        (inst, hashes(max_len), pred2).prop_map(|(i, h, s)| Op::Retract(i, h, s)),
    ]
}

fn index(shards: usize, cap: usize, max: usize) -> PlacementIndex {
    PlacementIndex::new(IndexConfig {
        shards,
        max_entries: max,
        default_instance_capacity: cap,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Without eviction or ring compaction (which one call per hash would run after every hash
    /// instead of after the whole call: under 1024 gains per instance, no compaction), every
    /// sharding of the batched walk equals one call, one shard lock, per hash.
    #[test]
    fn batched_writes_equal_the_per_hash_walk(ops in proptest::collection::vec(op(64), 1..16)) {
        let reference = index(64, 1 << 20, 1 << 20);
        for (t, o) in ops.iter().enumerate() {
            apply_per_hash(&reference, o, t as Millis * 10);
        }
        let want = state(&reference);
        // 1: one lock, order kept; 4 and 64: counting sort; 1024: comparison sort.
        for shards in [1, 4, 64, 1024] {
            let ix = index(shards, 1 << 20, 1 << 20);
            for (t, o) in ops.iter().enumerate() {
                apply(&ix, o, t as Millis * 10);
            }
            prop_assert_eq!(&state(&ix), &want, "{} shards", shards);
        }
    }

    /// With eviction (small per-instance and global caps) and calls longer than a chunk, the
    /// state does not depend on the sharding. One shard is the walk before batching (every hash
    /// in the call's order under the same lock, compaction and eviction after the call); more
    /// shards regroup the hashes, and the CLOCK rings, hence what is evicted, stay in the
    /// call's order.
    #[test]
    fn eviction_does_not_depend_on_sharding(ops in proptest::collection::vec(op(700), 1..24)) {
        let one = index(1, 150, 400);
        for (t, o) in ops.iter().enumerate() {
            apply(&one, o, t as Millis * 10);
        }
        let want = state(&one);
        for shards in [4, 64, 1024] {
            let ix = index(shards, 150, 400);
            for (t, o) in ops.iter().enumerate() {
                apply(&ix, o, t as Millis * 10);
            }
            prop_assert_eq!(&state(&ix), &want, "{} shards", shards);
        }
    }
}

#[test]
fn chunk_boundaries_and_repeats_keep_the_order() {
    // Longer than several chunks, every hash twice in a row and again later: the ring lists
    // each gained hash once, in first-seen order.
    let chain: Vec<BlockHash> = (0..(3 * WRITE_CHUNK as u64 + 17))
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    let mut ops: Vec<BlockHash> = chain.iter().flat_map(|&h| [h, h]).collect();
    ops.extend_from_slice(&chain[..100]);
    for shards in [1, 64, 1024] {
        let ix = index(shards, 1 << 20, 1 << 20);
        ix.predict(InstanceId(2), &ops, Source::Local, 100, 0);
        let s = state(&ix);
        assert_eq!(s.rings[2], chain, "{shards} shards");
        assert_eq!(s.total, chain.len());
        assert_eq!(s.counts[2], chain.len());
        assert_eq!(s.by_source, [0, chain.len(), 0]);
    }
}
