//! Step-time model of a continuous-batching engine.
//!
//! One engine step runs a batch made of prefill chunks (new prompt tokens, at most the token
//! budget) and one token for each decoding sequence. Its duration is
//!
//! ```text
//! step = base
//!      + Σ_prefill chunk × prefill_per_token                      (linear layers: ~2·params FLOPs/token)
//!      + Σ_prefill chunk × (ctx_before + chunk/2) × attn_per_token_ctx   (attention over the context)
//!      + n_decode × decode_per_seq                                 (per-sequence decode cost)
//!      + Σ_decode ctx × decode_per_ctx_token                       (reading each sequence's KV)
//!      + cpu_loaded_tokens × cpu_load_per_token                    (CPU-tier hits copied back)
//! ```
//!
//! Only uncached prompt tokens enter a prefill chunk, so a prefix hit saves exactly its share of
//! the linear and attention terms. Sources for the shape: vLLM's scheduler (chunked prefill with a
//! token budget, `max_num_batched_tokens`), the roofline view of LLM inference (prefill is
//! compute-bound, decode is memory-bandwidth-bound: weights read once per step plus each
//! sequence's KV), and DistServe / Splitwise measurements of step time vs batch size. The preset
//! numbers are in [`super::params`].

use serde::{Deserialize, Serialize};

/// Timing coefficients (microseconds unless stated).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimingParams {
    /// Fixed cost of every step (weights read once, launch and scheduling overhead).
    pub step_base_us: f64,
    /// Linear-layer cost per prefill token.
    pub prefill_us_per_token: f64,
    /// Attention cost per prefill token per token of context before it (nanoseconds).
    pub attn_ns_per_token_ctx: f64,
    /// Cost per decoding sequence in the batch.
    pub decode_us_per_seq: f64,
    /// Cost per context token of a decoding sequence (KV read), nanoseconds.
    pub decode_ns_per_ctx_token: f64,
    /// Copying one token's KV from the CPU tier back to the GPU.
    pub cpu_load_us_per_token: f64,
}

impl Default for TimingParams {
    /// The `llama3-8b-h100` class.
    fn default() -> Self {
        TimingParams {
            step_base_us: 9_000.0,
            prefill_us_per_token: 50.0,
            attn_ns_per_token_ctx: 1.6,
            decode_us_per_seq: 100.0,
            decode_ns_per_ctx_token: 65.0,
            cpu_load_us_per_token: 5.0,
        }
    }
}

/// What a step computes, summarised for the cost model.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatchShape {
    /// Σ chunk tokens over prefilling sequences.
    pub prefill_tokens: u64,
    /// Σ chunk × (ctx_before + chunk / 2): attention work of the prefill chunks.
    pub prefill_ctx_work: f64,
    /// Decoding sequences in the batch.
    pub decode_seqs: u64,
    /// Σ context length over decoding sequences.
    pub decode_ctx_tokens: u64,
    /// Tokens loaded from the CPU tier in this step.
    pub cpu_loaded_tokens: u64,
}

impl BatchShape {
    /// Adds one prefill chunk of `chunk` tokens starting after `ctx_before` tokens of context.
    pub fn add_prefill(&mut self, ctx_before: u32, chunk: u32) {
        self.prefill_tokens += u64::from(chunk);
        self.prefill_ctx_work +=
            f64::from(chunk) * (f64::from(ctx_before) + f64::from(chunk) / 2.0);
    }

    /// Adds one decoding sequence with `ctx` tokens of context.
    pub fn add_decode(&mut self, ctx: u32) {
        self.decode_seqs += 1;
        self.decode_ctx_tokens += u64::from(ctx);
    }

    /// Whether the step does nothing.
    pub fn is_empty(&self) -> bool {
        self.prefill_tokens == 0 && self.decode_seqs == 0 && self.cpu_loaded_tokens == 0
    }
}

impl TimingParams {
    /// Duration of a step computing `b`, in microseconds (at least 1).
    pub fn step_us(&self, b: &BatchShape) -> u64 {
        let us = self.step_base_us
            + b.prefill_tokens as f64 * self.prefill_us_per_token
            + b.prefill_ctx_work * self.attn_ns_per_token_ctx / 1_000.0
            + b.decode_seqs as f64 * self.decode_us_per_seq
            + b.decode_ctx_tokens as f64 * self.decode_ns_per_ctx_token / 1_000.0
            + b.cpu_loaded_tokens as f64 * self.cpu_load_us_per_token;
        if us.is_finite() && us >= 1.0 {
            us.round() as u64
        } else {
            1
        }
    }

    /// Checks every coefficient is finite and non-negative.
    pub fn validate(&self) -> Result<(), String> {
        let all = [
            ("step_base_us", self.step_base_us),
            ("prefill_us_per_token", self.prefill_us_per_token),
            ("attn_ns_per_token_ctx", self.attn_ns_per_token_ctx),
            ("decode_us_per_seq", self.decode_us_per_seq),
            ("decode_ns_per_ctx_token", self.decode_ns_per_ctx_token),
            ("cpu_load_us_per_token", self.cpu_load_us_per_token),
        ];
        for (name, v) in all {
            if !v.is_finite() || v < 0.0 {
                return Err(format!("timing.{name} must be finite and >= 0, got {v}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_of_the_default_class() {
        let t = TimingParams::default();
        // Decode at batch 1 with 1k context: ~10 ms.
        let mut b = BatchShape::default();
        b.add_decode(1024);
        let one = t.step_us(&b);
        assert!((9_000..11_000).contains(&one), "{one}");
        // Decode at batch 128 with 1k context each: ~30 ms.
        let mut b = BatchShape::default();
        for _ in 0..128 {
            b.add_decode(1024);
        }
        let many = t.step_us(&b);
        assert!((25_000..35_000).contains(&many), "{many}");
        // A full 8192-token prefill chunk from an empty context: ~20k tokens/s.
        let mut b = BatchShape::default();
        b.add_prefill(0, 8192);
        let rate = 8192.0 / (t.step_us(&b) as f64 / 1e6);
        assert!((15_000.0..22_000.0).contains(&rate), "{rate}");
    }

    #[test]
    fn attention_grows_with_context() {
        let t = TimingParams::default();
        let mut short = BatchShape::default();
        short.add_prefill(0, 1000);
        let mut long = BatchShape::default();
        long.add_prefill(30_000, 1000);
        assert!(t.step_us(&long) > t.step_us(&short));
    }
}
