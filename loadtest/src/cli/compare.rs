//! `compare`: the same trace against several routers, each on a fresh simulated fleet.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use kvgate_loadtest::compare::contender::default_python;
use kvgate_loadtest::compare::{self, CompareConfig, ContenderSpec};
use kvgate_loadtest::replay::{Arrivals, ReplayConfig};
use kvgate_loadtest::report::{rounds, table, Report};
use kvgate_loadtest::sizing::{self, FleetShape};
use kvgate_sim::{EngineOverrides, FleetConfig, FleetMix};

use super::common::{command_line, OutputArgs, PromptArgs, TenantArgs, WorkloadArgs};
use super::replay::secs;

/// Flags of `compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub prompt: PromptArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub tenants: TenantArgs,
    /// Contenders, comma-separated: kvgate policies (kvgate, round_robin, least_load,
    /// consistent_hash, sglang_cache_aware, dynamo_cost, llmd_weighted, ...), `smg`,
    /// `sglang-router`, `vllm-router` (from --python's venv: loadtest/peers/install.sh); repeat
    /// the flag for `NAME=COMMAND TEMPLATE` contenders.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kvgate,round_robin,least_load"
    )]
    pub contenders: Vec<String>,
    /// External router as `NAME=COMMAND TEMPLATE` (repeatable; placeholders {python} {bindir}
    /// {port} {metrics_port} {workers} {workers_comma} {model}).
    #[arg(long = "external")]
    pub externals: Vec<String>,
    /// Simulated engines per fleet.
    #[arg(long, default_value_t = 8)]
    pub engines: usize,
    /// Engine model/GPU class (simulator preset).
    #[arg(long, default_value = "llama3-8b-h100")]
    pub preset: String,
    /// Engines of several classes instead of --engines/--preset, in instance order, e.g.
    /// `llama3-8b-h100:4,llama3-8b-a100-40gb:4`; each engine runs its own preset, with the
    /// capacity flags below applied to every engine.
    #[arg(long, value_name = "PRESET:COUNT,...", conflicts_with_all = ["engines", "preset"])]
    pub fleet: Option<FleetMix>,
    /// GPU KV memory per engine, GiB (capacity from each preset's geometry).
    #[arg(long)]
    pub kv_memory_gib: Option<f64>,
    /// GPU KV blocks per engine (overrides the memory-derived capacity).
    #[arg(long)]
    pub gpu_blocks: Option<u32>,
    /// CPU-offload KV blocks per engine.
    #[arg(long)]
    pub cpu_blocks: Option<u32>,
    /// Engines run this many times faster than real; arrivals are sped up to match.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Trace speed-up in engine-model time (wall-clock arrivals use speed-up × time-scale).
    #[arg(long, default_value_t = 1.0)]
    pub speed_up: f64,
    /// Stop sending after this many wall-clock seconds per contender.
    #[arg(long)]
    pub max_duration_s: Option<f64>,
    /// Most requests in flight per contender. A replay is open-loop: a request that finds the
    /// cap reached is sent late, which throttles the very backlog being measured (the summary
    /// flags a run whose sends lagged). Each request in flight holds up to four sockets in this
    /// process with an in-process kvgate, so `ulimit -n` must allow four times this.
    #[arg(long, default_value_t = 4096)]
    pub concurrency: usize,
    /// Per-request timeout, wall-clock seconds.
    #[arg(long, default_value_t = 300.0)]
    pub timeout_s: f64,
    /// Interpreter for {python} (default: the peers' venv from loadtest/peers/install.sh).
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Base kvgate config (TOML) for kvgate contenders; pools and policy are set per run.
    #[arg(long)]
    pub kvgate_config: Option<PathBuf>,
    /// Seconds to wait for a router to become ready.
    #[arg(long, default_value_t = 60.0)]
    pub ready_timeout_s: f64,
    /// Also compute the references (fleet-sized LRU, infinite cache, no-queue TTFT and E2E floors).
    #[arg(long)]
    pub references: bool,
    /// Keep every request's record in results.json.
    #[arg(long)]
    pub keep_records: bool,
    /// Report wall-clock latencies instead of engine-model time (wall × time-scale).
    #[arg(long)]
    pub wall_time: bool,
    /// No live progress line.
    #[arg(long)]
    pub no_progress: bool,
    /// Requests of the unmeasured warm-up run before the first contender (round robin over the
    /// trace's first requests on a fleet of its own; 0: none), so that the first contender does
    /// not pay alone for the process's cold start.
    #[arg(long, default_value_t = 200)]
    pub warm_up_run: usize,
    /// Run every contender this many times, the order rotated each round (round r starts with
    /// the r-th contender); the summary gives each figure's mean and its lowest and highest run.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
}

pub async fn run(a: CompareArgs) -> anyhow::Result<()> {
    let started = Report::now_unix_s();
    let trace = a.workload.load()?;
    let (builder, token_error) = a.prompt.builder(&trace, a.workload.seed)?;
    let mut contenders = Vec::new();
    for c in a.contenders.iter().filter(|c| !c.trim().is_empty()) {
        contenders.push(ContenderSpec::parse(c.trim()).map_err(anyhow::Error::msg)?);
    }
    for e in &a.externals {
        contenders.push(ContenderSpec::parse(e).map_err(anyhow::Error::msg)?);
    }
    if contenders.is_empty() {
        bail!("no contenders");
    }
    let fleet = FleetConfig {
        engines: a.engines,
        preset: a.preset.clone(),
        fleet: a.fleet.clone(),
        time_scale: a.time_scale,
        engine: EngineOverrides {
            kv_memory_gib: a.kv_memory_gib,
            num_gpu_blocks: a.gpu_blocks,
            num_cpu_blocks: a.cpu_blocks,
            ..Default::default()
        },
        seed: a.workload.seed,
        tokenizer_dir: a.prompt.tokenizer_dir.clone(),
        ..FleetConfig::default()
    };
    fleet.validate().context("fleet configuration")?;
    let kvgate_base = match &a.kvgate_config {
        Some(p) => {
            kvgate::config::Config::from_file(p).with_context(|| format!("{}", p.display()))?
        }
        None => kvgate::config::Config::default(),
    };
    let timeout = secs("timeout-s", a.timeout_s)?;
    let cfg = CompareConfig {
        fleet: fleet.clone(),
        contenders,
        replay: ReplayConfig {
            arrivals: Arrivals::Trace {
                speed_up: a.speed_up * a.time_scale,
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
            ..ReplayConfig::new("", fleet.model.clone())
        },
        kvgate_base,
        python: a.python.clone().unwrap_or_else(default_python),
        ready_timeout: secs("ready-timeout-s", a.ready_timeout_s)?,
        sample_interval: Duration::from_secs(1),
        log_dir: a.output.out.join("logs"),
        keep_records: a.keep_records,
        model_time: !a.wall_time,
        ttft_slo_s: a.tenants.slo()?,
        warm_up_run: a.warm_up_run,
        rounds: a.rounds as usize,
    };
    let references = if a.references {
        // The same engines the comparison starts, each with its own capacity.
        let shape = FleetShape::from_config(&fleet)?;
        let sped = trace.speed_up(a.speed_up)?;
        let r = sizing::size(&sped, &shape, true)?;
        eprintln!(
            "references: infinite cache {:.1} %, fleet-sized LRU {:.1} %, TTFT floor mean {:.3} s p99 {:.3} s, E2E floor mean {:.3} s p99 {:.3} s",
            r.infinite_hit_ratio * 100.0,
            r.fleet_lru_hit_ratio * 100.0,
            r.ttft_floor_s.as_ref().map_or(0.0, |d| d.mean),
            r.ttft_floor_s.as_ref().map_or(0.0, |d| d.p99),
            r.e2e_floor_s.as_ref().map_or(0.0, |d| d.mean),
            r.e2e_floor_s.as_ref().map_or(0.0, |d| d.p99),
        );
        Some(serde_json::to_value(&r)?)
    } else {
        None
    };
    let warm_up = compare::warm_up(&trace, &builder, &cfg).await;
    if let Some(w) = &warm_up {
        match &w.error {
            None => eprintln!(
                "warm-up: round robin over the first {} requests ({} answered), {:.1} s, not measured",
                w.requests, w.ok, w.wall_s
            ),
            Some(e) => eprintln!("warm-up failed (the comparison still runs): {e}"),
        }
    }
    let results = compare::run(&trace, &builder, &cfg).await;
    let report = Report {
        tool: format!("kvgate-loadtest {}", env!("CARGO_PKG_VERSION")),
        command_line: command_line(),
        started_unix_s: started,
        kind: "compare".into(),
        parameters: serde_json::json!({
            "fleet": cfg.fleet,
            "replay": cfg.replay,
            "speed_up_model_time": a.speed_up,
            "api": a.prompt.api,
            "seed": a.workload.seed,
            "latencies_in": if cfg.model_time { "engine-model seconds (wall × time_scale)" } else { "wall-clock seconds" },
            "kvgate_config": cfg.kvgate_base,
            "python": cfg.python,
            "warm_up": warm_up,
            "rounds": cfg.rounds,
        }),
        trace: trace.stats(),
        prompt_tokens: token_error,
        references,
        over_rounds: if cfg.rounds > 1 {
            rounds::over_rounds(&results)
        } else {
            Vec::new()
        },
        contenders: results,
    };
    print!("{}", table::render(&report.contenders));
    if !report.over_rounds.is_empty() {
        print!("{}", rounds::render(&report.over_rounds));
    }
    a.output.write(&report)
}
