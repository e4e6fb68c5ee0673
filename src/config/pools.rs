//! `[[pools]]`: the instances the gateway fronts, grouped by the model they serve; and `[sim]`,
//! the embedded simulated fleet used when no pool is configured.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Which engine family an instance is: decides metric names for load scraping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Flavour {
    /// vLLM (`vllm:*` metrics). Also fine for any OpenAI-compatible server.
    #[default]
    Vllm,
    /// SGLang (`sglang:*` metrics).
    Sglang,
}

/// One `[[pools]]` entry: instances serving one model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// Model name clients send in `model`.
    pub model: String,
    /// Engine KV block size in tokens (token mode); default 16, vLLM's default.
    #[serde(default)]
    pub block_size: Option<u32>,
    /// Tokenizer for token mode: `"builtin"` (the simulator's), a Hugging Face model directory
    /// (`tokenizer.json` plus `chat_template.jinja` / `tokenizer_config.json`), or a
    /// `tokenizer.json` file. Setting it makes `hash_mode = "auto"` use token mode for this pool.
    #[serde(default)]
    pub tokenizer: Option<String>,
    /// Chat template (Jinja file) when `tokenizer` is a `tokenizer.json` file; default: the
    /// built-in template.
    #[serde(default)]
    pub chat_template: Option<PathBuf>,
    /// Engine family.
    #[serde(default)]
    pub flavour: Flavour,
    /// A discovered pool's bound on instances serving at once (default
    /// [`PoolConfig::DEFAULT_MAX_INSTANCES`]).
    #[serde(default)]
    pub max_instances: Option<usize>,
    /// The instances, for the `static` discovery source (the default); empty for `dns` and
    /// `kubernetes`, whose instances come and go while the gateway runs.
    #[serde(default)]
    pub instances: Vec<InstanceConfig>,
    /// Where the pool's instances come from (`[pools.discovery]`).
    #[serde(default)]
    pub discovery: kvgate_discovery::DiscoveryConfig,
}

impl PoolConfig {
    /// vLLM's default KV block size, used when a pool does not name one.
    pub const DEFAULT_BLOCK_SIZE: u32 = 16;

    /// Instances a discovered pool may have serving at once, unless `max_instances` says
    /// otherwise; further endpoints are left out (and logged) until others go.
    pub const DEFAULT_MAX_INSTANCES: usize = 128;

    /// True when the pool's instances are discovered while the gateway runs (not a fixed list).
    pub fn is_discovered(&self) -> bool {
        self.discovery.source != kvgate_discovery::SourceKind::Static
    }

    /// Instance slots the pool may occupy: its fixed list, or for a discovered pool twice its
    /// serving bound, so that a rolling update's draining instances fit beside their successors.
    pub fn slot_budget(&self) -> usize {
        if self.is_discovered() {
            2 * self.max_instances.unwrap_or(Self::DEFAULT_MAX_INSTANCES)
        } else {
            self.instances.len()
        }
    }

    /// The engines' KV block size in tokens: configured, else vLLM's default; never 0.
    pub fn block_size(&self) -> u32 {
        self.block_size.unwrap_or(Self::DEFAULT_BLOCK_SIZE).max(1)
    }
}

/// One instance (engine endpoint) in a pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceConfig {
    /// Unique name, used in logs, metrics labels and the `x-kvgate-instance` header.
    /// Default: the URL's `host:port`.
    #[serde(default)]
    pub name: Option<String>,
    /// Base URL, `http://host:port`.
    pub url: String,
    /// ZMQ endpoint of the engine's KV event publisher (e.g. `tcp://10.0.0.5:5557`).
    #[serde(default)]
    pub kv_events: Option<String>,
    /// ZMQ endpoint of the engine's KV event replay socket.
    #[serde(default)]
    pub kv_replay: Option<String>,
    /// KV event topic filter.
    #[serde(default)]
    pub kv_topic: Option<String>,
    /// KV cache capacity in blocks, when the engine does not report it.
    #[serde(default)]
    pub capacity_blocks: Option<u64>,
}

impl PoolConfig {
    /// A pool serving `model` on `instances`, with text-mode hashing defaults (no tokenizer, no
    /// template, the default block size) and the vLLM flavour.
    pub fn serving(model: impl Into<String>, instances: Vec<InstanceConfig>) -> Self {
        Self {
            model: model.into(),
            block_size: None,
            tokenizer: None,
            chat_template: None,
            flavour: Default::default(),
            max_instances: None,
            instances,
            discovery: Default::default(),
        }
    }
}

impl InstanceConfig {
    /// An instance at `url` named `name`, with no KV event stream and no configured capacity.
    pub fn at(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            name: Some(name.into()),
            url: url.into(),
            kv_events: None,
            kv_replay: None,
            kv_topic: None,
            capacity_blocks: None,
        }
    }
}

/// `[sim]` section: the embedded simulated fleet started when no pool is configured
/// (the simulator's own fleet configuration; its defaults live there).
pub type SimConfig = kvgate_sim::FleetConfig;
