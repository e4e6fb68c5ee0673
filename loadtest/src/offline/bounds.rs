//! Router-independent hit-ratio references computed from the workload alone.
//!
//! - **Infinite cache:** one cache that never evicts; a request hits the leading run of its blocks
//!   that any earlier request computed. No router, fleet or capacity can do better.
//! - **Fleet-sized LRU:** one ideal LRU cache as large as the whole fleet's capacity, as if the
//!   fleet were a single engine: what a perfect router could hope for at that capacity.
//!
//! Invariants: requests are visited in arrival order; a request's hit is the leading run present
//! *before* it is inserted; blocks are inserted last-to-first, so a prompt's head is the most
//! recently used part (engines free a finished request's blocks tail first, keeping prefixes
//! longest); a hit never covers the prompt's last token (engines recompute it); hits are counted in tokens (full blocks only) over all prompt tokens, the unit the
//! engines' own counters use.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::lru::{IdentityBuild, LruSet};
use super::workload::Workload;

/// A hit ratio with its parts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HitRatio {
    /// Prompt tokens served from cache.
    pub cached_tokens: u64,
    /// All prompt tokens.
    pub prompt_tokens: u64,
}

impl HitRatio {
    /// `cached / prompt`, 0 when there were no prompt tokens.
    pub fn ratio(&self) -> f64 {
        if self.prompt_tokens == 0 {
            0.0
        } else {
            self.cached_tokens as f64 / self.prompt_tokens as f64
        }
    }
}

/// Hit ratio of a single cache that never evicts: the upper bound for any router and fleet.
pub fn infinite_cache_hit(workload: &Workload) -> HitRatio {
    let mut seen: HashSet<u64, IdentityBuild> = HashSet::default();
    let mut out = HitRatio::default();
    let b = u64::from(workload.block_tokens);
    for r in &workload.requests {
        let run = r.blocks.iter().take_while(|h| seen.contains(h)).count() as u64;
        out.cached_tokens += lookup_cap(run, r.prompt_tokens, b) * b;
        out.prompt_tokens += u64::from(r.prompt_tokens);
        seen.extend(r.blocks.iter().copied());
    }
    out
}

/// Per-request leading run (in blocks) an infinite cache would give each request, in workload order.
pub fn infinite_cache_runs(workload: &Workload) -> Vec<u32> {
    let b = u64::from(workload.block_tokens);
    let mut seen: HashSet<u64, IdentityBuild> = HashSet::default();
    workload
        .requests
        .iter()
        .map(|r| {
            let run = r.blocks.iter().take_while(|h| seen.contains(h)).count() as u64;
            seen.extend(r.blocks.iter().copied());
            lookup_cap(run, r.prompt_tokens, b) as u32
        })
        .collect()
}

/// Hit ratio of one ideal LRU cache holding `capacity_blocks` blocks.
pub fn lru_cache_hit(workload: &Workload, capacity_blocks: usize) -> HitRatio {
    let mut lru = LruSet::new(capacity_blocks);
    let mut out = HitRatio::default();
    let b = u64::from(workload.block_tokens);
    for r in &workload.requests {
        let run = r.blocks.iter().take_while(|&&h| lru.contains(h)).count() as u64;
        out.cached_tokens += lookup_cap(run, r.prompt_tokens, b) * b;
        out.prompt_tokens += u64::from(r.prompt_tokens);
        for &h in r.blocks.iter().rev() {
            lru.touch(h);
        }
    }
    out
}

/// Engines look up at most `(prompt − 1) / block` blocks: the last prompt token is always
/// recomputed to produce the first output token (vLLM's rule, kept by the engine model).
fn lookup_cap(run: u64, prompt_tokens: u32, block_tokens: u64) -> u64 {
    run.min(u64::from(prompt_tokens.saturating_sub(1)) / block_tokens.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offline::workload::OfflineRequest;

    fn w(reqs: &[&[u64]]) -> Workload {
        Workload {
            requests: reqs
                .iter()
                .enumerate()
                .map(|(i, b)| OfflineRequest {
                    arrival_us: i as u64,
                    prompt_tokens: b.len() as u32 * 10 + 1,
                    output_tokens: 1,
                    blocks: b.to_vec(),
                })
                .collect(),
            block_tokens: 10,
        }
    }

    #[test]
    fn infinite_counts_leading_runs_only() {
        let wl = w(&[&[1, 2, 3], &[1, 2, 4], &[5, 2, 3]]);
        let h = infinite_cache_hit(&wl);
        assert_eq!(h.prompt_tokens, 93);
        assert_eq!(h.cached_tokens, 20);
        assert_eq!(infinite_cache_runs(&wl), vec![0, 2, 0]);
    }

    #[test]
    fn lru_is_bounded_by_infinite_and_keeps_heads() {
        let wl = w(&[&[1, 2, 3], &[7, 8, 9], &[1, 2, 3]]);
        // Capacity 4: after the second request the cache holds 7, 8, 9 and the head `1`, so the
        // third request hits exactly one block.
        assert_eq!(lru_cache_hit(&wl, 4).cached_tokens, 10);
        assert_eq!(lru_cache_hit(&wl, 6).cached_tokens, 30);
        assert_eq!(lru_cache_hit(&wl, 0).cached_tokens, 0);
        assert!(lru_cache_hit(&wl, 100).cached_tokens <= infinite_cache_hit(&wl).cached_tokens);
    }
}
