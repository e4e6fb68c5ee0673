//! Longest-prefix matching: for a prompt's chain, the leading run each instance holds, by tier.
//!
//! Invariants:
//! - Exact: an instance's run ends at the first block it does not hold live (gaps end runs;
//!   expired predictions never count).
//! - Cost O(blocks examined × holders per block); allocation-free once `out` has grown.
//! - Blocks are looked up in batches (16, doubling up to 1024), grouped by shard, so each shard's
//!   read lock is taken once per batch and independent lookups under it overlap their cache
//!   misses. A batch may look past the point where every run has ended; the doubling keeps that
//!   waste below the work already done.
//! - A row's fresh run ([`InstanceMatch::fresh`]) is a prefix of its run: it ends at the first
//!   block whose entry is not fresh, even if later ones are.

use super::holders::{Entry, Holders};
use super::{InstanceMatch, PlacementIndex, PrefixMatches};
use crate::{BlockHash, InstanceId, Millis, Tier};

const BATCH_MIN: usize = 16;
const BATCH_MAX: usize = 1024;
/// Lookups issued under one shard lock before their results are merged.
const LOOKAHEAD: usize = 16;
/// Shard counts up to this are grouped by a counting sort.
const COUNTING_SHARDS: usize = 256;

/// Per-block result of a batch: bit `r` set when row `r` holds the block live (and in CPU /
/// disk, and fresh).
#[derive(Clone, Copy, Default)]
struct Masks {
    held: u64,
    cpu: u64,
    disk: u64,
    fresh: u64,
}

impl PlacementIndex {
    /// For `hashes` (a prompt's chain), the leading run each instance holds, by tier.
    /// Expired predictions do not count. Clears and fills `out`.
    ///
    /// Walks blocks from 0 with the set of instances still matching and stops as soon as that
    /// set is empty.
    pub fn match_prefix(&self, hashes: &[BlockHash], now: Millis, out: &mut PrefixMatches) {
        self.match_prefix_fresh(hashes, now, Millis::MAX, out);
    }

    /// [`PlacementIndex::match_prefix`], also counting each row's leading blocks that are fresh
    /// at `fresh_from` ([`InstanceMatch::fresh`]), so that a decision need not predict them again.
    pub fn match_prefix_fresh(
        &self,
        hashes: &[BlockHash],
        now: Millis,
        fresh_from: Millis,
        out: &mut PrefixMatches,
    ) {
        out.rows.clear();
        let Some((&first, rest)) = hashes.split_first() else {
            return;
        };
        {
            let shard = self.shard(first).read();
            let Some(holders) = shard.map.get(&first) else {
                return;
            };
            // Holders are sorted by instance, so rows start sorted by instance.
            for e in holders.as_slice().iter().filter(|e| e.live(now)) {
                let mut row = InstanceMatch {
                    instance: InstanceId(e.instance),
                    ..Default::default()
                };
                count_tier(&mut row, e.best_tier());
                row.fresh = u32::from(e.fresh(fresh_from));
                out.rows.push(row);
            }
        }
        if out.rows.len() <= 64 {
            self.match_batched(rest, now, fresh_from, &mut out.rows);
        } else {
            self.match_linear(rest, now, fresh_from, &mut out.rows);
        }
    }

    /// Up to 64 rows: batched lookups with per-block bit masks over the rows.
    fn match_batched(
        &self,
        rest: &[BlockHash],
        now: Millis,
        fresh_from: Millis,
        rows: &mut [InstanceMatch],
    ) {
        let mut alive: u64 = if rows.len() == 64 {
            u64::MAX
        } else {
            (1u64 << rows.len()) - 1
        };
        // Sized to the chain, not to the largest batch: a fixed 1024-entry set (32 KiB) cost a
        // short prompt more to zero than its lookups, and flushed the L1 cache doing it.
        let cap = rest.len().min(BATCH_MAX);
        let mut shard_of = vec![0u32; cap];
        let mut order = vec![0u32; cap];
        let mut masks = vec![Masks::default(); cap];
        let mut pos = 0;
        let mut batch = BATCH_MIN;
        while pos < rest.len() && alive != 0 {
            let chunk = &rest[pos..rest.len().min(pos + batch)];
            let n = chunk.len();
            for (s, &h) in shard_of.iter_mut().zip(chunk) {
                *s = self.shard_index(h) as u32;
            }
            self.group_by_shard(&shard_of[..n], &mut order[..n]);
            let mut k = 0;
            while k < n {
                let s = shard_of[order[k] as usize];
                let mut end = k + 1;
                while end < n && shard_of[order[end] as usize] == s {
                    end += 1;
                }
                let shard = self.shards[s as usize].read();
                for group in order[k..end].chunks(LOOKAHEAD) {
                    // First every lookup of the group, then every merge: the lookups (and the
                    // spilled lists they point to) are independent, so their misses overlap.
                    let mut hit: [Option<&Holders>; LOOKAHEAD] = [None; LOOKAHEAD];
                    for (h, &i) in hit.iter_mut().zip(group) {
                        *h = shard.map.get(&chunk[i as usize]);
                        if let Some(Holders::Many(v)) = h {
                            prefetch((&**v as *const Vec<Entry>).cast());
                        }
                    }
                    // Only the group's own slots: most groups hold one or two blocks.
                    let hit = &hit[..group.len()];
                    let mut found: [&[Entry]; LOOKAHEAD] = [&[]; LOOKAHEAD];
                    for (f, h) in found.iter_mut().zip(hit) {
                        if let Some(h) = h {
                            *f = h.as_slice();
                            prefetch(f.as_ptr());
                        }
                    }
                    for (f, &i) in found.iter().zip(group) {
                        masks[i as usize] = row_masks(rows, f, now, fresh_from);
                    }
                }
                drop(shard);
                k = end;
            }
            for m in &masks[..n] {
                alive &= m.held;
                let mut bits = alive;
                while bits != 0 {
                    let r = bits.trailing_zeros();
                    let bit = 1u64 << r;
                    let tier = if m.cpu & bit != 0 {
                        Tier::Cpu
                    } else if m.disk & bit != 0 {
                        Tier::Disk
                    } else {
                        Tier::Gpu
                    };
                    count_fresh(&mut rows[r as usize], m.fresh & bit != 0);
                    count_tier(&mut rows[r as usize], tier);
                    bits &= bits - 1;
                }
                if alive == 0 {
                    break;
                }
            }
            pos += n;
            batch = (batch * 2).min(BATCH_MAX);
        }
    }

    /// Fills `order` with the positions `0..shard_of.len()` grouped by shard (ascending), each
    /// shard's positions in ascending order (stable: the write paths rely on it).
    /// A counting sort when the shard count is small, a comparison sort otherwise.
    pub(super) fn group_by_shard(&self, shard_of: &[u32], order: &mut [u32]) {
        if self.shards.len() <= COUNTING_SHARDS {
            let mut buf = [0u32; COUNTING_SHARDS + 1];
            // Only the index's own shards: the prefix sum over all 257 slots cost more than a
            // short batch's lookups.
            let start = &mut buf[..=self.shards.len()];
            for &s in shard_of {
                start[s as usize + 1] += 1;
            }
            for i in 1..start.len() {
                start[i] += start[i - 1];
            }
            for (i, &s) in shard_of.iter().enumerate() {
                let slot = &mut start[s as usize];
                order[*slot as usize] = i as u32;
                *slot += 1;
            }
        } else {
            for (i, o) in order.iter_mut().enumerate() {
                *o = i as u32;
            }
            order.sort_unstable_by_key(|&i| (shard_of[i as usize], i));
        }
    }

    /// Any number of rows: one lookup per block, compacting the still-matching rows to the front.
    fn match_linear(
        &self,
        rest: &[BlockHash],
        now: Millis,
        fresh_from: Millis,
        rows: &mut [InstanceMatch],
    ) {
        let mut active = rows.len();
        for &h in rest {
            if active == 0 {
                break;
            }
            let shard = self.shard(h).read();
            let Some(holders) = shard.map.get(&h) else {
                break;
            };
            let holders = holders.as_slice();
            let (mut w, mut j) = (0, 0);
            for r in 0..active {
                let inst = rows[r].instance.0;
                while j < holders.len() && holders[j].instance < inst {
                    j += 1;
                }
                if j < holders.len() && holders[j].instance == inst && holders[j].live(now) {
                    count_fresh(&mut rows[r], holders[j].fresh(fresh_from));
                    count_tier(&mut rows[r], holders[j].best_tier());
                    // Kept rows stay in instance order: the merge above relies on it.
                    rows.swap(w, r);
                    w += 1;
                }
            }
            active = w;
        }
    }
}

/// Merges sorted `rows` (≤ 64) with sorted `holders` into bit masks.
fn row_masks(rows: &[InstanceMatch], holders: &[Entry], now: Millis, fresh_from: Millis) -> Masks {
    let mut m = Masks::default();
    let mut j = 0;
    for (r, row) in rows.iter().enumerate() {
        let inst = row.instance.0;
        while j < holders.len() && holders[j].instance < inst {
            j += 1;
        }
        if j < holders.len() && holders[j].instance == inst && holders[j].live(now) {
            let bit = 1u64 << r;
            m.held |= bit;
            if holders[j].fresh(fresh_from) {
                m.fresh |= bit;
            }
            match holders[j].best_tier() {
                Tier::Gpu => {}
                Tier::Cpu => m.cpu |= bit,
                Tier::Disk => m.disk |= bit,
            }
        }
    }
    m
}

/// Hints the CPU to fetch the cache line at `p` (a spilled holder list about to be merged).
#[inline(always)]
fn prefetch(p: *const Entry) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint; it never faults, even on an invalid address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Extends the row's fresh run by a block it holds, called before the block is counted: the run
/// goes on only while it is as long as the row's whole run (no stale block came before).
fn count_fresh(row: &mut InstanceMatch, fresh: bool) {
    if fresh && row.fresh == row.total() {
        row.fresh += 1;
    }
}

fn count_tier(row: &mut InstanceMatch, tier: Tier) {
    match tier {
        Tier::Gpu => row.gpu += 1,
        Tier::Cpu => row.cpu += 1,
        Tier::Disk => row.disk += 1,
    }
}

#[cfg(test)]
mod tests {
    use super::super::IndexConfig;
    use super::*;
    use crate::{Source, Tier};

    fn runs(shards: usize) -> Vec<InstanceMatch> {
        let ix = PlacementIndex::new(IndexConfig {
            shards,
            max_entries: 1 << 20,
            default_instance_capacity: 1 << 20,
        });
        let chain: Vec<BlockHash> = (0..3000u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        ix.predict(InstanceId(1), &chain[..2500], Source::Local, 100, 0);
        ix.predict(InstanceId(2), &chain, Source::Local, 100, 0);
        ix.store(InstanceId(2), &chain[..700], Tier::Cpu, 0);
        // Instance 3's run ends at its gap (block 40), and its expired tail never counts.
        ix.predict(InstanceId(3), &chain[..40], Source::Peer, 100, 0);
        ix.predict(InstanceId(3), &chain[41..], Source::Peer, 100, 0);
        ix.predict(InstanceId(4), &chain, Source::Peer, 5, 0);
        let mut out = PrefixMatches::default();
        ix.match_prefix(&chain, 10, &mut out);
        out.rows.sort_by_key(|r| r.instance);
        out.rows
    }

    /// Each instance's (run, fresh run) at `fresh_from` 50, now 10; with `crowd` more instances
    /// holding block 0, so that more than 64 rows take the linear path.
    fn fresh_runs(crowd: u32) -> Vec<(u32, u32, u32)> {
        let ix = PlacementIndex::new(IndexConfig {
            shards: 16,
            max_entries: 1 << 20,
            default_instance_capacity: 1 << 20,
        });
        let chain: Vec<BlockHash> = (0..3000u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        // Instance 1: fresh up to block 1000, then predictions that expire before 50.
        ix.predict(InstanceId(1), &chain[..1000], Source::Local, 100, 0);
        ix.predict(InstanceId(1), &chain[1000..2500], Source::Local, 30, 0);
        ix.predict(InstanceId(1), &chain[2000..2100], Source::Local, 100, 0);
        // Instance 2: engine-reported blocks, then fresh local predictions.
        ix.predict(InstanceId(2), &chain, Source::Local, 100, 0);
        ix.store(InstanceId(2), &chain[..700], Tier::Cpu, 0);
        // Instance 3: a peer's predictions are never fresh (a local one would take them over).
        ix.predict(InstanceId(3), &chain, Source::Peer, 100, 0);
        for i in 0..crowd {
            ix.predict(InstanceId(10 + i), &chain[..1], Source::Local, 100, 0);
        }
        let mut out = PrefixMatches::default();
        ix.match_prefix_fresh(&chain, 10, 50, &mut out);
        let mut rows: Vec<_> = out
            .rows
            .iter()
            .filter(|r| r.instance.0 < 10)
            .map(|r| (r.instance.0, r.total(), r.fresh))
            .collect();
        rows.sort_unstable();
        // Without a threshold nothing is fresh.
        ix.match_prefix(&chain, 10, &mut out);
        assert!(out.rows.iter().all(|r| r.fresh == 0));
        rows
    }

    #[test]
    fn a_fresh_run_is_the_leading_blocks_a_local_prediction_would_not_change() {
        let expect = vec![(1, 2500, 1000), (2, 3000, 3000), (3, 3000, 0)];
        assert_eq!(fresh_runs(0), expect, "batched path");
        assert_eq!(fresh_runs(70), expect, "linear path");
    }

    #[test]
    fn every_grouping_path_gives_the_same_runs() {
        let expect = vec![
            InstanceMatch {
                instance: InstanceId(1),
                gpu: 2500,
                cpu: 0,
                disk: 0,
                fresh: 0,
            },
            InstanceMatch {
                instance: InstanceId(2),
                gpu: 2300,
                cpu: 700,
                disk: 0,
                fresh: 0,
            },
            InstanceMatch {
                instance: InstanceId(3),
                gpu: 40,
                cpu: 0,
                disk: 0,
                fresh: 0,
            },
        ];
        for shards in [1, 4, 64, 256, 1024] {
            assert_eq!(runs(shards), expect, "{shards} shards");
        }
    }
}
