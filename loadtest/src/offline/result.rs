//! What one simulated run reports, and the references it is compared with.
//!
//! Invariants: every figure is computed from the engines' own counters or from per-request
//! timestamps in virtual time (never from what the router believed), except
//! `router_matched_ratio`, which is labelled as the router's belief.

use serde::{Deserialize, Serialize};

use super::summary::Dist;
use crate::replay::record::RequestRecord;

/// One point of a run's timeline (a fixed-width bucket of virtual time).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TimelinePoint {
    /// Bucket start, seconds of virtual time.
    pub t_s: f64,
    /// Hit ratio (tokens) of requests that got their first token in this bucket.
    pub hit_ratio: f64,
    /// Time-weighted max/mean in-flight requests over instances (1 = perfectly even).
    pub load_spread: f64,
    /// Time-weighted mean in-flight requests per instance.
    pub mean_in_flight: f64,
    /// Mean TTFT of requests that got their first token in this bucket, seconds.
    pub mean_ttft_s: f64,
}

/// Results of one policy on one workload and fleet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyResult {
    /// Policy name.
    pub policy: String,
    /// Requests in the workload.
    pub requests: usize,
    /// Requests that finished.
    pub completed: usize,
    /// Requests an engine refused (queue full or too long).
    pub rejected: usize,
    /// Requests still running when the simulation stopped (only with a time bound).
    pub unfinished: usize,
    /// Time to first token, seconds.
    pub ttft_s: Dist,
    /// End-to-end latency, seconds.
    pub e2e_s: Dist,
    /// Generated tokens per second over the makespan.
    pub output_tokens_per_s: f64,
    /// Finished requests per second over the makespan.
    pub requests_per_s: f64,
    /// Prefix hit ratio in prompt tokens, from the engines' counters.
    pub hit_ratio: f64,
    /// Prompt tokens the engines served from cache.
    pub cached_tokens: u64,
    /// Prompt tokens the engines received.
    pub prompt_tokens: u64,
    /// Share of the prompt tokens the router *believed* cached on its choice (index view).
    pub router_matched_ratio: f64,
    /// Share of the prompt tokens the router believed cached on the best-matching instance:
    /// the gap to `router_matched_ratio` is cache the policy traded for load.
    pub router_best_ratio: f64,
    /// Fraction of requests sent to each instance.
    pub instance_share: Vec<f64>,
    /// The same run by engine class (one entry for a fleet of one class), in fleet order.
    #[serde(default)]
    pub classes: Vec<ClassResult>,
    /// Per engine, in fleet order: what it received and how its requests fared.
    #[serde(default)]
    pub instances: Vec<InstanceResult>,
    /// Largest instance share over the mean share (1 = perfectly even).
    pub share_max_over_mean: f64,
    /// Time-weighted max/mean in-flight requests over instances, over the run.
    pub load_spread: f64,
    /// Utilisation between the first and the last arrival: the fraction of the fleet's time
    /// spent on work, where a step's fixed cost counts in proportion to the share of its token
    /// budget it used (a step decoding a handful of sequences is mostly spare capacity). Reaches
    /// 1 only when steps run full; the load measure the utilisation search targets.
    pub utilisation: f64,
    /// Prompt tokens the engines computed (uncached, recomputation included) over what the fleet
    /// could prefill at its nominal rate, between the first and the last arrival.
    pub prefill_utilisation: f64,
    /// Fraction of time the engines spent in steps between the first and the last arrival
    /// (a step decoding one sequence counts as busy, so this overstates load at low batch sizes).
    pub busy: f64,
    /// First arrival to last completion, seconds of virtual time.
    pub makespan_s: f64,
    /// Wall-clock time the simulation took, milliseconds.
    pub wall_ms: f64,
    /// Hit ratio, load spread and TTFT over time.
    pub timeline: Vec<TimelinePoint>,
    /// Every request that ended, in the live replay's record format (written apart, with
    /// `--records`; never in the JSON report, which stays a summary).
    #[serde(skip)]
    pub records: Vec<RequestRecord>,
}

/// One engine class's part of a run: the requests routed to its engines.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassResult {
    /// The class (preset label).
    pub preset: String,
    /// Its engines in the fleet.
    pub engines: usize,
    /// Fraction of the routed requests its engines received.
    pub request_share: f64,
    /// Time to first token of the requests it served, seconds.
    pub ttft_s: Dist,
    /// End-to-end latency of the requests it served, seconds.
    pub e2e_s: Dist,
    /// Prefix hit ratio of its engines, from their counters.
    pub hit_ratio: f64,
}

/// One engine's part of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InstanceResult {
    /// Fraction of the routed requests it received.
    pub request_share: f64,
    /// Mean prompt length of those requests, tokens.
    pub mean_prompt_tokens: f64,
    /// Time to first token of the requests it served, seconds.
    pub ttft_s: Dist,
    /// End-to-end latency of the requests it served, seconds.
    pub e2e_s: Dist,
    /// The engine's own prefix hit ratio.
    pub hit_ratio: f64,
    /// Prompt tokens the engine computed (its prefill work: queried minus hit).
    pub computed_tokens: u64,
}

/// Workload-level references no router can beat (or, for the LRU, hardly).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct References {
    /// Hit ratio of one infinite cache.
    pub infinite_hit_ratio: f64,
    /// Hit ratio of one LRU cache as large as the whole fleet.
    pub fleet_lru_hit_ratio: f64,
    /// Capacity of that LRU, in blocks.
    pub fleet_lru_capacity_blocks: u64,
    /// TTFT of each request alone on an idle engine with the infinite cache's hit, seconds (on
    /// the fastest engine class for that request, in a fleet of several classes).
    pub ttft_floor_s: Dist,
    /// End-to-end latency of each request alone on an idle engine with the infinite cache's hit
    /// (its whole output decoded in a batch of one), seconds; fastest class per request.
    #[serde(default)]
    pub e2e_floor_s: Dist,
}
