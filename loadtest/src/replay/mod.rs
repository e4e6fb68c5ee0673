//! Live open-loop replay of a trace against an OpenAI-compatible endpoint.
//!
//! A dispatcher sleeps until each request's scheduled offset, then spawns it, subject to a
//! concurrency cap (a semaphore: at most `concurrency` requests in flight; a request waiting for a
//! permit is sent late and its lag is recorded). Sending stops at `max_requests` or `max_duration`;
//! requests still in flight get `drain_timeout` to finish, then are cancelled and counted as
//! unfinished. One `reqwest::Client` is shared by all requests.

pub mod progress;
pub mod record;
pub mod request;
pub mod schedule;
pub mod sse;
pub mod tenants;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::task::JoinSet;

use crate::prompt::{ApiKind, PromptBuilder};
use crate::trace::Trace;
pub use progress::Progress;
pub use record::{ErrorClass, Outcome, RequestRecord};
pub use schedule::{schedule, Arrivals, ScheduleError};
pub use tenants::TenantMix;

/// Replay parameters.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayConfig {
    /// Base URL of the endpoint (e.g. `http://127.0.0.1:8080`).
    pub base_url: String,
    /// Further base URLs of the same router (replicas behind one Service): each request goes
    /// to one of `base_url` and these, picked by a hash of its index (uniform, reproducible).
    pub replica_urls: Vec<String>,
    /// Model name sent in every request.
    pub model: String,
    /// Arrival process.
    pub arrivals: Arrivals,
    /// Stop after this many requests.
    pub max_requests: Option<usize>,
    /// Stop sending after this much wall time.
    pub max_duration: Option<Duration>,
    /// Most requests in flight at once.
    pub concurrency: usize,
    /// Whole-request timeout.
    pub request_timeout: Duration,
    /// How long in-flight requests may run after sending stops.
    pub drain_timeout: Duration,
    /// Draw the live progress line (when stderr is a terminal).
    pub progress: bool,
    /// Split the requests between tenants (and perhaps send only one tenant's).
    pub tenants: Option<TenantMix>,
}

impl ReplayConfig {
    /// Defaults for a base URL: trace timing at speed 1, 256 in flight, 300 s timeout.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        ReplayConfig {
            base_url: base_url.into(),
            replica_urls: Vec::new(),
            model: model.into(),
            arrivals: Arrivals::Trace { speed_up: 1.0 },
            max_requests: None,
            max_duration: None,
            concurrency: 256,
            request_timeout: Duration::from_secs(300),
            drain_timeout: Duration::from_secs(300),
            progress: true,
            tenants: None,
        }
    }
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// Bad arrival parameters.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// The HTTP client could not be built.
    #[error("building HTTP client: {0}")]
    Client(reqwest::Error),
    /// A parameter is out of range.
    #[error("invalid replay parameter: {0}")]
    Parameter(String),
}

/// Everything a replay measured.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayOutput {
    /// One record per sent request, by trace index.
    pub records: Vec<RequestRecord>,
    /// Requests cancelled after the drain timeout.
    pub unfinished: usize,
    /// Wall time from the first send to the last completion.
    pub wall_s: f64,
    /// Mean lag between scheduled and actual send (concurrency cap, overloaded client).
    pub mean_send_lag_s: f64,
    /// Target API.
    pub api: ApiKind,
}

/// The replica (of `n`) request `index` is sent to: a fixed mix of the index, so the choice is
/// uniform, independent of the trace's structure, and the same in every run.
fn replica_of(index: usize, n: usize) -> usize {
    if n <= 1 {
        return 0;
    }
    (kvgate_core::policy::util::mix(index as u64) % n as u64) as usize
}

/// Replays `trace` with prompts from `builder` according to `cfg`.
pub async fn run(
    trace: &Trace,
    builder: &PromptBuilder,
    cfg: &ReplayConfig,
    label: &str,
) -> Result<ReplayOutput, ReplayError> {
    if cfg.concurrency == 0 {
        return Err(ReplayError::Parameter(
            "concurrency must be at least 1".into(),
        ));
    }
    let requests = &trace.requests[..trace
        .requests
        .len()
        .min(cfg.max_requests.unwrap_or(usize::MAX))];
    let offsets = schedule(requests, cfg.arrivals)?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(cfg.concurrency.min(1024))
        .tcp_nodelay(true)
        .build()
        .map_err(ReplayError::Client)?;
    let urls: Vec<Arc<str>> = std::iter::once(&cfg.base_url)
        .chain(&cfg.replica_urls)
        .map(|base| format!("{}{}", base.trim_end_matches('/'), builder.api().path()).into())
        .collect();
    let model: Arc<str> = cfg.model.as_str().into();
    let progress = Arc::new(Progress::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let render = cfg.progress.then(|| {
        tokio::spawn(progress::render(
            progress.clone(),
            requests.len(),
            label.to_string(),
            stop.clone(),
        ))
    });
    let records = Arc::new(Mutex::new(Vec::with_capacity(requests.len())));
    let sem = Arc::new(tokio::sync::Semaphore::new(cfg.concurrency));
    let start = tokio::time::Instant::now();
    let deadline = cfg.max_duration.map(|d| start + d);
    let mut tasks = JoinSet::new();
    let mix = cfg.tenants.as_ref();
    let header: Option<Arc<str>> = mix.map(|m| m.header.as_str().into());
    for (index, (req, offset)) in requests.iter().zip(&offsets).enumerate() {
        if mix.is_some_and(|m| !m.sends(index)) {
            continue;
        }
        let tenant: Option<Arc<str>> = mix.map(|m| m.of(index).into());
        let header = header.clone();
        let at = start + *offset;
        if deadline.is_some_and(|d| at > d) {
            break;
        }
        tokio::time::sleep_until(at).await;
        let Ok(permit) = sem.clone().acquire_owned().await else {
            break;
        };
        // Reap finished tasks so the set stays as small as the concurrency cap.
        while tasks.try_join_next().is_some() {}
        let sent_at = start.elapsed().as_secs_f64();
        progress.sent.fetch_add(1, Ordering::Relaxed);
        let replica = replica_of(index, urls.len());
        let url = urls[replica].clone();
        let replica = (urls.len() > 1).then_some(replica as u32);
        let (client, model, builder) = (client.clone(), model.clone(), builder.clone());
        let (req, progress, records) = (req.clone(), progress.clone(), records.clone());
        let timeout = cfg.request_timeout;
        let scheduled = offset.as_secs_f64();
        tasks.spawn(async move {
            let _permit = permit;
            let (outcome, measured) = match builder.body(&req, &model) {
                Ok(body) => {
                    request::send(request::Attempt {
                        client: &client,
                        url: &url,
                        body,
                        timeout,
                        header: header.as_deref().zip(tenant.as_deref()),
                    })
                    .await
                }
                Err(_) => (
                    Outcome::Error {
                        class: ErrorClass::Other,
                    },
                    request::Measured::default(),
                ),
            };
            let mut rec = measured.into_record(
                outcome,
                index,
                scheduled,
                sent_at,
                req.input_length,
                req.output_length,
            );
            rec.tenant = tenant.map(|t| t.to_string());
            rec.replica = replica;
            if let Some(t) = rec.ttft_s {
                progress.ttft(t);
            }
            match rec.outcome {
                Outcome::Ok => {}
                Outcome::Rejected { .. } => {
                    progress.rejected.fetch_add(1, Ordering::Relaxed);
                }
                Outcome::Error { .. } => {
                    progress.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            progress.done.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut r) = records.lock() {
                r.push(rec);
            }
        });
    }
    let drained = tokio::time::timeout(cfg.drain_timeout, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    let unfinished = if drained.is_err() {
        let n = tasks.len();
        tasks.abort_all();
        n
    } else {
        0
    };
    let wall_s = start.elapsed().as_secs_f64();
    stop.cancel();
    if let Some(h) = render {
        let _ = h.await;
    }
    let mut records = std::mem::take(&mut *records.lock().unwrap_or_else(|e| e.into_inner()));
    records.sort_by_key(|r| r.index);
    let lag: f64 = records
        .iter()
        .map(|r| (r.sent_at_s - r.scheduled_at_s).max(0.0))
        .sum();
    Ok(ReplayOutput {
        mean_send_lag_s: crate::stats::ratio(lag, records.len() as f64),
        records,
        unfinished,
        wall_s,
        api: builder.api(),
    })
}
