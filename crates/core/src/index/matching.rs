//! Longest-prefix matching: for a prompt's chain, the leading run each instance holds, by tier.
//!
//! Invariants:
//! - Exact: an instance's run ends at the first block it does not hold live (gaps end runs;
//!   expired predictions never count).
//! - Cost O(blocks examined × holders per block); allocation-free once `out` has grown.
//! - Blocks are looked up in batches (16, doubling up to 256), grouped by shard, so each shard's
//!   read lock is taken once per batch and independent lookups under it overlap their cache
//!   misses. A batch may look past the point where every run has ended; the doubling keeps that
//!   waste below the work already done.

use super::holders::Entry;
use super::{InstanceMatch, PlacementIndex, PrefixMatches};
use crate::{BlockHash, InstanceId, Millis, Tier};

const BATCH_MIN: usize = 16;
const BATCH_MAX: usize = 256;

/// Per-block result of a batch: bit `r` set when row `r` holds the block live (and in CPU / disk).
#[derive(Clone, Copy, Default)]
struct Masks {
    held: u64,
    cpu: u64,
    disk: u64,
}

impl PlacementIndex {
    /// For `hashes` (a prompt's chain), the leading run each instance holds, by tier.
    /// Expired predictions do not count. Clears and fills `out`.
    ///
    /// Walks blocks from 0 with the set of instances still matching and stops as soon as that
    /// set is empty.
    pub fn match_prefix(&self, hashes: &[BlockHash], now: Millis, out: &mut PrefixMatches) {
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
                out.rows.push(row);
            }
        }
        if out.rows.len() <= 64 {
            self.match_batched(rest, now, &mut out.rows);
        } else {
            self.match_linear(rest, now, &mut out.rows);
        }
    }

    /// Up to 64 rows: batched lookups with per-block bit masks over the rows.
    fn match_batched(&self, rest: &[BlockHash], now: Millis, rows: &mut [InstanceMatch]) {
        let mut alive: u64 = if rows.len() == 64 {
            u64::MAX
        } else {
            (1u64 << rows.len()) - 1
        };
        let mut order = [0u64; BATCH_MAX];
        let mut masks = [Masks::default(); BATCH_MAX];
        let mut pos = 0;
        let mut batch = BATCH_MIN;
        while pos < rest.len() && alive != 0 {
            let chunk = &rest[pos..rest.len().min(pos + batch)];
            let n = chunk.len();
            for (k, &h) in chunk.iter().enumerate() {
                order[k] = ((self.shard_index(h) as u64) << 32) | k as u64;
            }
            order[..n].sort_unstable();
            let mut k = 0;
            while k < n {
                let s = (order[k] >> 32) as usize;
                let shard = self.shards[s].read();
                while k < n && (order[k] >> 32) as usize == s {
                    let i = (order[k] & 0xffff_ffff) as usize;
                    masks[i] = match shard.map.get(&chunk[i]) {
                        Some(holders) => row_masks(rows, holders.as_slice(), now),
                        None => Masks::default(),
                    };
                    k += 1;
                }
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

    /// Any number of rows: one lookup per block, compacting the still-matching rows to the front.
    fn match_linear(&self, rest: &[BlockHash], now: Millis, rows: &mut [InstanceMatch]) {
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
fn row_masks(rows: &[InstanceMatch], holders: &[Entry], now: Millis) -> Masks {
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
            match holders[j].best_tier() {
                Tier::Gpu => {}
                Tier::Cpu => m.cpu |= bit,
                Tier::Disk => m.disk |= bit,
            }
        }
    }
    m
}

fn count_tier(row: &mut InstanceMatch, tier: Tier) {
    match tier {
        Tier::Gpu => row.gpu += 1,
        Tier::Cpu => row.cpu += 1,
        Tier::Disk => row.disk += 1,
    }
}
