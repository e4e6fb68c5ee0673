//! Checkpoint placements: a bandwidth-saving encoding of peers' decisions.
//!
//! Block hashes are chained (`h_i = xxh3(h_{i-1} ‖ content_i)`), so one hash names its whole
//! prefix: if a prompt's block `j` has hash `h`, every block before it is the same as in the prompt
//! that produced `h`. A replica can therefore share a decision as a few **checkpoint** hashes (the
//! blocks at absolute positions `j ≡ stride − 1 (mod stride)`, plus the decision's last block)
//! instead of every block hash: `stride`× fewer bytes. The receiver keeps checkpoints here and
//! **materializes** them when a prompt that contains one arrives ([`Checkpoints::materialize`],
//! called by the gateway before matching): the prompt's prefix up to the deepest checkpoint each
//! instance holds becomes ordinary `Source::Peer` predictions in the index (from the stride segment
//! of the shallowest checkpoint found: what lies before it is already indexed). The price is
//! granularity: a prompt that shares only part of a gossiped decision matches up to the last
//! checkpoint inside the shared part (less than `stride` blocks short).
//!
//! Invariants:
//! - Bounded: at most `capacity` checkpoint hashes (expired ones go first, then arbitrary ones),
//!   each with at most `MAX_HOLDERS` instances.
//! - A materialized checkpoint is consumed: the index holds its prefix from then on (until TTL).
//! - `materialize` looks up `len / stride + 1` hashes, never every block.

use crate::store::PlacementStore;
use ahash::AHashMap;
use kvgate_core::{BlockHash, InstanceId, Millis};
use parking_lot::Mutex;

const SHARDS: usize = 16;
const MAX_HOLDERS: usize = 8;

/// Positions (0-based) of the checkpoint blocks among `from..len` of a prompt of `len` blocks.
pub fn checkpoint_positions(from: usize, len: usize, stride: usize) -> impl Iterator<Item = usize> {
    let stride = stride.max(1);
    // The smallest j >= from with (j + 1) % stride == 0.
    let r = (from + 1) % stride;
    let first = if r == 0 { from } else { from + stride - r };
    let last = len.checked_sub(1);
    (first..len)
        .step_by(stride)
        .chain(last.filter(|&l| l >= from && (l + 1) % stride != 0))
}

/// Checkpoint hash → (instance, expires_at) of the instances holding the prefix it ends.
type Shard = Mutex<AHashMap<BlockHash, Vec<(InstanceId, Millis)>>>;

/// Received checkpoints: hash → instances holding the prefix it ends, with expiry.
pub struct Checkpoints {
    stride: usize,
    capacity_per_shard: usize,
    shards: Vec<Shard>,
}

impl Checkpoints {
    /// A store for `stride`, holding at most `capacity` hashes.
    pub fn new(stride: usize, capacity: usize) -> Self {
        Self {
            stride: stride.max(1),
            capacity_per_shard: (capacity / SHARDS).max(1),
            shards: (0..SHARDS).map(|_| Mutex::new(AHashMap::new())).collect(),
        }
    }

    fn shard(&self, h: BlockHash) -> &Shard {
        &self.shards[(h as usize) % SHARDS]
    }

    /// Number of checkpoint hashes held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every checkpoint (checkpoints are not attributed to the peer that sent them).
    pub fn clear(&self) {
        for s in &self.shards {
            s.lock().clear();
        }
    }

    /// Records that `instance` holds the prefixes ending in `hashes` until `now + ttl_ms`.
    pub fn insert(&self, instance: InstanceId, hashes: &[BlockHash], ttl_ms: u64, now: Millis) {
        let expires = now.saturating_add(ttl_ms);
        for &h in hashes {
            let mut s = self.shard(h).lock();
            if s.len() >= self.capacity_per_shard && !s.contains_key(&h) {
                s.retain(|_, v| {
                    v.retain(|(_, e)| *e > now);
                    !v.is_empty()
                });
                if s.len() >= self.capacity_per_shard {
                    // Still full of live entries: drop an arbitrary eighth (ahash order is
                    // unrelated to age or content, so this is a random sample).
                    let drop: Vec<BlockHash> = s
                        .keys()
                        .take(self.capacity_per_shard / 8 + 1)
                        .copied()
                        .collect();
                    for k in drop {
                        s.remove(&k);
                    }
                }
            }
            let v = s.entry(h).or_default();
            if let Some(e) = v.iter_mut().find(|(i, _)| *i == instance) {
                e.1 = e.1.max(expires);
            } else if v.len() < MAX_HOLDERS {
                v.push((instance, expires));
            } else if let Some(min) = v.iter_mut().min_by_key(|(_, e)| *e) {
                // Replace the holder that expires first.
                *min = (instance, expires);
            }
        }
    }

    /// Forgets that `instance` holds the checkpoints among `hashes` (a retracted decision's, or
    /// blocks its engine evicted); other hashes are not looked for.
    pub fn retract(&self, instance: InstanceId, hashes: &[BlockHash]) {
        for &h in hashes {
            let mut s = self.shard(h).lock();
            if let Some(v) = s.get_mut(&h) {
                v.retain(|(i, _)| *i != instance);
                if v.is_empty() {
                    s.remove(&h);
                }
            }
        }
    }

    /// Turns the checkpoints found in `prompt` into `Source::Peer` predictions of the prefix up
    /// to the deepest checkpoint per instance; returns how many instances gained a prefix.
    pub fn materialize(
        &self,
        prompt: &[BlockHash],
        now: Millis,
        store: &dyn PlacementStore,
    ) -> usize {
        if prompt.is_empty() {
            return 0;
        }
        // (instance, shallowest position, deepest position, expiry of the deepest)
        let mut found: Vec<(InstanceId, usize, usize, Millis)> = Vec::new();
        for j in checkpoint_positions(0, prompt.len(), self.stride) {
            let h = prompt[j];
            let mut s = self.shard(h).lock();
            let Some(v) = s.remove(&h) else { continue };
            drop(s);
            for (inst, exp) in v {
                if exp <= now {
                    continue;
                }
                match found.iter_mut().find(|f| f.0 == inst) {
                    // Positions are visited in increasing order: this one is the deepest so far.
                    Some(f) => {
                        f.2 = j;
                        f.3 = exp;
                    }
                    None => found.push((inst, j, j, exp)),
                }
            }
        }
        for &(inst, first, depth, exp) in &found {
            // Everything before the stride segment of the shallowest unconsumed checkpoint is
            // already in the index: materialized from an earlier checkpoint, this replica's own,
            // or event-sourced (a decision shares only the blocks its origin did not know). So
            // only that segment onwards is inserted, not the whole prefix again.
            let start = first / self.stride * self.stride;
            store.predict_peer(inst, &prompt[start..=depth], exp - now, now);
        }
        found.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex as StdMutex;

    #[test]
    fn positions_are_absolute_multiples_plus_last() {
        let p: Vec<usize> = checkpoint_positions(0, 40, 16).collect();
        assert_eq!(p, vec![15, 31, 39]);
        let p: Vec<usize> = checkpoint_positions(0, 32, 16).collect();
        assert_eq!(p, vec![15, 31]);
        let p: Vec<usize> = checkpoint_positions(20, 40, 16).collect();
        assert_eq!(p, vec![31, 39]);
        let p: Vec<usize> = checkpoint_positions(16, 40, 16).collect();
        assert_eq!(p, vec![31, 39]);
        let p: Vec<usize> = checkpoint_positions(15, 40, 16).collect();
        assert_eq!(p, vec![15, 31, 39]);
        let p: Vec<usize> = checkpoint_positions(0, 5, 1).collect();
        assert_eq!(p, vec![0, 1, 2, 3, 4]);
        assert_eq!(checkpoint_positions(10, 10, 16).count(), 0);
        for from in 0..50 {
            for len in from..60 {
                let v: Vec<usize> = checkpoint_positions(from, len, 7).collect();
                assert!(v.iter().all(|&j| j >= from && j < len));
                assert!(v.windows(2).all(|w| w[0] < w[1]));
                if len > from {
                    assert_eq!(v.last().copied(), Some(len - 1));
                }
            }
        }
    }

    #[derive(Default)]
    struct Rec(StdMutex<Vec<(InstanceId, usize, u64)>>);
    impl PlacementStore for Rec {
        fn predict_peer(&self, i: InstanceId, h: &[BlockHash], ttl: u64, _now: Millis) {
            self.0
                .lock()
                .map(|mut v| v.push((i, h.len(), ttl)))
                .unwrap_or(());
        }
        fn retract_peer(&self, _: InstanceId, _: &[BlockHash]) {}
        fn clear_peer(&self, _: InstanceId) {}
        fn for_each_local(&self, _: Millis, _: &mut dyn FnMut(InstanceId, BlockHash, Millis)) {}
    }

    #[test]
    fn materializes_deepest_prefix_per_instance_once() {
        let prompt: Vec<u64> = (100..148).collect(); // 48 blocks
        let c = Checkpoints::new(16, 1000);
        c.insert(InstanceId(1), &[prompt[15], prompt[31]], 1_000, 0);
        c.insert(InstanceId(2), &[prompt[15]], 1_000, 0);
        c.insert(InstanceId(3), &[prompt[15]], 10, 0); // expires
        let r = Rec::default();
        // A prompt sharing the first 40 blocks: instance 1 to block 31, instance 2 to block 15.
        let mut q = prompt[..40].to_vec();
        q.push(9_999);
        assert_eq!(c.materialize(&q, 100, &r), 2);
        let mut got = r.0.lock().unwrap().clone();
        got.sort();
        assert_eq!(
            got,
            vec![(InstanceId(1), 32, 900), (InstanceId(2), 16, 900)]
        );
        assert_eq!(c.materialize(&q, 100, &r), 0, "consumed");
    }

    #[test]
    fn materializes_only_from_the_first_unconsumed_segment() {
        let prompt: Vec<u64> = (100..180).collect(); // 80 blocks
        let c = Checkpoints::new(16, 1000);
        let r = Rec::default();
        c.insert(InstanceId(1), &[prompt[15], prompt[31]], 1_000, 0);
        assert_eq!(c.materialize(&prompt, 1, &r), 1);
        // A later continuation shared from block 32 on: only its checkpoints arrive.
        c.insert(
            InstanceId(1),
            &[prompt[47], prompt[63], prompt[79]],
            1_000,
            0,
        );
        assert_eq!(c.materialize(&prompt, 2, &r), 1);
        let got = r.0.lock().unwrap().clone();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].1, 32, "first: the whole prefix to block 31");
        assert_eq!(got[1].1, 80 - 32, "then: blocks 32..=79 only");
    }

    #[test]
    fn bounded() {
        let c = Checkpoints::new(16, 160);
        let hashes: Vec<u64> = (0..10_000).collect();
        c.insert(InstanceId(0), &hashes, 1_000, 0);
        assert!(c.len() <= 160, "{}", c.len());
    }
}
