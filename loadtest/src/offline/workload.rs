//! A trace turned into what the simulator replays: arrivals in virtual microseconds and each
//! prompt's chain of engine block hashes.
//!
//! Invariants:
//! - Engine block `j` covers prompt tokens `[j·b, (j+1)·b)` (`b` = engine block size); only blocks
//!   the prompt fills completely exist, as in the engines.
//! - A block's hash chains its parent with the trace ids of the trace blocks it overlaps and its
//!   offset inside the first of them, using kvgate's own block hash ([`kvgate_core::hash`]). Two
//!   requests therefore get identical chains exactly as far as their trace ids agree, and the
//!   gateway-side hashes equal the engine-side ones (token mode).
//! - Requests are in arrival order; ties keep trace order.

use kvgate_core::hash::{hash_token_blocks, namespace_root, Namespace};
use kvgate_core::BlockHash;

use crate::trace::Trace;

use super::OfflineError;

/// Model name mixed into the chain root: the namespace every simulated request shares.
pub const SIM_MODEL: &str = "kvgate-sim";

/// One request as the simulator replays it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfflineRequest {
    /// Arrival in virtual microseconds since the start of the run (after speed-up).
    pub arrival_us: u64,
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// Tokens to generate (at least 1: a request always has a first token).
    pub output_tokens: u32,
    /// Engine block hashes of the prompt's full blocks.
    pub blocks: Vec<BlockHash>,
}

/// A whole replayable workload.
#[derive(Clone, Debug, Default)]
pub struct Workload {
    /// Requests in arrival order.
    pub requests: Vec<OfflineRequest>,
    /// Engine block size in tokens the chains were cut with.
    pub block_tokens: u32,
}

impl Workload {
    /// Builds a workload from a trace: timestamps divided by `speed_up`, prompts cut into
    /// `engine_block_tokens`-token blocks.
    pub fn from_trace(
        trace: &Trace,
        engine_block_tokens: u32,
        speed_up: f64,
    ) -> Result<Self, OfflineError> {
        if engine_block_tokens == 0 || trace.block_tokens == 0 {
            return Err(OfflineError::Param(
                "block sizes must be at least 1 token".into(),
            ));
        }
        if !(speed_up.is_finite() && speed_up > 0.0) {
            return Err(OfflineError::Param(format!(
                "speed-up must be a positive number, got {speed_up}"
            )));
        }
        let root = namespace_root(&Namespace {
            model: SIM_MODEL,
            lora: None,
            cache_salt: None,
        });
        let mut requests = Vec::with_capacity(trace.requests.len());
        for (i, r) in trace.requests.iter().enumerate() {
            let blocks = engine_chain(
                root,
                &r.hash_ids,
                trace.block_tokens,
                r.input_length,
                engine_block_tokens,
            )
            .map_err(|msg| OfflineError::Param(format!("trace request {i}: {msg}")))?;
            requests.push(OfflineRequest {
                arrival_us: (r.timestamp_ms as f64 * 1000.0 / speed_up).round() as u64,
                prompt_tokens: r.input_length,
                output_tokens: r.output_length.max(1),
                blocks,
            });
        }
        // The trace is sorted already; keep the invariant even for hand-built traces.
        requests.sort_by_key(|r| r.arrival_us);
        Ok(Self {
            requests,
            block_tokens: engine_block_tokens,
        })
    }

    /// The same workload with arrivals compressed by `factor` (> 1 means faster).
    pub fn rescaled(&self, factor: f64) -> Result<Self, OfflineError> {
        if !(factor.is_finite() && factor > 0.0) {
            return Err(OfflineError::Param(format!(
                "speed-up must be a positive number, got {factor}"
            )));
        }
        let mut out = self.clone();
        for r in &mut out.requests {
            r.arrival_us = (r.arrival_us as f64 / factor).round() as u64;
        }
        Ok(out)
    }

    /// Span from the first to the last arrival, in microseconds.
    pub fn span_us(&self) -> u64 {
        match (self.requests.first(), self.requests.last()) {
            (Some(a), Some(b)) => b.arrival_us - a.arrival_us,
            _ => 0,
        }
    }

    /// Total prompt tokens.
    pub fn prompt_tokens(&self) -> u64 {
        self.requests
            .iter()
            .map(|r| u64::from(r.prompt_tokens))
            .sum()
    }
}

/// The engine block chain of one prompt described by trace ids.
///
/// Fails when the ids do not cover the prompt (fewer than `ceil(input / trace_block)` ids).
pub fn engine_chain(
    root: BlockHash,
    hash_ids: &[u64],
    trace_block_tokens: u32,
    input_tokens: u32,
    engine_block_tokens: u32,
) -> Result<Vec<BlockHash>, String> {
    let tb = u64::from(trace_block_tokens);
    let eb = u64::from(engine_block_tokens);
    let needed = u64::from(input_tokens).div_ceil(tb);
    if (hash_ids.len() as u64) < needed {
        return Err(format!(
            "{} ids cannot cover {input_tokens} tokens in {trace_block_tokens}-token blocks",
            hash_ids.len()
        ));
    }
    let n = u64::from(input_tokens) / eb;
    let mut out = Vec::with_capacity(n as usize);
    // Hash input of one block: the ids it overlaps (lo, hi halves) and its offset in the first.
    let mut words: Vec<u32> = Vec::with_capacity(8);
    let mut parent = root;
    for j in 0..n {
        let start = j * eb;
        let end = start + eb - 1;
        words.clear();
        for t in start / tb..=end / tb {
            let id = hash_ids[t as usize];
            words.push(id as u32);
            words.push((id >> 32) as u32);
        }
        words.push((start % tb) as u32);
        let before = out.len();
        hash_token_blocks(parent, &words, words.len(), &mut out);
        // hash_token_blocks appends exactly one hash for a block of words.len() words.
        match out.get(before) {
            Some(&h) => parent = h,
            None => return Err("internal: block hash not produced".into()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceRequest;

    fn req(ts: u64, input: u32, ids: Vec<u64>) -> TraceRequest {
        TraceRequest {
            timestamp_ms: ts,
            input_length: input,
            output_length: 10,
            hash_ids: ids,
        }
    }

    #[test]
    fn chains_share_exactly_the_common_trace_prefix() {
        let trace = Trace {
            requests: vec![
                req(0, 1024, vec![1, 2]),
                req(10, 1500, vec![1, 2, 3]),
                req(20, 1024, vec![1, 9]),
            ],
            block_tokens: 512,
        };
        let w = Workload::from_trace(&trace, 16, 1.0).expect("workload");
        let [a, b, c] = [&w.requests[0], &w.requests[1], &w.requests[2]];
        assert_eq!(a.blocks.len(), 64);
        assert_eq!(b.blocks.len(), 1500 / 16);
        assert_eq!(&b.blocks[..64], &a.blocks[..]);
        assert_eq!(&c.blocks[..32], &a.blocks[..32]);
        assert_ne!(c.blocks[32], a.blocks[32]);
        // Sub-blocks of one trace block differ from each other.
        assert_ne!(a.blocks[0], a.blocks[1]);
        assert_eq!(w.requests[1].arrival_us, 10_000);
    }

    #[test]
    fn engine_blocks_larger_than_trace_blocks_span_ids() {
        let root = 7;
        let x = engine_chain(root, &[1, 2, 3, 4], 512, 2048, 1024).expect("chain");
        let y = engine_chain(root, &[1, 2, 3, 5], 512, 2048, 1024).expect("chain");
        assert_eq!(x.len(), 2);
        assert_eq!(x[0], y[0]);
        assert_ne!(x[1], y[1]);
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert!(engine_chain(0, &[1], 512, 600, 16).is_err());
        let trace = Trace {
            requests: vec![req(0, 10, vec![1])],
            block_tokens: 512,
        };
        assert!(Workload::from_trace(&trace, 0, 1.0).is_err());
        assert!(Workload::from_trace(&trace, 16, 0.0).is_err());
        assert!(Workload::from_trace(&trace, 16, f64::NAN).is_err());
    }

    #[test]
    fn speed_up_compresses_arrivals() {
        let trace = Trace {
            requests: vec![req(0, 10, vec![1]), req(3000, 10, vec![2])],
            block_tokens: 512,
        };
        let w = Workload::from_trace(&trace, 16, 3.0).expect("workload");
        assert_eq!(w.requests[1].arrival_us, 1_000_000);
        assert_eq!(
            w.rescaled(2.0).expect("rescale").requests[1].arrival_us,
            500_000
        );
        assert_eq!(w.span_us(), 1_000_000);
    }
}
