//! The `offline` subcommand: arguments, the run, the JSON report and the summary table.
//!
//! Invariants: every figure printed is also in the JSON report; the report records the exact
//! parameters used (fleet, router settings, policy configuration after overrides, seed,
//! speed-up), so a run can be repeated exactly.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use kvgate_sim::model::EngineParams;
use kvgate_sim::{EngineOverrides, FleetConfig, FleetMix};
use serde::{Deserialize, Serialize};

use super::engine_loop::FleetSpec;
use super::policies::{apply_overrides, resolve_policies};
use super::result::{PolicyResult, References};
use super::router::{nominal_decode_rates, nominal_rates, IndexMode, RouterSettings};
use super::runner::{references, run_policies, run_with_references, OfflineConfig};
use super::utilisation::{find_speed_up, SpeedUpFit};
use super::workload::Workload;
use super::OfflineError;
use crate::synth;
use crate::trace::{TieSpread, Trace};

/// Arguments of `kvgate-loadtest offline`.
#[derive(Clone, Debug, clap::Args)]
pub struct OfflineArgs {
    /// Mooncake-format JSONL trace.
    #[arg(long, required_unless_present = "synth", conflicts_with = "synth")]
    pub trace: Option<PathBuf>,
    /// A synthetic workload instead of a trace, with its default parameters: system-prompt,
    /// chat, agent, rag, long, mix (cut in `--trace-block-tokens` blocks).
    #[arg(long, value_name = "KIND")]
    pub synth: Option<String>,
    /// Seed of the synthetic workload (independent of `--seed`, so tie-breaking can be varied on
    /// the same workload).
    #[arg(long, default_value_t = 1)]
    pub synth_seed: u64,
    /// Tokens per trace block (`hash_ids` granularity).
    #[arg(long, default_value_t = 512)]
    pub trace_block_tokens: u32,
    /// Leave out the first N requests; the rest start at time 0 (a later window of a trace).
    #[arg(long, default_value_t = 0)]
    pub skip_requests: usize,
    /// Replay only the first N requests (after --skip-requests).
    #[arg(long)]
    pub max_requests: Option<usize>,
    /// Number of simulated engines.
    #[arg(long, default_value_t = 16)]
    pub engines: usize,
    /// Engine model/GPU class (see `kvgate-sim` presets).
    #[arg(long, default_value = "llama3-8b-h100")]
    pub preset: String,
    /// Engines of several classes instead of --engines/--preset, in instance order, e.g.
    /// `llama3-8b-h100:4,llama3-8b-a100-40gb:4`.
    #[arg(long, value_name = "PRESET:COUNT,...", conflicts_with_all = ["engines", "preset"])]
    pub fleet: Option<FleetMix>,
    /// GPU KV blocks per engine (overrides the preset's capacity; every engine of a mixed fleet).
    #[arg(long)]
    pub capacity_blocks: Option<u32>,
    /// CPU-offload KV blocks per engine (0 = no offload tier; every engine of a mixed fleet).
    #[arg(long)]
    pub cpu_blocks: Option<u32>,
    /// Trace speed-up (arrival times divided by it).
    #[arg(long, conflicts_with = "target_utilisation")]
    pub speed_up: Option<f64>,
    /// Instead of a speed-up: find the one where round robin keeps the fleet this busy (0..1).
    #[arg(long)]
    pub target_utilisation: Option<f64>,
    /// Policies to compare: `all` or a comma-separated list.
    #[arg(long, default_value = "all")]
    pub policies: String,
    /// Seed for tie-breaking and event ordering.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Placement index sources.
    #[arg(long, default_value = "both")]
    pub index: IndexMode,
    /// Policy parameter override, `section.field=value` (repeatable), e.g. `kvgate.queue_weight=2`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Lifetime of a predicted placement (default: the gateway's).
    #[arg(long)]
    pub predicted_ttl_ms: Option<u64>,
    /// Instance rates the router uses: `nominal` (calibrated to the engine model, as an operator
    /// would configure them; one engine class only), `gateway` (the gateway's uncalibrated
    /// defaults) or `learned` (the gateway's defaults, then learned from observed time to first
    /// token, as the gateway does).
    #[arg(long, default_value = "learned")]
    pub rates: RatesMode,
    /// Index entry bound per instance as a multiple of the engine's GPU + CPU blocks.
    #[arg(long, default_value_t = 2.0)]
    pub index_capacity_factor: f64,
    /// How often expired predictions are swept from the index, virtual ms (routing ignores
    /// expired predictions either way and capacity eviction takes them first, so the sweep only
    /// frees memory; the gateway sweeps every second of wall time).
    #[arg(long, default_value_t = 60_000)]
    pub expire_interval_ms: u64,
    /// Engine metrics scrape interval in virtual ms (0 = never scraped; default: the gateway's
    /// `[load] poll_interval_ms`).
    #[arg(long, default_value_t = kvgate::config::LoadConfig::default().poll_interval_ms)]
    pub scrape_interval_ms: u64,
    /// How long after the engine step that produced them KV events reach the router's index,
    /// virtual ms (0: at the step's end; a live gateway adds transport and ingest time, which
    /// its `kvgate_kv_event_lag_seconds` histogram measures).
    #[arg(long, default_value_t = 0)]
    pub event_lag_ms: u64,
    /// Small requests each router routes before the workload (`compare` warms every router up
    /// with 1 before its replay, which moves a round-robin rotation by one place).
    #[arg(long, default_value_t = 0)]
    pub warm_up_requests: u32,
    /// Requests of the same arrival instant reach the router in a random order drawn from
    /// `--seed` (as concurrent sends reach a live gateway) instead of the trace's order.
    #[arg(long)]
    pub shuffle_simultaneous: bool,
    /// Time from a request's arrival to the routing decision, virtual µs per 1,000 prompt tokens
    /// (0: at once). Live the body is built, sent, read and hashed first, so long prompts are
    /// decided after short ones sent just after them; to mirror a live run at `--time-scale S`,
    /// S times the wall-clock rate measured there (docs/loadtest.md).
    #[arg(long, default_value_t = 0.0, value_name = "US")]
    pub ingest_us_per_ktoken: f64,
    /// Each request's extra time to the decision, uniform in [0, this) virtual µs, drawn from
    /// `--seed` (0: none): the live path's jitter, which reorders requests sent that close.
    #[arg(long, default_value_t = 0, value_name = "US")]
    pub ingest_jitter_us: u64,
    /// Spread requests that share a timestamp over the interval to the next distinct timestamp,
    /// in trace order: at uniform offsets drawn from `--synth-seed` (`uniform`, the default when
    /// the flag is given bare; `compare --spread-ties --seed S` draws the same for S) or at equal
    /// intervals (`even`).
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "uniform", value_name = "HOW")]
    pub spread_ties: Option<TieSpread>,
    /// Skip the no-queue TTFT and E2E floors (the slowest references).
    #[arg(long)]
    pub no_floor: bool,
    /// Also print one row per engine and policy: request and prompt-token share, mean prompt,
    /// TTFT, E2E and hit ratio.
    #[arg(long)]
    pub instances: bool,
    /// Worker threads (default: available cores).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Write the full report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write every request's record here, one JSON object per line with its policy's name, in the
    /// format `compare --keep-records` keeps live runs' (virtual seconds; `instance` is the
    /// engine's index in fleet order).
    #[arg(long)]
    pub records: Option<PathBuf>,
}

/// Where the router's per-instance rates come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum RatesMode {
    /// Calibrated to the engine model ([`super::router::nominal_rates`]).
    Nominal,
    /// The gateway's configured defaults.
    Gateway,
    /// Learned from each request's time to first token from the gateway's defaults, as the
    /// gateway does (`[routing.rates]` defaults).
    Learned,
}

/// Parameters a report was produced with.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunParams {
    /// Trace path, or `synth:KIND` for a synthetic workload.
    pub trace: String,
    /// Seed of the synthetic workload, when one was generated.
    #[serde(default)]
    pub synth_seed: Option<u64>,
    /// Requests replayed.
    pub requests: usize,
    /// Engines.
    pub engines: usize,
    /// Preset name, or the fleet string of a fleet of several classes.
    pub preset: String,
    /// Engine parameters after overrides (the first engine's in a fleet of several classes; see
    /// `classes`).
    pub engine: EngineParams,
    /// Every engine class: preset, engine count, parameters after overrides, in fleet order.
    #[serde(default)]
    pub classes: Vec<FleetClass>,
    /// The preset of each instance, in instance order.
    #[serde(default)]
    pub instance_presets: Vec<String>,
    /// Speed-up applied to the trace.
    pub speed_up: f64,
    /// Utilisation search, when one ran.
    pub speed_up_fit: Option<SpeedUpFit>,
    /// Index sources.
    pub index: IndexMode,
    /// Prediction lifetime.
    pub predicted_ttl_ms: u64,
    /// Scrape interval.
    pub scrape_interval_ms: u64,
    /// KV event lag.
    #[serde(default)]
    pub event_lag_ms: u64,
    /// Warm-up requests routed before the workload.
    #[serde(default)]
    pub warm_up_requests: u32,
    /// Whether simultaneous arrivals were shuffled.
    #[serde(default)]
    pub shuffle_simultaneous: bool,
    /// Ingest time to the decision, virtual µs per 1,000 prompt tokens.
    #[serde(default)]
    pub ingest_us_per_ktoken: f64,
    /// Largest ingest jitter, virtual µs.
    #[serde(default)]
    pub ingest_jitter_us: u64,
    /// How requests sharing a timestamp were spread over their tick (`--spread-ties`), if they
    /// were.
    #[serde(default)]
    pub spread_ties: Option<TieSpread>,
    /// Prefill rate the router assumed per instance, tokens/s.
    pub prefill_tokens_per_s: f64,
    /// Decode interference the router assumed, ms per decoding sequence.
    pub decode_interference_ms: f64,
    /// Policy configuration after overrides.
    pub policy_config: serde_json::Value,
    /// Overrides as given.
    pub overrides: Vec<String>,
    /// Seed.
    pub seed: u64,
}

/// One engine class of the simulated fleet.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FleetClass {
    /// Preset name.
    pub preset: String,
    /// Engines of this class.
    pub engines: usize,
    /// Their parameters after overrides.
    pub params: EngineParams,
}

/// The whole report of one `offline` run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OfflineReport {
    /// What ran.
    pub params: RunParams,
    /// References computed from the workload and fleet.
    pub references: References,
    /// One entry per policy, in the order given.
    pub results: Vec<PolicyResult>,
    /// Wall time of the whole command, seconds.
    pub wall_s: f64,
}

/// Router settings with the gateway's defaults for this fleet (see [`RouterSettings::gateway_defaults`]).
pub fn gateway_router_settings(
    fleet: &FleetSpec,
    index: IndexMode,
    predicted_ttl_ms: Option<u64>,
    scrape_interval_ms: u64,
) -> RouterSettings {
    let mut s = RouterSettings::gateway_defaults(fleet.reported_capacity_blocks());
    s.index_mode = index;
    if let Some(ttl) = predicted_ttl_ms {
        s.predicted_ttl_ms = ttl;
    }
    s.scrape_interval_ms = scrape_interval_ms;
    s
}

/// Mean context of a decoding sequence: mean prompt plus half the mean output.
fn typical_context(w: &Workload) -> u32 {
    let n = w.requests.len().max(1) as u64;
    let prompt: u64 = w.requests.iter().map(|r| u64::from(r.prompt_tokens)).sum();
    let out: u64 = w.requests.iter().map(|r| u64::from(r.output_tokens)).sum();
    ((prompt + out / 2) / n).min(u64::from(u32::MAX)) as u32
}

/// Runs the `offline` subcommand: simulates, prints the summary table, writes the JSON report.
pub fn run_cli(args: OfflineArgs) -> Result<OfflineReport, OfflineError> {
    let started = Instant::now();
    let (mut trace, source) = match (&args.trace, &args.synth) {
        (Some(path), _) => (
            Trace::load_with(path, args.trace_block_tokens)?,
            path.display().to_string(),
        ),
        (None, Some(kind)) => {
            let w = synth::Workload::named(kind).map_err(|e| OfflineError::Param(e.to_string()))?;
            let t = w
                .generate(args.synth_seed, args.trace_block_tokens)
                .map_err(|e| OfflineError::Param(e.to_string()))?;
            (t, format!("synth:{kind}"))
        }
        (None, None) => {
            return Err(OfflineError::Param(
                "give --trace FILE or --synth KIND".into(),
            ))
        }
    };
    if let Some(how) = args.spread_ties {
        // Before slicing: a tick's interval is read from the next timestamp in the whole trace.
        trace = trace.spread_ties(how, args.synth_seed);
    }
    trace = trace.skip(args.skip_requests);
    if let Some(n) = args.max_requests {
        trace = trace.slice(Some(n), None);
    }
    if trace.requests.is_empty() {
        return Err(OfflineError::Param(format!(
            "the workload has no requests (after --skip-requests {})",
            args.skip_requests
        )));
    }
    if args.fleet.is_none() && args.engines == 0 {
        return Err(OfflineError::Param("--engines must be at least 1".into()));
    }
    // The simulator's own fleet configuration derives every engine's parameters, so presets,
    // fleet strings and overrides mean the same here as in `kvgate sim` and `compare`.
    let fleet_cfg = FleetConfig {
        engines: args.engines,
        preset: args.preset.clone(),
        fleet: args.fleet.clone(),
        engine: EngineOverrides {
            num_gpu_blocks: args.capacity_blocks,
            num_cpu_blocks: args.cpu_blocks,
            ..Default::default()
        },
        ..FleetConfig::default()
    };
    let fleet = FleetSpec::from_config(&fleet_cfg)?;
    fleet.validate()?;
    let classes: Vec<FleetClass> = fleet
        .classes()
        .into_iter()
        .map(|(preset, engines, params)| FleetClass {
            preset,
            engines,
            params,
        })
        .collect();
    let params = classes
        .first()
        .map(|c| c.params.clone())
        .ok_or_else(|| OfflineError::Param("the fleet needs at least one engine".into()))?;
    let policy_cfg = apply_overrides(&args.overrides)?;
    let policies = resolve_policies(&args.policies)?;
    let base = Workload::from_trace(&trace, fleet.block_size(), 1.0)?;
    let mut router = gateway_router_settings(
        &fleet,
        args.index,
        args.predicted_ttl_ms,
        args.scrape_interval_ms,
    );
    router.index_capacity_factor = args.index_capacity_factor;
    router.event_lag_ms = args.event_lag_ms;
    router.warm_up_requests = args.warm_up_requests;
    router.shuffle_simultaneous = args.shuffle_simultaneous;
    if !(args.ingest_us_per_ktoken.is_finite() && args.ingest_us_per_ktoken >= 0.0) {
        return Err(OfflineError::Param(format!(
            "--ingest-us-per-ktoken must be a finite number ≥ 0, not {}",
            args.ingest_us_per_ktoken
        )));
    }
    router.ingest_us_per_ktoken = args.ingest_us_per_ktoken;
    router.ingest_jitter_us = args.ingest_jitter_us;
    router.expire_interval_ms = args.expire_interval_ms.max(1);
    match args.rates {
        // The router holds one rate for every instance, as the gateway's `[routing.rates]` does;
        // engines of several classes need rates learned per instance.
        RatesMode::Nominal if classes.len() > 1 => {
            return Err(OfflineError::Param(
                "--rates nominal calibrates one rate for every instance; a fleet of several \
                 engine classes needs --rates learned (the default)"
                    .into(),
            ))
        }
        RatesMode::Nominal => {
            router.rates = nominal_rates(&params, typical_context(&base));
            router.decode_rates = nominal_decode_rates(&params);
        }
        RatesMode::Gateway => {}
        RatesMode::Learned => {
            router.learn_rates = Some(kvgate_core::load::RateConfig::default());
        }
    }
    let cfg = OfflineConfig {
        router,
        fleet,
        policy: policy_cfg,
        seed: args.seed,
        jobs: args
            .jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
    };
    let with_floor = !args.no_floor;
    let (speed_up, fit, early_refs) = match (args.speed_up, args.target_utilisation) {
        (Some(s), _) => (s, None, None),
        (None, Some(u)) => {
            // The search is sequential; the references depend on the requests' order only, not
            // their arrival times, so they are computed meanwhile on another worker.
            let (fit, refs) = if cfg.jobs >= 2 {
                std::thread::scope(|sc| {
                    let refs = sc.spawn(|| references(&base, &cfg.fleet, with_floor));
                    let fit = find_speed_up(&base, &cfg, u, 0.01, 10);
                    let refs = refs.join().unwrap_or_else(|_| {
                        Err(OfflineError::Param("the references worker panicked".into()))
                    });
                    (fit, Some(refs))
                })
            } else {
                (find_speed_up(&base, &cfg, u, 0.01, 10), None)
            };
            let fit = fit?;
            eprintln!(
                "round_robin reaches {:.1} % utilisation at speed-up {:.3} ({} probes)",
                fit.utilisation * 100.0,
                fit.speed_up,
                fit.probes.len()
            );
            (fit.speed_up, Some(fit), refs.transpose()?)
        }
        (None, None) => (1.0, None, None),
    };
    let workload = base.rescaled(speed_up)?;
    let (results, references) = match early_refs {
        Some(refs) => (run_policies(&workload, &cfg, &policies)?, refs),
        None => run_with_references(&workload, &cfg, &policies, with_floor)?,
    };
    let report = OfflineReport {
        params: RunParams {
            trace: source,
            synth_seed: args.synth.as_ref().map(|_| args.synth_seed),
            requests: workload.requests.len(),
            engines: cfg.fleet.len(),
            preset: match &args.fleet {
                Some(m) if !m.is_uniform() => m.to_string(),
                Some(m) => m
                    .groups()
                    .first()
                    .map_or_else(|| args.preset.clone(), |g| g.preset.clone()),
                None => args.preset.clone(),
            },
            engine: params,
            instance_presets: cfg.fleet.engines.iter().map(|e| e.preset.clone()).collect(),
            classes,
            speed_up,
            speed_up_fit: fit,
            index: args.index,
            predicted_ttl_ms: cfg.router.predicted_ttl_ms,
            scrape_interval_ms: cfg.router.scrape_interval_ms,
            event_lag_ms: cfg.router.event_lag_ms,
            warm_up_requests: cfg.router.warm_up_requests,
            shuffle_simultaneous: cfg.router.shuffle_simultaneous,
            ingest_us_per_ktoken: cfg.router.ingest_us_per_ktoken,
            ingest_jitter_us: cfg.router.ingest_jitter_us,
            spread_ties: args.spread_ties,
            prefill_tokens_per_s: cfg.router.rates.prefill_tokens_per_s,
            decode_interference_ms: cfg.router.rates.decode_interference_ms,
            policy_config: serde_json::to_value(&cfg.policy).unwrap_or(serde_json::Value::Null),
            overrides: args.overrides.clone(),
            seed: args.seed,
        },
        references,
        results,
        wall_s: started.elapsed().as_secs_f64(),
    };
    if let Some(path) = &args.json {
        let out = output_error(path);
        let body = serde_json::to_vec_pretty(&report).map_err(|e| out(e.to_string()))?;
        std::fs::write(path, body).map_err(|e| out(e.to_string()))?;
    }
    if let Some(path) = &args.records {
        write_records(path, &report.results)?;
    }
    println!("{}", summary_table(&report));
    if args.instances {
        println!(
            "{}",
            crate::offline::instances::instance_table(&report.results)
        );
    }
    Ok(report)
}

/// The error for a failed write of an output file at `path`.
fn output_error(path: &std::path::Path) -> impl Fn(String) -> OfflineError + '_ {
    move |msg| OfflineError::Output {
        path: path.display().to_string(),
        msg,
    }
}

/// One line of `--records`: a request's record and the policy that routed it.
#[derive(Serialize)]
struct PolicyRecord<'a> {
    policy: &'a str,
    #[serde(flatten)]
    record: &'a crate::replay::record::RequestRecord,
}

/// Writes every result's request records to `path`, one JSON object per line.
fn write_records(path: &std::path::Path, results: &[PolicyResult]) -> Result<(), OfflineError> {
    use std::io::Write as _;
    let out = output_error(path);
    let file = std::fs::File::create(path).map_err(|e| out(e.to_string()))?;
    let mut w = std::io::BufWriter::new(file);
    for r in results {
        for record in &r.records {
            let line = PolicyRecord {
                policy: &r.policy,
                record,
            };
            serde_json::to_writer(&mut w, &line).map_err(|e| out(e.to_string()))?;
            w.write_all(b"\n").map_err(|e| out(e.to_string()))?;
        }
    }
    w.flush().map_err(|e| out(e.to_string()))
}

/// The terminal summary: one row per policy with ratios against the best contender, then the
/// references.
pub fn summary_table(report: &OfflineReport) -> String {
    let rs = &report.results;
    let best = |f: &dyn Fn(&PolicyResult) -> f64, higher: bool| -> f64 {
        let it = rs.iter().map(f).filter(|v| v.is_finite());
        if higher {
            it.fold(f64::NEG_INFINITY, f64::max)
        } else {
            it.fold(f64::INFINITY, f64::min)
        }
    };
    let best_mean = best(&|r| r.ttft_s.mean, false);
    let best_p99 = best(&|r| r.ttft_s.p99, false);
    let best_hit = best(&|r| r.hit_ratio, true);
    let rel = |v: f64, b: f64| if b > 0.0 && b.is_finite() { v / b } else { 0.0 };
    let p = &report.params;
    let mut s = String::new();
    let fleet = if p.classes.is_empty() {
        vec![FleetClass {
            preset: p.preset.clone(),
            engines: p.engines,
            params: p.engine.clone(),
        }]
    } else {
        p.classes.clone()
    };
    let fleet_text = fleet
        .iter()
        .map(|c| {
            format!(
                "{} × {} ({} GPU + {} CPU blocks of {} tokens)",
                c.engines,
                c.preset,
                c.params.num_gpu_blocks,
                c.params.num_cpu_blocks,
                c.params.block_size
            )
        })
        .collect::<Vec<_>>()
        .join(" + ");
    let _ = writeln!(
        s,
        "offline: {} requests, {fleet_text}, speed-up {:.3}, index {:?}, seed {}",
        p.requests, p.speed_up, p.index, p.seed
    );
    let _ = writeln!(
        s,
        "{:<20} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>6} {:>6} {:>7} {:>6} {:>6} {:>6} {:>5} {:>5} {:>7}",
        "policy", "ttft", "p50", "p90", "p99", "e2e", "out tok/s", "hit", "×mean", "×p99", "÷hit",
        "share", "spread", "util", "busy", "errors"
    );
    for r in rs {
        let _ = writeln!(
            s,
            "{:<20} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.2} {:>9.0} {:>6.3} {:>6.2} {:>7.2} {:>6.2} {:>6.2} {:>6.2} {:>5.2} {:>5.2} {:>7}",
            r.policy,
            r.ttft_s.mean,
            r.ttft_s.p50,
            r.ttft_s.p90,
            r.ttft_s.p99,
            r.e2e_s.mean,
            r.output_tokens_per_s,
            r.hit_ratio,
            rel(r.ttft_s.mean, best_mean),
            rel(r.ttft_s.p99, best_p99),
            rel(r.hit_ratio, best_hit),
            r.share_max_over_mean,
            r.load_spread,
            r.utilisation,
            r.busy,
            r.rejected + r.unfinished,
        );
    }
    if fleet.len() > 1 {
        let _ = writeln!(
            s,
            "by engine class: {:<20} {:<24} {:>6} {:>8} {:>8} {:>8} {:>6}",
            "policy", "class", "share", "ttft", "p99", "e2e", "hit"
        );
        for r in rs {
            for c in &r.classes {
                let _ = writeln!(
                    s,
                    "                 {:<20} {:<24} {:>6.3} {:>8.3} {:>8.3} {:>8.2} {:>6.3}",
                    r.policy,
                    format!("{} × {}", c.engines, c.preset),
                    c.request_share,
                    c.ttft_s.mean,
                    c.ttft_s.p99,
                    c.e2e_s.mean,
                    c.hit_ratio
                );
            }
        }
    }
    let f = &report.references;
    let _ = writeln!(
        s,
        "references: infinite-cache hit {:.3}, fleet-LRU hit {:.3} ({} blocks), no-queue TTFT floor mean {:.3} p50 {:.3} p90 {:.3} p99 {:.3}, E2E floor mean {:.3} p99 {:.3}",
        f.infinite_hit_ratio,
        f.fleet_lru_hit_ratio,
        f.fleet_lru_capacity_blocks,
        f.ttft_floor_s.mean,
        f.ttft_floor_s.p50,
        f.ttft_floor_s.p90,
        f.ttft_floor_s.p99,
        f.e2e_floor_s.mean,
        f.e2e_floor_s.p99
    );
    let _ = writeln!(
        s,
        "(times in s; ×mean/×p99: TTFT over the best contender's; ÷hit: hit ratio over the best; share: busiest instance's request share over the mean; spread: time-weighted max/mean in-flight; util: work over capacity (a step's fixed cost weighted by its token-budget fill); busy: time in engine steps; wall {:.1} s; per policy: {})",
        report.wall_s,
        rs.iter()
            .map(|r| format!("{} {:.1}s", r.policy, r.wall_ms / 1e3))
            .collect::<Vec<_>>()
            .join(", ")
    );
    s
}
