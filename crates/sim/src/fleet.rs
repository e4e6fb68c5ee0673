//! A fleet of simulated engines in one process, each with its own port, cache, queue, metrics
//! and KV-event sockets. [`FleetConfig`] is the single place of the simulator's defaults.
//!
//! Ports: HTTP on `base_port + i` (or OS-chosen with 0); KV events on `event_base_port + i` and
//! replay on `event_base_port + engines + i` (or OS-chosen with 0), all bound on 127.0.0.1. With
//! `kv_events_endpoint`, engine `i` publishes to that vLLM-style endpoint with its port + `i`
//! (vLLM's data-parallel rule), bound or connected by vLLM's rule.

use std::path::PathBuf;
use std::sync::Arc;

use kvgate_tokenizer::TokenMode;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use crate::error::SimError;
use crate::kv_events::{BindMode, EventEncoding, PublisherConfig};
use crate::model::params::preset;
use crate::model::{EngineParams, TimingParams};
use crate::server::faults::Faults;
use crate::server::{EngineConfig, Flavour, RunningEngine};

/// Overrides of preset-derived engine parameters (unset = the preset's value).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineOverrides {
    /// Tokens per block.
    pub block_size: Option<u32>,
    /// GPU blocks, given directly.
    pub num_gpu_blocks: Option<u32>,
    /// KV memory in GiB; capacity then comes from the preset's geometry.
    pub kv_memory_gib: Option<f64>,
    /// CPU offload blocks.
    pub num_cpu_blocks: Option<u32>,
    /// `max_num_seqs`.
    pub max_num_seqs: Option<u32>,
    /// `max_num_batched_tokens`.
    pub max_num_batched_tokens: Option<u32>,
    /// `max_model_len`.
    pub max_model_len: Option<u32>,
    /// Waiting-queue bound.
    pub max_waiting: Option<u32>,
    /// Timing coefficients.
    pub timing: Option<TimingParams>,
}

/// Fleet settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetConfig {
    /// Number of engines.
    pub engines: usize,
    /// First HTTP port (0 = OS picks every port).
    pub base_port: u16,
    /// Served model name.
    pub model: String,
    /// Model/GPU class preset.
    pub preset: String,
    /// vLLM or SGLang flavour.
    pub flavour: Flavour,
    /// Divides every duration (10 = ten times faster than real).
    pub time_scale: f64,
    /// Publish KV events over ZMQ.
    pub kv_events: bool,
    /// Event encoding.
    pub event_encoding: EventEncoding,
    /// First KV-event port (0 = OS picks).
    pub event_base_port: u16,
    /// Open a replay ROUTER socket per engine.
    pub replay: bool,
    /// vLLM-style endpoint template instead of 127.0.0.1 ports (e.g. `tcp://*:5557`).
    pub kv_events_endpoint: Option<String>,
    /// Event topic.
    pub topic: String,
    /// Parameter overrides.
    pub engine: EngineOverrides,
    /// Seed of generated text and fault dice (engine `i` uses `seed + i`).
    pub seed: u64,
    /// Model directory with `tokenizer.json` (and chat template); none = built-in tokenizer.
    pub tokenizer_dir: Option<PathBuf>,
    /// Output length when a request sets no `max_tokens`.
    pub default_max_tokens: u32,
    /// Faults at start.
    pub faults: Faults,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            engines: 4,
            base_port: 0,
            model: "kvgate-sim".to_string(),
            preset: "llama3-8b-h100".to_string(),
            flavour: Flavour::Vllm,
            time_scale: 1.0,
            kv_events: true,
            event_encoding: EventEncoding::Map,
            event_base_port: 0,
            replay: true,
            kv_events_endpoint: None,
            topic: String::new(),
            engine: EngineOverrides::default(),
            seed: 0,
            tokenizer_dir: None,
            default_max_tokens: 16,
            faults: Faults::default(),
        }
    }
}

impl FleetConfig {
    /// Engine parameters: the preset with the overrides applied, validated.
    pub fn engine_params(&self) -> Result<EngineParams, SimError> {
        let pre = preset(&self.preset).ok_or_else(|| {
            SimError::Config(format!(
                "unknown preset {:?}; known: {}",
                self.preset,
                crate::model::PRESET_NAMES.join(", ")
            ))
        })?;
        let mut p = pre.params();
        let o = &self.engine;
        if let Some(bs) = o.block_size {
            p.block_size = bs;
            if pre.num_gpu_blocks_override.is_none() {
                p.num_gpu_blocks = pre
                    .geometry
                    .capacity_blocks(pre.kv_memory_bytes, bs.max(1))
                    .min(u64::from(u32::MAX)) as u32;
            }
        }
        if let Some(gib) = o.kv_memory_gib {
            if !gib.is_finite() || gib <= 0.0 {
                return Err(SimError::Config("kv_memory_gib must be > 0".into()));
            }
            let bytes = (gib * (1u64 << 30) as f64) as u64;
            p.num_gpu_blocks = pre
                .geometry
                .capacity_blocks(bytes, p.block_size)
                .min(u64::from(u32::MAX)) as u32;
        }
        if let Some(v) = o.num_gpu_blocks {
            p.num_gpu_blocks = v;
        }
        if let Some(v) = o.num_cpu_blocks {
            p.num_cpu_blocks = v;
        }
        if let Some(v) = o.max_num_seqs {
            p.max_num_seqs = v;
        }
        if let Some(v) = o.max_num_batched_tokens {
            p.max_num_batched_tokens = v;
        }
        if let Some(v) = o.max_model_len {
            p.max_model_len = v;
        }
        if let Some(v) = o.max_waiting {
            p.max_waiting = v;
        }
        if let Some(t) = &o.timing {
            p.timing = t.clone();
        }
        p.validate()?;
        Ok(p)
    }

    /// Checks the whole configuration.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.engines == 0 || self.engines > 1024 {
            return Err(SimError::Config("engines must be in 1..=1024".into()));
        }
        if !self.time_scale.is_finite() || self.time_scale <= 0.0 || self.time_scale > 100_000.0 {
            return Err(SimError::Config("time_scale must be in (0, 100000]".into()));
        }
        if self.base_port != 0 && u32::from(self.base_port) + self.engines as u32 > 65_536 {
            return Err(SimError::Config("base_port + engines exceeds 65535".into()));
        }
        if self.event_base_port != 0
            && u32::from(self.event_base_port) + 2 * self.engines as u32 > 65_536
        {
            return Err(SimError::Config(
                "event_base_port + 2 × engines exceeds 65535".into(),
            ));
        }
        self.engine_params().map(|_| ())
    }
}

/// What a client needs to know about one simulated engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimInstanceInfo {
    /// Instance name (`sim-0`, ...).
    pub name: String,
    /// Base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    /// Served model.
    pub model: String,
    /// Tokens per block.
    pub block_size: u32,
    /// KV-event PUB endpoint (subscribers connect here when it was bound).
    pub kv_events_endpoint: Option<String>,
    /// Replay ROUTER endpoint.
    pub replay_endpoint: Option<String>,
    /// GPU capacity in blocks.
    pub capacity_blocks: u64,
}

/// A running fleet.
pub struct Fleet {
    engines: Vec<RunningEngine>,
    infos: Vec<SimInstanceInfo>,
}

/// Loads the tokenizer a fleet config asks for.
pub fn load_tokens(dir: Option<&std::path::Path>) -> Result<TokenMode, SimError> {
    match dir {
        Some(d) => TokenMode::from_model_dir(d)
            .map_err(|e| SimError::Tokenizer(format!("{}: {e}", d.display()))),
        None => TokenMode::builtin().map_err(|e| SimError::Tokenizer(e.to_string())),
    }
}

fn port_in(endpoint: &str) -> Option<(String, u16)> {
    let (head, port) = endpoint.rsplit_once(':')?;
    Some((head.to_string(), port.parse().ok()?))
}

impl Fleet {
    /// Starts every engine; on error, the ones already started are stopped.
    pub async fn start(cfg: FleetConfig) -> Result<Fleet, SimError> {
        let tokens = Arc::new(load_tokens(cfg.tokenizer_dir.as_deref())?);
        Self::start_with_tokens(cfg, tokens).await
    }

    /// Like [`Fleet::start`], with a tokenizer the caller already holds (`tokenizer_dir` is then
    /// ignored), so a gateway and its embedded fleet share one.
    pub async fn start_with_tokens(
        cfg: FleetConfig,
        tokens: Arc<TokenMode>,
    ) -> Result<Fleet, SimError> {
        cfg.validate()?;
        let params = cfg.engine_params()?;
        let mut fleet = Fleet {
            engines: Vec::with_capacity(cfg.engines),
            infos: Vec::new(),
        };
        for i in 0..cfg.engines {
            match start_one(&cfg, &params, tokens.clone(), i).await {
                Ok((e, info)) => {
                    fleet.engines.push(e);
                    fleet.infos.push(info);
                }
                Err(err) => {
                    fleet.shutdown().await;
                    return Err(err);
                }
            }
        }
        Ok(fleet)
    }

    /// The engines, in order.
    pub fn instances(&self) -> Vec<SimInstanceInfo> {
        self.infos.clone()
    }

    /// The running engines (for in-process inspection).
    pub fn engines(&self) -> &[RunningEngine] {
        &self.engines
    }

    /// Stops every engine.
    pub async fn shutdown(self) {
        self.shutdown_checked().await;
    }

    /// Stops every engine, all at once; returns how many engine loops failed to stop within
    /// [`crate::server::LOOP_STOP_TIMEOUT`] (0 on a clean shutdown).
    pub async fn shutdown_checked(self) -> usize {
        let stops = self.engines.into_iter().map(RunningEngine::shutdown);
        futures_util::future::join_all(stops)
            .await
            .into_iter()
            .filter(|stopped| !stopped)
            .count()
    }
}

async fn start_one(
    cfg: &FleetConfig,
    params: &EngineParams,
    tokens: Arc<TokenMode>,
    i: usize,
) -> Result<(RunningEngine, SimInstanceInfo), SimError> {
    let port = if cfg.base_port == 0 {
        0
    } else {
        cfg.base_port + i as u16
    };
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let kv_events = if cfg.kv_events {
        let (endpoint, mode) = match &cfg.kv_events_endpoint {
            Some(t) => {
                let (head, p) = port_in(t)
                    .ok_or_else(|| SimError::Config(format!("bad kv_events_endpoint {t:?}")))?;
                (
                    format!("{head}:{}", u32::from(p) + i as u32),
                    BindMode::Auto,
                )
            }
            None => {
                let p = if cfg.event_base_port == 0 {
                    0
                } else {
                    u32::from(cfg.event_base_port) + i as u32
                };
                (format!("tcp://127.0.0.1:{p}"), BindMode::Bind)
            }
        };
        let replay_endpoint = cfg.replay.then(|| {
            let p = if cfg.event_base_port == 0 {
                0
            } else {
                u32::from(cfg.event_base_port) + (cfg.engines + i) as u32
            };
            format!("tcp://127.0.0.1:{p}")
        });
        Some(PublisherConfig {
            endpoint,
            mode,
            replay_endpoint,
            topic: cfg.topic.clone(),
            encoding: cfg.event_encoding,
            buffer_steps: 10_000,
            dp_rank: Some(0),
            queue: 4096,
        })
    } else {
        None
    };
    let name = format!("sim-{i}");
    let ecfg = EngineConfig {
        name: name.clone(),
        model: cfg.model.clone(),
        flavour: cfg.flavour,
        params: params.clone(),
        time_scale: cfg.time_scale,
        seed: cfg.seed.wrapping_add(i as u64),
        kv_events,
        faults: cfg.faults.clone(),
        tokens,
        default_max_tokens: cfg.default_max_tokens,
        queue: params.max_waiting as usize + 64,
    };
    let engine = RunningEngine::start(ecfg, listener).await?;
    let info = SimInstanceInfo {
        name,
        url: format!("http://{}", engine.addr),
        model: cfg.model.clone(),
        block_size: params.block_size,
        kv_events_endpoint: engine.publisher.as_ref().map(|p| p.endpoint().to_string()),
        replay_endpoint: engine
            .publisher
            .as_ref()
            .and_then(|p| p.replay_endpoint().map(str::to_string)),
        capacity_blocks: u64::from(params.num_gpu_blocks),
    };
    Ok((engine, info))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let c = FleetConfig::default();
        assert_eq!(c.engine_params().unwrap().num_gpu_blocks, 24_576);
        let mut c = FleetConfig::default();
        c.engine.kv_memory_gib = Some(24.0);
        assert_eq!(c.engine_params().unwrap().num_gpu_blocks, 12_288);
        c.engine.block_size = Some(32);
        assert_eq!(c.engine_params().unwrap().num_gpu_blocks, 6_144);
        c.preset = "nope".into();
        assert!(c.validate().is_err());
        let r: Result<FleetConfig, _> = serde_json::from_str(r#"{"engines": 2, "nope": 1}"#);
        assert!(r.is_err());
    }
}
