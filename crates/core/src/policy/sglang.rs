//! `sglang_cache_aware`: SGLang router's cache-aware policy, reproduced with its weaknesses.
//!
//! 1. Loads are this router's in-flight counts. If `max − min > balance_abs_threshold` and
//!    `max > min × balance_rel_threshold`, the fleet is "imbalanced": pick the least-loaded
//!    candidate (the first one on ties), ignoring the cache.
//! 2. Otherwise match the prompt text against the tree of past routing decisions;
//!    `match_rate = matched bytes / prompt bytes`. Above `cache_threshold`, route to the first
//!    candidate among the tenants of the deepest matched node; else to the tenant with the
//!    smallest tree (fewest bytes), the first one on ties.
//! 3. Insert the prompt into the tree under the chosen instance (in [`Policy::on_routed`]).
//!
//! Eviction: every `eviction_interval_ms` of request time, each tenant's least recently used
//! leaves are dropped until it holds at most `max_tree_size` bytes. Between evictions the tree is
//! additionally capped at 4 × `max_tree_size` per tenant, checked on insert, so memory stays bounded.
//! Known weaknesses kept on purpose: a single hot worker switches affinity off fleet-wide; the
//! tree never learns of engine evictions; ties favour the first worker.

use super::config::SglangParams;
use super::sglang_tree::Tree;
use super::util::decision;
use super::{Candidate, Decision, Policy, Reason, RouteRequest};
use crate::InstanceId;
use parking_lot::Mutex;

/// SGLang-style cache-aware routing over its own approximate tree.
#[derive(Debug)]
pub struct SglangCacheAware {
    params: SglangParams,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    tree: Tree,
    last_eviction: u64,
    tick: u64,
}

impl SglangCacheAware {
    /// A policy with these parameters and an empty tree.
    pub fn new(params: SglangParams) -> Self {
        Self {
            params,
            state: Mutex::new(State::default()),
        }
    }
}

impl Policy for SglangCacheAware {
    fn name(&self) -> &'static str {
        "sglang_cache_aware"
    }

    fn decide(&self, req: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<Decision> {
        let p = &self.params;
        let loads: Vec<u32> = candidates.iter().map(|c| c.load.in_flight).collect();
        let max = *loads.iter().max()?;
        let min = *loads.iter().min()?;
        let first_min = loads.iter().position(|&l| l == min)?;
        let scores: Vec<f64> = loads.iter().map(|&l| f64::from(l)).collect();
        let imbalanced = max - min > p.balance_abs_threshold
            && f64::from(max) > f64::from(min) * p.balance_rel_threshold;
        if imbalanced {
            return Some(decision(
                candidates,
                first_min,
                &scores,
                0.0,
                Reason::Rebalance,
            ));
        }
        let mut st = self.state.lock();
        for c in candidates {
            st.tree.add_tenant(c.id);
        }
        let (matched, tenants) = st.tree.prefix_match(req.text);
        let rate = if req.text.is_empty() {
            0.0
        } else {
            matched as f64 / req.text.len() as f64
        };
        if rate > p.cache_threshold {
            let hit = candidates
                .iter()
                .position(|c| tenants.iter().any(|(t, _)| *t == c.id));
            if let Some(i) = hit {
                return Some(decision(candidates, i, &scores, 0.0, Reason::CacheMatch));
            }
        }
        let smallest = candidates
            .iter()
            .enumerate()
            .min_by_key(|(i, c)| (st.tree.tenant_chars(c.id).unwrap_or(0), *i))
            .map_or(first_min, |(i, _)| i);
        Some(decision(
            candidates,
            smallest,
            &scores,
            0.0,
            Reason::LeastLoaded,
        ))
    }

    fn on_routed(&self, req: &RouteRequest<'_>, chosen: InstanceId) {
        let p = &self.params;
        let mut st = self.state.lock();
        st.tick += 1;
        let tick = st.tick;
        st.tree.insert(req.text, chosen, tick);
        let due = req.now.saturating_sub(st.last_eviction) >= p.eviction_interval_ms;
        let over = st.tree.tenant_chars(chosen).unwrap_or(0) > p.max_tree_size.saturating_mul(4);
        if due || over {
            st.last_eviction = req.now;
            st.tree.evict_tenants_above(p.max_tree_size);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::util::testing::{cand, req};

    fn route(p: &SglangCacheAware, text: &[u8], cs: &[Candidate]) -> u32 {
        let r = req(&[], text, 0);
        let d = p.decide(&r, cs).map_or(u32::MAX, |d| d.chosen.0);
        p.on_routed(&r, InstanceId(d));
        d
    }

    #[test]
    fn affinity_then_smallest_tenant() {
        let p = SglangCacheAware::new(SglangParams::default());
        let cs: Vec<_> = (0..3).map(|i| cand(i, 0, 0, 0)).collect();
        // Empty tree: all tenants have 0 bytes; the first wins (SGLang's tie behaviour).
        assert_eq!(route(&p, b"system prompt A; question 1", &cs), 0);
        // Next unrelated prompt goes to a smaller tenant.
        assert_eq!(route(&p, b"zzz other", &cs), 1);
        // A prompt sharing > 30 % with the first follows it.
        assert_eq!(route(&p, b"system prompt A; question 2", &cs), 0);
    }

    #[test]
    fn imbalance_overrides_affinity() {
        let p = SglangCacheAware::new(SglangParams::default());
        let cs: Vec<_> = (0..2).map(|i| cand(i, 0, 0, 0)).collect();
        assert_eq!(route(&p, b"shared system prompt", &cs), 0);
        let cs = vec![cand(0, 0, 0, 100), cand(1, 0, 0, 10)];
        assert_eq!(route(&p, b"shared system prompt", &cs), 1);
        // Balanced again (abs difference below 64): affinity to 0 returns.
        let cs = vec![cand(0, 0, 0, 40), cand(1, 0, 0, 10)];
        assert_eq!(route(&p, b"shared system prompt", &cs), 0);
    }
}
