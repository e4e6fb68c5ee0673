//! The live fleet: each discovered pool follows the endpoint sets its discovery source publishes
//! (`kvgate_discovery`), and what lives beside an instance starts and stops with it.
//!
//! - **Added** (a new endpoint): it serves at once (new instances start healthy, so a pod that
//!   turned ready takes traffic on the next request); its KV event ingestion starts; gossip
//!   peers learn its name.
//! - **Removed** (no longer listed: scaled down, not ready, terminating): it takes no new requests;
//!   requests and streams under way finish on it; its event ingestion stops and gossip forgets it.
//! - **Freed** (drain grace over, nothing in flight): its index entries, capacity and learned
//!   rates are dropped and its id slot may go to a new instance.
//!
//! Invariants:
//! - A source failure keeps the membership as it was (the source keeps its last set and reports
//!   the error); only a successful look at the backend removes instances.
//! - Membership changes are serialised in [`crate::fleet::Fleet`]; this module only reacts to
//!   them, off the request path.

use crate::app::AppState;
use crate::fleet::{tasks, Instance};
use crate::metrics;
use kvgate_discovery::EndpointSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How often drained instances are looked for.
const SWEEP_INTERVAL: Duration = Duration::from_millis(500);

/// Starts following every discovered pool's source, and the sweep of drained instances; they
/// stop when `token` is cancelled.
pub fn spawn(state: &AppState, token: CancellationToken) -> Vec<tokio::task::JoinHandle<()>> {
    let mut handles = Vec::new();
    let mut any = false;
    for pool in state.fleet.pools() {
        if !pool.config.is_discovered() {
            // Its instances never change: sized once, so that dashboards and alerts over
            // `kvgate_pool_instances` see every pool.
            publish_sizes(state, pool.index);
            continue;
        }
        any = true;
        if let Some(rx) = state.take_source(pool.index) {
            handles.push(follow(state.clone(), pool.index, rx, token.clone()));
            continue;
        }
        match crate::discovery::start(&pool.config.discovery, token.clone()) {
            Ok((rx, task)) => {
                handles.push(task);
                handles.push(follow(state.clone(), pool.index, rx, token.clone()));
            }
            Err(e) => {
                metrics::set_discovery_up(&pool.model, false);
                tracing::error!(pool = %pool.model, error = %e, "discovery not started: the pool has no instances");
            }
        }
    }
    if any {
        handles.push(tokio::spawn(sweep_loop(state.clone(), token)));
    }
    handles
}

/// Follows the endpoint sets on `rx` for `pool` until `token` is cancelled or the source ends.
pub fn follow(
    state: AppState,
    pool: usize,
    mut rx: watch::Receiver<EndpointSet>,
    token: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last_error: Option<String> = None;
        loop {
            let set = rx.borrow_and_update().clone();
            apply(&state, pool, &set, &mut last_error);
            tokio::select! {
                _ = token.cancelled() => return,
                changed = rx.changed() => if changed.is_err() { return },
            }
        }
    })
}

/// Applies one endpoint set to `pool`.
pub fn apply(state: &AppState, pool: usize, set: &EndpointSet, last_error: &mut Option<String>) {
    let Some(p) = state.fleet.pools().get(pool) else {
        return;
    };
    let model = p.model.as_str();
    metrics::set_discovery_up(model, set.error.is_none());
    if set.error != *last_error {
        match &set.error {
            Some(e) => {
                tracing::warn!(pool = %model, error = %e, "discovery failing; keeping the last known instances")
            }
            None if last_error.is_some() => tracing::info!(pool = %model, "discovery recovered"),
            None => {}
        }
        last_error.clone_from(&set.error);
    }
    let now = state.clock.now_ms();
    let change = state.fleet.reconcile(pool, &set.endpoints, now);
    for (name, why) in &change.refused {
        tracing::warn!(pool = %model, endpoint = %name, "endpoint left out: {why}");
    }
    metrics::record_discovery_changes(model, "refused", change.refused.len());
    for (name, other) in &change.other_model {
        tracing::debug!(pool = %model, endpoint = %name, model = %other, "endpoint labelled for another model: not this pool's");
    }
    metrics::record_discovery_changes(model, "other_model", change.other_model.len());
    if change.is_empty() {
        return;
    }
    for inst in change.added.iter().chain(&change.revived) {
        start_instance(state, inst);
    }
    for inst in &change.removed {
        stop_instance(state, inst);
    }
    metrics::record_discovery_changes(model, "added", change.added.len());
    metrics::record_discovery_changes(model, "revived", change.revived.len());
    metrics::record_discovery_changes(model, "removed", change.removed.len());
    publish_sizes(state, pool);
    tracing::info!(
        pool = %model,
        version = set.version,
        added = change.added.len(),
        revived = change.revived.len(),
        removed = change.removed.len(),
        serving = state.fleet.view().members(pool).len(),
        "fleet changed"
    );
}

fn start_instance(state: &AppState, inst: &Arc<Instance>) {
    tasks::announce(inst, &state.config, state.routing.index());
    state
        .events
        .add(&state.fleet, inst, state.config.events.dp_ranks);
    if let Some(g) = state.routing.gossip() {
        g.directory()
            .insert(inst.id, &crate::app::gossip_name(&state.fleet, inst));
    }
    tracing::info!(instance = %inst.name, url = %inst.config.url, id = inst.id.0, "instance serving");
}

fn stop_instance(state: &AppState, inst: &Arc<Instance>) {
    state.events.remove(inst.id);
    if let Some(g) = state.routing.gossip() {
        g.directory().remove(inst.id);
    }
    inst.metrics.set_healthy(false);
    tracing::info!(instance = %inst.name, in_flight = state.routing.load().snapshot(inst.id).in_flight, "instance draining");
}

fn publish_sizes(state: &AppState, pool: usize) {
    let view = state.fleet.view();
    let (serving, draining) =
        view.instances()
            .filter(|i| i.pool == pool)
            .fold((0, 0), |(s, d), i| {
                if i.is_removed() {
                    (s, d + 1)
                } else {
                    (s + 1, d)
                }
            });
    metrics::set_pool_instances(&state.fleet.pools()[pool].model, serving, draining);
}

/// Frees drained instances (nothing in flight, grace over) and forgets what was learned about
/// them.
pub fn sweep(state: &AppState) -> Vec<Arc<Instance>> {
    let load = state.routing.load();
    let freed = state
        .fleet
        .sweep(state.clock.now_ms(), |i| load.snapshot(i.id).in_flight > 0);
    for inst in &freed {
        state.routing.forget_instance(inst.id);
        tracing::info!(instance = %inst.name, id = inst.id.0, "instance drained and forgotten");
    }
    let mut pools: Vec<usize> = freed.iter().map(|i| i.pool).collect();
    pools.dedup();
    for p in pools {
        publish_sizes(state, p);
    }
    freed
}

async fn sweep_loop(state: AppState, token: CancellationToken) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        sweep(&state);
    }
}
