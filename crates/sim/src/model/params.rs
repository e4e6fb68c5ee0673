//! Engine parameters, KV capacity from model geometry, and presets for model/GPU classes.
//!
//! Capacity: `bytes_per_token = 2 (K and V) × layers × kv_heads × head_dim × dtype_bytes`,
//! `capacity_blocks = kv_memory_bytes / (bytes_per_token × block_size)`.
//!
//! Preset derivations (all figures bf16; "KV memory" = GPU memory × 0.9 utilisation − weights −
//! ~5 % activations/graphs, rounded down):
//!
//! | preset | geometry (layers, kv heads, head dim) | B/token | KV memory | prefill | decode b=1 → b=128 (1k ctx) |
//! |---|---|---:|---:|---:|---:|
//! | `llama3-8b-h100` | 32, 8, 128 | 128 KiB | 48 GiB (80 GB − 16 GB weights) | ~17–20k tok/s | 9.2 → 30 ms |
//! | `llama3-8b-a100-40gb` | 32, 8, 128 | 128 KiB | 16 GiB (40 GB − 16 GB weights) | ~5.5k tok/s | 15 → 73 ms |
//! | `qwen-32b-h200` | 64, 8, 128 | 256 KiB | 52 GiB (141 GB − 65 GB weights) | ~6k tok/s | 15 → 42 ms |
//! | `llama3-70b-4xh100` | 80, 8, 128 (TP 4) | 320 KiB | 128 GiB (4 × 80 GB − 141 GB) | ~8k tok/s | 15 → 38 ms |
//! | `tiny-cpu` | 2, 2, 64 | 1 KiB | 48 blocks × 32 tokens, given directly | estimate | 2.0 → 4.7 ms at b=16 |
//!
//! Sources: prefill ≈ 2 × params FLOPs per token at ~30 % MFU of an H100's 989 dense bf16
//! TFLOP/s (≈ 20k tok/s for 8B, the figure vLLM and SGLang benchmarks report for 8B-class
//! models); decode at batch 1 is bound by reading the weights once (16 GB / 3.35 TB/s ≈ 5 ms,
//! ~9–10 ms measured with overheads), growing ~0.1–0.15 ms per sequence plus the KV read
//! (bytes/token ÷ HBM bandwidth); `tiny-cpu` matches vLLM 0.32 for CPU on the 2-layer test model
//! (~480 tok/s on one stream, ~3.4k tok/s at 16 streams).
//!
//! `llama3-8b-a100-40gb` is the same model on the previous generation, a slower class to mix with
//! `llama3-8b-h100` in one fleet. A100 40GB SXM: 312 dense bf16 TFLOP/s (0.315× the H100's 989),
//! 1.555 TB/s of HBM2 (0.464× 3.35 TB/s), PCIe Gen4 (half Gen5's bandwidth). Each coefficient of
//! the H100 class is scaled by the ratio of the resource it stands for: the compute-bound terms
//! (prefill per token, prefill attention, the per-sequence decode cost) by 989/312 = 3.17 at the
//! same ~30 % MFU; the weight read of a step's fixed cost by bandwidth (16 GB / 1.555 TB/s =
//! 10.3 ms, plus the H100 class's ~4.2 ms of launch, scheduling and sampling overhead = 14.5 ms);
//! the KV read per context token by bandwidth (65 ns × 3.35/1.555 = 140 ns); the CPU-tier copy by
//! PCIe (5 → 10 µs per token). KV memory by the same rule as above: 40 GB × 0.9 − 16 GB weights −
//! ~2 GB = 18 GB, rounded down to 16 GiB = 8,192 blocks of 16 (131,072 tokens: one longest
//! prompt fills it). Prefill comes out ~3.1× slower than the H100 class and decode at batch 1
//! ~1.6×, at batch 128 ~2.4× — within the 2–3× that published vLLM comparisons of the two GPUs
//! report for 8B models in bf16. A100 kernels often reach a higher MFU than H100 ones; at ~40 %
//! prefill would be ~2.4× slower (`timing.prefill_us_per_token` ≈ 120).

use serde::{Deserialize, Serialize};

use super::timing::TimingParams;
use crate::error::SimError;

/// Transformer KV geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelGeometry {
    /// Transformer layers.
    pub layers: u32,
    /// KV heads (after GQA).
    pub kv_heads: u32,
    /// Dimension of one head.
    pub head_dim: u32,
    /// Bytes per KV element (2 for bf16/fp16, 1 for fp8).
    pub dtype_bytes: u32,
}

impl ModelGeometry {
    /// `2 × layers × kv_heads × head_dim × dtype_bytes`.
    pub fn bytes_per_token(&self) -> u64 {
        2 * u64::from(self.layers)
            * u64::from(self.kv_heads)
            * u64::from(self.head_dim)
            * u64::from(self.dtype_bytes)
    }

    /// Blocks of `block_size` tokens fitting in `kv_memory_bytes`.
    pub fn capacity_blocks(&self, kv_memory_bytes: u64, block_size: u32) -> u64 {
        let per_block = self.bytes_per_token() * u64::from(block_size.max(1));
        kv_memory_bytes.checked_div(per_block).unwrap_or(0)
    }
}

/// Everything the engine model needs. Derived from a preset; every field can be overridden.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineParams {
    /// Tokens per KV block.
    pub block_size: u32,
    /// GPU KV blocks.
    pub num_gpu_blocks: u32,
    /// CPU offload blocks (0 = no offload tier).
    pub num_cpu_blocks: u32,
    /// Maximum running sequences (vLLM `max_num_seqs`).
    pub max_num_seqs: u32,
    /// Token budget of one step (vLLM `max_num_batched_tokens`, chunked prefill).
    pub max_num_batched_tokens: u32,
    /// Longest prompt + output accepted.
    pub max_model_len: u32,
    /// Waiting-queue bound; submissions beyond it are rejected.
    pub max_waiting: u32,
    /// KV event buffer bound (events beyond it drop the oldest).
    pub max_kv_events: u32,
    /// Step-time coefficients.
    pub timing: TimingParams,
}

impl Default for EngineParams {
    /// The `llama3-8b-h100` preset.
    fn default() -> Self {
        llama3_8b_h100().params()
    }
}

impl EngineParams {
    /// Parameters of the named preset.
    pub fn from_preset(name: &str) -> Result<Self, SimError> {
        preset(name).map(|p| p.params()).ok_or_else(|| {
            SimError::Config(format!(
                "unknown preset {name:?}; known: {}",
                PRESET_NAMES.join(", ")
            ))
        })
    }

    /// Rejects values the model cannot run with.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |m: &str| Err(SimError::Config(m.to_string()));
        if self.block_size == 0 || self.block_size > 4096 {
            return bad("block_size must be in 1..=4096");
        }
        if self.num_gpu_blocks == 0 || self.num_gpu_blocks > 50_000_000 {
            return bad("num_gpu_blocks must be in 1..=50000000");
        }
        if self.num_cpu_blocks > 200_000_000 {
            return bad("num_cpu_blocks must be <= 200000000");
        }
        if self.max_num_seqs == 0 || self.max_num_batched_tokens == 0 {
            return bad("max_num_seqs and max_num_batched_tokens must be > 0");
        }
        if self.max_model_len == 0 || self.max_waiting == 0 || self.max_kv_events == 0 {
            return bad("max_model_len, max_waiting and max_kv_events must be > 0");
        }
        self.timing.validate().map_err(SimError::Config)
    }
}

/// A model/GPU class.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Preset {
    /// Preset name.
    pub name: &'static str,
    /// What it stands for.
    pub description: &'static str,
    /// KV geometry.
    pub geometry: ModelGeometry,
    /// Memory for the KV cache, bytes.
    pub kv_memory_bytes: u64,
    /// Default block size.
    pub block_size: u32,
    /// Blocks given directly instead of derived (a test model with a forced cache size).
    pub num_gpu_blocks_override: Option<u32>,
    /// `max_num_seqs`.
    pub max_num_seqs: u32,
    /// `max_num_batched_tokens`.
    pub max_num_batched_tokens: u32,
    /// `max_model_len`.
    pub max_model_len: u32,
    /// Timing coefficients.
    pub timing: TimingParams,
}

impl Preset {
    /// Engine parameters of this class.
    pub fn params(&self) -> EngineParams {
        let blocks = self
            .num_gpu_blocks_override
            .map(u64::from)
            .unwrap_or_else(|| {
                self.geometry
                    .capacity_blocks(self.kv_memory_bytes, self.block_size)
            });
        EngineParams {
            block_size: self.block_size,
            num_gpu_blocks: blocks.min(u64::from(u32::MAX)) as u32,
            num_cpu_blocks: 0,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_model_len: self.max_model_len,
            max_waiting: 4096,
            max_kv_events: 65_536,
            timing: self.timing.clone(),
        }
    }
}

const GIB: u64 = 1 << 30;

/// Names of the built-in presets.
pub const PRESET_NAMES: [&str; 5] = [
    "llama3-8b-h100",
    "llama3-8b-a100-40gb",
    "qwen-32b-h200",
    "llama3-70b-4xh100",
    "tiny-cpu",
];

fn llama3_8b_h100() -> Preset {
    Preset {
        name: "llama3-8b-h100",
        description: "Llama-3-8B class, bf16, one H100 80GB",
        geometry: ModelGeometry {
            layers: 32,
            kv_heads: 8,
            head_dim: 128,
            dtype_bytes: 2,
        },
        kv_memory_bytes: 48 * GIB,
        block_size: 16,
        num_gpu_blocks_override: None,
        max_num_seqs: 256,
        max_num_batched_tokens: 8192,
        max_model_len: 131_072,
        timing: TimingParams::default(),
    }
}

/// The named preset, if it exists.
pub fn preset(name: &str) -> Option<Preset> {
    match name {
        "llama3-8b-h100" => Some(llama3_8b_h100()),
        "llama3-8b-a100-40gb" => Some(Preset {
            name: "llama3-8b-a100-40gb",
            description: "Llama-3-8B class, bf16, one A100 40GB SXM (the H100 class's slower peer)",
            kv_memory_bytes: 16 * GIB,
            timing: TimingParams {
                step_base_us: 14_500.0,
                prefill_us_per_token: 158.0,
                attn_ns_per_token_ctx: 5.0,
                decode_us_per_seq: 317.0,
                decode_ns_per_ctx_token: 140.0,
                cpu_load_us_per_token: 10.0,
            },
            ..llama3_8b_h100()
        }),
        "qwen-32b-h200" => Some(Preset {
            name: "qwen-32b-h200",
            description: "Qwen2.5-32B class, bf16, one H200 141GB",
            geometry: ModelGeometry {
                layers: 64,
                kv_heads: 8,
                head_dim: 128,
                dtype_bytes: 2,
            },
            kv_memory_bytes: 52 * GIB,
            block_size: 16,
            num_gpu_blocks_override: None,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            max_model_len: 131_072,
            timing: TimingParams {
                step_base_us: 15_000.0,
                prefill_us_per_token: 160.0,
                attn_ns_per_token_ctx: 4.0,
                decode_us_per_seq: 150.0,
                decode_ns_per_ctx_token: 60.0,
                cpu_load_us_per_token: 10.0,
            },
        }),
        "llama3-70b-4xh100" => Some(Preset {
            name: "llama3-70b-4xh100",
            description: "Llama-3-70B class, bf16, tensor-parallel over 4 H100 80GB",
            geometry: ModelGeometry {
                layers: 80,
                kv_heads: 8,
                head_dim: 128,
                dtype_bytes: 2,
            },
            kv_memory_bytes: 128 * GIB,
            block_size: 16,
            num_gpu_blocks_override: None,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            max_model_len: 131_072,
            timing: TimingParams {
                step_base_us: 15_000.0,
                prefill_us_per_token: 120.0,
                attn_ns_per_token_ctx: 2.0,
                decode_us_per_seq: 150.0,
                decode_ns_per_ctx_token: 25.0,
                cpu_load_us_per_token: 12.0,
            },
        }),
        "tiny-cpu" => Some(Preset {
            name: "tiny-cpu",
            description: "vLLM 0.32 for CPU serving a 2-layer test Llama (block 32, 48 blocks)",
            geometry: ModelGeometry {
                layers: 2,
                kv_heads: 2,
                head_dim: 64,
                dtype_bytes: 2,
            },
            kv_memory_bytes: 48 * 32 * 1024,
            block_size: 32,
            num_gpu_blocks_override: Some(48),
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            max_model_len: 1024,
            timing: TimingParams {
                step_base_us: 1_800.0,
                prefill_us_per_token: 20.0,
                attn_ns_per_token_ctx: 0.05,
                decode_us_per_seq: 180.0,
                decode_ns_per_ctx_token: 1.0,
                cpu_load_us_per_token: 0.5,
            },
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_from_geometry() {
        let g = ModelGeometry {
            layers: 32,
            kv_heads: 8,
            head_dim: 128,
            dtype_bytes: 2,
        };
        assert_eq!(g.bytes_per_token(), 131_072);
        assert_eq!(g.capacity_blocks(48 * GIB, 16), 24_576);
        assert_eq!(EngineParams::default().num_gpu_blocks, 24_576);
        let q = EngineParams::from_preset("qwen-32b-h200").unwrap();
        assert_eq!(q.num_gpu_blocks, 13_312);
        let a = EngineParams::from_preset("llama3-8b-a100-40gb").unwrap();
        assert_eq!(a.num_gpu_blocks, 8_192);
        assert_eq!(
            (a.block_size, a.max_model_len),
            (
                EngineParams::default().block_size,
                EngineParams::default().max_model_len
            )
        );
        assert_eq!(
            EngineParams::from_preset("tiny-cpu")
                .unwrap()
                .num_gpu_blocks,
            48
        );
        assert!(EngineParams::from_preset("nope").is_err());
        for name in PRESET_NAMES {
            EngineParams::from_preset(name).unwrap().validate().unwrap();
        }
    }

    /// The A100 class against the H100 class on the calibration shapes of `timing.rs`: its
    /// ratios are those of the two GPUs' compute and bandwidth.
    #[test]
    fn the_a100_class_is_slower_by_the_hardware_ratios() {
        use crate::model::timing::BatchShape;
        let h = EngineParams::from_preset("llama3-8b-h100").unwrap().timing;
        let a = EngineParams::from_preset("llama3-8b-a100-40gb")
            .unwrap()
            .timing;
        let prefill = |t: &TimingParams| {
            let mut b = BatchShape::default();
            b.add_prefill(0, 8192);
            8192.0 / (t.step_us(&b) as f64 / 1e6)
        };
        let decode = |t: &TimingParams, n: usize| {
            let mut b = BatchShape::default();
            for _ in 0..n {
                b.add_decode(1024);
            }
            t.step_us(&b) as f64 / 1e3
        };
        let rate = prefill(&a);
        assert!((4_500.0..7_000.0).contains(&rate), "{rate}");
        let slower = prefill(&h) / rate;
        assert!((2.8..3.5).contains(&slower), "{slower}");
        let (one, many) = (decode(&a, 1), decode(&a, 128));
        assert!((13.0..17.0).contains(&one), "{one} ms");
        assert!((60.0..85.0).contains(&many), "{many} ms");
        let ratio_one = one / decode(&h, 1);
        let ratio_many = many / decode(&h, 128);
        assert!((1.4..1.8).contains(&ratio_one), "{ratio_one}");
        assert!((2.0..3.0).contains(&ratio_many), "{ratio_many}");
    }

    #[test]
    fn params_reject_unknown_fields() {
        let r: Result<EngineParams, _> = serde_json::from_str(r#"{"block_size": 16, "bogus": 1}"#);
        assert!(r.is_err());
        let p: EngineParams = serde_json::from_str(r#"{"block_size": 32}"#).unwrap();
        assert_eq!(p.block_size, 32);
    }
}
