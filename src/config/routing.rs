//! `[routing]`: how prompts are hashed, how the placement index is bounded, which policy decides.

use serde::{Deserialize, Serialize};

/// How a prompt becomes block hashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HashMode {
    /// Token mode for pools with a tokenizer (and the embedded simulated fleet), text mode otherwise.
    Auto,
    /// Fixed-size byte blocks of a canonical rendering: works with any backend, no tokenizer.
    Text,
    /// Token ids in the engine's block size: exact, matches engine KV events. Needs a tokenizer.
    Token,
}

impl std::str::FromStr for HashMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(HashMode::Auto),
            "text" => Ok(HashMode::Text),
            "token" => Ok(HashMode::Token),
            other => Err(format!("expected `auto`, `text` or `token`, got `{other}`")),
        }
    }
}

/// `[routing.index]`: bounds of the KV placement index (maps to `kvgate_core::index::IndexConfig`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IndexSection {
    /// Lock shards (rounded up to a power of two): more shards, less contention.
    pub shards: usize,
    /// Global cap on (block, instance) entries.
    pub max_entries: usize,
    /// Per-instance cap on entries when the engine's cache size is unknown.
    pub default_instance_capacity: usize,
    /// How often expired predictions are swept (off the request path).
    pub expire_interval_ms: u64,
    /// An instance's index capacity, as a multiple of its configured or engine-reported KV
    /// capacity in blocks. Above 1 because engines with a CPU or disk offload tier hold more
    /// blocks than their GPU capacity reports, and predictions for requests in flight need room
    /// beside them: with a factor of 1 the index forgets blocks the engine still holds.
    pub capacity_factor: f64,
}

impl IndexSection {
    /// The index capacity for an instance whose KV cache holds `blocks` blocks.
    pub fn instance_capacity(&self, blocks: u64) -> usize {
        let scaled = blocks as f64 * self.capacity_factor.max(1.0);
        if scaled >= usize::MAX as f64 {
            usize::MAX
        } else {
            scaled as usize
        }
    }
}

impl Default for IndexSection {
    fn default() -> Self {
        Self {
            shards: 64,
            max_entries: 8_000_000,
            default_instance_capacity: 262_144,
            expire_interval_ms: 1_000,
            capacity_factor: 2.0,
        }
    }
}

impl IndexSection {
    /// The core's index configuration.
    pub fn to_core(&self) -> kvgate_core::index::IndexConfig {
        kvgate_core::index::IndexConfig {
            shards: self.shards,
            max_entries: self.max_entries,
            default_instance_capacity: self.default_instance_capacity,
        }
    }
}

/// `[routing.tokenize]`: token-mode hashing of large prompts off the serving threads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TokenizeSection {
    /// Bodies of at least this many bytes to a token-mode pool are tokenized on a blocking
    /// thread instead of the connection's serving thread (smaller ones take less time than the
    /// hand-off).
    pub offload_min_bytes: usize,
    /// Blocking threads tokenizing at once (0 = one per available core).
    pub threads: usize,
    /// Requests waiting for a tokenizing thread, beyond which a request gets 503.
    pub max_queued: usize,
    /// Longest wait for a tokenizing thread before 503.
    pub max_wait_ms: u64,
}

impl Default for TokenizeSection {
    fn default() -> Self {
        Self {
            offload_min_bytes: 64 * 1024,
            threads: 0,
            max_queued: 256,
            max_wait_ms: 5_000,
        }
    }
}

impl TokenizeSection {
    /// Tokenizing threads in effect.
    pub fn threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

/// `[routing]` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoutingConfig {
    /// The routing policy and its parameters (`[routing.policy]`).
    pub policy: kvgate_core::policy::PolicyConfig,
    /// Prompt hashing mode.
    pub hash_mode: HashMode,
    /// Text mode: bytes per block of the canonical prompt rendering.
    pub text_block_bytes: usize,
    /// Text mode: assumed bytes per token, to estimate prompt tokens for cost scoring.
    pub text_bytes_per_token: u32,
    /// How long a routing decision counts as "the chosen instance holds these blocks" unless an
    /// engine event confirms or contradicts it.
    pub predicted_ttl_ms: u64,
    /// Recent decisions shown by `/admin/decisions`; each serving thread keeps its own newest
    /// ones (at most [`crate::decision_log::MAX_SHARDS`] logs).
    pub decision_log_size: usize,
    /// Token mode: bytes of chat-prefix token ids kept per pool so a growing conversation is
    /// tokenized only in its new text (0 disables the cache).
    pub tokenizer_cache_bytes: u64,
    /// Per-instance speed: starting values and bounds of the rates learned from observed TTFT.
    pub rates: kvgate_core::load::RateConfig,
    /// Per-instance decode speed: starting values and bounds of the step model learned from
    /// streamed responses' inter-token timing.
    pub decode_rates: kvgate_core::load::DecodeRateConfig,
    /// Expected output tokens of a request without `max_tokens` before any response has been
    /// seen; afterwards each pool's learned mean.
    pub initial_output_tokens: u32,
    /// Placement index bounds.
    pub index: IndexSection,
    /// Where large prompts are tokenized.
    pub tokenize: TokenizeSection,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            policy: kvgate_core::policy::PolicyConfig::default(),
            hash_mode: HashMode::Auto,
            text_block_bytes: 256,
            text_bytes_per_token: 4,
            predicted_ttl_ms: 120_000,
            decision_log_size: 256,
            tokenizer_cache_bytes: 256 * 1024 * 1024,
            rates: kvgate_core::load::RateConfig::default(),
            decode_rates: kvgate_core::load::DecodeRateConfig::default(),
            initial_output_tokens: 256,
            index: IndexSection::default(),
            tokenize: TokenizeSection::default(),
        }
    }
}

impl RoutingConfig {
    /// The core router's configuration: the gateway predicts and matches always.
    pub fn router_config(&self) -> kvgate_core::router::RouterConfig {
        kvgate_core::router::RouterConfig {
            predicted_ttl_ms: self.predicted_ttl_ms,
            predict: true,
            match_index: true,
            rates: self.rates.clone(),
            decode_rates: self.decode_rates.clone(),
            initial_output_tokens: f64::from(self.initial_output_tokens.max(1)),
        }
    }
}
