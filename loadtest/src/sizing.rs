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
//!
//! A fleet may mix engine classes ([`FleetShape::from_config`] with a fleet string): the
//! fleet-sized LRU then holds the sum of every engine's own capacity, the floor takes each
//! request's fastest class, and the per-engine figures are given per class.

use serde::Serialize;

use kvgate_sim::model::{preset, EngineParams, ModelGeometry};
use kvgate_sim::{EngineOverrides, FleetConfig};

use crate::offline::{floors_fastest, infinite_cache_hit, lru_cache_hit, Workload};
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
    /// The fleet configuration was refused by the simulator.
    #[error("fleet: {0}")]
    Fleet(String),
    /// A parameter is out of range.
    #[error("invalid sizing parameter: {0}")]
    Parameter(String),
    /// The offline engine model failed.
    #[error("engine model: {0}")]
    Offline(String),
}

/// One class of engines in the fleet being sized.
#[derive(Debug, Clone, Serialize)]
pub struct ShapeClass {
    /// Preset name (model/GPU class).
    pub preset: String,
    /// Engines of this class.
    pub engines: usize,
    /// Engine parameters (capacity, block size, timing).
    pub params: EngineParams,
    /// Model geometry of the preset.
    pub geometry: ModelGeometry,
}

impl ShapeClass {
    /// GPU + CPU capacity of one engine of this class, tokens.
    pub fn engine_tokens(&self) -> u64 {
        engine_blocks(&self.params) * u64::from(self.params.block_size)
    }
}

fn engine_blocks(p: &EngineParams) -> u64 {
    u64::from(p.num_gpu_blocks) + u64::from(p.num_cpu_blocks)
}

/// The fleet being sized: one or several classes of engines, all with one block size.
#[derive(Debug, Clone, Serialize)]
pub struct FleetShape {
    /// Preset name, or the fleet string of a fleet of several classes.
    pub preset: String,
    /// Number of engines.
    pub engines: usize,
    /// The classes, in fleet order.
    pub classes: Vec<ShapeClass>,
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
        Self::from_config(&FleetConfig {
            engines,
            preset: preset_name.to_string(),
            engine: EngineOverrides {
                kv_memory_gib,
                num_gpu_blocks: gpu_blocks,
                num_cpu_blocks: cpu_blocks,
                ..Default::default()
            },
            ..FleetConfig::default()
        })
    }

    /// The fleet a simulator configuration starts (its presets or fleet string, and its
    /// overrides applied to every engine), so sizing sees exactly the engines `compare` runs.
    pub fn from_config(cfg: &FleetConfig) -> Result<Self, SizingError> {
        if cfg.engine_count() == 0 {
            return Err(SizingError::Parameter("engines must be at least 1".into()));
        }
        if cfg.fleet.is_none() && preset(&cfg.preset).is_none() {
            return Err(SizingError::Preset(cfg.preset.clone()));
        }
        if let Some(g) = cfg.engine.kv_memory_gib {
            if !(g.is_finite() && g > 0.0) {
                return Err(SizingError::Parameter("kv memory must be > 0 GiB".into()));
            }
        }
        let engines = cfg
            .per_engine_params()
            .map_err(|e| SizingError::Fleet(e.to_string()))?;
        let mut classes: Vec<ShapeClass> = Vec::new();
        for (name, params) in engines {
            match classes.iter_mut().find(|c| c.preset == name) {
                Some(c) => c.engines += 1,
                None => {
                    let geometry = preset(&name)
                        .map(|p| p.geometry)
                        .ok_or_else(|| SizingError::Preset(name.clone()))?;
                    classes.push(ShapeClass {
                        preset: name,
                        engines: 1,
                        params,
                        geometry,
                    });
                }
            }
        }
        Ok(FleetShape {
            preset: match &cfg.fleet {
                Some(m) if !m.is_uniform() => m.to_string(),
                _ => classes
                    .first()
                    .map(|c| c.preset.clone())
                    .unwrap_or_default(),
            },
            engines: cfg.engine_count(),
            classes,
        })
    }

    /// GPU + CPU capacity of the largest engine, tokens.
    pub fn engine_tokens(&self) -> u64 {
        self.classes
            .iter()
            .map(ShapeClass::engine_tokens)
            .max()
            .unwrap_or(0)
    }

    /// GPU + CPU capacity of the whole fleet, tokens.
    pub fn fleet_tokens(&self) -> u64 {
        self.classes
            .iter()
            .map(|c| c.engine_tokens() * c.engines as u64)
            .sum()
    }

    /// Tokens per block (shared by every class; 0 for an empty fleet, which no constructor
    /// makes).
    pub fn block_size(&self) -> u32 {
        self.classes.first().map_or(0, |c| c.params.block_size)
    }
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
    /// KV memory per engine for the (first class's) preset geometry, GiB.
    pub kv_memory_gib: f64,
    /// Hit ratio of one ideal LRU cache of the whole suggested fleet.
    pub fleet_lru_hit_ratio: f64,
}

/// One engine class's figures in a sizing report.
#[derive(Debug, Clone, Serialize)]
pub struct ClassSizing {
    /// Preset name.
    pub preset: String,
    /// Engines of this class.
    pub engines: usize,
    /// KV bytes per token of its model.
    pub bytes_per_token: u64,
    /// Capacity of one of its engines (GPU + CPU), tokens.
    pub engine_capacity_tokens: u64,
    /// Hit ratio of one ideal LRU cache as large as one of its engines.
    pub engine_lru_hit_ratio: f64,
}

/// Where a fleet stands against a trace.
#[derive(Debug, Clone, Serialize)]
pub struct SizingReport {
    /// The fleet.
    pub fleet: FleetShape,
    /// KV bytes per token of the model (the first class's).
    pub bytes_per_token: u64,
    /// Capacity of one engine (GPU + CPU), tokens; the largest engine's in a mixed fleet.
    pub engine_capacity_tokens: u64,
    /// Capacity of the fleet, tokens: every engine's own capacity, summed.
    pub fleet_capacity_tokens: u64,
    /// Per engine class, in fleet order (one entry for a fleet of one class).
    pub classes: Vec<ClassSizing>,
    /// The trace's working set.
    pub working_set: WorkingSet,
    /// Hit ratio of one infinite cache (tokens) — no router can beat it.
    pub infinite_hit_ratio: f64,
    /// Hit ratio of one ideal LRU cache as large as one engine (the largest).
    pub single_engine_lru_hit_ratio: f64,
    /// Hit ratio of one ideal LRU cache as large as the whole fleet.
    pub fleet_lru_hit_ratio: f64,
    /// No-queue TTFT floor at this speed-up (each request alone on an idle engine of its fastest
    /// class with the best possible hit), when computed.
    pub ttft_floor_s: Option<crate::offline::summary::Dist>,
    /// No-queue end-to-end floor at this speed-up (each request alone on an idle engine of its
    /// fastest class with the best possible hit, its whole output decoded in a batch of one),
    /// when computed.
    pub e2e_floor_s: Option<crate::offline::summary::Dist>,
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
    let bs = fleet.block_size();
    let first = fleet
        .classes
        .first()
        .ok_or_else(|| SizingError::Parameter("the fleet has no engines".into()))?;
    let wl =
        Workload::from_trace(trace, bs, 1.0).map_err(|e| SizingError::Offline(e.to_string()))?;
    let fleet_blocks: u64 = fleet
        .classes
        .iter()
        .map(|c| engine_blocks(&c.params) * c.engines as u64)
        .sum();
    let largest_blocks = fleet
        .classes
        .iter()
        .map(|c| engine_blocks(&c.params))
        .max()
        .unwrap_or(0);
    let lru = |blocks: u64| lru_cache_hit(&wl, blocks as usize).ratio();
    let infinite = infinite_cache_hit(&wl).ratio();
    let ws = working_set(trace);
    // Bisect the per-engine GPU capacity: LRU hit ratio grows with capacity.
    let ws_blocks = (ws.distinct_tokens / u64::from(bs.max(1))).max(1);
    let target = TARGET_OF_BOUND * infinite;
    let n = fleet.engines.max(1) as u64;
    let (mut lo, mut hi) = (1u64, ws_blocks.div_ceil(n).max(1));
    while lo < hi && (hi - lo) * 50 > hi {
        let mid = (lo + hi) / 2;
        if lru(mid * n) >= target {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let gpu_blocks = hi.min(u64::from(u32::MAX)) as u32;
    let floors = if with_floor {
        let params: Vec<EngineParams> = fleet.classes.iter().map(|c| c.params.clone()).collect();
        Some(floors_fastest(&wl, &params).map_err(|e| SizingError::Offline(e.to_string()))?)
    } else {
        None
    };
    let classes = fleet
        .classes
        .iter()
        .map(|c| ClassSizing {
            preset: c.preset.clone(),
            engines: c.engines,
            bytes_per_token: c.geometry.bytes_per_token(),
            engine_capacity_tokens: c.engine_tokens(),
            engine_lru_hit_ratio: lru(engine_blocks(&c.params)),
        })
        .collect();
    Ok(SizingReport {
        bytes_per_token: first.geometry.bytes_per_token(),
        engine_capacity_tokens: fleet.engine_tokens(),
        fleet_capacity_tokens: fleet.fleet_tokens(),
        classes,
        one_engine_holds_working_set: fleet.engine_tokens() >= ws.distinct_tokens,
        working_set: ws,
        infinite_hit_ratio: infinite,
        single_engine_lru_hit_ratio: lru(largest_blocks),
        fleet_lru_hit_ratio: lru(fleet_blocks),
        ttft_floor_s: floors.as_ref().map(|f| f.ttft_s),
        e2e_floor_s: floors.map(|f| f.e2e_s),
        suggestion: Suggestion {
            gpu_blocks,
            gpu_tokens: u64::from(gpu_blocks) * u64::from(bs),
            kv_memory_gib: (u64::from(gpu_blocks)
                * u64::from(bs)
                * first.geometry.bytes_per_token()) as f64
                / GIB,
            fleet_lru_hit_ratio: lru(u64::from(gpu_blocks) * n),
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
        assert_eq!(f.classes[0].geometry.bytes_per_token(), 131_072);
        assert_eq!(
            f.classes[0].params.num_gpu_blocks as u64 * 16,
            (1u64 << 30) / 131_072
        );
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

    /// A mixed fleet counts each engine with its own capacity and floors each request on its
    /// fastest class.
    #[test]
    fn a_mixed_fleet_sizes_each_engine_by_its_class() {
        let t = trace();
        let cfg = |fleet: &str, gpu: Option<u32>| FleetConfig {
            fleet: Some(fleet.parse().expect("fleet")),
            engine: EngineOverrides {
                num_gpu_blocks: gpu,
                num_cpu_blocks: Some(8),
                ..Default::default()
            },
            ..FleetConfig::default()
        };
        let mixed = FleetShape::from_config(&cfg("llama3-8b-h100:2,llama3-8b-a100-40gb:2", None))
            .expect("mixed");
        assert_eq!(mixed.engines, 4);
        assert_eq!(mixed.preset, "llama3-8b-h100:2,llama3-8b-a100-40gb:2");
        assert_eq!(
            mixed.fleet_tokens(),
            2 * (24_576 + 8) * 16 + 2 * (8_192 + 8) * 16
        );
        assert_eq!(mixed.engine_tokens(), (24_576 + 8) * 16);
        let r = size(&t, &mixed, true).expect("size");
        assert_eq!(r.classes.len(), 2);
        assert_eq!(r.classes[1].engine_capacity_tokens, (8_192 + 8) * 16);
        assert_eq!(r.fleet_capacity_tokens, mixed.fleet_tokens());
        // The floor is the H100 class's: the same as a fleet of H100s alone.
        let h100 = FleetShape::from_config(&cfg("llama3-8b-h100:4", None)).expect("h100");
        let a100 = FleetShape::from_config(&cfg("llama3-8b-a100-40gb:4", None)).expect("a100");
        // (TTFT floor, E2E floor) of a fleet.
        let floors = |f: &FleetShape| {
            let r = size(&t, f, true).expect("size");
            (r.ttft_floor_s.expect("floor"), r.e2e_floor_s.expect("e2e"))
        };
        let (h100_ttft, h100_e2e) = floors(&h100);
        let (a100_ttft, a100_e2e) = floors(&a100);
        assert_eq!(r.ttft_floor_s.expect("floor"), h100_ttft);
        assert_eq!(r.e2e_floor_s.expect("e2e floor"), h100_e2e);
        assert!(a100_e2e.mean > h100_e2e.mean);
        assert!(a100_ttft.mean > 2.0 * h100_ttft.mean);
        // Small capacities, different per class: the fleet-sized LRU holds the sum of the
        // engines' own capacities (2 × 200 + 2 × 8 GPU blocks + 4 × 8 CPU blocks).
        let mut small = mixed.clone();
        small.classes[0].params.num_gpu_blocks = 200;
        small.classes[1].params.num_gpu_blocks = 8;
        let s = size(&t, &small, false).expect("size");
        let wl = Workload::from_trace(&t, small.block_size(), 1.0).expect("workload");
        let lru = |blocks: usize| lru_cache_hit(&wl, blocks).ratio();
        assert_eq!(s.fleet_lru_hit_ratio, lru(2 * 208 + 2 * 16));
        assert_ne!(
            lru(2 * 208 + 2 * 16),
            lru(4 * 16),
            "the check must tell the two apart"
        );
        assert_eq!(s.single_engine_lru_hit_ratio, lru(208));
        assert_eq!(s.classes[1].engine_lru_hit_ratio, lru(16));
        let e = FleetShape::from_config(&cfg("llama3-8b-h100:1,tiny-cpu:1", None)).unwrap_err();
        assert!(e.to_string().contains("block size"), "{e}");
    }
}
