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
    /// The instances.
    pub instances: Vec<InstanceConfig>,
}

impl PoolConfig {
    /// vLLM's default KV block size, used when a pool does not name one.
    pub const DEFAULT_BLOCK_SIZE: u32 = 16;

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
            instances,
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
