//! Open-loop load: Poisson arrivals at a fixed rate, each request to a random live replica.
//!
//! Invariants: bounded in requests (`rate × duration`) and time, and in concurrency (`max_in_flight`:
//! an arrival finding no slot is counted as shed, not queued); probe requests are hashed with the
//! target replica's own `Routing::prepare` before sending, so the probe watches exactly the chain
//! the gateway routes.

use crate::probe::Sample;
use crate::workload::Workload;
use kvgate::app::AppState;
use kvgate::proxy::parse::{parse, Endpoint};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Semaphore};

/// A replica the driver may send to.
#[derive(Clone)]
pub struct Target {
    /// Replica number.
    pub index: usize,
    /// Completions URL.
    pub url: String,
    /// Its state (for hashing probes).
    pub state: AppState,
}

/// Live targets; the orchestrator removes and adds replicas while the load runs.
pub type Targets = Arc<RwLock<Vec<Target>>>;

/// Counters of one run.
#[derive(Default)]
pub struct Counters {
    /// Requests sent.
    pub sent: AtomicU64,
    /// Responses with a 2xx status.
    pub ok: AtomicU64,
    /// Failed requests (status or transport).
    pub failed: AtomicU64,
    /// Arrivals shed for lack of a concurrency slot.
    pub shed: AtomicU64,
    /// Follow-up turns sent through another replica than the previous turn.
    pub cross_follow_ups: AtomicU64,
    /// Of those, routed to the previous turn's instance.
    pub cross_same_instance: AtomicU64,
    /// Follow-up turns, through any replica.
    pub follow_ups: AtomicU64,
    /// Of those, routed to the previous turn's instance.
    pub same_instance: AtomicU64,
    /// Prompt tokens the engines reported (`usage.prompt_tokens`).
    pub prompt_tokens: AtomicU64,
    /// Of those, served from their prefix cache (`usage.prompt_tokens_details.cached_tokens`).
    pub cached_tokens: AtomicU64,
    /// Prompt tokens of follow-up turns.
    pub follow_up_prompt_tokens: AtomicU64,
    /// Of those, served from the prefix cache.
    pub follow_up_cached_tokens: AtomicU64,
    /// Sum of response latencies, µs.
    pub latency_us: AtomicU64,
}

/// Driver settings.
pub struct Drive {
    /// Requests per second.
    pub rate: f64,
    /// How long.
    pub duration: Duration,
    /// Probe requests per second (single-turn, hashed, watched).
    pub probe_rate: f64,
    /// Concurrency bound.
    pub max_in_flight: usize,
    /// Probes are sent only within this window (warm-up and restart excluded).
    pub probe_window: (Instant, Instant),
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// Runs the load; returns when every request has finished.
pub async fn run(
    d: Drive,
    targets: Targets,
    mut workload: Workload,
    probes: mpsc::Sender<Sample>,
    counters: Arc<Counters>,
) {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap_or_default();
    let slots = Arc::new(Semaphore::new(d.max_in_flight));
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(u64, Option<(String, usize)>)>();
    let mut rng = SmallRng::seed_from_u64(7);
    let start = Instant::now();
    let total = (d.rate * d.duration.as_secs_f64()) as u64;
    let probe_every = if d.probe_rate > 0.0 {
        (d.rate / d.probe_rate).max(1.0) as u64
    } else {
        u64::MAX
    };
    let mut next_at = Duration::ZERO;
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..total {
        // Exponential inter-arrival times.
        let u: f64 = rng.gen_range(f64::EPSILON..1.0);
        next_at += Duration::from_secs_f64(-u.ln() / d.rate);
        if next_at > d.duration {
            break;
        }
        let wait = (start + next_at).saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        while let Ok((conv, outcome)) = done_rx.try_recv() {
            workload.completed(conv, outcome);
        }
        while tasks.try_join_next().is_some() {}
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            counters.shed.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let target = {
            let t = targets.read().unwrap_or_else(|e| e.into_inner());
            if t.is_empty() {
                continue;
            }
            t[rng.gen_range(0..t.len())].clone()
        };
        let now = Instant::now();
        let probe = n % probe_every == 0 && now >= d.probe_window.0 && now < d.probe_window.1;
        let mut req = workload.next(probe);
        let body = std::mem::take(&mut req.body);
        if probe {
            let pool = &target.state.fleet.pools()[0];
            if let Ok(prep) = parse(Endpoint::Completions, body.as_bytes())
                .map_err(|e| e.to_string())
                .and_then(|input| {
                    target
                        .state
                        .routing
                        .prepare(pool, &input)
                        .map_err(|e| e.to_string())
                })
            {
                let _ = probes.try_send(Sample {
                    sent: Instant::now(),
                    origin: target.index,
                    hashes: prep.hashes.into(),
                });
            }
        }
        counters.sent.fetch_add(1, Ordering::Relaxed);
        let (client, counters, done) = (client.clone(), counters.clone(), done_tx.clone());
        tasks.spawn(async move {
            let _permit = permit;
            let t0 = Instant::now();
            let r = client
                .post(&target.url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await;
            let outcome = match r {
                Ok(r) if r.status().is_success() => {
                    let inst = header(&r, "x-kvgate-instance");
                    let body = r.bytes().await.unwrap_or_default();
                    counters.ok.fetch_add(1, Ordering::Relaxed);
                    if let Some((prompt, cached)) = usage(&body) {
                        counters.prompt_tokens.fetch_add(prompt, Ordering::Relaxed);
                        counters.cached_tokens.fetch_add(cached, Ordering::Relaxed);
                        if req.previous.is_some() {
                            counters
                                .follow_up_prompt_tokens
                                .fetch_add(prompt, Ordering::Relaxed);
                            counters
                                .follow_up_cached_tokens
                                .fetch_add(cached, Ordering::Relaxed);
                        }
                    }
                    if let Some((prev, _)) = &req.previous {
                        counters.follow_ups.fetch_add(1, Ordering::Relaxed);
                        if *prev == inst {
                            counters.same_instance.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if let Some((prev, via)) = &req.previous {
                        if *via != target.index {
                            counters.cross_follow_ups.fetch_add(1, Ordering::Relaxed);
                            if *prev == inst {
                                counters.cross_same_instance.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    Some((inst, target.index))
                }
                other => {
                    // The first few failures are shown: a benchmark that fails must say why.
                    if counters.failed.fetch_add(1, Ordering::Relaxed) < 3 {
                        match other {
                            Ok(r) => {
                                let status = r.status();
                                let text = r.text().await.unwrap_or_default();
                                eprintln!("request failed: {status}: {text:.200}");
                            }
                            Err(e) => eprintln!("request failed: {e}"),
                        }
                    }
                    None
                }
            };
            counters
                .latency_us
                .fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
            if !req.probe {
                let _ = done.send((req.conversation, outcome));
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// Prompt and cached tokens of an OpenAI-style answer's `usage`, when it reports them (the light
/// engines do not).
fn usage(body: &[u8]) -> Option<(u64, u64)> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let u = v.get("usage")?;
    let prompt = u.get("prompt_tokens")?.as_u64()?;
    let cached = u
        .pointer("/prompt_tokens_details/cached_tokens")
        .and_then(|c| c.as_u64())
        .unwrap_or(0);
    Some((prompt, cached))
}
