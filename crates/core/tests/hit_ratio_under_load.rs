//! Closed-loop check in virtual time: the default policy keeps its cache hit ratio as load rises,
//! where a TTFT-only greedy scorer trades hits for shorter queues.
//!
//! Fleet: 4 FCFS prefill servers at 10 000 tokens/s (decode ignored). Workload: 64 interleaved
//! conversations; turn `t` resends the conversation so far (40 + 8·t blocks of 16 tokens), ten
//! turns per conversation. The index learns only from the router's own predictions, which here are
//! exact (the engines cache everything they compute).

use kvgate_core::index::{IndexConfig, PlacementIndex, PrefixMatches};
use kvgate_core::load::{InstanceRates, LoadGuard, LoadTracker};
use kvgate_core::policy::kvgate::Kvgate;
use kvgate_core::policy::util::mix;
use kvgate_core::policy::{Candidate, KvgateParams, Policy, RouteRequest};
use kvgate_core::{InstanceId, Source};
use std::sync::Arc;

const N: u32 = 4;
const TPB: u32 = 16;
const TOKENS_PER_MS: f64 = 10.0;

struct Outcome {
    hit_ratio: f64,
    mean_ttft_ms: f64,
}

fn run(policy: &Kvgate, gap_ms: f64, requests: u64) -> Outcome {
    let index = PlacementIndex::new(IndexConfig {
        shards: 16,
        max_entries: 1 << 22,
        default_instance_capacity: 1 << 22,
    });
    let load = Arc::new(LoadTracker::new(N as usize));
    let mut busy_until = [0.0f64; N as usize];
    let mut inflight: Vec<(f64, LoadGuard)> = Vec::new();
    let mut buf = PrefixMatches::default();
    let (mut cached, mut total, mut ttft_sum) = (0u64, 0u64, 0.0);
    for k in 0..requests {
        let now = k as f64 * gap_ms;
        // Requests whose prefill finished by now release their prefill load.
        inflight.retain(|(done, _)| *done > now);
        let session = k % 64;
        let round = k / 64;
        let turn = round % 10;
        let conversation = session + 64 * (round / 10);
        let blocks = 40 + 8 * turn;
        let hashes: Vec<u64> = (0..blocks).map(|b| mix(conversation << 20 | b)).collect();
        index.match_prefix(&hashes, now as u64, &mut buf);
        let cands: Vec<Candidate> = (0..N)
            .map(|i| Candidate {
                id: InstanceId(i),
                matched: buf.get(InstanceId(i)),
                load: load.snapshot(InstanceId(i)),
                engine: None,
                rates: InstanceRates {
                    prefill_tokens_per_s: TOKENS_PER_MS * 1000.0,
                    decode_interference_ms: 0.0,
                },
                decode: Default::default(),
                cache_capacity_blocks: None,
            })
            .collect();
        let req = RouteRequest {
            hashes: &hashes,
            tokens_per_block: TPB,
            prompt_tokens: blocks as u32 * TPB,
            expected_output_tokens: 100,
            kv_block_tokens: 16,
            text: b"",
            seed: mix(k),
            concurrent_decisions: 0.0,
            now: now as u64,
        };
        let d = policy.decide(&req, &cands).expect("candidates");
        let hit = u64::from(d.matched_blocks * TPB);
        let uncached = u64::from(req.prompt_tokens) - hit;
        let i = d.chosen.index();
        let done = busy_until[i].max(now) + uncached as f64 / TOKENS_PER_MS;
        busy_until[i] = done;
        index.predict(d.chosen, &hashes, Source::Local, u64::MAX / 4, now as u64);
        inflight.push((done, load.dispatch(d.chosen, uncached)));
        cached += hit;
        total += u64::from(req.prompt_tokens);
        ttft_sum += done - now;
    }
    Outcome {
        hit_ratio: cached as f64 / total as f64,
        mean_ttft_ms: ttft_sum / requests as f64,
    }
}

#[test]
fn hit_ratio_holds_as_load_rises() {
    let kvgate = Kvgate::new(KvgateParams::default());
    let greedy = Kvgate::new(KvgateParams {
        objective: kvgate_core::policy::Objective::Ttft,
        fleet_weight: 0.0,
        fleet_load_weight: 0.0,
        ..Default::default()
    });
    // With perfect reuse a request costs ~18 ms of one server: gap 9 ms ≈ 50 % load, 3.7 ms ≈ 120 %.
    let (light, heavy) = (9.0, 3.7);
    let k_light = run(&kvgate, light, 2560);
    let k_heavy = run(&kvgate, heavy, 2560);
    let g_light = run(&greedy, light, 2560);
    let g_heavy = run(&greedy, heavy, 2560);
    println!(
        "kvgate: hit {:.3} / {:.3} (ttft {:.0} / {:.0} ms); greedy: hit {:.3} / {:.3} (ttft {:.0} / {:.0} ms)",
        k_light.hit_ratio, k_heavy.hit_ratio, k_light.mean_ttft_ms, k_heavy.mean_ttft_ms,
        g_light.hit_ratio, g_heavy.hit_ratio, g_light.mean_ttft_ms, g_heavy.mean_ttft_ms
    );
    assert!(
        k_heavy.hit_ratio >= 0.95 * k_light.hit_ratio,
        "kvgate hit ratio fell under load"
    );
    assert!(
        k_heavy.hit_ratio > g_heavy.hit_ratio,
        "kvgate must keep more hits than greedy under overload"
    );
}
