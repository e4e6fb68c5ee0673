//! Policy selection and parameters: the one place where policy defaults live.
//!
//! Every struct here is `serde(deny_unknown_fields, default)`: a config file names only what it
//! changes, and a misspelt key is an error rather than a silently ignored setting.

use super::consistent_hash::ConsistentHash;
use super::dynamo::DynamoCost;
use super::kvgate::Kvgate;
use super::least_load::LeastLoad;
use super::llmd::LlmdWeighted;
use super::power_of_two::PowerOfTwo;
use super::random::Random;
use super::round_robin::RoundRobin;
use super::sglang::SglangCacheAware;
use super::Policy;
use serde::{Deserialize, Serialize};

/// Which policy routes requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyName {
    /// kvgate's cost-based policy (predicted TTFT plus fleet recompute cost).
    #[default]
    Kvgate,
    /// Rotation.
    RoundRobin,
    /// Uniform by request seed.
    Random,
    /// Fewest in-flight requests.
    LeastLoad,
    /// Less loaded of two seeded samples.
    PowerOfTwo,
    /// Rendezvous hashing on the first blocks.
    ConsistentHash,
    /// SGLang router's cache-aware policy (approximate tree over prompt text).
    SglangCacheAware,
    /// NVIDIA Dynamo's KV-block cost.
    DynamoCost,
    /// llm-d's weighted prefix / queue / KV-utilisation scorers.
    LlmdWeighted,
}

impl PolicyName {
    /// Every policy, default first.
    pub const ALL: [PolicyName; 9] = [
        PolicyName::Kvgate,
        PolicyName::RoundRobin,
        PolicyName::Random,
        PolicyName::LeastLoad,
        PolicyName::PowerOfTwo,
        PolicyName::ConsistentHash,
        PolicyName::SglangCacheAware,
        PolicyName::DynamoCost,
        PolicyName::LlmdWeighted,
    ];

    /// The config / metric name (same as serde's).
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::Kvgate => "kvgate",
            PolicyName::RoundRobin => "round_robin",
            PolicyName::Random => "random",
            PolicyName::LeastLoad => "least_load",
            PolicyName::PowerOfTwo => "power_of_two",
            PolicyName::ConsistentHash => "consistent_hash",
            PolicyName::SglangCacheAware => "sglang_cache_aware",
            PolicyName::DynamoCost => "dynamo_cost",
            PolicyName::LlmdWeighted => "llmd_weighted",
        }
    }
}

impl std::fmt::Display for PolicyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown policy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy {0:?} (expected one of: kvgate, round_robin, random, least_load, power_of_two, consistent_hash, sglang_cache_aware, dynamo_cost, llmd_weighted)")]
pub struct UnknownPolicy(pub String);

impl std::str::FromStr for PolicyName {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyName::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownPolicy(s.to_owned()))
    }
}

/// Which policy to run and every policy's parameters.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// The active policy. Default `kvgate`.
    pub name: PolicyName,
    /// Parameters of `kvgate`.
    pub kvgate: KvgateParams,
    /// Parameters of `sglang_cache_aware`.
    pub sglang: SglangParams,
    /// Parameters of `dynamo_cost`.
    pub dynamo: DynamoParams,
    /// Parameters of `llmd_weighted`.
    pub llmd: LlmdParams,
    /// Parameters of `consistent_hash`.
    pub consistent_hash: ConsistentHashParams,
}

/// What the `kvgate` policy minimises.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// The request's time to first token, plus the fleet's recompute price and a low-weighted
    /// stall of the sequences decoding beside it: the lowest mean TTFT, at the price of mean
    /// end-to-end latency and request-share evenness (docs/offline-simulator.md).
    Ttft,
    /// Everyone's end-to-end latency: the request's own (first token, then its decode in the batch
    /// it joins) plus what it adds to the requests already there (its prefill stalls their
    /// steps, its sequence lengthens every later step), and its wait for KV memory. The default:
    /// users wait for the whole answer, and on the measured workloads it has the lower mean and
    /// p99 end-to-end latency and the more even request share, for a higher mean TTFT.
    #[default]
    E2e,
    /// `e2e`, plus a price per request pushed over its time-to-first-token or time-per-output-
    /// token target, so that as many requests as possible meet both.
    Slo,
}

impl Objective {
    /// The config name.
    pub fn as_str(self) -> &'static str {
        match self {
            Objective::Ttft => "ttft",
            Objective::E2e => "e2e",
            Objective::Slo => "slo",
        }
    }
}

/// Parameters of the default `kvgate` policy (see [`super::kvgate`] for the model).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvgateParams {
    /// What the policy minimises. Default `e2e`.
    pub objective: Objective,
    /// Objectives `e2e` and `slo`: weight of the decode terms (the request's own decode in the
    /// batch it joins, and what it adds to the other sequences' decode and to their steps while
    /// it prefills) against its time to first token. Default 0.5: another user's millisecond
    /// counts half of this request's own (at 1, everyone's alike, the sum of everyone's latency
    /// is minimised, but the prices of stalls and slowdowns are only as good as the learned decode
    /// model, and mean TTFT and p99 TTFT pay more for less).
    pub decode_weight: f64,
    /// Objective `slo`: time-to-first-token target, ms. Default 2000.
    pub ttft_slo_ms: f64,
    /// Objective `slo`: time-per-output-token target, ms. Default 100.
    pub tpot_slo_ms: f64,
    /// Objective `slo`: price of one request missing a target, ms. Default 30 000.
    pub slo_penalty_ms: f64,
    /// Fraction of a GPU-resident block's prefill saved by a hit. Default 1.0.
    pub gpu_credit: f64,
    /// Fraction saved by a block in CPU offload (the transfer costs the rest). Default 0.8.
    pub cpu_credit: f64,
    /// Fraction saved by a block on disk / remote offload. Default 0.5.
    pub disk_credit: f64,
    /// Base price of recomputing blocks another instance holds, as a multiple of the recompute
    /// time, on an instance with requests in flight. Default 1.0. Higher keeps more of the
    /// available hits (92 % of the fleet-sized LRU bound met on 13 of 22 measured workloads at
    /// 1, 17 at 3, 19 at 5) at the same mean end-to-end latency, for a higher mean TTFT on short
    /// cached prompts and a less even request share (docs/offline-simulator.md).
    pub fleet_weight: f64,
    /// The same base price on an instance with nothing in flight: its time is otherwise unused,
    /// so a recompute there delays no one and its copy (a new replica of a prefix the others
    /// hold) serves later requests. Default 0.0.
    pub idle_fleet_weight: f64,
    /// Added to the price per request waiting for its first token on the candidate (how many
    /// requests a recompute there delays grows with its queue). Default 0.5.
    pub fleet_load_weight: f64,
    /// Upper bound of the total price multiplier, so a deep queue can never pin traffic to a
    /// hot instance forever. Default 8.0.
    pub fleet_max_factor: f64,
    /// Fraction of the recompute not charged to a request that makes a new replica of a shared
    /// prefix (held by several instances, all with work in flight) on an instance with nothing
    /// in flight: the copy serves later requests, so its cost is theirs to share, not this
    /// request's alone. Default 1.0.
    pub replica_credit: f64,
    /// Price, per sequence decoding on the candidate, of this request's prefill time there: a
    /// continuous-batching step that carries a prefill chunk makes every decoding sequence in
    /// the batch wait for it. Weighted low because a first token matters more to its user than
    /// one later token to each of the others. Default 0.1.
    pub stall_weight: f64,
    /// Uncached prompt tokens assumed per request in an engine's waiting queue when only
    /// engine-scraped load is known. Default 1024.
    pub engine_waiting_tokens: f64,
    /// Costs within this many ms of the best tie. Default 0.01.
    pub tie_epsilon_ms: f64,
    /// Costs within this fraction of the best also tie: differences that small are below what
    /// learned rates and load snapshots can resolve, so they should not decide. Ties go to the
    /// candidate with the fewest requests in flight (which also evens out decode batches), then
    /// by request seed. Default 0.1.
    pub tie_relative: f64,
    /// Bound on any instance's share of the requests offered to it, as a multiple of its share
    /// of the candidates' capacity (learned prefill rates; on one hardware class the mean share
    /// 1 / candidates), kept by a price in the cost model (see [`super::share`]). 0 switches
    /// the price off. Default 0 (off).
    pub max_share: f64,
    /// Growth rate of the share price: an instance that took `Q` requests beyond its share
    /// bound pays `best × (e^(share_price × Q) − 1)`, `best` being the decision's lowest cost,
    /// so the price grows until it stops being the cheapest often enough. Default 0.2.
    pub share_price: f64,
    /// Memory of the share bound, in decisions: each instance's excess decays by `1 / window`
    /// of itself at every decision, so the price answers a burst of consecutive picks at once
    /// but caps a sustained skew only softly (a steady excess `e` per decision settles at
    /// `e × window`). 0 never forgets: the bound holds the long-run share. Default 0.
    pub share_window: f64,
    /// Weight of the decisions gateway replicas are estimated to take at the same moment on the
    /// same view (see [`crate::load::ConcurrentDecisions`]): with any, the choice is mixed over
    /// the cheapest candidates so that concurrent requests do not all take the same one (see
    /// [`super::kvgate`]). 0 decides as if alone; 1 uses the estimate as it is. No effect
    /// without peers. Default 1: with the window measured from the peers' convergence lag, it
    /// keeps 8 replicas' hit ratio near one gateway's on bursty traffic, and at a high steady
    /// rate spreads what peers decide within that window (docs/gossip.md).
    pub concurrency_weight: f64,
    /// Objectives `e2e` and `slo`: how much a request larger than its neighbours discounts
    /// their delays (`τ`): each neighbour's stall and slowdown counts
    /// `min(1, (s_neighbour / s_own)^τ)`, at least 1/4, where `s` is a request's time alone on
    /// the instance (its prefill plus its decode at an empty batch's pace). At 0 every user's
    /// milliseconds count alike, which minimises their sum and sorts requests by size: a long
    /// prompt, whose prefill stalls every neighbour, avoids busy instances for the few with few
    /// neighbours, where it queues behind other long prompts and decodes among long contexts —
    /// the p99 end-to-end latency. Above 0 a long request weighs its own wait more, trading
    /// some mean latency for the tail (docs/offline-simulator.md). Default 0.
    pub size_weight: f64,
}

impl Default for KvgateParams {
    fn default() -> Self {
        Self {
            objective: Objective::default(),
            decode_weight: 0.5,
            ttft_slo_ms: 2000.0,
            tpot_slo_ms: 100.0,
            slo_penalty_ms: 30_000.0,
            gpu_credit: 1.0,
            cpu_credit: 0.8,
            disk_credit: 0.5,
            fleet_weight: 1.0,
            idle_fleet_weight: 0.0,
            fleet_load_weight: 0.5,
            fleet_max_factor: 8.0,
            replica_credit: 1.0,
            stall_weight: 0.1,
            engine_waiting_tokens: 1024.0,
            tie_epsilon_ms: 0.01,
            tie_relative: 0.1,
            max_share: 0.0,
            share_price: 0.2,
            share_window: 0.0,
            concurrency_weight: 1.0,
            size_weight: 0.0,
        }
    }
}

/// A `kvgate` parameter outside its valid range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {requirement}")]
pub struct InvalidKvgateParam {
    /// The field's name in `[routing.policy.kvgate]`.
    pub field: &'static str,
    /// What it must be.
    pub requirement: &'static str,
}

impl KvgateParams {
    /// Checks that every parameter is finite and in range (credits in `[0, 1]`, everything else
    /// `>= 0`).
    pub fn validate(&self) -> Result<(), InvalidKvgateParam> {
        let credits = [
            ("replica_credit", self.replica_credit),
            ("gpu_credit", self.gpu_credit),
            ("cpu_credit", self.cpu_credit),
            ("disk_credit", self.disk_credit),
        ];
        for (field, v) in credits {
            if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
                return Err(InvalidKvgateParam {
                    field,
                    requirement: "must be between 0 and 1",
                });
            }
        }
        let non_negative = [
            ("fleet_weight", self.fleet_weight),
            ("idle_fleet_weight", self.idle_fleet_weight),
            ("fleet_load_weight", self.fleet_load_weight),
            ("fleet_max_factor", self.fleet_max_factor),
            ("stall_weight", self.stall_weight),
            ("engine_waiting_tokens", self.engine_waiting_tokens),
            ("tie_epsilon_ms", self.tie_epsilon_ms),
            ("tie_relative", self.tie_relative),
            ("decode_weight", self.decode_weight),
            ("ttft_slo_ms", self.ttft_slo_ms),
            ("tpot_slo_ms", self.tpot_slo_ms),
            ("slo_penalty_ms", self.slo_penalty_ms),
            ("share_price", self.share_price),
            ("share_window", self.share_window),
            ("concurrency_weight", self.concurrency_weight),
            ("size_weight", self.size_weight),
        ];
        for (field, v) in non_negative {
            if !(v.is_finite() && v >= 0.0) {
                return Err(InvalidKvgateParam {
                    field,
                    requirement: "must be finite and >= 0",
                });
            }
        }
        if !(self.max_share == 0.0 || (self.max_share.is_finite() && self.max_share > 1.0)) {
            return Err(InvalidKvgateParam {
                field: "max_share",
                requirement: "must be 0 (off) or above 1 (a multiple of the capacity share)",
            });
        }
        Ok(())
    }
}

/// Parameters of `sglang_cache_aware` (SGLang router CLI defaults).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SglangParams {
    /// Minimum matched fraction of the prompt to follow cache affinity. Default 0.3.
    pub cache_threshold: f64,
    /// Load imbalance needs `max − min` above this (in-flight requests). Default 64.
    pub balance_abs_threshold: u32,
    /// ... and `max > min × this`. Default 1.5.
    pub balance_rel_threshold: f64,
    /// Per-instance bound on characters (bytes) in the tree, enforced every eviction interval.
    /// Default 2^26.
    pub max_tree_size: usize,
    /// Eviction period in ms of the caller's clock. Default 120 000.
    pub eviction_interval_ms: u64,
}

impl Default for SglangParams {
    fn default() -> Self {
        Self {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
            max_tree_size: 1 << 26,
            eviction_interval_ms: 120_000,
        }
    }
}

/// Parameters of `dynamo_cost`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DynamoParams {
    /// Weight of prefill blocks against decode blocks. Default 1.0.
    pub prefill_load_scale: f64,
    /// 0 = argmin; above 0, softmax sampling over normalised costs. Default 0.0.
    pub temperature: f64,
    /// Overlap credit per GPU block. Default 1.0.
    pub gpu_credit: f64,
    /// Overlap credit per CPU-offload block. Default 0.75.
    pub cpu_credit: f64,
    /// Overlap credit per disk block. Default 0.25.
    pub disk_credit: f64,
    /// Active KV blocks assumed per decoding sequence when the engine's KV usage is unknown.
    /// Default 64.
    pub blocks_per_decoding_seq: f64,
}

impl Default for DynamoParams {
    fn default() -> Self {
        Self {
            prefill_load_scale: 1.0,
            temperature: 0.0,
            gpu_credit: 1.0,
            cpu_credit: 0.75,
            disk_credit: 0.25,
            blocks_per_decoding_seq: 64.0,
        }
    }
}

/// Parameters of `llmd_weighted` (llm-d defaults).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LlmdParams {
    /// Weight of the prefix-match scorer. Default 3.
    pub prefix_weight: f64,
    /// Weight of the queue scorer. Default 2.
    pub queue_weight: f64,
    /// Weight of the KV-utilisation scorer. Default 2.
    pub kv_weight: f64,
}

impl Default for LlmdParams {
    fn default() -> Self {
        Self {
            prefix_weight: 3.0,
            queue_weight: 2.0,
            kv_weight: 2.0,
        }
    }
}

/// Parameters of `consistent_hash`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsistentHashParams {
    /// Leading blocks that form the key. Default 4.
    pub prefix_blocks: usize,
    /// Bytes of text hashed when the prompt has no full block. Default 256.
    pub short_prompt_bytes: usize,
}

impl Default for ConsistentHashParams {
    fn default() -> Self {
        Self {
            prefix_blocks: 4,
            short_prompt_bytes: 256,
        }
    }
}

/// Builds the configured policy.
pub fn build_policy(cfg: &PolicyConfig) -> Box<dyn Policy> {
    match cfg.name {
        PolicyName::Kvgate => Box::new(Kvgate::new(cfg.kvgate.clone())),
        PolicyName::RoundRobin => Box::new(RoundRobin::default()),
        PolicyName::Random => Box::new(Random),
        PolicyName::LeastLoad => Box::new(LeastLoad),
        PolicyName::PowerOfTwo => Box::new(PowerOfTwo),
        PolicyName::ConsistentHash => Box::new(ConsistentHash::new(cfg.consistent_hash.clone())),
        PolicyName::SglangCacheAware => Box::new(SglangCacheAware::new(cfg.sglang.clone())),
        PolicyName::DynamoCost => Box::new(DynamoCost::new(cfg.dynamo.clone())),
        PolicyName::LlmdWeighted => Box::new(LlmdWeighted::new(cfg.llmd.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_build() {
        for n in PolicyName::ALL {
            assert_eq!(n.as_str().parse::<PolicyName>(), Ok(n));
            let cfg = PolicyConfig {
                name: n,
                ..Default::default()
            };
            assert_eq!(build_policy(&cfg).name(), n.as_str());
        }
        assert!("nope".parse::<PolicyName>().is_err());
    }

    #[test]
    fn kvgate_params_are_validated() {
        assert_eq!(KvgateParams::default().validate(), Ok(()));
        let bad = KvgateParams {
            stall_weight: -1.0,
            ..Default::default()
        };
        assert_eq!(bad.validate().map_err(|e| e.field), Err("stall_weight"));
        let bad = KvgateParams {
            idle_fleet_weight: f64::NAN,
            ..Default::default()
        };
        assert_eq!(
            bad.validate().map_err(|e| e.field),
            Err("idle_fleet_weight")
        );
        let bad = KvgateParams {
            cpu_credit: 1.5,
            ..Default::default()
        };
        assert_eq!(bad.validate().map_err(|e| e.field), Err("cpu_credit"));
        let bad = KvgateParams {
            size_weight: f64::INFINITY,
            ..Default::default()
        };
        assert_eq!(bad.validate().map_err(|e| e.field), Err("size_weight"));
    }

    #[test]
    fn partial_config_keeps_defaults_and_rejects_unknown_keys() {
        let cfg: PolicyConfig =
            toml::from_str("name = \"dynamo_cost\"\n[dynamo]\ntemperature = 0.5\n").unwrap();
        assert_eq!(cfg.name, PolicyName::DynamoCost);
        assert_eq!(cfg.dynamo.temperature, 0.5);
        assert_eq!(cfg.dynamo.cpu_credit, 0.75);
        assert_eq!(cfg.kvgate, KvgateParams::default());
        assert!(toml::from_str::<PolicyConfig>("[kvgate]\nfleet_wieght = 1.0\n").is_err());
        assert!(toml::from_str::<PolicyConfig>("name = \"fastest\"\n").is_err());
        let round: PolicyConfig =
            toml::from_str(&toml::to_string(&PolicyConfig::default()).unwrap()).unwrap();
        assert_eq!(round, PolicyConfig::default());
    }
}
