//! Per-instance results of an offline run: what each engine received and how its requests fared.
//!
//! The fleet-wide share figure says *that* one instance collected more than its share; these
//! rows say *what* it collected (mean prompt size, hit ratio) and what that did to the requests
//! it served (TTFT, E2E), which is what tells a load imbalance from a specialisation.
//!
//! Invariant: one row per engine in fleet order; shares sum to 1 over the routed requests.

use super::result::{InstanceResult, PolicyResult};
use super::summary::Dist;
use super::workload::OfflineRequest;
use crate::offline::engine_loop::ratio;
use kvgate_sim::model::EngineModel;
use std::fmt::Write as _;

/// One row per engine: requests routed there (`placed[i]` is request `i`'s engine, `u32::MAX`
/// when never routed), their mean prompt, TTFT and E2E, and the engine's own hit ratio.
pub fn instance_results(
    engines: &[EngineModel],
    placed: &[u32],
    rejected: &[bool],
    ttft_us: &[Option<u64>],
    done_us: &[Option<u64>],
    reqs: &[OfflineRequest],
) -> Vec<InstanceResult> {
    let routed = placed.iter().filter(|&&p| p != u32::MAX).count();
    let mut rows: Vec<Acc> = (0..engines.len()).map(|_| Acc::default()).collect();
    for (i, &p) in placed.iter().enumerate() {
        let Some(acc) = rows.get_mut(p as usize) else {
            continue;
        };
        acc.requests += 1;
        acc.prompt_tokens += u64::from(reqs[i].prompt_tokens);
        if rejected[i] {
            continue;
        }
        if let Some(t) = ttft_us[i] {
            acc.ttfts.push(t as f64 / 1e6);
        }
        if let Some(d) = done_us[i] {
            acc.e2es
                .push(d.saturating_sub(reqs[i].arrival_us) as f64 / 1e6);
        }
    }
    rows.into_iter()
        .zip(engines)
        .map(|(mut acc, eng)| {
            let s = eng.stats();
            InstanceResult {
                request_share: ratio(acc.requests as f64, routed as f64),
                mean_prompt_tokens: ratio(acc.prompt_tokens as f64, acc.requests as f64),
                ttft_s: Dist::of(&mut acc.ttfts),
                e2e_s: Dist::of(&mut acc.e2es),
                hit_ratio: ratio(s.prefix_cache_hits as f64, s.prefix_cache_queries as f64),
                computed_tokens: s.prefix_cache_queries.saturating_sub(s.prefix_cache_hits),
            }
        })
        .collect()
}

#[derive(Default)]
struct Acc {
    requests: usize,
    prompt_tokens: u64,
    ttfts: Vec<f64>,
    e2es: Vec<f64>,
}

/// Each row's share of the prompt tokens computed fleet-wide (its share of the prefill work).
pub fn prefill_shares(rows: &[InstanceResult]) -> Vec<f64> {
    let total: u64 = rows.iter().map(|r| r.computed_tokens).sum();
    rows.iter()
        .map(|r| ratio(r.computed_tokens as f64, total as f64))
        .collect()
}

/// The busiest instance's prefill share over the mean share (1.0 = perfectly even).
pub fn prefill_share_max_over_mean(rows: &[InstanceResult]) -> f64 {
    let shares = prefill_shares(rows);
    shares.iter().copied().fold(0.0, f64::max) * shares.len() as f64
}

/// The per-engine rows of every policy as a text table.
pub fn instance_table(results: &[PolicyResult]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "by instance: {:<20} {:>4} {:>7} {:>7} {:>9} {:>8} {:>8} {:>6}",
        "policy", "#", "share", "prefill", "prompt", "ttft", "e2e", "hit"
    );
    for r in results {
        let tokens = prefill_shares(&r.instances);
        for (i, (row, t)) in r.instances.iter().zip(tokens).enumerate() {
            let _ = writeln!(
                s,
                "             {:<20} {:>4} {:>7.3} {:>7.3} {:>9.0} {:>8.3} {:>8.2} {:>6.3}",
                r.policy,
                i,
                row.request_share,
                t,
                row.mean_prompt_tokens,
                row.ttft_s.mean,
                row.e2e_s.mean,
                row.hit_ratio
            );
        }
    }
    let _ = write!(
        s,
        "(share: of the requests routed; prefill: of the prompt tokens the fleet computed (cache misses); prompt: mean prompt tokens; times in s)"
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(computed: u64) -> InstanceResult {
        InstanceResult {
            computed_tokens: computed,
            ..InstanceResult::default()
        }
    }

    #[test]
    fn prefill_shares_are_the_computed_tokens_over_the_fleets() {
        let rows = [row(1000), row(3000)];
        assert_eq!(prefill_shares(&rows), vec![0.25, 0.75]);
        assert_eq!(prefill_share_max_over_mean(&rows), 1.5);
        assert_eq!(prefill_shares(&[row(0)]), vec![0.0]);
    }
}
