//! [`Instance`]: one engine endpoint the gateway routes to, and its lifecycle.
//!
//! Invariants:
//! - An instance is *serving* until it is removed (its discovery source stopped listing it),
//!   then *draining*: it takes no new requests, its in-flight requests and streams finish, and
//!   after its pool's drain grace (and once nothing of it is in flight) its slot is freed and
//!   everything learned about it is dropped.
//! - `uid` is unique for the life of the process, even when an id slot is reused: per-instance
//!   state kept outside the fleet (health streaks, warned-once flags) is keyed by it.

use super::engine::EngineCell;
use super::health::Health;
use super::Ewma;
use crate::config::{Flavour, InstanceConfig};
use crate::error::GatewayError;
use http::HeaderValue;
use kvgate_core::InstanceId;
use std::sync::atomic::{AtomicU64, Ordering};

/// One instance.
pub struct Instance {
    /// Id slot, unique among the instances present (serving or draining).
    pub id: InstanceId,
    /// Process-unique serial: never reused, unlike `id`.
    pub uid: u64,
    /// Unique name among serving instances (metric label, response header).
    pub name: String,
    /// `name` as a header value, prebuilt for the response path.
    pub name_header: HeaderValue,
    /// Index of its pool.
    pub pool: usize,
    /// `host:port`.
    pub authority: String,
    /// Reached over TLS (`https://`; `[upstream.tls]`).
    pub tls: bool,
    /// `authority` as the `Host` header of every request to it, built once.
    pub host_header: HeaderValue,
    /// Its configuration (KV event endpoints etc., read by the event ingestion).
    pub config: InstanceConfig,
    /// Engine family.
    pub flavour: Flavour,
    /// Role for disaggregated serving (`prefill`, `decode`, `both`), from a discovered pod's
    /// labels; `None` when not labelled (static instances). Shown in `/admin/instances`; routing
    /// does not use it yet.
    pub role: Option<String>,
    /// The engine's data-parallel size, from a discovered pod's labels: its KV events arrive on
    /// that many sockets (rank r on port + r). `None`: `events.dp_ranks`.
    pub dp_size: Option<u32>,
    /// Health verdicts.
    pub health: Health,
    /// Time from sending a request to its response headers.
    pub header_latency: Ewma,
    /// Time to first streamed chunk.
    pub ttft: Ewma,
    /// Last engine-reported load (staleness judged by the reader).
    pub engine: EngineCell,
    /// KV cache capacity in blocks (0 = unknown): config, else the engine's report.
    pub capacity_blocks: AtomicU64,
    /// Pre-registered metric handles.
    pub metrics: crate::metrics::InstanceMetrics,
    /// Gateway milliseconds + 1 when it was removed; 0 while serving.
    removed_at: AtomicU64,
}

impl Instance {
    /// A serving instance of pool `pool` (model `model`) in slot `id`, from its configuration.
    pub fn new(
        id: InstanceId,
        uid: u64,
        pool: usize,
        model: &str,
        flavour: Flavour,
        config: InstanceConfig,
    ) -> Result<Instance, GatewayError> {
        let (authority, tls) =
            super::parse_base_url(&config.url).map_err(GatewayError::Internal)?;
        let name = config.name.clone().unwrap_or_else(|| authority.clone());
        let name_header =
            HeaderValue::from_str(&name).map_err(|e| GatewayError::Internal(e.to_string()))?;
        let host_header =
            HeaderValue::from_str(&authority).map_err(|e| GatewayError::Internal(e.to_string()))?;
        Ok(Instance {
            id,
            uid,
            name_header,
            pool,
            authority,
            tls,
            host_header,
            flavour,
            role: None,
            dp_size: None,
            health: Health::new(),
            header_latency: Ewma::default(),
            ttft: Ewma::default(),
            engine: EngineCell::default(),
            capacity_blocks: AtomicU64::new(config.capacity_blocks.unwrap_or(0)),
            metrics: crate::metrics::InstanceMetrics::new(model, &name),
            name,
            config,
            removed_at: AtomicU64::new(0),
        })
    }

    /// Capacity in blocks, if known.
    pub fn capacity(&self) -> Option<u64> {
        match self.capacity_blocks.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    /// The identity discovery keys it by: its name and base URL.
    pub fn key(&self) -> (&str, &str) {
        (&self.name, &self.config.url)
    }

    /// True once removed (draining or gone): it takes no new requests and teaches nothing.
    pub fn is_removed(&self) -> bool {
        self.removed_at.load(Ordering::Relaxed) != 0
    }

    /// When it was removed, in gateway milliseconds.
    pub fn removed_at(&self) -> Option<u64> {
        match self.removed_at.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t - 1),
        }
    }

    pub(super) fn mark_removed(&self, now_ms: u64) {
        self.removed_at
            .store(now_ms.saturating_add(1), Ordering::Relaxed);
    }

    pub(super) fn mark_serving(&self) {
        self.removed_at.store(0, Ordering::Relaxed);
    }
}
