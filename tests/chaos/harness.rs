//! Shared harness of the chaos suite: a gateway configured in front of simulated engines, a
//! bounded load generator that injects one fault once a given number of requests completed, and
//! readers of the gateway's admin views.
//!
//! Invariants: every load is bounded in requests and in time (each request has the client's
//! timeout); the fault is triggered by a count of completed requests, never by a sleep; while the
//! fault is being injected no new request starts, so a request marked "after the fault" met the
//! fault in place (one not so marked may still have reached the engine after it).

use crate::common::*;
use kvgate::config::{Config, InstanceConfig, PoolConfig};
use kvgate_sim::fleet::SimInstanceInfo;
use serde_json::{json, Value};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Notify, RwLock};

/// Time scale of every simulated engine: fast enough that a load of ~100 requests takes well
/// under a second of engine time.
pub const TIME_SCALE: f64 = 20.0;

/// A simulated fleet of `engines` in this process.
pub async fn fleet(engines: usize, kv_events: bool) -> kvgate_sim::Fleet {
    kvgate_sim::Fleet::start(kvgate_sim::FleetConfig {
        engines,
        time_scale: TIME_SCALE,
        kv_events,
        ..Default::default()
    })
    .await
    .expect("simulated fleet")
}

/// A gateway config fronting `infos` as one pool (token mode, the engines' block size, KV events
/// and replay where the engines publish them, their capacities), with fast health checks and
/// load scrapes.
pub fn config(infos: &[SimInstanceInfo]) -> Config {
    let mut cfg = config_for(&[]);
    cfg.pools = vec![PoolConfig {
        model: infos[0].model.clone(),
        block_size: Some(infos[0].block_size),
        tokenizer: Some("builtin".into()),
        chat_template: None,
        flavour: Default::default(),
        instances: infos
            .iter()
            .map(|i| InstanceConfig {
                name: Some(i.name.clone()),
                url: i.url.clone(),
                kv_events: i.kv_events_endpoint.clone(),
                kv_replay: i.replay_endpoint.clone(),
                kv_topic: None,
                capacity_blocks: Some(i.capacity_blocks),
            })
            .collect(),
        max_instances: None,
        discovery: Default::default(),
    }];
    cfg
}

/// `POST /admin/faults` on a simulated engine at `url`.
pub async fn set_faults(url: &str, faults: Value) {
    let r = client()
        .post(format!("{url}/admin/faults"))
        .json(&faults)
        .send()
        .await
        .expect("fault request");
    assert!(r.status().is_success(), "faults refused: {}", r.status());
}

/// `GET path` on the gateway, as JSON.
pub async fn admin(gw: &Gateway, path: &str) -> Value {
    get_json(gw.url(path)).await
}

/// The `/admin/instances` entry of instance `name`.
pub async fn instance_view(gw: &Gateway, name: &str) -> Value {
    let v = admin(gw, "/admin/instances").await;
    v["instances"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["name"] == name).cloned())
        .unwrap_or(Value::Null)
}

/// The `/admin/index` KV event stream status of instance `name`.
pub async fn stream_view(gw: &Gateway, name: &str) -> Value {
    let v = admin(gw, "/admin/index").await;
    v["events"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["instance"] == name).cloned())
        .unwrap_or(Value::Null)
}

/// Waits until every event stream of `gw` is connected (at most 10 s).
pub async fn streams_connected(gw: &Gateway, n: usize) {
    let ok = eventually_async(10, || async {
        let v = admin(gw, "/admin/index").await;
        let s = v["events"].as_array().cloned().unwrap_or_default();
        s.len() == n && s.iter().all(|s| s["connected"] == true)
    })
    .await;
    assert!(ok, "event streams never connected");
}

/// Waits until every instance of `gw` is usable (at most 10 s).
pub async fn all_usable(gw: &Gateway) {
    let ok = eventually(10, || {
        let now = gw.state.clock.now_ms();
        gw.state
            .fleet
            .view()
            .instances()
            .all(|i| i.health.usable(now))
    })
    .await;
    assert!(ok, "instances never all usable");
}

/// A chat completion request with a prompt of its own (no shared prefix: load decides).
pub fn chat(model: &str, i: usize, max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": model, "max_tokens": max_tokens, "stream": stream,
        "messages": [{"role": "user", "content": format!("request {i}: tell me about item {}", i * 7919)}],
    })
}

/// The outcome of one request of a load.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Position in the load.
    pub i: usize,
    /// HTTP status (0: no answer at all).
    pub status: u16,
    /// `x-kvgate-instance` of the answer.
    pub instance: Option<String>,
    /// The whole body (for a stream: every event), or the transport error.
    pub body: String,
    /// Started after the fault was injected.
    pub after_fault: bool,
    /// Got no answer at first and was sent again ([`Load::failover`]).
    pub failed_over: bool,
    /// When it started.
    pub started: Instant,
}

impl Outcome {
    /// A 2xx answer whose body arrived whole.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status) && !self.body.starts_with("transport:")
    }
    /// The OpenAI-style error body's `code`, if any.
    pub fn code(&self) -> Option<String> {
        let v: Value = serde_json::from_str(&self.body).ok()?;
        v["error"]["code"].as_str().map(str::to_string)
    }
}

/// What the fault action can see of the load.
pub struct Progress {
    completed: AtomicUsize,
    started: AtomicUsize,
    changed: Notify,
}

impl Progress {
    /// Requests that started and have not ended.
    pub fn outstanding(&self) -> usize {
        self.started.load(Ordering::SeqCst) - self.completed.load(Ordering::SeqCst)
    }
}

/// A fault action: runs once, while no new request starts.
pub type Fault<'a> = Box<dyn FnOnce(Arc<Progress>) -> Pin<Box<dyn Future<Output = ()> + 'a>> + 'a>;

/// A bounded load.
pub struct Load<'a> {
    /// Requests in all.
    pub requests: usize,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Completed requests after which the fault is injected.
    pub fault_after: usize,
    /// Where request `i` goes (a full URL) and its body.
    pub request: Box<dyn Fn(usize) -> (String, Value) + Sync + 'a>,
    /// Whether a request that got no answer at all (the gateway it went to was gone) is sent
    /// once more, to where `request` then points, as a client-side balancer would.
    pub failover: bool,
}

/// The outcomes of a load, in request order, and the fault's wall time.
pub struct Report {
    pub outcomes: Vec<Outcome>,
    pub fault_at: Option<Instant>,
}

impl Report {
    /// Requests that did not succeed.
    pub fn lost(&self) -> Vec<&Outcome> {
        self.outcomes.iter().filter(|o| !o.ok()).collect()
    }
    /// Requests started after the fault.
    pub fn after(&self) -> impl Iterator<Item = &Outcome> {
        self.outcomes.iter().filter(|o| o.after_fault)
    }
    /// How many of `outcomes` an instance answered.
    pub fn served_by(outcomes: &[&Outcome], name: &str) -> usize {
        outcomes
            .iter()
            .filter(|o| o.instance.as_deref() == Some(name))
            .count()
    }
}

/// Runs `load`, injecting `fault` once `load.fault_after` requests completed.
pub async fn run<'a>(load: Load<'a>, fault: Fault<'a>) -> Report {
    let progress = Arc::new(Progress {
        completed: AtomicUsize::new(0),
        started: AtomicUsize::new(0),
        changed: Notify::new(),
    });
    // Workers take the gate briefly before each request; the fault holds it while it runs.
    let gate = RwLock::new(());
    let faulted = AtomicBool::new(false);
    let next = AtomicUsize::new(0);
    let http = client();
    let worker = || async {
        let mut mine = Vec::new();
        loop {
            let after_fault = {
                let _g = gate.read().await;
                faulted.load(Ordering::SeqCst)
            };
            let i = next.fetch_add(1, Ordering::SeqCst);
            if i >= load.requests {
                return mine;
            }
            progress.started.fetch_add(1, Ordering::SeqCst);
            let started = Instant::now();
            let mut failed_over = false;
            let (status, instance, body) = loop {
                let (url, body) = (load.request)(i);
                let got = match http.post(url).json(&body).send().await {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        let instance = r
                            .headers()
                            .get("x-kvgate-instance")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string);
                        let body = match r.text().await {
                            Ok(t) => t,
                            Err(e) => format!("transport: {e}"),
                        };
                        (status, instance, body)
                    }
                    Err(e) => (0, None, format!("transport: {e:?}")),
                };
                if got.0 == 0 && load.failover && !failed_over {
                    failed_over = true;
                    continue;
                }
                break got;
            };
            mine.push(Outcome {
                i,
                status,
                instance,
                body,
                after_fault,
                failed_over,
                started,
            });
            progress.completed.fetch_add(1, Ordering::SeqCst);
            progress.changed.notify_waiters();
        }
    };
    let injector = async {
        loop {
            let changed = progress.changed.notified();
            if progress.completed.load(Ordering::SeqCst) >= load.fault_after {
                break;
            }
            // Bounded: the load itself is bounded and each request has a timeout.
            if tokio::time::timeout(Duration::from_secs(30), changed)
                .await
                .is_err()
            {
                return None;
            }
        }
        let _g = gate.write().await;
        fault(progress.clone()).await;
        faulted.store(true, Ordering::SeqCst);
        Some(Instant::now())
    };
    let workers = futures::future::join_all((0..load.concurrency).map(|_| worker()));
    let (done, fault_at) = tokio::join!(workers, injector);
    let mut outcomes: Vec<Outcome> = done.into_iter().flatten().collect();
    outcomes.sort_by_key(|o| o.i);
    assert_eq!(outcomes.len(), load.requests);
    assert!(fault_at.is_some(), "the fault was never injected");
    Report { outcomes, fault_at }
}

/// Prints a one-line summary of a scenario (shown with `--nocapture`).
pub fn summary(name: &str, started: Instant, report: &Report) {
    let lost = report.lost().len();
    eprintln!(
        "chaos {name}: {} requests, {lost} lost, {:.2} s",
        report.outcomes.len(),
        started.elapsed().as_secs_f64()
    );
}
