//! Engine KV event ingestion wired to the fleet: one `kvgate_events` source per serving instance
//! that sets `kv_events`, feeding the routing index; started and stopped with the instance as
//! discovery adds and removes it.
//!
//! Invariants: ingestion starts with the background tasks and stops with them; it never runs on
//! the request path (handlers only bump a dispatch counter); its per-stream state is shown in
//! `/admin/index` under `events`.

use crate::app::AppState;
use crate::config::Flavour;
use crate::fleet::{Fleet, Instance};
use kvgate_core::InstanceId;
use kvgate_events::{Dialect, EventSource, EventsHandle, StreamStatus};
use std::sync::{Arc, OnceLock};
use tokio_util::sync::CancellationToken;

/// The running ingestion, set once when the background tasks start.
#[derive(Default)]
pub struct Events(OnceLock<EventsHandle>);

impl Events {
    /// Counts a request dispatched to `instance` (silence detection). One atomic add.
    pub fn note_dispatch(&self, instance: InstanceId) {
        if let Some(h) = self.0.get() {
            h.note_dispatch(instance);
        }
    }

    /// Per-stream status, in configuration order (empty when no instance has `kv_events`).
    pub fn status(&self) -> Vec<StreamStatus> {
        self.0.get().map(EventsHandle::status).unwrap_or_default()
    }

    fn stop(&self) {
        if let Some(h) = self.0.get() {
            h.stop();
        }
    }
}

/// The event source of `inst`, if it has `kv_events`: hashed under its pool's model and block
/// size, one stream per data-parallel rank (the instance's own `dp_size`, else
/// `default_dp_ranks`).
pub fn source(fleet: &Fleet, inst: &Instance, default_dp_ranks: u32) -> Option<EventSource> {
    let endpoint = inst.config.kv_events.as_ref()?;
    let pool = &fleet.pools()[inst.pool];
    // Same default as routing's token mode (vLLM's default block size).
    let block_size = pool.config.block_size();
    let mut src = EventSource::new(inst.id, &inst.name, endpoint, &pool.model, block_size);
    src.replay_endpoint = inst.config.kv_replay.clone();
    src.topic = inst.config.kv_topic.clone().unwrap_or_default();
    src.dp_ranks = inst.dp_size.unwrap_or(default_dp_ranks);
    src.dialect = match inst.flavour {
        Flavour::Vllm => Dialect::Vllm,
        Flavour::Sglang => Dialect::Sglang,
    };
    Some(src)
}

/// The event sources of `fleet`'s serving instances.
pub fn sources(fleet: &Fleet, default_dp_ranks: u32) -> Vec<EventSource> {
    fleet
        .view()
        .serving()
        .filter_map(|i| source(fleet, i, default_dp_ranks))
        .collect()
}

impl Events {
    /// Starts ingestion for an instance discovery added (nothing without `kv_events`, or before
    /// the background tasks started).
    pub fn add(&self, fleet: &Fleet, inst: &Instance, default_dp_ranks: u32) {
        let (Some(h), Some(src)) = (self.0.get(), source(fleet, inst, default_dp_ranks)) else {
            return;
        };
        if let Err(e) = h.add(src) {
            tracing::error!(instance = %inst.name, error = %e, "KV event ingestion not started");
        }
    }

    /// Stops ingestion for a removed instance.
    pub fn remove(&self, instance: InstanceId) {
        if let Some(h) = self.0.get() {
            h.remove(instance);
        }
    }
}

/// Starts ingestion for `state`'s fleet; it stops when `token` is cancelled. Runs even with no
/// source yet: discovery may add instances with `kv_events` later.
pub fn spawn(state: &AppState, token: CancellationToken) -> Option<tokio::task::JoinHandle<()>> {
    let sources = sources(&state.fleet, state.config.events.dp_ranks);
    let clock = state.clock;
    let handle = EventsHandle::start(
        &state.config.events,
        sources,
        state.routing.index().clone(),
        Arc::new(move || clock.now_ms()),
    );
    match handle {
        Ok(h) => {
            if state.events.0.set(h).is_err() {
                tracing::warn!("KV event ingestion already running");
                return None;
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "KV event ingestion not started");
            return None;
        }
    }
    let state = state.clone();
    Some(tokio::spawn(async move {
        token.cancelled().await;
        state.events.stop();
    }))
}
