//! Fleet sizing: how much KV cache the engines have versus how much the trace needs.
//!
//! Capacity comes from model geometry and memory, as in the simulator:
//! `bytes_per_token = 2 × layers × kv_heads × head_dim × dtype_bytes`. The working set is the
//! trace's distinct blocks. Caching matters when one engine cannot hold the working set but the
//! fleet holds much of it; [`size`] reports where a configuration stands and suggests a per-engine
//! capacity where one fleet-sized ideal LRU cache reaches [`TARGET_OF_BOUND`] of the
//! infinite-cache bound. It also computes the references every comparison is judged against: the
//! fleet-sized LRU hit ratio, the infinite-cache bound and (via the offline engine model) the
//! no-queue TTFT floor.

use serde::Serialize;

use kvgate_sim::model::{preset, EngineParams, ModelGeometry};

use crate::offline::{infinite_cache_hit, lru_cache_hit, ttft_floor, Workload};
use crate::trace::Trace;

/// Fraction of the infinite-cache bound the suggested fleet should reach with one ideal LRU.
pub const TARGET_OF_BOUND: f64 = 0.9;
const GIB: f64 = (1u64 << 30) as f64;

/// Why sizing failed.
#[derive(Debug, thiserror::Error)]
pub enum SizingError {
    /// Unknown preset.
    #[error("unknown preset {0:?}; known: {known}", known = kvgate_sim::model::PRESET_NAMES.join(", "))]
    Preset(String),
    /// A parameter is out of range.
    #[error("invalid sizing parameter: {0}")]
    Parameter(String),
    /// The offline engine model failed.
    #[error("engine model: {0}")]
    Offline(String),
}

/// The fleet being sized.
#[derive(Debug, Clone, Serialize)]
pub struct FleetShape {
    /// Preset name (model/GPU class).
    pub preset: String,
    /// Number of engines.
    pub engines: usize,
    /// Engine parameters (capacity, block size, timing).
    pub params: EngineParams,
    /// Model geometry of the preset.
    pub geometry: ModelGeometry,
}

impl FleetShape {
    /// A fleet of `engines` engines of `preset`, optionally with `kv_memory_gib` of GPU KV memory
    /// (or `gpu_blocks` directly) and `cpu_blocks` of offload per engine.
    pub fn new(
        preset_name: &str,
        engines: usize,
        kv_memory_gib: Option<f64>,
        gpu_blocks: Option<u32>,
        cpu_blocks: Option<u32>,
    ) -> Result<Self, SizingError> {
        let p = preset(preset_name).ok_or_else(|| SizingError::Preset(preset_name.into()))?;
        if engines == 0 {
            return Err(SizingError::Parameter("engines must be at least 1".into()));
        }
        let mut params = p.params();
        if let Some(g) = kv_memory_gib {
            if !(g.is_finite() && g > 0.0) {
                return Err(SizingError::Parameter("kv memory must be > 0 GiB".into()));
            }
            params.num_gpu_blocks = blocks_for(&p.geometry, g, params.block_size);
        }
        if let Some(b) = gpu_blocks {
            params.num_gpu_blocks = b;
        }
        if let Some(c) = cpu_blocks {
            params.num_cpu_blocks = c;
        }
        Ok(FleetShape {
            preset: preset_name.to_string(),
            engines,
            params,
            geometry: p.geometry,
        })
    }

    /// GPU + CPU capacity of one engine, tokens.
    pub fn engine_tokens(&self) -> u64 {
        (u64::from(self.params.num_gpu_blocks) + u64::from(self.params.num_cpu_blocks))
            * u64::from(self.params.block_size)
    }
}

fn blocks_for(g: &ModelGeometry, gib: f64, block_size: u32) -> u32 {
    g.capacity_blocks((gib * GIB) as u64, block_size)
        .min(u64::from(u32::MAX)) as u32
}

/// Distinct data a trace touches and how soon it comes back.
#[derive(Debug, Clone, Serialize)]
pub struct WorkingSet {
    /// Distinct trace blocks.
    pub distinct_blocks: usize,
    /// Distinct blocks × block size, tokens.
    pub distinct_tokens: u64,
    /// Median time between consecutive uses of a block, seconds (trace time).
    pub median_reuse_s: Option<f64>,
}

/// Working set of a trace.
pub fn working_set(trace: &Trace) -> WorkingSet {
    let mut last: ahash::AHashMap<u64, u64> = ahash::AHashMap::new();
    let mut gaps: Vec<u64> = Vec::new();
    for r in &trace.requests {
        for &id in &r.hash_ids {
            if let Some(prev) = last.insert(id, r.timestamp_ms) {
                gaps.push(r.timestamp_ms - prev);
            }
        }
    }
    gaps.sort_unstable();
    WorkingSet {
        distinct_blocks: last.len(),
        distinct_tokens: last.len() as u64 * u64::from(trace.block_tokens),
        median_reuse_s: gaps.get(gaps.len() / 2).map(|&ms| ms as f64 / 1000.0),
    }
}

/// A suggested per-engine capacity.
#[derive(Debug, Clone, Serialize)]
pub struct Suggestion {
    /// GPU KV blocks per engine.
    pub gpu_blocks: u32,
    /// The same in tokens.
    pub gpu_tokens: u64,
    /// KV memory per engine for the preset's geometry, GiB.
    pub kv_memory_gib: f64,
    /// Hit ratio of one ideal LRU cache of the whole suggested fleet.
    pub fleet_lru_hit_ratio: f64,
}

/// Where a fleet stands against a trace.
#[derive(Debug, Clone, Serialize)]
pub struct SizingReport {
    /// The fleet.
    pub fleet: FleetShape,
    /// KV bytes per token of the model.
    pub bytes_per_token: u64,
    /// Capacity of one engine (GPU + CPU), tokens.
    pub engine_capacity_tokens: u64,
    /// Capacity of the fleet, tokens.
    pub fleet_capacity_tokens: u64,
    /// The trace's working set.
    pub working_set: WorkingSet,
    /// Hit ratio of one infinite cache (tokens) — no router can beat it.
    pub infinite_hit_ratio: f64,
    /// Hit ratio of one ideal LRU cache as large as one engine.
    pub single_engine_lru_hit_ratio: f64,
    /// Hit ratio of one ideal LRU cache as large as the whole fleet.
    pub fleet_lru_hit_ratio: f64,
    /// No-queue TTFT floor at this speed-up (each request alone on an idle engine with the best
    /// possible hit), when computed.
    pub ttft_floor_s: Option<crate::offline::summary::Dist>,
    /// Does one engine hold the working set? (Then caching hardly matters for routing.)
    pub one_engine_holds_working_set: bool,
    /// Suggested capacity for this engine count.
    pub suggestion: Suggestion,
}

/// Sizes `fleet` against `trace` (computing the TTFT floor when `with_floor`).
pub fn size(
    trace: &Trace,
    fleet: &FleetShape,
    with_floor: bool,
) -> Result<SizingReport, SizingError> {
    let bs = fleet.params.block_size;
    let wl =
        Workload::from_trace(trace, bs, 1.0).map_err(|e| SizingError::Offline(e.to_string()))?;
    let engine_blocks = fleet.params.num_gpu_blocks as usize + fleet.params.num_cpu_blocks as usize;
    let lru = |blocks: usize| lru_cache_hit(&wl, blocks).ratio();
    let infinite = infinite_cache_hit(&wl).ratio();
    let ws = working_set(trace);
    // Bisect the per-engine GPU capacity: LRU hit ratio grows with capacity.
    let ws_blocks = (ws.distinct_tokens / u64::from(bs.max(1))).max(1);
    let target = TARGET_OF_BOUND * infinite;
    let (mut lo, mut hi) = (1u64, ws_blocks.div_ceil(fleet.engines as u64).max(1));
    while lo < hi && (hi - lo) * 50 > hi {
        let mid = (lo + hi) / 2;
        if lru(mid as usize * fleet.engines) >= target {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let gpu_blocks = hi.min(u64::from(u32::MAX)) as u32;
    let floor = if with_floor {
        Some(ttft_floor(&wl, &fleet.params).map_err(|e| SizingError::Offline(e.to_string()))?)
    } else {
        None
    };
    Ok(SizingReport {
        bytes_per_token: fleet.geometry.bytes_per_token(),
        engine_capacity_tokens: fleet.engine_tokens(),
        fleet_capacity_tokens: fleet.engine_tokens() * fleet.engines as u64,
        one_engine_holds_working_set: fleet.engine_tokens() >= ws.distinct_tokens,
        working_set: ws,
        infinite_hit_ratio: infinite,
        single_engine_lru_hit_ratio: lru(engine_blocks),
        fleet_lru_hit_ratio: lru(engine_blocks * fleet.engines),
        ttft_floor_s: floor,
        suggestion: Suggestion {
            gpu_blocks,
            gpu_tokens: u64::from(gpu_blocks) * u64::from(bs),
            kv_memory_gib: (u64::from(gpu_blocks)
                * u64::from(bs)
                * fleet.geometry.bytes_per_token()) as f64
                / GIB,
            fleet_lru_hit_ratio: lru(gpu_blocks as usize * fleet.engines),
        },
        fleet: fleet.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceRequest;

    fn trace() -> Trace {
        // 40 requests over 8 shared 4-block prefixes, each with a unique tail block.
        let reqs = (0..40u64)
            .map(|i| {
                let p = i % 8;
                TraceRequest {
                    timestamp_ms: i * 100,
                    input_length: 5 * 64,
                    output_length: 4,
                    hash_ids: vec![p * 10, p * 10 + 1, p * 10 + 2, p * 10 + 3, 1000 + i],
                }
            })
            .collect();
        Trace::from_requests(reqs, 64).unwrap()
    }

    #[test]
    fn bytes_per_token_and_capacity() {
        let f = FleetShape::new("llama3-8b-h100", 4, Some(1.0), None, None).unwrap();
        // 2 × 32 layers × 8 heads × 128 × 2 bytes = 128 KiB per token.
        assert_eq!(f.geometry.bytes_per_token(), 131_072);
        assert_eq!(f.params.num_gpu_blocks as u64 * 16, (1u64 << 30) / 131_072);
        assert!(FleetShape::new("nope", 4, None, None, None).is_err());
        assert!(FleetShape::new("llama3-8b-h100", 0, None, None, None).is_err());
    }

    #[test]
    fn working_set_and_bounds() {
        let t = trace();
        let ws = working_set(&t);
        assert_eq!(ws.distinct_blocks, 8 * 4 + 40);
        assert_eq!(ws.median_reuse_s, Some(0.8));
        let f = FleetShape::new("llama3-8b-h100", 4, None, Some(40), Some(0)).unwrap();
        let r = size(&t, &f, false).unwrap();
        // 32 of 40 requests reuse their 4-block prefix: 32 × 256 of 40 × 320 tokens.
        assert!(
            (r.infinite_hit_ratio - 0.64).abs() < 1e-9,
            "{}",
            r.infinite_hit_ratio
        );
        assert!(r.single_engine_lru_hit_ratio <= r.fleet_lru_hit_ratio);
        assert!(r.fleet_lru_hit_ratio <= r.infinite_hit_ratio + 1e-12);
        assert!(r.suggestion.fleet_lru_hit_ratio >= TARGET_OF_BOUND * r.infinite_hit_ratio - 0.05);
        assert!(!r.one_engine_holds_working_set);
    }
}
