//! Seeded synthetic workloads written in the trace format.
//!
//! Each generator describes prompts as sequences of *segments* (a system prompt, a user turn, an
//! answer, a document, ...), each with a unique id and a length in tokens. [`Assembler`] cuts the
//! concatenated segments into `block_tokens`-token blocks and gives each block a prefix-chained id
//! (a hash of the previous block's id and the segment pieces inside it, renumbered densely), so two
//! prompts share block ids exactly as far as their segments agree — the Mooncake convention.
//!
//! Every generator is a pure function of its parameters and seed. Parameters are documented on
//! each struct; lengths are drawn uniformly in `[mean/2, 3·mean/2]` (heavy-tailed lognormals for
//! `long`); sessions/requests arrive as a Poisson process at `rate` per second.

pub mod agent;
pub mod chat;
pub mod long;
pub mod rag;
pub mod system_prompt;

use ahash::AHashMap;
use rand::rngs::SmallRng;
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::trace::{Trace, TraceError, TraceRequest};

/// Most requests a generator may produce.
pub const MAX_REQUESTS: usize = 2_000_000;
/// Longest prompt a generator may produce, tokens (histories stop growing past it).
pub const MAX_PROMPT_TOKENS: u32 = 1 << 20;

/// Why generation failed.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// A parameter is out of range.
    #[error("invalid workload parameter: {0}")]
    Parameter(String),
    /// The result is not a valid trace.
    #[error(transparent)]
    Trace(#[from] TraceError),
}

/// A piece of prompt: a segment id and its length in tokens.
pub type Segment = (u64, u32);

/// One generated request before block ids are assigned.
#[derive(Debug, Clone)]
pub struct Draft {
    /// Arrival, ms.
    pub timestamp_ms: u64,
    /// Prompt segments in order.
    pub segments: Vec<Segment>,
    /// Output length, tokens.
    pub output_length: u32,
}

/// Turns segment lists into prefix-chained block ids.
#[derive(Debug)]
pub struct Assembler {
    block_tokens: u32,
    /// Chain hash → dense id (first seen, first numbered).
    dense: AHashMap<u64, u64>,
}

impl Assembler {
    /// An assembler for `block_tokens`-token blocks.
    pub fn new(block_tokens: u32) -> Self {
        Assembler {
            block_tokens: block_tokens.max(1),
            dense: AHashMap::new(),
        }
    }

    /// Block ids and total length of a prompt.
    pub fn ids(&mut self, segments: &[Segment]) -> (Vec<u64>, u32) {
        let total: u32 = segments
            .iter()
            .map(|s| s.1)
            .fold(0u32, |a, b| a.saturating_add(b));
        let mut ids = Vec::with_capacity(total.div_ceil(self.block_tokens) as usize);
        let mut chain = 0x6b76_6761_7465_u64;
        let mut fill = 0u32;
        for &(seg, len) in segments {
            let mut off = 0u32;
            while off < len {
                let take = (len - off).min(self.block_tokens - fill);
                chain = mix(chain ^ mix(seg ^ mix(u64::from(off) << 32 | u64::from(take))));
                fill += take;
                off += take;
                if fill == self.block_tokens {
                    ids.push(self.dense_id(chain));
                    fill = 0;
                }
            }
        }
        if fill > 0 {
            // A partial last block gets its own id, distinct from any full block's.
            ids.push(self.dense_id(mix(chain ^ 0x7061_7274)));
        }
        (ids, total)
    }

    fn dense_id(&mut self, h: u64) -> u64 {
        let next = self.dense.len() as u64;
        *self.dense.entry(h).or_insert(next)
    }

    /// Builds a trace from drafts (sorted by arrival).
    pub fn trace(mut self, drafts: Vec<Draft>) -> Result<Trace, SynthError> {
        if drafts.len() > MAX_REQUESTS {
            return Err(SynthError::Parameter(format!(
                "more than {MAX_REQUESTS} requests"
            )));
        }
        let mut drafts = drafts;
        drafts.sort_by_key(|d| d.timestamp_ms);
        let mut reqs = Vec::with_capacity(drafts.len());
        for d in drafts {
            let (hash_ids, input_length) = self.ids(&d.segments);
            if input_length == 0 {
                continue;
            }
            reqs.push(TraceRequest {
                timestamp_ms: d.timestamp_ms,
                input_length,
                output_length: d.output_length.max(1),
                hash_ids,
            });
        }
        Ok(Trace::from_requests(reqs, self.block_tokens)?)
    }
}

/// SplitMix64 finaliser.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A length around `mean`: uniform in `[mean/2, 3·mean/2]`, at least 1.
pub(crate) fn around(rng: &mut SmallRng, mean: u32) -> u32 {
    if mean <= 1 {
        return 1;
    }
    rng.gen_range(mean / 2..=mean + mean / 2).max(1)
}

/// Next Poisson arrival after `t_ms` at `rate` per second.
pub(crate) fn next_arrival(rng: &mut SmallRng, t_ms: f64, rate: f64) -> f64 {
    let u: f64 = rng.gen();
    t_ms + -(1.0 - u).ln() / rate * 1000.0
}

/// Unique segment ids: a namespace per generator in the top byte, a counter below.
#[derive(Debug)]
pub(crate) struct SegIds {
    ns: u64,
    next: u64,
}

impl SegIds {
    pub(crate) fn new(ns: u8) -> Self {
        SegIds {
            ns: u64::from(ns) << 56,
            next: 0,
        }
    }
    pub(crate) fn fresh(&mut self) -> u64 {
        self.next += 1;
        self.ns | self.next
    }
}

pub(crate) fn check_rate(rate: f64) -> Result<(), SynthError> {
    if rate.is_finite() && rate > 0.0 {
        Ok(())
    } else {
        Err(SynthError::Parameter(format!(
            "rate must be > 0, got {rate}"
        )))
    }
}

/// A workload and its parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Workload {
    /// One shared system prompt in front of unique questions.
    SystemPrompt(system_prompt::SystemPromptParams),
    /// Multi-turn chat; every turn carries the whole history.
    Chat(chat::ChatParams),
    /// Agent loops (plan / act / reflect) with growing history.
    Agent(agent::AgentParams),
    /// RAG / few-shot prompts combining documents from a pool.
    Rag(rag::RagParams),
    /// Mostly unrelated long prompts with mixed output lengths, a little growing reuse.
    Long(long::LongParams),
    /// Several workloads at once, merged by arrival time.
    Mix(Vec<Workload>),
}

impl Workload {
    /// Generates the workload's drafts, with segment namespace `ns` (mixes use one per part).
    fn drafts(&self, seed: u64, ns: u8) -> Result<Vec<Draft>, SynthError> {
        match self {
            Workload::SystemPrompt(p) => p.drafts(seed, ns),
            Workload::Chat(p) => p.drafts(seed, ns),
            Workload::Agent(p) => p.drafts(seed, ns),
            Workload::Rag(p) => p.drafts(seed, ns),
            Workload::Long(p) => p.drafts(seed, ns),
            Workload::Mix(parts) => {
                if parts.len() > 200 {
                    return Err(SynthError::Parameter("at most 200 mixed workloads".into()));
                }
                let mut all = Vec::new();
                for (i, w) in parts.iter().enumerate() {
                    if matches!(w, Workload::Mix(_)) {
                        return Err(SynthError::Parameter("mixes cannot nest".into()));
                    }
                    all.extend(w.drafts(mix(seed ^ i as u64), i as u8 + 1)?);
                    if all.len() > MAX_REQUESTS {
                        return Err(SynthError::Parameter(format!(
                            "more than {MAX_REQUESTS} requests"
                        )));
                    }
                }
                Ok(all)
            }
        }
    }

    /// Generates a trace with `block_tokens`-token blocks.
    pub fn generate(&self, seed: u64, block_tokens: u32) -> Result<Trace, SynthError> {
        if block_tokens == 0 {
            return Err(SynthError::Parameter(
                "block size must be at least 1".into(),
            ));
        }
        Assembler::new(block_tokens).trace(self.drafts(seed, 0)?)
    }

    /// Names accepted by [`Workload::named`].
    pub const NAMES: [&'static str; 6] = ["system-prompt", "chat", "agent", "rag", "long", "mix"];

    /// The workload called `kind`, with its default parameters.
    pub fn named(kind: &str) -> Result<Workload, SynthError> {
        Ok(match kind {
            "system-prompt" => Workload::SystemPrompt(Default::default()),
            "chat" => Workload::Chat(Default::default()),
            "agent" => Workload::Agent(Default::default()),
            "rag" => Workload::Rag(Default::default()),
            "long" => Workload::Long(Default::default()),
            "mix" => Workload::default_mix(),
            other => {
                return Err(SynthError::Parameter(format!(
                    "unknown workload {other:?}; known: {}",
                    Self::NAMES.join(", ")
                )))
            }
        })
    }

    /// The default mix: chat, agents, RAG and a shared system prompt together.
    pub fn default_mix() -> Workload {
        Workload::Mix(vec![
            Workload::Chat(chat::ChatParams::default()),
            Workload::Agent(agent::AgentParams::default()),
            Workload::Rag(rag::RagParams::default()),
            Workload::SystemPrompt(system_prompt::SystemPromptParams::default()),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_segments_share_ids_exactly() {
        let mut a = Assembler::new(4);
        let (x, nx) = a.ids(&[(1, 6), (2, 5)]);
        let (y, ny) = a.ids(&[(1, 6), (3, 5)]);
        let (z, _) = a.ids(&[(1, 6), (2, 5)]);
        assert_eq!((nx, ny), (11, 11));
        assert_eq!(x.len(), 3);
        assert_eq!(x, z);
        // Block 0 is entirely segment 1; block 1 mixes segments 1 and 2/3.
        assert_eq!(x[0], y[0]);
        assert_ne!(x[1], y[1]);
        assert_ne!(x[2], y[2]);
        // A prefix of a longer prompt shares its full blocks but not its partial last block.
        let (p, _) = a.ids(&[(1, 6)]);
        assert_eq!(p[0], x[0]);
        assert_ne!(p[1], x[1]);
    }

    #[test]
    fn every_name_gives_a_workload() {
        for name in Workload::NAMES {
            let w = Workload::named(name).unwrap();
            assert!(!w.generate(1, 512).unwrap().requests.is_empty(), "{name}");
        }
        let e = Workload::named("longg").unwrap_err().to_string();
        assert!(e.contains("longg") && e.contains("long, mix"), "{e}");
    }

    #[test]
    fn every_workload_is_a_valid_seeded_trace() {
        let w = Workload::default_mix();
        let t1 = w.generate(7, 64).unwrap();
        let t2 = w.generate(7, 64).unwrap();
        let t3 = w.generate(8, 64).unwrap();
        assert_eq!(t1, t2);
        assert_ne!(t1, t3);
        assert!(t1.requests.len() > 100, "{}", t1.requests.len());
        let s = t1.stats();
        assert!(s.infinite_hit_ratio_tokens > 0.3, "{s:?}");
        // Written and read back it stays identical.
        let mut buf = Vec::new();
        t1.write(&mut buf).unwrap();
        assert_eq!(Trace::parse(buf.as_slice(), 64).unwrap(), t1);
    }
}
