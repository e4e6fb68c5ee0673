//! Scheduler behaviour through the public `EngineModel` API.

use super::*;

fn params(blocks: u32) -> EngineParams {
    EngineParams {
        block_size: 16,
        num_gpu_blocks: blocks,
        max_num_seqs: 64,
        max_num_batched_tokens: 2048,
        ..EngineParams::default()
    }
}

fn req(id: u64, prefix: u64, prompt_blocks: u32, output: u32) -> SimRequest {
    SimRequest {
        id,
        blocks: (0..u64::from(prompt_blocks))
            .map(|i| prefix * 1_000_000 + i)
            .collect(),
        block_tokens: vec![],
        prompt_tokens: prompt_blocks * 16 + 5,
        output_tokens: output,
    }
}

/// (id, first-token time, cached tokens) per request, (id, finish time), and the end time.
type RunResult = (Vec<(u64, u64, u32)>, Vec<(u64, u64)>, u64);

/// Runs until idle.
fn run(m: &mut EngineModel, start: u64) -> RunResult {
    let mut now = start;
    let mut firsts = Vec::new();
    let mut fins = Vec::new();
    for _ in 0..1_000_000 {
        let Some(out) = m.step(now) else { break };
        now = out.end_us;
        for (id, c) in out.first_tokens {
            firsts.push((id, now, c));
        }
        for id in out.finished {
            fins.push((id, now));
        }
    }
    (firsts, fins, now)
}

#[test]
fn cached_prompt_reaches_first_token_sooner() {
    let mut m = EngineModel::new(params(1000));
    m.submit(req(1, 7, 100, 1), 0);
    let (f1, _, end) = run(&mut m, 0);
    let ttft_cold = f1[0].1;
    assert_eq!(f1[0].2, 0);
    m.submit(req(2, 7, 100, 1), end);
    let (f2, _, _) = run(&mut m, end);
    let ttft_warm = f2[0].1 - end;
    assert_eq!(f2[0].2, 100 * 16, "all full prompt blocks hit");
    assert!(
        ttft_warm * 4 < ttft_cold,
        "warm {ttft_warm} cold {ttft_cold}"
    );
    let st = m.stats();
    assert_eq!(st.prefix_cache_queries, 2 * (100 * 16 + 5));
    assert_eq!(st.prefix_cache_hits, 1600);
}

#[test]
fn last_token_is_always_recomputed() {
    let mut m = EngineModel::new(params(100));
    // Prompt of exactly 2 full blocks: a repeat may hit only the first one.
    let r = SimRequest {
        id: 1,
        blocks: vec![1, 2],
        prompt_tokens: 32,
        output_tokens: 1,
        ..Default::default()
    };
    m.submit(r.clone(), 0);
    let (_, _, end) = run(&mut m, 0);
    m.submit(SimRequest { id: 2, ..r }, end);
    let (f, _, _) = run(&mut m, end);
    assert_eq!(f[0].2, 16);
}

#[test]
fn queueing_delay_grows_with_load() {
    let mut mean_ttft = Vec::new();
    for n in [1u64, 8, 32] {
        let mut m = EngineModel::new(params(100_000));
        for id in 0..n {
            m.submit(req(id, id + 1, 200, 8), 0);
        }
        let (f, _, _) = run(&mut m, 0);
        assert_eq!(f.len() as u64, n);
        mean_ttft.push(f.iter().map(|x| x.1).sum::<u64>() / n);
    }
    assert!(
        mean_ttft[0] < mean_ttft[1] && mean_ttft[1] < mean_ttft[2],
        "{mean_ttft:?}"
    );
}

#[test]
fn max_num_seqs_bounds_the_batch() {
    let mut p = params(100_000);
    p.max_num_seqs = 4;
    let mut m = EngineModel::new(p);
    for id in 0..10 {
        m.submit(req(id, id + 1, 2, 50), 0);
    }
    let mut now = 0;
    for _ in 0..5 {
        let out = m.step(now).unwrap();
        now = out.end_us;
        let l = m.load();
        assert!(l.running <= 4);
        assert_eq!(l.running + l.waiting, 10);
    }
    let (_, fins, _) = run(&mut m, now);
    assert_eq!(fins.len(), 10);
}

#[test]
fn preemption_when_blocks_run_out() {
    // 20 blocks; each request needs 2 prompt blocks + output growth up to 4 blocks.
    let mut m = EngineModel::new(params(20));
    for id in 0..8 {
        m.submit(req(id, id + 1, 2, 40), 0);
    }
    let (f, fins, _) = run(&mut m, 0);
    assert_eq!(f.len(), 8);
    assert_eq!(fins.len(), 8, "every request still completes");
    let st = m.stats();
    assert!(st.preemptions > 0, "{st:?}");
    assert_eq!(st.generation_tokens, 8 * 40);
    assert_eq!(m.load().kv_usage, 0.0);
}

#[test]
fn rejects_what_cannot_fit_and_bounds_the_queue() {
    let mut p = params(4);
    p.max_waiting = 2;
    let mut m = EngineModel::new(p);
    assert!(
        m.try_submit(req(1, 1, 10, 1), 0).is_err(),
        "longer than the cache"
    );
    m.submit(req(2, 2, 1, 1), 0);
    m.submit(req(3, 3, 1, 1), 0);
    m.submit(req(4, 4, 1, 1), 0);
    let out = m.step(0).unwrap();
    assert_eq!(out.rejected, vec![1, 4]);
    let (_, fins, _) = run(&mut m, out.end_us);
    assert_eq!(fins.len() + out.finished.len(), 2);
    assert_eq!(m.stats().requests_rejected, 2);
}

#[test]
fn abort_frees_blocks_and_events_follow_the_cache() {
    let mut m = EngineModel::new(params(50));
    m.submit(req(1, 1, 3, 100), 0);
    let out = m.step(0).unwrap();
    assert_eq!(out.first_tokens, vec![(1, 0)]);
    assert!(m.load().kv_usage > 0.0);
    assert!(m.abort(1));
    assert_eq!(m.load().kv_usage, 0.0);
    assert!(m.is_idle());
    let ev = m.drain_kv_events();
    assert_eq!(ev.len(), 1);
    assert!(matches!(&ev[0], KvEvent::BlockStored { block_hashes, .. } if block_hashes.len() == 3));
    assert!(m.reset_prefix_cache(0));
    assert_eq!(m.drain_kv_events(), vec![KvEvent::AllBlocksCleared]);
    assert_eq!(m.cached_blocks(), 0);
}

#[test]
fn chunked_prefill_splits_long_prompts() {
    let mut m = EngineModel::new(params(10_000));
    m.submit(req(1, 1, 400, 1), 0); // 6405 tokens, budget 2048 → 4 steps
    let mut steps = 0;
    let mut now = 0;
    while let Some(out) = m.step(now) {
        now = out.end_us;
        steps += 1;
        if !out.first_tokens.is_empty() {
            break;
        }
    }
    assert_eq!(steps, 4);
}

#[test]
fn cpu_tier_hits_count_and_cost_less_than_prefill() {
    let mut p = params(8);
    p.num_cpu_blocks = 64;
    let mut m = EngineModel::new(p);
    m.submit(req(1, 1, 6, 1), 0);
    let (_, _, t) = run(&mut m, 0);
    m.submit(req(2, 2, 6, 1), t); // evicts request 1's blocks to the CPU tier
    let (_, _, t) = run(&mut m, t);
    m.submit(req(3, 1, 6, 1), t);
    let (f, _, _) = run(&mut m, t);
    assert_eq!(f[0].2, 96);
    assert!(m.stats().cpu_cache_hits > 0);
    let ev = m.drain_kv_events();
    assert!(ev.iter().any(|e| matches!(
        e,
        KvEvent::BlockStored {
            medium: Medium::Cpu,
            ..
        }
    )));
}

#[test]
fn generated_blocks_are_cached_for_the_next_turn() {
    use crate::hashing::engine_block_hashes;
    let mut m = EngineModel::new(params(100));
    let prompt: Vec<u32> = (1000..1020).collect(); // one full block + 4 tokens
    let output: Vec<u32> = (5000..5030).collect();
    let r1 = SimRequest {
        id: 1,
        blocks: engine_block_hashes(&prompt, 16, None),
        block_tokens: prompt.clone(),
        prompt_tokens: 20,
        output_tokens: 30,
    };
    m.try_submit_with_output(r1, output.clone(), 0).unwrap();
    let (_, _, end) = run(&mut m, 0);
    // KV holds 20 + 29 tokens: blocks 1 and 2 of the sequence are full and hold generated tokens.
    let stored: Vec<(usize, Option<u64>, usize)> = m
        .drain_kv_events()
        .into_iter()
        .filter_map(|e| match e {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                ..
            } => Some((block_hashes.len(), parent_block_hash, token_ids.len())),
            _ => None,
        })
        .collect();
    assert_eq!(stored.len(), 3, "{stored:?}");
    assert!(stored
        .iter()
        .skip(1)
        .all(|s| s.0 == 1 && s.1.is_some() && s.2 == 16));
    // The next turn's prompt = previous prompt + answer + more: it hits all three blocks.
    let mut turn2 = prompt.clone();
    turn2.extend_from_slice(&output);
    turn2.extend(7000..7010);
    let r2 = SimRequest {
        id: 2,
        blocks: engine_block_hashes(&turn2, 16, None),
        block_tokens: turn2.clone(),
        prompt_tokens: turn2.len() as u32,
        output_tokens: 1,
    };
    m.submit(r2, end);
    let (f, _, _) = run(&mut m, end);
    assert_eq!(f[0].2, 48);
}

#[test]
fn random_workloads_keep_the_invariants() {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use std::collections::HashSet;
    for seed in 0..20u64 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut p = params(rng.gen_range(8..200));
        p.max_num_seqs = rng.gen_range(1..16);
        p.max_num_batched_tokens = rng.gen_range(16..600);
        p.num_cpu_blocks = if seed % 2 == 0 {
            rng.gen_range(0..50)
        } else {
            0
        };
        let mut m = EngineModel::new(p);
        let mut now = 0;
        let mut accepted_out = 0u64;
        let mut done = HashSet::new();
        let mut events = Vec::new();
        for id in 0..60u64 {
            let r = req(
                id,
                rng.gen_range(0..5),
                rng.gen_range(0..12),
                rng.gen_range(1..40),
            );
            if m.try_submit(r.clone(), now).is_ok() {
                accepted_out += u64::from(r.output_tokens);
            }
            for _ in 0..rng.gen_range(0..4) {
                if let Some(out) = m.step(now) {
                    now = out.end_us;
                    done.extend(out.finished);
                }
            }
            events.extend(m.drain_kv_events());
        }
        for _ in 0..100_000 {
            let Some(out) = m.step(now) else { break };
            now = out.end_us;
            done.extend(out.finished);
        }
        events.extend(m.drain_kv_events());
        assert!(m.is_idle());
        assert_eq!(m.load().kv_usage, 0.0, "seed {seed}: blocks leaked");
        let st = m.stats();
        assert_eq!(st.generation_tokens, accepted_out, "seed {seed}");
        assert_eq!(done.len() as u64, st.requests_finished);
        // The GPU event stream reproduces the cache exactly.
        let mut gpu = HashSet::new();
        for e in events {
            match e {
                KvEvent::BlockStored {
                    block_hashes,
                    medium: Medium::Gpu,
                    ..
                } => {
                    for h in block_hashes {
                        assert!(gpu.insert(h), "seed {seed}: stored twice without removal");
                    }
                }
                KvEvent::BlockRemoved {
                    block_hashes,
                    medium: Medium::Gpu,
                } => {
                    for h in block_hashes {
                        assert!(gpu.remove(&h), "seed {seed}: removed unknown block");
                    }
                }
                _ => {}
            }
        }
        let truth: HashSet<u64> = m.cached_hashes().into_iter().collect();
        assert_eq!(gpu, truth, "seed {seed}");
    }
}
