//! The sizing driver against one running gateway: index fill, idle measurement, then per cell a
//! closed-loop pilot, a warm-up and an open-loop measured window.
//!
//! Invariants: requests of a window are sent at `start + i / rate` whatever the answers do (open
//! loop; how late the driver itself fell behind is recorded); every window ends only when every
//! request sent in it has answered or failed (each bounded by [`REQUEST_TIMEOUT`]), so the CPU
//! read after it covers all of its work; the fill stops as soon as the gateway's entry gauge
//! reaches 99 % of the target (the index's cap, when set to the target, keeps it there).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_tokenizer::{ChatMessage, TokenMode};
use tokio::task::JoinSet;

use super::bodies::{Bodies, Conversations, TurnShape};
use super::procfs::{self, TICKS_PER_S};
use super::{CellRecord, HashKind, Kind};
use crate::fleet_metrics::sum_metric;
use crate::prompt::{ApiKind, PromptBuilder};
use crate::stats::percentile_sorted;

/// Longest a single request may take before it counts as an error.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Concurrent fill requests.
const FILL_CONCURRENCY: usize = 4;
/// Pilot: closed-loop requests until this much time or [`PILOT_MAX`] requests.
const PILOT_TIME: Duration = Duration::from_millis(600);
const PILOT_MAX: usize = 200;
const PILOT_MIN: usize = 3;

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    /// Reading `/proc` failed (the process is gone?).
    #[error("reading /proc for pid {pid}: {source}")]
    Proc {
        /// The process.
        pid: u32,
        /// The error.
        source: std::io::Error,
    },
    /// The gateway's metrics could not be read.
    #[error("scraping {url}: {message}")]
    Metrics {
        /// The metrics URL.
        url: String,
        /// What failed.
        message: String,
    },
    /// The fill did not reach its target in time.
    #[error("index fill reached {entries} of {target} entries in {seconds:.0} s ({errors} errors{first})")]
    Fill {
        /// Entries reached.
        entries: u64,
        /// Target.
        target: u64,
        /// Time spent.
        seconds: f64,
        /// Failed fill requests.
        errors: u64,
        /// The first failure, prefixed with ": ".
        first: String,
    },
    /// The built-in tokenizer or prompt words could not be built.
    #[error("prompts: {0}")]
    Prompt(String),
    /// The HTTP client could not be built.
    #[error("http client: {0}")]
    Client(String),
}

/// What to measure against one gateway.
#[derive(Debug, Clone)]
pub struct DriveConfig {
    /// Gateway base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    /// Gateway process id.
    pub pid: u32,
    /// Backend process ids (their CPU is reported beside the gateway's).
    pub backend_pids: Vec<u32>,
    /// Hash mode of the gateway.
    pub mode: HashKind,
    /// The gateway's `server.threads` (recorded).
    pub threads: usize,
    /// Index entries to fill to before measuring (0: no fill).
    pub index_entries: u64,
    /// Longest the fill may take.
    pub fill_timeout: Duration,
    /// No-traffic time measured after the fill.
    pub idle: Duration,
    /// Mean prompt lengths, content tokens.
    pub lengths: Vec<u32>,
    /// Kinds of traffic.
    pub kinds: Vec<Kind>,
    /// Requests per second asked.
    pub rate: f64,
    /// Gateway cores a cell may use at most; the rate is lowered below that by the pilot.
    pub budget_cores: f64,
    /// Unmeasured time at the cell's rate before its window.
    pub warmup: Duration,
    /// Measured window per cell.
    pub duration: Duration,
    /// Conversations at once in multi-turn cells.
    pub conversations: usize,
    /// Model name sent.
    pub model: String,
    /// `max_tokens` sent.
    pub max_tokens: u32,
    /// Seed of the prompt text.
    pub seed: u64,
}

/// Figures of the fill and the idle period.
#[derive(Debug, Clone, Copy, Default)]
struct Baseline {
    entries: u64,
    rss_mib: f64,
    idle_cores: f64,
}

/// Runs the fill, the idle measurement and every cell, calling `on_cell` as each ends.
pub async fn run(
    cfg: &DriveConfig,
    mut on_cell: impl FnMut(&CellRecord),
) -> Result<Vec<CellRecord>, DriveError> {
    let client = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .pool_max_idle_per_host(1024)
        .build()
        .map_err(|e| DriveError::Client(e.to_string()))?;
    let mode = TokenMode::builtin().map_err(|e| DriveError::Prompt(e.to_string()))?;
    let builder = PromptBuilder::new(mode.clone(), ApiKind::Chat, 16, cfg.seed)
        .map_err(|e| DriveError::Prompt(e.to_string()))?;
    let bodies = Arc::new(Bodies::new(builder, &cfg.model, cfg.max_tokens, cfg.seed));
    let base = fill_and_idle(cfg, &client, &bodies).await?;
    let mut out = Vec::new();
    // Ids of unique prompts and conversations never repeat within a run (the fill uses its own).
    let mut next_id: u64 = 1 << 40;
    for &tokens in &cfg.lengths {
        for &kind in &cfg.kinds {
            let rec = cell(
                cfg,
                &client,
                &bodies,
                &mode,
                base,
                tokens,
                kind,
                &mut next_id,
            )
            .await?;
            on_cell(&rec);
            out.push(rec);
        }
    }
    Ok(out)
}

fn ticks(pid: u32) -> Result<u64, DriveError> {
    procfs::cpu_ticks(pid).map_err(|source| DriveError::Proc { pid, source })
}

fn ticks_of(pids: &[u32]) -> Result<u64, DriveError> {
    procfs::cpu_ticks_of(pids).map_err(|source| DriveError::Proc {
        pid: pids.first().copied().unwrap_or(0),
        source,
    })
}

fn mib(pid: u32) -> Result<procfs::Memory, DriveError> {
    procfs::memory(pid).map_err(|source| DriveError::Proc { pid, source })
}

async fn metrics(client: &reqwest::Client, base: &str) -> Result<String, DriveError> {
    let url = format!("{base}/metrics");
    let err = |message: String| DriveError::Metrics {
        url: url.clone(),
        message,
    };
    let r = client
        .get(&url)
        .send()
        .await
        .map_err(|e| err(e.to_string()))?;
    if !r.status().is_success() {
        return Err(err(format!("status {}", r.status())));
    }
    r.text().await.map_err(|e| err(e.to_string()))
}

async fn index_entries(client: &reqwest::Client, base: &str) -> Result<u64, DriveError> {
    let page = metrics(client, base).await?;
    Ok(sum_metric(&page, kvgate::metrics::INDEX_ENTRIES).unwrap_or(0.0) as u64)
}

async fn fill_and_idle(
    cfg: &DriveConfig,
    client: &reqwest::Client,
    bodies: &Arc<Bodies>,
) -> Result<Baseline, DriveError> {
    let started = Instant::now();
    if cfg.index_entries > 0 {
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let first_error = Arc::new(std::sync::Mutex::new(String::new()));
        let url = format!("{}/v1/completions", cfg.url);
        let mut workers = JoinSet::new();
        for _ in 0..FILL_CONCURRENCY {
            let (stop, next, errors, first_error) = (
                stop.clone(),
                next.clone(),
                errors.clone(),
                first_error.clone(),
            );
            let (client, url, bodies, mode) =
                (client.clone(), url.clone(), bodies.clone(), cfg.mode);
            workers.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    let body = bodies.fill(mode, id);
                    if let Err(e) = send(&client, &url, body).await {
                        errors.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut f) = first_error.lock() {
                            if f.is_empty() {
                                *f = e;
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            });
        }
        let target = (cfg.index_entries as f64 * 0.99) as u64;
        let mut entries;
        let reached = loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            entries = index_entries(client, &cfg.url).await?;
            if entries >= target {
                break true;
            }
            if started.elapsed() > cfg.fill_timeout {
                break false;
            }
        };
        stop.store(true, Ordering::Relaxed);
        while workers.join_next().await.is_some() {}
        if !reached {
            let first = first_error.lock().map(|f| f.clone()).unwrap_or_default();
            return Err(DriveError::Fill {
                entries,
                target: cfg.index_entries,
                seconds: started.elapsed().as_secs_f64(),
                errors: errors.load(Ordering::Relaxed),
                first: if first.is_empty() {
                    String::new()
                } else {
                    format!(": {first}")
                },
            });
        }
        eprintln!(
            "  fill: {} requests, {:.1} s",
            next.load(Ordering::Relaxed),
            started.elapsed().as_secs_f64()
        );
    }
    // Let the fill's last answers and allocations settle before the idle window.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let entries = index_entries(client, &cfg.url).await?;
    let rss = mib(cfg.pid)?;
    let t0 = ticks(cfg.pid)?;
    let w0 = Instant::now();
    tokio::time::sleep(cfg.idle).await;
    let idle_s = (ticks(cfg.pid)? - t0) as f64 / TICKS_PER_S;
    let idle_cores = idle_s / w0.elapsed().as_secs_f64().max(1e-9);
    eprintln!(
        "  index {entries} entries, RSS {:.0} MiB, idle {idle_cores:.3} cores",
        rss.rss_kib as f64 / 1024.0
    );
    Ok(Baseline {
        entries,
        rss_mib: rss.rss_kib as f64 / 1024.0,
        idle_cores,
    })
}

/// Sends one chat or completion body; `Ok` for a 2xx answer read to its end.
async fn send(client: &reqwest::Client, url: &str, body: Vec<u8>) -> Result<(), String> {
    let r = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status();
    let bytes = r.bytes().await.map_err(|e| e.to_string())?;
    if status.is_success() {
        Ok(())
    } else {
        Err(format!(
            "status {status}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        ))
    }
}

/// Where a cell's bodies come from.
struct Source<'a> {
    bodies: &'a Bodies,
    gen: Gen,
    /// A body drawn by [`Source::peek`] and not sent yet.
    pending: Option<Vec<u8>>,
}

enum Gen {
    Unique { words: u32, next_id: u64 },
    Multi(Conversations),
}

impl<'a> Source<'a> {
    /// Bodies of `kind` at `tokens`, ids from `first_id` on (each cell gets its own range).
    fn new(
        bodies: &'a Bodies,
        kind: Kind,
        tokens: u32,
        conversations: usize,
        first_id: u64,
    ) -> Self {
        let gen = match kind {
            Kind::Unique => Gen::Unique {
                words: tokens,
                next_id: first_id,
            },
            Kind::MultiTurn => Gen::Multi(Conversations::new(
                TurnShape::for_mean(tokens),
                conversations,
                first_id,
            )),
        };
        Source {
            bodies,
            gen,
            pending: None,
        }
    }

    fn draw(&mut self) -> Vec<u8> {
        match &mut self.gen {
            Gen::Unique { words, next_id } => {
                *next_id += 1;
                self.bodies.unique(*next_id, *words)
            }
            Gen::Multi(convs) => convs.next(self.bodies).0,
        }
    }

    fn next(&mut self) -> Vec<u8> {
        match self.pending.take() {
            Some(b) => b,
            None => self.draw(),
        }
    }

    /// The body [`Source::next`] returns next.
    fn peek(&mut self) -> &[u8] {
        if self.pending.is_none() {
            self.pending = Some(self.draw());
        }
        self.pending.as_deref().unwrap_or_default()
    }
}

/// What one window measured.
#[derive(Debug, Default)]
struct Window {
    requests: u64,
    errors: u64,
    first_error: Option<String>,
    latencies_ms: Vec<f64>,
    body_bytes: u64,
    max_lag_ms: f64,
    wall_s: f64,
}

/// Sends `n` requests at `rate` from `source`, open loop; returns when all have ended.
async fn window(
    client: &reqwest::Client,
    url: &str,
    rate: f64,
    n: u64,
    source: &mut Source<'_>,
) -> Window {
    let mut w = Window::default();
    let mut set: JoinSet<(Result<(), String>, f64)> = JoinSet::new();
    let start = tokio::time::Instant::now();
    let collect =
        |w: &mut Window, r: Result<(Result<(), String>, f64), tokio::task::JoinError>| match r {
            Ok((Ok(()), ms)) => w.latencies_ms.push(ms),
            Ok((Err(e), _)) => {
                w.errors += 1;
                w.first_error.get_or_insert(e);
            }
            Err(e) => {
                w.errors += 1;
                w.first_error.get_or_insert(e.to_string());
            }
        };
    for i in 0..n {
        let body = source.next();
        w.body_bytes += body.len() as u64;
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        let now = tokio::time::Instant::now();
        if now < due {
            tokio::time::sleep_until(due).await;
        } else {
            w.max_lag_ms = w.max_lag_ms.max((now - due).as_secs_f64() * 1e3);
        }
        let (client, url) = (client.clone(), url.to_string());
        set.spawn(async move {
            let t = Instant::now();
            let r = send(&client, &url, body).await;
            (r, t.elapsed().as_secs_f64() * 1e3)
        });
        w.requests += 1;
        while let Some(r) = set.try_join_next() {
            collect(&mut w, r);
        }
    }
    while let Some(r) = set.join_next().await {
        collect(&mut w, r);
    }
    w.wall_s = start.elapsed().as_secs_f64();
    w
}

/// Exact prompt tokens of a chat body under the built-in tokenizer and template.
fn chat_tokens(mode: &TokenMode, body: &[u8]) -> u32 {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return 0;
    };
    let msgs: Vec<ChatMessage> = v["messages"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| {
                    ChatMessage::new(
                        m["role"].as_str().unwrap_or("user"),
                        m["content"].as_str().unwrap_or(""),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    mode.chat_tokens(&msgs)
        .map(|t| u32::try_from(t.len()).unwrap_or(u32::MAX))
        .unwrap_or(0)
}

async fn token_cache(client: &reqwest::Client, base: &str) -> Result<(f64, f64), DriveError> {
    let page = metrics(client, base).await?;
    Ok((
        sum_metric(&page, kvgate::metrics::TOKEN_CACHE_HITS).unwrap_or(0.0),
        sum_metric(&page, kvgate::metrics::TOKEN_CACHE_MISSES).unwrap_or(0.0),
    ))
}

#[allow(clippy::too_many_arguments)]
async fn cell(
    cfg: &DriveConfig,
    client: &reqwest::Client,
    bodies: &Bodies,
    mode: &TokenMode,
    base: Baseline,
    tokens: u32,
    kind: Kind,
    next_id: &mut u64,
) -> Result<CellRecord, DriveError> {
    let url = format!("{}/v1/chat/completions", cfg.url);
    *next_id += 1 << 32;
    let mut src = Source::new(bodies, kind, tokens, cfg.conversations, *next_id);
    // Multi-turn: one request per conversation slot first, so that the slots' own cold starts
    // (each slot's first request carries its whole prompt) are behind the pilot and the window;
    // from then on one request in `turns` opens a new conversation, as in steady chat traffic.
    if kind == Kind::MultiTurn {
        for _ in 0..cfg.conversations {
            let _ = send(client, &url, src.next()).await;
        }
    }
    // Pilot: closed loop, to keep the open-loop rate within the budget of cores.
    let t0 = ticks(cfg.pid)?;
    let p0 = Instant::now();
    let mut pilot = 0usize;
    while pilot < PILOT_MIN || (pilot < PILOT_MAX && p0.elapsed() < PILOT_TIME) {
        // Failures show up in the windows; the pilot only times.
        let _ = send(client, &url, src.next()).await;
        pilot += 1;
    }
    let pilot_cpu = (ticks(cfg.pid)? - t0) as f64 / TICKS_PER_S / pilot as f64;
    let rate = if pilot_cpu > 0.0 && pilot_cpu * cfg.rate > cfg.budget_cores {
        (cfg.budget_cores / pilot_cpu).floor().max(1.0)
    } else {
        cfg.rate
    };
    let warm = (rate * cfg.warmup.as_secs_f64()).round() as u64;
    if warm > 0 {
        window(client, &url, rate, warm, &mut src).await;
    }
    let n = (rate * cfg.duration.as_secs_f64()).round().max(1.0) as u64;
    let first_prompt_tokens = chat_tokens(mode, src.peek());
    let cache0 = token_cache(client, &cfg.url).await?;
    let (g0, b0, d0) = (
        ticks(cfg.pid)?,
        ticks_of(&cfg.backend_pids)?,
        ticks(std::process::id())?,
    );
    let w = window(client, &url, rate, n, &mut src).await;
    let (g1, b1, d1) = (
        ticks(cfg.pid)?,
        ticks_of(&cfg.backend_pids)?,
        ticks(std::process::id())?,
    );
    let cache1 = token_cache(client, &cfg.url).await?;
    let mem = mib(cfg.pid)?;
    let entries = index_entries(client, &cfg.url).await?;
    let cpu_s = (g1 - g0) as f64 / TICKS_PER_S;
    let mut lat = w.latencies_ms.clone();
    lat.sort_by(f64::total_cmp);
    let (hits, misses) = (cache1.0 - cache0.0, cache1.1 - cache0.1);
    let rec = CellRecord {
        mode: cfg.mode,
        threads: cfg.threads,
        index_target: cfg.index_entries,
        index_after_fill: base.entries,
        index_after_cell: entries,
        rss_after_fill_mib: base.rss_mib,
        idle_cores: base.idle_cores,
        tokens,
        kind,
        rate,
        rate_asked: cfg.rate,
        requests: w.requests,
        errors: w.errors,
        first_error: w.first_error.clone(),
        wall_s: w.wall_s,
        cpu_s,
        backend_cpu_s: (b1 - b0) as f64 / TICKS_PER_S,
        driver_cpu_s: (d1 - d0) as f64 / TICKS_PER_S,
        cores_per_100: CellRecord::scale_to_100(cpu_s, w.wall_s, w.requests, base.idle_cores),
        cpu_ms_per_request: cpu_s * 1e3 / w.requests.max(1) as f64,
        p50_ms: percentile_sorted(&lat, 50.0).unwrap_or(0.0),
        p99_ms: percentile_sorted(&lat, 99.0).unwrap_or(0.0),
        body_kib: w.body_bytes as f64 / w.requests.max(1) as f64 / 1024.0,
        first_prompt_tokens,
        rss_mib: mem.rss_kib as f64 / 1024.0,
        hwm_mib: mem.hwm_kib as f64 / 1024.0,
        token_cache_hit_ratio: (cfg.mode == HashKind::Token && hits + misses > 0.0)
            .then(|| hits / (hits + misses)),
        max_send_lag_ms: w.max_lag_ms,
    };
    Ok(rec)
}
