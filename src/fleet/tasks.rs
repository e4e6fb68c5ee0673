//! Background probing of instances: active health checks, `/v1/models` refresh and engine load
//! scrapes. Each loop runs until its cancellation token fires.
//!
//! Invariants:
//! - Probes of one round run concurrently, each bounded by its timeout, so one slow instance never
//!   delays the others' verdicts beyond one timeout.
//! - These loops are the only writers of active health verdicts, engine load and the models cache.

use super::health::Streak;
use super::{models, scrape, Fleet, Instance};
use crate::client::{HttpClient, SendError};
use crate::clock::Clock;
use crate::config::Config;
use ahash::{AHashMap, AHashSet};
use futures_util::future::join_all;
use kvgate_core::index::PlacementIndex;
use kvgate_core::load::EngineLoad;
use kvgate_core::InstanceId;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Largest `/metrics` or `/v1/models` body read from an instance.
const PROBE_BODY_LIMIT: usize = 4 * 1024 * 1024;

/// Everything a probing loop needs.
#[derive(Clone)]
pub struct Probe {
    /// The fleet.
    pub fleet: Arc<Fleet>,
    /// The shared client.
    pub client: HttpClient,
    /// Config.
    pub config: Arc<Config>,
    /// The clock.
    pub clock: Clock,
    /// The placement index (engine-reported capacities go there).
    pub index: Arc<PlacementIndex>,
    /// The router's fleet-wide count of requests in flight to an instance, recorded with each
    /// scrape (see [`EngineLoad::tracked_in_flight`]).
    pub tracked_in_flight: Arc<dyn Fn(InstanceId) -> u32 + Send + Sync>,
}

/// Spawns every probing loop; they stop when `token` is cancelled.
pub fn spawn(probe: Probe, token: CancellationToken) -> Vec<tokio::task::JoinHandle<()>> {
    for inst in probe.fleet.view().serving() {
        announce(inst, &probe.config, &probe.index);
    }
    let mut handles = vec![
        tokio::spawn(health_loop(probe.clone(), token.clone())),
        tokio::spawn(models_loop(probe.clone(), token.clone())),
    ];
    if probe.config.load.enabled {
        handles.push(tokio::spawn(scrape_loop(probe, token)));
    }
    handles
}

/// Makes a new serving instance known: its health gauge, and its configured cache capacity in
/// the index.
pub fn announce(inst: &Instance, config: &Config, index: &PlacementIndex) {
    inst.metrics.set_healthy(true);
    if let Some(c) = inst.capacity() {
        index.set_instance_capacity(inst.id, config.routing.index.instance_capacity(c));
    }
}

/// The serving instances now, to probe in one round.
fn serving(fleet: &Fleet) -> Vec<Arc<Instance>> {
    fleet.view().serving().cloned().collect()
}

/// `GET path` on `inst`, its body read up to `limit` bytes.
async fn get(
    client: &HttpClient,
    inst: &Instance,
    path: &str,
    timeout: Duration,
    limit: usize,
) -> Result<(http::StatusCode, bytes::Bytes), SendError> {
    client
        .get_bytes(
            (&inst.authority, inst.tls),
            &inst.host_header,
            path,
            timeout,
            limit,
        )
        .await
}

fn ticker(ms: u64) -> tokio::time::Interval {
    let mut t = tokio::time::interval(Duration::from_millis(ms));
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

async fn health_loop(p: Probe, token: CancellationToken) {
    let h = &p.config.health;
    let timeout = Duration::from_millis(h.timeout_ms);
    // By instance uid: a reused id slot starts a new streak.
    let mut streaks: AHashMap<u64, Streak> = AHashMap::new();
    let mut tick = ticker(h.interval_ms);
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        let round = serving(&p.fleet);
        streaks.retain(|uid, _| round.iter().any(|i| i.uid == *uid));
        let checks = round.iter().map(|inst| {
            let client = p.client.clone();
            async move {
                let got = get(&client, inst, "/health", timeout, 64 * 1024).await;
                matches!(got, Ok((s, _)) if s.is_success())
            }
        });
        let results = tokio::select! {
            _ = token.cancelled() => return,
            r = join_all(checks) => r,
        };
        let now = p.clock.now_ms();
        for (inst, ok) in round.iter().zip(results) {
            let streak = streaks.entry(inst.uid).or_default();
            if let Some(v) = streak.observe(
                ok,
                inst.health.active_ok(),
                h.healthy_threshold,
                h.unhealthy_threshold,
            ) {
                if v {
                    tracing::info!(instance = %inst.name, "instance healthy again");
                } else {
                    tracing::warn!(instance = %inst.name, "instance unhealthy: /health failed {} times", h.unhealthy_threshold);
                }
                inst.health.set_active(v);
            } else if ok && inst.health.active_ok() && inst.health.connect_ejected(now) {
                // A passing check proves the instance accepts connections again.
                tracing::info!(instance = %inst.name, "ejected instance answers /health; ending ejection");
                inst.health.set_active(true);
            }
            inst.metrics.set_healthy(inst.health.usable(now));
        }
    }
}

async fn models_loop(p: Probe, token: CancellationToken) {
    let timeout = Duration::from_millis(p.config.health.timeout_ms.max(1_000));
    let mut tick = ticker(p.config.health.models_refresh_ms);
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = p.clock.now_ms();
        let round = serving(&p.fleet);
        let fetches = round.iter().filter(|i| i.health.usable(now)).map(|inst| {
            let client = p.client.clone();
            async move {
                match get(&client, inst, "/v1/models", timeout, PROBE_BODY_LIMIT).await {
                    Ok((s, body)) if s.is_success() => match models::parse_list(&body) {
                        Ok(list) => Some((inst.pool, list)),
                        Err(e) => {
                            tracing::debug!(instance = %inst.name, error = %e, "unreadable /v1/models");
                            None
                        }
                    },
                    _ => None,
                }
            }
        });
        let answers: Vec<_> = tokio::select! {
            _ = token.cancelled() => return,
            r = join_all(fetches) => r.into_iter().flatten().collect(),
        };
        let (body, discovered) = models::union(p.fleet.pools(), &answers);
        p.fleet.models_cache().set(body);
        p.fleet.set_discovered(discovered);
    }
}

async fn scrape_loop(p: Probe, token: CancellationToken) {
    let timeout = Duration::from_millis(p.config.load.timeout_ms);
    let mut tick = ticker(p.config.load.poll_interval_ms);
    // Instance uids already told they report no load metrics.
    let mut warned: AHashSet<u64> = AHashSet::new();
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        let round = serving(&p.fleet);
        warned.retain(|uid| round.iter().any(|i| i.uid == *uid));
        let scrapes = round.iter().map(|inst| {
            let client = p.client.clone();
            async move {
                match get(&client, inst, "/metrics", timeout, PROBE_BODY_LIMIT).await {
                    Ok((s, body)) if s.is_success() => {
                        let text = std::str::from_utf8(&body).ok()?;
                        Some(scrape::parse_metrics(text, inst.flavour))
                    }
                    _ => None,
                }
            }
        });
        let results = tokio::select! {
            _ = token.cancelled() => return,
            r = join_all(scrapes) => r,
        };
        let now = p.clock.now_ms();
        for (inst, res) in round.iter().zip(results) {
            let Some(s) = res.filter(|s| s.found) else {
                if warned.insert(inst.uid) {
                    tracing::debug!(instance = %inst.name, "no engine load metrics; scoring uses router-tracked load only");
                }
                continue;
            };
            // Read as the round's reports arrive: the engine counted what the router had sent
            // by then (requests sent or finished since are in neither count).
            let tracked = (p.tracked_in_flight)(inst.id);
            inst.engine.set(EngineLoad {
                running: s.running,
                waiting: s.waiting,
                kv_usage: s.kv_usage,
                at: now,
                stale: false,
                tracked_in_flight: Some(tracked),
            });
            if let Some(c) = s.capacity_blocks {
                // Configured capacity wins over the engine's report.
                if inst.config.capacity_blocks.is_none()
                    && inst.capacity_blocks.swap(c, Ordering::Relaxed) != c
                {
                    let cap = p.config.routing.index.instance_capacity(c);
                    p.index.set_instance_capacity(inst.id, cap);
                }
            }
        }
    }
}
