//! The no-queue floors: each request alone on an idle engine with the best hit any cache could
//! give it (the infinite cache's leading run), timed by the engine model itself, to its first
//! token (the TTFT floor) and to its last (the end-to-end floor: its whole output decoded in a
//! batch of one).
//!
//! No router can beat either at any percentile: queueing only adds time, every other sequence in
//! a batch only lengthens its steps, and no placement can hit more than the infinite cache. In a
//! fleet of several engine classes a request's floor is its floor on the class that serves it
//! fastest ([`floors_fastest`]), each floor taken on its own fastest class.
//!
//! Invariants: one engine is reused for every request, always idle when a request is submitted;
//! before each request a warm-up request holding exactly the request's infinite-cache run is
//! computed, so the engine's lookup finds that run (never more: everything the engine holds was
//! seen earlier, so it is inside the infinite cache; generated tokens are never cached, as the
//! requests carry no token ids); the engine is given enough GPU blocks that a warm-up is never
//! evicted by the request it warms, nor a request by its own output.

use kvgate_sim::model::{EngineModel, EngineParams, SimRequest};

use super::bounds::infinite_cache_runs;
use super::summary::Dist;
use super::workload::Workload;
use super::OfflineError;

/// Id of warm-up requests (never a workload index).
const WARM_ID: u64 = u64::MAX;

/// One request's floors, seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RequestFloor {
    /// From submission to its first token.
    pub ttft_s: f64,
    /// From submission to its last token.
    pub e2e_s: f64,
}

/// Per-request floors in workload order (`None` for requests the engine refuses, e.g. longer
/// than its model length).
pub fn floor_per_request(
    workload: &Workload,
    params: &EngineParams,
) -> Result<Vec<Option<RequestFloor>>, OfflineError> {
    params
        .validate()
        .map_err(|e| OfflineError::Engine(e.to_string()))?;
    if params.block_size != workload.block_tokens {
        return Err(OfflineError::Param(format!(
            "workload cut in {}-token blocks but engines use {}",
            workload.block_tokens, params.block_size
        )));
    }
    let bs = u64::from(workload.block_tokens.max(1));
    let longest = workload
        .requests
        .iter()
        .map(|r| r.blocks.len() as u64 + u64::from(r.output_tokens).div_ceil(bs) + 2)
        .max()
        .unwrap_or(0);
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
            now = drain(&mut engine, now, None).end;
        }
        let req = SimRequest {
            id: i as u64,
            blocks: r.blocks.clone(),
            block_tokens: Vec::new(),
            prompt_tokens: r.prompt_tokens,
            output_tokens: r.output_tokens,
        };
        let submitted = now;
        engine.submit(req, now);
        let d = drain(&mut engine, now, Some(i as u64));
        now = d.end;
        let secs = |t: u64| t.saturating_sub(submitted) as f64 / 1e6;
        out.push(match (d.first, d.last) {
            (Some(first), Some(last)) => Some(RequestFloor {
                ttft_s: secs(first),
                e2e_s: secs(last),
            }),
            _ => None,
        });
    }
    Ok(out)
}

/// The floors' distributions over a workload, seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Floors {
    /// Time to first token.
    pub ttft_s: Dist,
    /// End-to-end latency.
    pub e2e_s: Dist,
}

/// The floors' distributions over the workload when each request may run on any of the engine
/// classes `classes`: per request and per floor, the fastest class's, seconds.
pub fn floors_fastest(
    workload: &Workload,
    classes: &[EngineParams],
) -> Result<Floors, OfflineError> {
    if classes.is_empty() {
        return Err(OfflineError::Param(
            "the floor needs at least one engine class".into(),
        ));
    }
    let mut best: Vec<Option<RequestFloor>> = vec![None; workload.requests.len()];
    for p in classes {
        for (b, f) in best.iter_mut().zip(floor_per_request(workload, p)?) {
            *b = match (*b, f) {
                (Some(x), Some(y)) => Some(RequestFloor {
                    ttft_s: x.ttft_s.min(y.ttft_s),
                    e2e_s: x.e2e_s.min(y.e2e_s),
                }),
                (x, y) => x.or(y),
            };
        }
    }
    let floors: Vec<RequestFloor> = best.into_iter().flatten().collect();
    let mut ttft: Vec<f64> = floors.iter().map(|f| f.ttft_s).collect();
    let mut e2e: Vec<f64> = floors.iter().map(|f| f.e2e_s).collect();
    Ok(Floors {
        ttft_s: Dist::of(&mut ttft),
        e2e_s: Dist::of(&mut e2e),
    })
}

/// What [`drain`] saw.
struct Drained {
    /// When the engine went idle.
    end: u64,
    /// When the watched request got its first token.
    first: Option<u64>,
    /// When it got its last.
    last: Option<u64>,
}

/// Steps the engine until idle, watching when `watch` gets its first and last tokens.
fn drain(engine: &mut EngineModel, mut now: u64, watch: Option<u64>) -> Drained {
    let (mut first, mut last) = (None, None);
    // Bounded: an idle engine returns None; each step makes progress on a single request.
    while let Some(out) = engine.step(now) {
        now = out.end_us.max(now + 1);
        if let Some(w) = watch {
            if first.is_none() && out.first_tokens.iter().any(|&(id, _)| id == w) {
                first = Some(now);
            }
            if last.is_none() && out.finished.contains(&w) {
                last = Some(now);
            }
        }
        if engine.is_idle() {
            break;
        }
    }
    Drained {
        end: now,
        first,
        last,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offline::workload::OfflineRequest;

    /// The TTFT floor's distribution on one engine class.
    fn ttft_floor(w: &Workload, p: &EngineParams) -> Result<Dist, OfflineError> {
        Ok(floors_fastest(w, std::slice::from_ref(p))?.ttft_s)
    }

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
        let f = floor_per_request(&w, &params()).expect("floor");
        let (a, b) = (f[0].expect("a").ttft_s, f[1].expect("b").ttft_s);
        assert!(a > 0.0 && b > 0.0);
        assert!(b < a * 0.5, "250 of 256 blocks cached: {b} vs {a}");
        assert!(f[2].expect("c").ttft_s > 0.0);
        let d = ttft_floor(&w, &params()).expect("dist");
        assert_eq!(d.count, 3);
    }

    #[test]
    fn the_end_to_end_floor_is_the_whole_output_decoded_alone() {
        let mut short = req(&(1..=64).collect::<Vec<_>>(), 1024);
        short.output_tokens = 1;
        let mut long = req(&(1..=64).collect::<Vec<_>>(), 1024);
        long.output_tokens = 101;
        let w = Workload {
            requests: vec![short, long],
            block_tokens: 16,
        };
        let p = params();
        let f = floor_per_request(&w, &p).expect("floor");
        let (a, b) = (f[0].expect("short"), f[1].expect("long"));
        assert_eq!(a.e2e_s, a.ttft_s, "one output token: the first is the last");
        // The second is served from cache, so its first token is quicker; then 100 decode
        // steps of one sequence, each at least the step's fixed cost.
        assert!(b.ttft_s < a.ttft_s);
        let step_s = p.timing.step_base_us / 1e6;
        assert!(b.e2e_s - b.ttft_s >= 100.0 * step_s, "{b:?}");
        assert!(b.e2e_s - b.ttft_s < 100.0 * 2.0 * step_s, "{b:?}");
        let d = floors_fastest(&w, &[p]).expect("dists");
        assert_eq!(d.e2e_s.count, 2);
        assert!(d.e2e_s.mean > d.ttft_s.mean);
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
        let both = floors_fastest(&w, &[slow.clone(), fast.clone()])
            .expect("both")
            .ttft_s;
        assert_eq!(both, f);
        let e2e = floors_fastest(&w, &[slow, fast.clone()])
            .expect("e2e")
            .e2e_s;
        assert_eq!(e2e, floors_fastest(&w, &[fast]).expect("fast").e2e_s);
        assert!(floors_fastest(&w, &[]).is_err());
    }

    #[test]
    fn block_size_mismatch_is_an_error() {
        let w = Workload {
            requests: vec![req(&[1], 20)],
            block_tokens: 32,
        };
        assert!(floor_per_request(&w, &params()).is_err());
    }
}
