//! Routing policies: a request and a snapshot of every candidate instance in, a decision out.
//!
//! Invariants:
//! - Policies see only what the caller passes in: no clock, no I/O, no global state beyond their own
//!   bounded memory (e.g. the SGLang-style tree), so decisions are reproducible from a seed.
//! - Candidates are the healthy instances the request may go to (the caller removes unhealthy and
//!   already-tried ones); a policy always picks one of them when the slice is non-empty.
//! - Ties are broken by a per-request seed, never by slice position, so no instance is favoured.

mod concurrent;
mod config;
pub mod consistent_hash;
pub mod dynamo;
pub mod kvgate;
pub mod least_load;
pub mod llmd;
pub mod power_of_two;
pub mod random;
pub mod round_robin;
pub mod sglang;
mod sglang_tree;
pub mod share;
pub mod util;

pub use config::{
    build_policy, ConsistentHashParams, DynamoParams, InvalidKvgateParam, KvgateParams, LlmdParams,
    Objective, PolicyConfig, PolicyName, SglangParams, UnknownPolicy,
};

use crate::index::InstanceMatch;
use crate::load::{DecodeRates, EngineLoad, InstanceRates, RouterLoad};
use crate::{BlockHash, InstanceId, Millis};

/// What a policy knows about the request being routed.
#[derive(Clone, Copy, Debug)]
pub struct RouteRequest<'a> {
    /// The prompt's block hash chain (full blocks only).
    pub hashes: &'a [BlockHash],
    /// Tokens per block (exact in token mode, estimated in text mode).
    pub tokens_per_block: u32,
    /// Prompt length in tokens (exact or estimated).
    pub prompt_tokens: u32,
    /// The engines' KV block size in tokens (what [`Candidate::cache_capacity_blocks`] counts in).
    pub kv_block_tokens: u32,
    /// Output tokens the request is expected to produce (its `max_tokens`, else the pool's
    /// learned mean).
    pub expected_output_tokens: u32,
    /// Canonical prompt bytes (for character-based policies such as SGLang's tree).
    pub text: &'a [u8],
    /// Per-request seed for tie-breaking and sampling.
    pub seed: u64,
    /// Decisions other replicas are expected to take on the same view as this one (0 without
    /// peers; the router fills it in, see [`crate::load::ConcurrentDecisions`]).
    pub concurrent_decisions: f64,
    /// Now, in the caller's monotonic milliseconds.
    pub now: Millis,
}

/// One instance the request may go to, with everything known about it.
#[derive(Clone, Copy, Debug)]
pub struct Candidate {
    /// The instance.
    pub id: InstanceId,
    /// Leading blocks of this prompt it holds, by tier.
    pub matched: InstanceMatch,
    /// Fleet-wide router-tracked load (this replica plus peers' gossiped shares).
    pub load: RouterLoad,
    /// Engine-reported load, if any was scraped.
    pub engine: Option<EngineLoad>,
    /// Learned (or configured) prefill speed.
    pub rates: InstanceRates,
    /// Learned (or configured) decode speed.
    pub decode: DecodeRates,
    /// Capacity of the instance's KV cache in blocks, if known.
    pub cache_capacity_blocks: Option<u64>,
}

/// Why a policy chose what it chose (bounded set: used as a metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Lowest predicted cost.
    LowestCost,
    /// Best cache match.
    CacheMatch,
    /// Least loaded (no useful match, or balancing).
    LeastLoaded,
    /// Load imbalance overrode cache affinity.
    Rebalance,
    /// Rotation, hashing or random choice.
    Spread,
    /// Only one candidate.
    OnlyCandidate,
}

impl Reason {
    /// Stable label for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::LowestCost => "lowest_cost",
            Reason::CacheMatch => "cache_match",
            Reason::LeastLoaded => "least_loaded",
            Reason::Rebalance => "rebalance",
            Reason::Spread => "spread",
            Reason::OnlyCandidate => "only_candidate",
        }
    }
}

/// One candidate's score, for explanations (`/admin/decisions`).
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct CandidateScore {
    /// The instance.
    pub id: InstanceId,
    /// Policy-specific score (kvgate: predicted cost in ms; lower is better unless stated).
    pub score: f64,
    /// Leading blocks matched.
    pub matched_blocks: u32,
}

/// A routing decision.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Decision {
    /// The chosen instance.
    pub chosen: InstanceId,
    /// Leading blocks of the prompt the chosen instance holds.
    pub matched_blocks: u32,
    /// Predicted time to first token on the chosen instance, in ms (policies without a model: 0).
    pub predicted_cost_ms: f64,
    /// Why.
    pub reason: Reason,
    /// Every candidate's score, in candidate order.
    pub scores: Vec<CandidateScore>,
}

/// A routing policy. Implementations are `Send + Sync` and keep only bounded internal state.
pub trait Policy: Send + Sync {
    /// The policy's config name (e.g. `"kvgate"`, `"round_robin"`).
    fn name(&self) -> &'static str;
    /// Chooses among `candidates` (non-empty). Returns `None` only for an empty slice.
    fn decide(&self, req: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<Decision>;
    /// Whether the policy reads [`RouteRequest::text`]. Policies that do not are given an empty
    /// text, and the gateway hashes the prompt's canonical rendering without keeping it.
    fn reads_text(&self) -> bool {
        true
    }
    /// Whether the policy reads [`RouteRequest::concurrent_decisions`]. The router estimates
    /// the peers' concurrent decisions only for a policy that does (the estimate costs a lock
    /// and a scan on every decision).
    fn decides_with_peers(&self) -> bool {
        false
    }
    /// Tells the policy where the request went (policies with their own memory update it here).
    fn on_routed(&self, req: &RouteRequest<'_>, chosen: InstanceId) {
        let _ = (req, chosen);
    }
    /// Forgets what the policy remembers of `instance` (it left the fleet; its id may be given
    /// to a new instance).
    fn forget_instance(&self, instance: InstanceId) {
        let _ = instance;
    }
}
