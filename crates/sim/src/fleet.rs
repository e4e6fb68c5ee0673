//! A fleet of simulated engines in one process, each with its own port, cache, queue, metrics
//! and KV-event sockets. [`FleetConfig`] is the single place of the simulator's defaults.
//!
//! Engines may be of different classes ([`FleetConfig::fleet`], e.g. four H100s and four A100s):
//! each gets its own preset's parameters with the same [`EngineOverrides`] on top, and all of them
//! must end up with one block size, since a router pool hashes prompts in one block size.
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
use crate::fleet_mix::FleetMix;
use crate::kv_events::{BindMode, EventEncoding, PublisherConfig};
use crate::model::params::preset;
use crate::model::{EngineParams, TimingParams};
use crate::server::faults::Faults;
use crate::server::{EngineConfig, Flavour, RunningEngine};

/// Overrides of preset-derived engine parameters (unset = the preset's value). In a fleet of
/// several classes they apply to every engine, each on top of its own preset: `kv_memory_gib`
/// gives each the capacity of that memory for its own geometry, `num_gpu_blocks` gives them all
/// the same count, and `timing` replaces every engine's timing (erasing the classes' speed
/// difference).
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
    /// Number of engines (unused when `fleet` is set).
    pub engines: usize,
    /// First HTTP port (0 = OS picks every port).
    pub base_port: u16,
    /// Served model name.
    pub model: String,
    /// Model/GPU class preset of every engine (unused when `fleet` is set).
    pub preset: String,
    /// Engines of several classes, `PRESET:COUNT[,PRESET:COUNT...]`: when set, it gives the
    /// number of engines and each one's preset, in that order.
    pub fleet: Option<FleetMix>,
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
            fleet: None,
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
    /// Number of engines: the fleet's when `fleet` is set, else `engines`.
    pub fn engine_count(&self) -> usize {
        self.fleet.as_ref().map_or(self.engines, FleetMix::engines)
    }

    /// The preset of every engine, in engine order.
    pub fn engine_presets(&self) -> Vec<&str> {
        match &self.fleet {
            Some(m) => m.engine_presets(),
            None => vec![self.preset.as_str(); self.engines],
        }
    }

    /// What the fleet is made of, for logs and reports: `4 × llama3-8b-h100` or the fleet string.
    pub fn describe(&self) -> String {
        match &self.fleet {
            Some(m) => m.to_string(),
            None => format!("{} × {}", self.engines, self.preset),
        }
    }

    /// Parameters of the first engine: those of every engine unless `fleet` mixes classes (see
    /// [`FleetConfig::per_engine_params`]).
    pub fn engine_params(&self) -> Result<EngineParams, SimError> {
        let first = match &self.fleet {
            Some(m) => m
                .groups()
                .first()
                .map_or(self.preset.as_str(), |g| &g.preset),
            None => &self.preset,
        };
        self.params_for(first)
    }

    /// Every engine's preset and parameters, in engine order, validated; refuses a fleet whose
    /// engines would not share one block size.
    pub fn per_engine_params(&self) -> Result<Vec<(String, EngineParams)>, SimError> {
        if self.engine_count() > crate::fleet_mix::MAX_ENGINES {
            return Err(SimError::Config(format!(
                "engines must be in 1..={}",
                crate::fleet_mix::MAX_ENGINES
            )));
        }
        let mut by_preset: Vec<(&str, EngineParams)> = Vec::new();
        let mut out = Vec::with_capacity(self.engine_count());
        for name in self.engine_presets() {
            let p = match by_preset.iter().find(|(n, _)| *n == name) {
                Some((_, p)) => p.clone(),
                None => {
                    let p = self.params_for(name)?;
                    if let Some((other, q)) = by_preset.first() {
                        if q.block_size != p.block_size {
                            return Err(SimError::Config(format!(
                                "the engines of one fleet must share a block size (a router pool \
                                 hashes in one): {other} uses {}, {name} {}; set one with block_size \
                                 (--block-size)",
                                q.block_size, p.block_size
                            )));
                        }
                    }
                    by_preset.push((name, p.clone()));
                    p
                }
            };
            out.push((name.to_string(), p));
        }
        Ok(out)
    }

    /// Parameters of `preset_name` with the overrides applied, validated.
    pub fn params_for(&self, preset_name: &str) -> Result<EngineParams, SimError> {
        let pre = preset(preset_name).ok_or_else(|| {
            SimError::Config(format!(
                "unknown preset {preset_name:?}; known: {}",
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
        let engines = self.engine_count();
        if engines == 0 || engines > crate::fleet_mix::MAX_ENGINES {
            return Err(SimError::Config(format!(
                "engines must be in 1..={}",
                crate::fleet_mix::MAX_ENGINES
            )));
        }
        if !self.time_scale.is_finite() || self.time_scale <= 0.0 || self.time_scale > 100_000.0 {
            return Err(SimError::Config("time_scale must be in (0, 100000]".into()));
        }
        if self.base_port != 0 && u32::from(self.base_port) + engines as u32 > 65_536 {
            return Err(SimError::Config("base_port + engines exceeds 65535".into()));
        }
        if self.event_base_port != 0
            && u32::from(self.event_base_port) + 2 * engines as u32 > 65_536
        {
            return Err(SimError::Config(
                "event_base_port + 2 × engines exceeds 65535".into(),
            ));
        }
        self.per_engine_params().map(|_| ())
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
    /// The engine's preset (model/GPU class).
    #[serde(default)]
    pub preset: String,
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
        let params = cfg.per_engine_params()?;
        let mut fleet = Fleet {
            engines: Vec::with_capacity(params.len()),
            infos: Vec::new(),
        };
        for (i, (preset_name, p)) in params.iter().enumerate() {
            match start_one(&cfg, preset_name, p, tokens.clone(), i).await {
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
    preset_name: &str,
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
                u32::from(cfg.event_base_port) + (cfg.engine_count() + i) as u32
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
        preset: preset_name.to_string(),
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

    #[test]
    fn a_mixed_fleet_gives_each_engine_its_class() {
        let c: FleetConfig = serde_json::from_str(
            r#"{"engines": 3, "fleet": "llama3-8b-h100:2,llama3-8b-a100-40gb:1",
                "engine": {"num_cpu_blocks": 100}}"#,
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.engine_count(), 3);
        assert_eq!(c.describe(), "llama3-8b-h100:2,llama3-8b-a100-40gb:1");
        let p = c.per_engine_params().unwrap();
        let blocks: Vec<u32> = p.iter().map(|(_, p)| p.num_gpu_blocks).collect();
        assert_eq!(blocks, [24_576, 24_576, 8_192]);
        assert!(p.iter().all(|(_, p)| p.num_cpu_blocks == 100));
        assert!(p[2].1.timing.prefill_us_per_token > p[0].1.timing.prefill_us_per_token);
        assert_eq!(p[2].0, "llama3-8b-a100-40gb");
        // Memory overrides derive each class's capacity from its own geometry.
        let mut half = c.clone();
        half.engine.kv_memory_gib = Some(8.0);
        let p = half.per_engine_params().unwrap();
        assert!(p.iter().all(|(_, p)| p.num_gpu_blocks == 4_096));
        // Engines of one fleet share a block size.
        let mut mixed_blocks = c.clone();
        mixed_blocks.fleet = Some("llama3-8b-h100:1,tiny-cpu:1".parse().unwrap());
        let e = mixed_blocks.validate().unwrap_err().to_string();
        assert!(e.contains("block size") && e.contains("tiny-cpu"), "{e}");
        mixed_blocks.engine.block_size = Some(32);
        mixed_blocks.validate().unwrap();
        // Without a fleet, engines and preset decide, as before.
        let plain = FleetConfig::default();
        assert_eq!(plain.engine_presets(), ["llama3-8b-h100"; 4]);
        assert_eq!(plain.describe(), "4 × llama3-8b-h100");
        let e = serde_json::from_str::<FleetConfig>(r#"{"fleet": "h100:4"}"#).unwrap_err();
        assert!(e.to_string().contains("unknown preset"), "{e}");
    }
}
