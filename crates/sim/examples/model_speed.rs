//! Speed of the pure engine model, as the offline simulator drives it: 16 engines in virtual
//! time, Poisson arrivals with shared prefixes, round-robin, no I/O. Prints JSON.
//!
//! `cargo run --release -p kvgate-sim --example model_speed`

use std::time::Instant;

use kvgate_sim::model::{EngineModel, EngineParams, SimRequest};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn main() {
    let engines = 16usize;
    let requests = 20_000u64;
    let rate_per_s = 40.0; // fleet-wide, simulated
    let mut models: Vec<EngineModel> = (0..engines)
        .map(|_| EngineModel::new(EngineParams::default()))
        .collect();
    let mut next_step: Vec<Option<u64>> = vec![None; engines];
    let mut rng = SmallRng::seed_from_u64(1);
    let mut t = 0u64;
    let mut arrivals = Vec::with_capacity(requests as usize);
    for id in 0..requests {
        t += (-(1.0 - rng.gen::<f64>()).ln() / rate_per_s * 1e6) as u64;
        let group = rng.gen_range(0..64u64);
        let shared = 100; // 1,600 shared tokens
        let own = rng.gen_range(10..60u64);
        let mut blocks: Vec<u64> = (0..shared).map(|b| group << 32 | b).collect();
        blocks.extend((0..own).map(|b| (id + 1_000_000) << 32 | b));
        let prompt = (blocks.len() * 16 + 7) as u32;
        arrivals.push((
            t,
            SimRequest {
                id,
                blocks,
                block_tokens: vec![],
                prompt_tokens: prompt,
                output_tokens: rng.gen_range(16..256),
            },
        ));
    }
    let start = Instant::now();
    let mut steps = 0u64;
    let mut finished = 0u64;
    let mut ai = 0usize;
    loop {
        // Next event: an arrival or the earliest engine step.
        let next_arrival = arrivals.get(ai).map(|a| a.0);
        let (ei, next_eng) = next_step
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|s| (i, s)))
            .min_by_key(|x| x.1)
            .map_or((usize::MAX, None), |(i, s)| (i, Some(s)));
        match (next_arrival, next_eng) {
            (None, None) => break,
            (Some(ta), te) if te.is_none_or(|te| ta <= te) => {
                let e = ai % engines;
                let req = arrivals[ai].1.clone();
                models[e].submit(req, ta);
                if next_step[e].is_none() {
                    next_step[e] = Some(ta);
                }
                ai += 1;
            }
            (_, Some(te)) => {
                match models[ei].step(te) {
                    Some(out) => {
                        steps += 1;
                        finished += out.finished.len() as u64;
                        next_step[ei] = if models[ei].is_idle() {
                            None
                        } else {
                            Some(out.end_us)
                        };
                    }
                    None => next_step[ei] = None,
                }
                models[ei].drain_kv_events();
            }
            _ => break,
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let (q, h): (u64, u64) = models.iter().map(|m| m.stats()).fold((0, 0), |a, s| {
        (a.0 + s.prefix_cache_queries, a.1 + s.prefix_cache_hits)
    });
    println!(
        "{{\"engines\":{engines},\"requests\":{requests},\"finished\":{finished},\"simulated_s\":{:.1},\"wall_s\":{wall:.3},\"steps\":{steps},\"steps_per_s\":{:.0},\"hit_ratio\":{:.3}}}",
        t as f64 / 1e6,
        steps as f64 / wall,
        h as f64 / q.max(1) as f64
    );
}
