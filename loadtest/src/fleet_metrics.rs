//! Scraping the engines' own Prometheus metrics: the ground truth for hit ratio and load spread.
//!
//! Hit ratio is computed from the engines' prefix-cache counters (vLLM
//! `vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`, or SGLang
//! `sglang:cached_tokens_total / sglang:prompt_tokens_total`), never from what a router claims.
//! Counters are differenced between a snapshot before and after a run, so earlier traffic
//! (warm-up probes) does not count. Series sampling is bounded by [`MAX_SAMPLES`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::stats::{imbalance, ratio};

/// Most snapshots kept by a sampler (at 1 s intervals, almost 3 hours).
pub const MAX_SAMPLES: usize = 10_000;
/// Largest metrics page read.
const MAX_PAGE: usize = 4 << 20;

/// Why a scrape failed.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The request failed.
    #[error("scraping {url}: {source}")]
    Http {
        /// Metrics URL.
        url: String,
        /// Transport error.
        source: reqwest::Error,
    },
    /// The page has none of the known counters.
    #[error("{0}: no vLLM or SGLang prefix-cache counters found")]
    NoCounters(String),
    /// The page is too large.
    #[error("{0}: metrics page larger than {MAX_PAGE} bytes")]
    TooLarge(String),
}

/// Counters and gauges of one engine at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct EngineCounters {
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries: f64,
    /// Prompt tokens found in the prefix cache.
    pub prefix_hits: f64,
    /// Requests finished.
    pub requests: f64,
    /// Requests running now.
    pub running: f64,
    /// Requests waiting now.
    pub waiting: f64,
    /// Sum of the engine's own time-to-first-token histogram (arrival at the engine to first
    /// token; a simulated engine's in model seconds), seconds.
    pub ttft_sum_s: f64,
    /// Observations in that histogram.
    pub ttft_count: f64,
    /// Simulated engines only (`kvgate_sim_*`, 0 elsewhere): steps run.
    pub sim_steps: f64,
    /// ... the sum of how late each step's wake-up was, model seconds.
    pub sim_step_late_s: f64,
    /// ... model time skipped after falling too far behind scaled wall time, seconds.
    pub sim_clock_skipped_s: f64,
}

/// Sum of every sample of metric `name` (all label sets) in a Prometheus text page.
pub fn sum_metric(page: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in page.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let value = match rest.as_bytes().first() {
            Some(b'{') => rest.rfind('}').map(|i| &rest[i + 1..]),
            Some(b' ') => Some(rest),
            _ => None,
        };
        let Some(v) = value.and_then(|v| v.split_whitespace().next()) else {
            continue;
        };
        if let Ok(x) = v.parse::<f64>() {
            *found.get_or_insert(0.0) += x;
        }
    }
    found
}

/// Extracts the counters from a metrics page (vLLM names first, then SGLang's).
pub fn parse_counters(page: &str) -> Option<EngineCounters> {
    let g = |n| sum_metric(page, n);
    if let (Some(q), Some(h)) = (
        g("vllm:prefix_cache_queries_total"),
        g("vllm:prefix_cache_hits_total"),
    ) {
        return Some(EngineCounters {
            prefix_queries: q,
            prefix_hits: h,
            requests: g("vllm:request_success_total").unwrap_or(0.0),
            running: g("vllm:num_requests_running").unwrap_or(0.0),
            waiting: g("vllm:num_requests_waiting").unwrap_or(0.0),
            ttft_sum_s: g("vllm:time_to_first_token_seconds_sum").unwrap_or(0.0),
            ttft_count: g("vllm:time_to_first_token_seconds_count").unwrap_or(0.0),
            ..sim_clock(page)
        });
    }
    if let (Some(q), Some(h)) = (
        g("sglang:prompt_tokens_total"),
        g("sglang:cached_tokens_total"),
    ) {
        return Some(EngineCounters {
            prefix_queries: q,
            prefix_hits: h,
            requests: g("sglang:num_requests_total").unwrap_or(0.0),
            running: g("sglang:num_running_reqs").unwrap_or(0.0),
            waiting: g("sglang:num_queue_reqs").unwrap_or(0.0),
            ttft_sum_s: g("sglang:time_to_first_token_seconds_sum").unwrap_or(0.0),
            ttft_count: g("sglang:time_to_first_token_seconds_count").unwrap_or(0.0),
            ..sim_clock(page)
        });
    }
    None
}

/// The simulator's clock counters (zero on a real engine's page).
fn sim_clock(page: &str) -> EngineCounters {
    let g = |n| sum_metric(page, n).unwrap_or(0.0);
    EngineCounters {
        sim_steps: g("kvgate_sim_steps_total"),
        sim_step_late_s: g("kvgate_sim_step_late_seconds_total"),
        sim_clock_skipped_s: g("kvgate_sim_clock_skipped_seconds_total"),
        ..EngineCounters::default()
    }
}

/// Scrapes `{base}/metrics`.
pub async fn scrape(client: &reqwest::Client, base: &str) -> Result<EngineCounters, ScrapeError> {
    let url = format!("{}/metrics", base.trim_end_matches('/'));
    let http = |source| ScrapeError::Http {
        url: url.clone(),
        source,
    };
    let resp = client
        .get(&url)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map_err(http)?;
    if resp.content_length().is_some_and(|n| n as usize > MAX_PAGE) {
        return Err(ScrapeError::TooLarge(url));
    }
    let text = resp.text().await.map_err(http)?;
    if text.len() > MAX_PAGE {
        return Err(ScrapeError::TooLarge(url));
    }
    parse_counters(&text).ok_or(ScrapeError::NoCounters(url))
}

/// One scrape of every engine.
#[derive(Debug, Clone, Serialize)]
pub struct FleetSnapshot {
    /// Seconds since the sampler started.
    pub at_s: f64,
    /// Counters per engine, in fleet order.
    pub engines: Vec<EngineCounters>,
}

/// Scrapes every engine concurrently.
pub async fn snapshot(
    client: &reqwest::Client,
    engines: &[String],
    at_s: f64,
) -> Result<FleetSnapshot, ScrapeError> {
    let all = futures_util::future::join_all(engines.iter().map(|e| scrape(client, e))).await;
    Ok(FleetSnapshot {
        at_s,
        engines: all.into_iter().collect::<Result<_, _>>()?,
    })
}

/// What the engines' counters say about a run (after − before).
#[derive(Debug, Clone, Default, Serialize)]
pub struct FleetDelta {
    /// Prompt tokens hit / queried, fleet-wide.
    pub hit_ratio: f64,
    /// Prompt tokens queried.
    pub prefix_queries: f64,
    /// Prompt tokens hit.
    pub prefix_hits: f64,
    /// Requests finished per engine.
    pub requests_per_engine: Vec<f64>,
    /// Hit ratio per engine.
    pub hit_ratio_per_engine: Vec<f64>,
    /// Mean time to first token as the engines measured it (from a request's arrival at the
    /// engine), fleet-wide; None when they report none. A client's mean TTFT minus this is what
    /// the path to and from the engines added: the router's decision, proxying and transport.
    pub engine_ttft_mean_s: Option<f64>,
    /// Simulated engines: steps run, fleet-wide.
    pub sim_steps: f64,
    /// Simulated engines: mean lateness of a step's wake-up, model seconds (how far the
    /// engines trail scaled wall time; their clients see results that much later).
    pub sim_step_late_mean_s: f64,
    /// Simulated engines: model time skipped by engines that fell more than their lag bound
    /// behind, seconds, summed over engines (each skipped second is a second the engine did no
    /// work: the fleet was short of CPU and ran slower than its model).
    pub sim_clock_skipped_s: f64,
}

/// Differences two snapshots of the same fleet.
pub fn delta(before: &FleetSnapshot, after: &FleetSnapshot) -> FleetDelta {
    let mut d = FleetDelta::default();
    let (mut ttft_sum, mut ttft_n) = (0.0, 0.0);
    for (b, a) in before.engines.iter().zip(&after.engines) {
        ttft_sum += a.ttft_sum_s - b.ttft_sum_s;
        ttft_n += a.ttft_count - b.ttft_count;
        let q = a.prefix_queries - b.prefix_queries;
        let h = a.prefix_hits - b.prefix_hits;
        d.prefix_queries += q;
        d.prefix_hits += h;
        d.requests_per_engine.push(a.requests - b.requests);
        d.hit_ratio_per_engine.push(ratio(h, q));
        d.sim_steps += a.sim_steps - b.sim_steps;
        d.sim_step_late_mean_s += a.sim_step_late_s - b.sim_step_late_s;
        d.sim_clock_skipped_s += a.sim_clock_skipped_s - b.sim_clock_skipped_s;
    }
    d.hit_ratio = ratio(d.prefix_hits, d.prefix_queries);
    d.engine_ttft_mean_s = (ttft_n > 0.0).then(|| ttft_sum / ttft_n);
    d.sim_step_late_mean_s = ratio(d.sim_step_late_mean_s, d.sim_steps);
    d
}

/// One point of the fleet time series.
#[derive(Debug, Clone, Serialize)]
pub struct SeriesPoint {
    /// End of the interval, seconds since the start.
    pub at_s: f64,
    /// Hit ratio of the prompt tokens queried during the interval (None if none were).
    pub hit_ratio: Option<f64>,
    /// Running + waiting requests per engine at the end of the interval.
    pub load: Vec<f64>,
    /// Coefficient of variation of `load` (0 = perfectly even).
    pub load_cv: f64,
    /// Highest engine load / mean engine load (1 = even).
    pub load_max_over_mean: f64,
}

/// Turns consecutive snapshots into interval points.
pub fn series(samples: &[FleetSnapshot]) -> Vec<SeriesPoint> {
    samples
        .windows(2)
        .map(|w| {
            let d = delta(&w[0], &w[1]);
            let load: Vec<f64> = w[1].engines.iter().map(|e| e.running + e.waiting).collect();
            let m = crate::stats::mean(&load);
            let max = load.iter().copied().fold(0.0, f64::max);
            SeriesPoint {
                at_s: w[1].at_s,
                hit_ratio: (d.prefix_queries > 0.0).then_some(d.hit_ratio),
                load_cv: imbalance(&load),
                load_max_over_mean: ratio(max, m),
                load,
            }
        })
        .collect()
}

/// Samples a fleet periodically in the background.
pub struct Sampler {
    samples: Arc<Mutex<Vec<FleetSnapshot>>>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    /// Starts sampling `engines` every `interval` (failed scrapes are skipped).
    pub fn start(client: reqwest::Client, engines: Vec<String>, interval: Duration) -> Sampler {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = tokio_util::sync::CancellationToken::new();
        let (s, st) = (samples.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = st.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let at = start.elapsed().as_secs_f64();
                if let Ok(snap) = snapshot(&client, &engines, at).await {
                    if let Ok(mut v) = s.lock() {
                        if v.len() < MAX_SAMPLES {
                            v.push(snap);
                        }
                    }
                }
            }
        });
        Sampler {
            samples,
            stop,
            task,
        }
    }

    /// Stops sampling and returns the snapshots taken.
    pub async fn finish(self) -> Vec<FleetSnapshot> {
        self.stop.cancel();
        let _ = self.task.await;
        let mut v = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# HELP vllm:prefix_cache_hits_total x\n\
        # TYPE vllm:prefix_cache_hits_total counter\n\
        vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 30\n\
        vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 100\n\
        vllm:request_success_total{finished_reason=\"length\"} 4\n\
        vllm:request_success_total{finished_reason=\"stop\"} 1\n\
        vllm:num_requests_running 2\n\
        vllm:num_requests_waiting{model_name=\"m\"} 1e0\n\
        vllm:num_requests_running_other 99\n\
        vllm:time_to_first_token_seconds_bucket{le=\"+Inf\"} 5\n\
        vllm:time_to_first_token_seconds_sum{engine=\"0\"} 2.5\n\
        vllm:time_to_first_token_seconds_count{engine=\"0\"} 5\n\
        kvgate_sim_steps_total{engine=\"0\"} 40\n\
        kvgate_sim_step_late_seconds_total{engine=\"0\"} 0.8\n\
        kvgate_sim_clock_skipped_seconds_total{engine=\"0\"} 0\n";

    #[test]
    fn parses_vllm_counters() {
        let c = parse_counters(PAGE).unwrap();
        assert_eq!(c.prefix_hits, 30.0);
        assert_eq!(c.prefix_queries, 100.0);
        assert_eq!(c.requests, 5.0);
        assert_eq!(c.running, 2.0);
        assert_eq!(c.waiting, 1.0);
        assert_eq!((c.sim_steps, c.sim_step_late_s), (40.0, 0.8));
        assert_eq!((c.ttft_sum_s, c.ttft_count), (2.5, 5.0));
        assert_eq!(c.sim_clock_skipped_s, 0.0);
        assert!(parse_counters("foo 1\n").is_none());
        let sg = "sglang:cached_tokens_total{a=\"b\"} 5\nsglang:prompt_tokens_total 20\n";
        assert_eq!(parse_counters(sg).unwrap().prefix_hits, 5.0);
    }

    #[test]
    fn delta_and_series() {
        let e = |q, h, r| EngineCounters {
            prefix_queries: q,
            prefix_hits: h,
            requests: r,
            running: r,
            waiting: 0.0,
            // Each request's first token 0.25 s after it reached the engine.
            ttft_sum_s: r * 0.25,
            ttft_count: r,
            // A step per request so far, each woken 2 ms late; 0.5 s skipped per request.
            sim_steps: r,
            sim_step_late_s: r * 0.002,
            sim_clock_skipped_s: r * 0.5,
        };
        let a = FleetSnapshot {
            at_s: 0.0,
            engines: vec![e(10.0, 5.0, 1.0), e(0.0, 0.0, 0.0)],
        };
        let b = FleetSnapshot {
            at_s: 1.0,
            engines: vec![e(110.0, 55.0, 4.0), e(100.0, 0.0, 2.0)],
        };
        let d = delta(&a, &b);
        assert!((d.hit_ratio - 0.25).abs() < 1e-12);
        assert_eq!(d.requests_per_engine, vec![3.0, 2.0]);
        assert_eq!(d.sim_steps, 5.0);
        assert_eq!(d.engine_ttft_mean_s, Some(0.25));
        assert_eq!(delta(&a, &a).engine_ttft_mean_s, None);
        assert!((d.sim_step_late_mean_s - 0.002).abs() < 1e-12);
        assert!((d.sim_clock_skipped_s - 2.5).abs() < 1e-12);
        let s = series(&[a, b]);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].hit_ratio, Some(0.25));
        assert_eq!(s[0].load, vec![4.0, 2.0]);
    }
}
