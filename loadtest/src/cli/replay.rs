//! `replay`: one endpoint, one trace.

use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use kvgate_loadtest::compare::{ContenderResult, ContenderSpec};
use kvgate_loadtest::fleet_metrics;
use kvgate_loadtest::replay::{self, Arrivals, Outcome, ReplayConfig};
use kvgate_loadtest::report::summary::{goodput, summarise};
use kvgate_loadtest::report::{table, Report};

use super::common::{command_line, OutputArgs, PromptArgs, TenantArgs, WorkloadArgs};

/// Flags of `replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub prompt: PromptArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub tenants: TenantArgs,
    /// Base URL of the OpenAI-compatible endpoint.
    #[arg(long)]
    pub url: String,
    /// Model name sent in requests.
    #[arg(long, default_value = "kvgate-sim")]
    pub model: String,
    /// Replay at the trace's timestamps divided by this factor.
    #[arg(long, default_value_t = 1.0)]
    pub speed_up: f64,
    /// Poisson arrivals at this rate (requests/s) instead of the trace's timestamps.
    #[arg(long)]
    pub poisson_rate: Option<f64>,
    /// Stop sending after this many seconds.
    #[arg(long)]
    pub max_duration_s: Option<f64>,
    /// Most requests in flight.
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// Per-request timeout, seconds.
    #[arg(long, default_value_t = 300.0)]
    pub timeout_s: f64,
    /// Engine base URLs (comma-separated) whose /metrics give the true hit ratio and shares.
    #[arg(long, value_delimiter = ',')]
    pub engines: Vec<String>,
    /// Name of the endpoint in the report.
    #[arg(long, default_value = "endpoint")]
    pub name: String,
    /// No live progress line.
    #[arg(long)]
    pub no_progress: bool,
}

pub fn secs(name: &str, s: f64) -> anyhow::Result<Duration> {
    if !(s.is_finite() && s > 0.0) {
        bail!("--{name} must be > 0, got {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

pub async fn run(a: ReplayArgs) -> anyhow::Result<()> {
    let started = Report::now_unix_s();
    let trace = a.workload.load()?;
    let (builder, token_error) = a.prompt.builder(&trace, a.workload.seed)?;
    let timeout = secs("timeout-s", a.timeout_s)?;
    let cfg = ReplayConfig {
        base_url: a.url.trim_end_matches('/').to_string(),
        replica_urls: Vec::new(),
        model: a.model.clone(),
        arrivals: match a.poisson_rate {
            Some(rate) => Arrivals::Poisson {
                rate,
                seed: a.workload.seed,
            },
            None => Arrivals::Trace {
                speed_up: a.speed_up,
            },
        },
        max_requests: a.workload.max_requests,
        max_duration: a
            .max_duration_s
            .map(|s| secs("max-duration-s", s))
            .transpose()?,
        concurrency: a.concurrency,
        request_timeout: timeout,
        drain_timeout: timeout,
        progress: !a.no_progress,
        tenants: a.tenants.mix(a.workload.seed)?,
    };
    let slo = a.tenants.slo()?;
    let client = reqwest::Client::new();
    let before = if a.engines.is_empty() {
        None
    } else {
        Some(
            fleet_metrics::snapshot(&client, &a.engines, 0.0)
                .await
                .context("scraping the engines before the run")?,
        )
    };
    let sampler = (!a.engines.is_empty()).then(|| {
        fleet_metrics::Sampler::start(client.clone(), a.engines.clone(), Duration::from_secs(1))
    });
    let out = replay::run(&trace, &builder, &cfg, "").await?;
    let samples = match sampler {
        Some(s) => s.finish().await,
        None => Vec::new(),
    };
    let delta = match &before {
        Some(b) => {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let after = fleet_metrics::snapshot(&client, &a.engines, out.wall_s)
                .await
                .context("scraping the engines after the run")?;
            Some(fleet_metrics::delta(b, &after))
        }
        None => None,
    };
    let mut summary = summarise(&out, delta.as_ref(), &a.engines);
    summary.goodput = slo.map(|s| goodput(&out, s));
    let mut ttft_sorted: Vec<f64> = out
        .records
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Ok))
        .filter_map(|r| r.ttft_s)
        .collect();
    ttft_sorted.sort_by(f64::total_cmp);
    let spec = ContenderSpec::Endpoint {
        name: a.name.clone(),
        url: cfg.base_url.clone(),
    };
    let mut result = ContenderResult::failed(&spec, String::new());
    result.error = None;
    result.summary = Some(summary);
    result.fleet = delta;
    result.engines = a.engines.clone();
    result.series = fleet_metrics::series(&samples);
    result.ttft_sorted = ttft_sorted;
    result.records = out.records;
    let report = Report {
        tool: format!("kvgate-loadtest {}", env!("CARGO_PKG_VERSION")),
        command_line: command_line(),
        started_unix_s: started,
        kind: "replay".into(),
        parameters: serde_json::json!({ "replay": cfg, "api": a.prompt.api, "seed": a.workload.seed }),
        trace: trace.stats(),
        prompt_tokens: token_error,
        references: None,
        contenders: vec![result],
        over_rounds: Vec::new(),
    };
    print!("{}", table::render(&report.contenders));
    a.output.write(&report)
}
