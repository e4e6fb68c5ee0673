//! The no-queue TTFT floor: each request alone on an idle engine with the best hit any cache could
//! give it (the infinite cache's leading run), timed by the engine model itself.
//!
//! No router can beat it at any percentile: queueing only adds time and no placement can hit more
//! than the infinite cache. In a fleet of several engine classes a request's floor is its floor
//! on the class that serves it fastest ([`ttft_floor_fastest`]).
//!
//! Invariants: one engine is reused for every request, always idle when a request is submitted;
//! before each request a warm-up request holding exactly the request's infinite-cache run is
//! computed, so the engine's lookup finds that run (never more: everything the engine holds was
//! seen earlier, so it is inside the infinite cache); the engine is given enough GPU blocks that a
//! warm-up is never evicted by the request it warms.

use kvgate_sim::model::{EngineModel, EngineParams, SimRequest};

use super::bounds::infinite_cache_runs;
use super::summary::Dist;
use super::workload::Workload;
use super::OfflineError;

/// Id of warm-up requests (never a workload index).
const WARM_ID: u64 = u64::MAX;

/// Per-request TTFT floor in seconds, in workload order (`None` for requests the engine refuses,
/// e.g. longer than its model length).
pub fn ttft_floor_per_request(
    workload: &Workload,
    params: &EngineParams,
) -> Result<Vec<Option<f64>>, OfflineError> {
    params
        .validate()
        .map_err(|e| OfflineError::Engine(e.to_string()))?;
    if params.block_size != workload.block_tokens {
        return Err(OfflineError::Param(format!(
            "workload cut in {}-token blocks but engines use {}",
            workload.block_tokens, params.block_size
        )));
    }
    let longest = workload
        .requests
        .iter()
        .map(|r| r.blocks.len() + 2)
        .max()
        .unwrap_or(0) as u64;
    let mut p = params.clone();
    p.num_gpu_blocks =
        (u64::from(p.num_gpu_blocks).max(2 * longest + 16)).min(u64::from(u32::MAX)) as u32;
    let mut engine = EngineModel::new(p);
    let runs = infinite_cache_runs(workload);
    let mut now = 0u64;
    let mut out = Vec::with_capacity(workload.requests.len());
    for (i, (r, &run)) in workload.requests.iter().zip(&runs).enumerate() {
        if run > 0 {
            let warm_blocks = &r.blocks[..run as usize];
            let warm = SimRequest {
                id: WARM_ID,
                blocks: warm_blocks.to_vec(),
                block_tokens: Vec::new(),
                prompt_tokens: run * workload.block_tokens,
                output_tokens: 1,
            };
            engine.submit(warm, now);
            now = drain(&mut engine, now, None).0;
        }
        let req = SimRequest {
            id: i as u64,
            blocks: r.blocks.clone(),
            block_tokens: Vec::new(),
            prompt_tokens: r.prompt_tokens,
            output_tokens: 1,
        };
        let submitted = now;
        engine.submit(req, now);
        let (end, first) = drain(&mut engine, now, Some(i as u64));
        now = end;
        out.push(first.map(|t| t.saturating_sub(submitted) as f64 / 1e6));
    }
    Ok(out)
}

/// Distribution of the TTFT floor over the workload, seconds.
pub fn ttft_floor(workload: &Workload, params: &EngineParams) -> Result<Dist, OfflineError> {
    let mut v: Vec<f64> = ttft_floor_per_request(workload, params)?
        .into_iter()
        .flatten()
        .collect();
    Ok(Dist::of(&mut v))
}

/// Distribution of the TTFT floor over the workload when each request may run on any of the
/// engine classes `classes`: per request, the fastest class's floor, seconds.
pub fn ttft_floor_fastest(
    workload: &Workload,
    classes: &[EngineParams],
) -> Result<Dist, OfflineError> {
    let mut best: Vec<Option<f64>> = vec![None; workload.requests.len()];
    if classes.is_empty() {
        return Err(OfflineError::Param(
            "the floor needs at least one engine class".into(),
        ));
    }
    for p in classes {
        for (b, f) in best.iter_mut().zip(ttft_floor_per_request(workload, p)?) {
            *b = match (*b, f) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
        }
    }
    let mut v: Vec<f64> = best.into_iter().flatten().collect();
    Ok(Dist::of(&mut v))
}

/// Steps the engine until idle; returns the end time and when `watch` got its first token.
fn drain(engine: &mut EngineModel, mut now: u64, watch: Option<u64>) -> (u64, Option<u64>) {
    let mut first = None;
    // Bounded: an idle engine returns None; each step makes progress on a single request.
    while let Some(out) = engine.step(now) {
        now = out.end_us.max(now + 1);
        if let Some(w) = watch {
            if first.is_none() && out.first_tokens.iter().any(|&(id, _)| id == w) {
                first = Some(now);
            }
        }
        if engine.is_idle() {
            break;
        }
    }
    (now, first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offline::workload::OfflineRequest;

    fn params() -> EngineParams {
        EngineParams {
            num_gpu_blocks: 1000,
            ..Default::default()
        }
    }

    fn req(blocks: &[u64], tokens: u32) -> OfflineRequest {
        OfflineRequest {
            arrival_us: 0,
            prompt_tokens: tokens,
            output_tokens: 50,
            blocks: blocks.to_vec(),
        }
    }

    #[test]
    fn a_repeated_prefix_is_faster_and_the_floor_is_positive() {
        let long: Vec<u64> = (1..=256).collect();
        let mut other: Vec<u64> = (1..=250).collect();
        other.extend(1000..1006);
        let w = Workload {
            requests: vec![req(&long, 4096), req(&other, 4096), req(&[7; 1], 20)],
            block_tokens: 16,
        };
        let f = ttft_floor_per_request(&w, &params()).expect("floor");
        let (a, b) = (f[0].expect("a"), f[1].expect("b"));
        assert!(a > 0.0 && b > 0.0);
        assert!(b < a * 0.5, "250 of 256 blocks cached: {b} vs {a}");
        assert!(f[2].expect("c") > 0.0);
        let d = ttft_floor(&w, &params()).expect("dist");
        assert_eq!(d.count, 3);
    }

    #[test]
    fn the_fastest_class_sets_the_floor() {
        let w = Workload {
            requests: vec![req(&(1..=200).collect::<Vec<_>>(), 3200), req(&[9; 1], 20)],
            block_tokens: 16,
        };
        let fast = params();
        let slow = EngineParams {
            num_gpu_blocks: 1000,
            ..EngineParams::from_preset("llama3-8b-a100-40gb").expect("preset")
        };
        let f = ttft_floor(&w, &fast).expect("fast");
        let s = ttft_floor(&w, &slow).expect("slow");
        assert!(s.mean > 2.0 * f.mean, "{s:?} vs {f:?}");
        let both = ttft_floor_fastest(&w, &[slow, fast]).expect("both");
        assert_eq!(both, f);
        assert!(ttft_floor_fastest(&w, &[]).is_err());
    }

    #[test]
    fn block_size_mismatch_is_an_error() {
        let w = Workload {
            requests: vec![req(&[1], 20)],
            block_tokens: 32,
        };
        assert!(ttft_floor(&w, &params()).is_err());
    }
}
