//! The instances the gateway fronts: pools by model, health, latency, engine-reported load and the
//! union of their `/v1/models`.
//!
//! Invariants:
//! - Instance ids are dense (`0..n`) in configuration order and never change while the process
//!   lives; per-instance state lives in a `Vec` indexed by them.
//! - The request path only reads atomics and short locks here; all probing (health checks, metric
//!   scrapes, model lists) runs in background tasks ([`tasks`]) with timeouts.

pub mod engine;
pub mod health;
pub mod models;
pub mod scrape;
pub mod tasks;

use crate::config::{Config, Flavour, InstanceConfig, PoolConfig};
use crate::error::GatewayError;
use ahash::AHashMap;
use http::HeaderValue;
use kvgate_core::InstanceId;
use parking_lot::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

pub use health::Health;

/// Parses an instance base URL (`http://host:port`, optional trailing `/`); returns `host:port`.
pub fn parse_base_url(url: &str) -> Result<String, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => {
            return Err(format!(
                "scheme `{other}` is not supported (use http:// to reach instances)"
            ))
        }
        None => return Err(format!("`{url}` has no scheme; write http://{url}")),
    }
    let Some(authority) = uri.authority() else {
        return Err(format!("`{url}` has no host"));
    };
    if uri.path() != "/" && !uri.path().is_empty() {
        return Err(format!(
            "`{url}` has a path; give only http://host:port (paths like /v1 are added per request)"
        ));
    }
    if authority.port_u16().is_none() {
        return Err(format!("`{url}` has no port"));
    }
    Ok(authority.as_str().to_string())
}

/// An exponentially weighted moving average of milliseconds, updated lock-free.
#[derive(Debug, Default)]
pub struct Ewma {
    bits: AtomicU64,
}

impl Ewma {
    /// Weight of a new observation.
    const ALPHA: f64 = 0.2;

    /// Folds in one observation. Concurrent updates may lose one; acceptable for an average.
    pub fn observe(&self, ms: f64) {
        let old = f64::from_bits(self.bits.load(Ordering::Relaxed));
        let new = if old == 0.0 {
            ms
        } else {
            old + Self::ALPHA * (ms - old)
        };
        self.bits.store(new.to_bits(), Ordering::Relaxed);
    }
    /// The current average, or `None` before any observation.
    pub fn get(&self) -> Option<f64> {
        let v = f64::from_bits(self.bits.load(Ordering::Relaxed));
        (v != 0.0).then_some(v)
    }
}

/// One instance.
pub struct Instance {
    /// Dense id.
    pub id: InstanceId,
    /// Unique name (metric label, response header).
    pub name: String,
    /// `name` as a header value, prebuilt for the response path.
    pub name_header: HeaderValue,
    /// Index of its pool.
    pub pool: usize,
    /// `host:port`.
    pub authority: String,
    /// `authority` as the `Host` header of every request to it, built once.
    pub host_header: HeaderValue,
    /// Its configuration (KV event endpoints etc., read by the event ingestion).
    pub config: InstanceConfig,
    /// Engine family.
    pub flavour: Flavour,
    /// Health verdicts.
    pub health: Health,
    /// Time from sending a request to its response headers.
    pub header_latency: Ewma,
    /// Time to first streamed chunk.
    pub ttft: Ewma,
    /// Last engine-reported load (staleness judged by the reader).
    pub engine: engine::EngineCell,
    /// KV cache capacity in blocks (0 = unknown): config, else the engine's report.
    pub capacity_blocks: AtomicU64,
    /// Pre-registered metric handles.
    pub metrics: crate::metrics::InstanceMetrics,
}

impl Instance {
    /// Capacity in blocks, if known.
    pub fn capacity(&self) -> Option<u64> {
        match self.capacity_blocks.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }
}

/// One pool: the instances serving one model.
#[derive(Debug)]
pub struct Pool {
    /// Index in [`Fleet::pools`].
    pub index: usize,
    /// The served model name.
    pub model: String,
    /// Its members.
    pub instances: Vec<InstanceId>,
    /// Its configuration.
    pub config: PoolConfig,
}

/// All pools and instances.
pub struct Fleet {
    pools: Vec<Pool>,
    instances: Vec<Instance>,
    by_model: AHashMap<String, usize>,
    /// Model ids instances list in `/v1/models` beyond their pool's model (LoRA adapters,
    /// aliases) → pool. Replaced wholesale by the models refresher.
    discovered: RwLock<AHashMap<String, usize>>,
    /// The cached `/v1/models` answer.
    models: models::ModelsCache,
}

impl Fleet {
    /// Builds the fleet from validated config.
    pub fn new(cfg: &Config) -> Result<Fleet, GatewayError> {
        let mut pools = Vec::with_capacity(cfg.pools.len());
        let mut instances = Vec::new();
        let mut by_model = AHashMap::new();
        for (p, pc) in cfg.pools.iter().enumerate() {
            let mut members = Vec::with_capacity(pc.instances.len());
            for ic in &pc.instances {
                let authority = parse_base_url(&ic.url).map_err(GatewayError::Internal)?;
                let name = ic.name.clone().unwrap_or_else(|| authority.clone());
                let name_header = HeaderValue::from_str(&name)
                    .map_err(|e| GatewayError::Internal(e.to_string()))?;
                let host_header = HeaderValue::from_str(&authority)
                    .map_err(|e| GatewayError::Internal(e.to_string()))?;
                let id = InstanceId(instances.len() as u32);
                members.push(id);
                instances.push(Instance {
                    id,
                    name_header,
                    pool: p,
                    authority,
                    host_header,
                    config: ic.clone(),
                    flavour: pc.flavour,
                    health: Health::new(),
                    header_latency: Ewma::default(),
                    ttft: Ewma::default(),
                    engine: engine::EngineCell::default(),
                    capacity_blocks: AtomicU64::new(ic.capacity_blocks.unwrap_or(0)),
                    metrics: crate::metrics::InstanceMetrics::new(&pc.model, &name),
                    name,
                });
            }
            by_model.insert(pc.model.clone(), p);
            pools.push(Pool {
                index: p,
                model: pc.model.clone(),
                instances: members,
                config: pc.clone(),
            });
        }
        let models = models::ModelsCache::new(&pools);
        Ok(Fleet {
            pools,
            instances,
            by_model,
            discovered: RwLock::new(AHashMap::new()),
            models,
        })
    }

    /// All pools.
    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    /// All instances, indexed by id.
    pub fn instances(&self) -> &[Instance] {
        &self.instances
    }

    /// The instance with `id`.
    pub fn instance(&self, id: InstanceId) -> &Instance {
        &self.instances[id.index()]
    }

    /// The pool serving `model`. Without a model: the only pool, or an error when several exist.
    pub fn pool_for(&self, model: Option<&str>) -> Result<&Pool, GatewayError> {
        match model {
            Some(m) => {
                if let Some(&p) = self.by_model.get(m) {
                    return Ok(&self.pools[p]);
                }
                match self.discovered.read().get(m) {
                    Some(&p) => Ok(&self.pools[p]),
                    None => Err(GatewayError::UnknownModel(m.to_string())),
                }
            }
            None if self.pools.len() == 1 => Ok(&self.pools[0]),
            None => Err(GatewayError::ModelRequired),
        }
    }

    /// True when at least one instance is usable now.
    pub fn any_usable(&self, now_ms: u64) -> bool {
        self.instances.iter().any(|i| i.health.usable(now_ms))
    }

    /// The cached `/v1/models` body.
    pub fn models_json(&self) -> bytes::Bytes {
        self.models.get()
    }

    pub(crate) fn models_cache(&self) -> &models::ModelsCache {
        &self.models
    }

    pub(crate) fn set_discovered(&self, map: AHashMap<String, usize>) {
        *self.discovered.write() = map;
    }
}
