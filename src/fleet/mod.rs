//! The instances the gateway fronts: pools by model, health, latency, engine-reported load and the
//! union of their `/v1/models`. Pools are fixed by the configuration; their instances come and go
//! with discovery ([`membership`]).
//!
//! Invariants:
//! - The membership is an immutable [`FleetView`] swapped whole (`arc-swap`): the request path
//!   reads it lock-free and sees one consistent version; changes are serialised.
//! - Instance ids are slots below [`Fleet::capacity`]: static pools' instances take `0..n` in
//!   configuration order; a discovered instance takes the lowest free slot. A slot is reused only
//!   once its previous instance drained and everything learned about it was dropped.
//! - The request path only reads atomics and short locks here; all probing (health checks, metric
//!   scrapes, model lists) runs in background tasks ([`tasks`]) with timeouts.

pub mod engine;
pub mod health;
pub mod instance;
pub mod membership;
pub mod models;
pub mod retired;
pub mod scrape;
pub mod tasks;
pub mod view;

use crate::config::{Config, PoolConfig};
use crate::error::GatewayError;
use ahash::AHashMap;
use arc_swap::ArcSwap;
use kvgate_core::InstanceId;
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use health::Health;
pub use instance::Instance;
pub use view::FleetView;

/// Parses an instance base URL (`http://host:port` or `https://host:port`, optional trailing
/// `/`); returns `host:port` and whether it is `https`.
pub fn parse_base_url(url: &str) -> Result<(String, bool), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        Some(other) => {
            return Err(format!(
                "scheme `{other}` is not supported (use http:// or https:// to reach instances)"
            ))
        }
        None => return Err(format!("`{url}` has no scheme; write http://{url}")),
    };
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
    Ok((authority.as_str().to_string(), https))
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

/// One pool: the instances serving one model. Its members change with discovery: read them
/// from a [`FleetView`].
#[derive(Debug)]
pub struct Pool {
    /// Index in [`Fleet::pools`].
    pub index: usize,
    /// The served model name.
    pub model: String,
    /// Its configuration.
    pub config: PoolConfig,
}

/// All pools, and the instances serving them now.
pub struct Fleet {
    pools: Vec<Pool>,
    by_model: AHashMap<String, usize>,
    /// Model ids instances list in `/v1/models` beyond their pool's model (LoRA adapters,
    /// aliases) → pool. Replaced wholesale by the models refresher.
    discovered: RwLock<AHashMap<String, usize>>,
    /// The cached `/v1/models` answer.
    models: models::ModelsCache,
    /// The current membership, swapped whole on every change.
    view: ArcSwap<FleetView>,
    /// Id slots in all: the routing core's per-instance state is sized by it.
    capacity: usize,
    /// Serialises membership changes (readers never take it).
    edit: Mutex<()>,
    next_uid: AtomicU64,
    /// Names of freed instances, left out of `/metrics`.
    retired: retired::RetiredNames,
}

impl Fleet {
    /// Builds the fleet from validated config: the static pools' instances, in configuration
    /// order from id 0; discovered pools start empty.
    pub fn new(cfg: &Config) -> Result<Fleet, GatewayError> {
        let mut pools = Vec::with_capacity(cfg.pools.len());
        let mut slots = Vec::new();
        let mut members = Vec::with_capacity(cfg.pools.len());
        let mut by_model = AHashMap::new();
        for (p, pc) in cfg.pools.iter().enumerate() {
            let mut pool_members = Vec::with_capacity(pc.instances.len());
            for ic in &pc.instances {
                let id = InstanceId(slots.len() as u32);
                let uid = slots.len() as u64;
                slots.push(Some(Arc::new(Instance::new(
                    id,
                    uid,
                    p,
                    &pc.model,
                    pc.flavour,
                    ic.clone(),
                )?)));
                pool_members.push(id);
            }
            members.push(pool_members);
            by_model.insert(pc.model.clone(), p);
            pools.push(Pool {
                index: p,
                model: pc.model.clone(),
                config: pc.clone(),
            });
        }
        let capacity = cfg
            .pools
            .iter()
            .map(PoolConfig::slot_budget)
            .sum::<usize>()
            .min(kvgate_core::index::MAX_INSTANCES);
        let models = models::ModelsCache::new(&pools);
        let next_uid = AtomicU64::new(slots.len() as u64);
        Ok(Fleet {
            pools,
            by_model,
            discovered: RwLock::new(AHashMap::new()),
            models,
            view: ArcSwap::from_pointee(FleetView {
                version: 0,
                slots,
                members,
            }),
            capacity,
            edit: Mutex::new(()),
            next_uid,
            retired: retired::RetiredNames::default(),
        })
    }

    /// Names of instances freed from the fleet (none of that name is in it now), whose series
    /// `/metrics` leaves out.
    pub fn retired(&self) -> &retired::RetiredNames {
        &self.retired
    }

    /// All pools.
    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    /// The current membership, for a short read (a decision, a probing round).
    pub fn view(&self) -> arc_swap::Guard<Arc<FleetView>> {
        self.view.load()
    }

    /// The current membership, to hold across awaits.
    pub fn snapshot(&self) -> Arc<FleetView> {
        self.view.load_full()
    }

    /// The instance in slot `id` now (serving or draining), to hold for a request's life.
    pub fn instance(&self, id: InstanceId) -> Option<Arc<Instance>> {
        self.view.load().instance(id).cloned()
    }

    /// Id slots in all: every [`InstanceId`] the fleet hands out is below it.
    pub fn capacity(&self) -> usize {
        self.capacity
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

    /// True when at least one serving instance is usable now.
    pub fn any_usable(&self, now_ms: u64) -> bool {
        self.view().serving().any(|i| i.health.usable(now_ms))
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
