//! Orchestrated comparison: the same trace against several routers, each on a fresh fleet.
//!
//! First, unless disabled, a warm-up: round robin over the trace's first requests on a fleet of
//! its own, not measured, so that the first contender does not pay alone for this process's cold
//! start (threads, allocator pages, sockets). Then for every contender, in order: start a
//! new simulated fleet (cold caches), start the router (kvgate in-process, or an external
//! command), wait until it is ready and warmed up, snapshot the engines' counters, replay the
//! trace while sampling the fleet, snapshot again, stop the router and the fleet. A contender
//! that fails to start is reported with its error and the others still run. Hit ratio comes
//! from the engines' counters only.

pub mod contender;
pub mod external;
pub mod gateway;
pub mod ready;

use std::path::PathBuf;
use std::time::Duration;

use kvgate_sim::{Fleet, FleetConfig};
use serde::Serialize;

use crate::fleet_metrics::{self, FleetDelta, SeriesPoint};
use crate::prompt::PromptBuilder;
use crate::replay::{self, ReplayConfig, RequestRecord};
use crate::report::summary::{goodput, summarise, RunSummary};
use crate::trace::Trace;
pub use contender::{ContenderSpec, TemplateVars};

/// Comparison parameters.
#[derive(Debug, Clone)]
pub struct CompareConfig {
    /// Fleet started fresh for every contender.
    pub fleet: FleetConfig,
    /// Contenders, run in this order.
    pub contenders: Vec<ContenderSpec>,
    /// Replay settings (`base_url` is replaced by each router's URL).
    pub replay: ReplayConfig,
    /// Base gateway config for kvgate contenders (pools and policy are set per run).
    pub kvgate_base: kvgate::config::Config,
    /// Interpreter substituted for `{python}`.
    pub python: PathBuf,
    /// Longest wait for a router to become ready.
    pub ready_timeout: Duration,
    /// Fleet metrics sampling interval.
    pub sample_interval: Duration,
    /// Directory for external routers' logs.
    pub log_dir: PathBuf,
    /// Keep every request record in the results.
    pub keep_records: bool,
    /// Report latencies in engine-model time: wall-clock figures × the fleet's time scale.
    pub model_time: bool,
    /// Time-to-first-token objective for goodput, in the reported time unit.
    pub ttft_slo_s: Option<f64>,
    /// Requests of the unmeasured warm-up before the first contender (0: none).
    pub warm_up_run: usize,
    /// Times every contender runs; round `r` (from 0) starts with contender `r mod k`, so that
    /// no contender always runs first. At least 1.
    pub rounds: usize,
}

/// What the unmeasured warm-up did.
#[derive(Debug, Clone, Serialize)]
pub struct WarmUp {
    /// Requests replayed (the trace's first ones).
    pub requests: usize,
    /// Of those, answered in full.
    pub ok: usize,
    /// Wall-clock seconds it took, fleet start to stop.
    pub wall_s: f64,
    /// Why it failed, if it did (the comparison still runs).
    pub error: Option<String>,
}

/// Everything measured for one contender.
#[derive(Debug, Clone, Serialize)]
pub struct ContenderResult {
    /// Display name.
    pub name: String,
    /// Round of the comparison this run belongs to, from 1, when there were several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round: Option<usize>,
    /// What was run.
    pub spec: ContenderSpec,
    /// Router version.
    pub version: Option<String>,
    /// The command line of an external router.
    pub command: Option<String>,
    /// Why the contender could not run (then the figures are empty).
    pub error: Option<String>,
    /// Summary figures.
    pub summary: Option<RunSummary>,
    /// Engines' counter deltas.
    pub fleet: Option<FleetDelta>,
    /// Engine names in fleet order.
    pub engines: Vec<String>,
    /// Each engine's preset (model/GPU class), in fleet order.
    pub engine_presets: Vec<String>,
    /// Hit ratio and load spread over time.
    pub series: Vec<SeriesPoint>,
    /// Sorted TTFTs of successful requests (for distribution charts).
    pub ttft_sorted: Vec<f64>,
    /// Every request record (only with `keep_records`).
    pub records: Vec<RequestRecord>,
}

impl ContenderResult {
    /// The name shown in tables and charts: with several rounds, the round too.
    pub fn label(&self) -> String {
        match self.round {
            Some(r) => format!("{} (round {r})", self.name),
            None => self.name.clone(),
        }
    }

    /// A result for a contender that could not run.
    pub fn failed(spec: &ContenderSpec, error: String) -> Self {
        ContenderResult {
            name: spec.name().to_string(),
            round: None,
            spec: spec.clone(),
            version: None,
            command: None,
            error: Some(error),
            summary: None,
            fleet: None,
            engines: Vec::new(),
            engine_presets: Vec::new(),
            series: Vec::new(),
            ttft_sorted: Vec::new(),
            records: Vec::new(),
        }
    }
}

enum Router {
    Kvgate(Vec<gateway::InProcessGateway>),
    External(Box<external::ExternalRouter>),
}

impl Router {
    async fn stop(self) {
        match self {
            Router::Kvgate(g) => gateway::stop_all(g).await,
            Router::External(e) => e.stop().await,
        }
    }
}

/// Runs the warm-up: round robin over the trace's first `warm_up_run` requests on a fresh
/// fleet, through the same code as a contender, its figures discarded. `None` when disabled.
pub async fn warm_up(
    trace: &Trace,
    builder: &PromptBuilder,
    cfg: &CompareConfig,
) -> Option<WarmUp> {
    if cfg.warm_up_run == 0 || cfg.contenders.is_empty() {
        return None;
    }
    let requests = cfg
        .replay
        .max_requests
        .map_or(cfg.warm_up_run, |m| m.min(cfg.warm_up_run))
        .min(trace.requests.len());
    let spec = ContenderSpec::kvgate(kvgate_core::policy::PolicyName::RoundRobin);
    let wcfg = CompareConfig {
        replay: ReplayConfig {
            max_requests: Some(requests),
            ..cfg.replay.clone()
        },
        keep_records: false,
        ..cfg.clone()
    };
    let started = std::time::Instant::now();
    let r = run_one(trace, builder, &wcfg, &spec, "[warm-up, not measured] ").await;
    Some(WarmUp {
        requests,
        ok: r.summary.as_ref().map_or(0, |s| s.ok),
        wall_s: started.elapsed().as_secs_f64(),
        error: r.error,
    })
}

/// Runs every contender in turn, `rounds` times.
pub async fn run(
    trace: &Trace,
    builder: &PromptBuilder,
    cfg: &CompareConfig,
) -> Vec<ContenderResult> {
    let (k, rounds) = (cfg.contenders.len(), cfg.rounds.max(1));
    let mut out = Vec::with_capacity(k * rounds);
    for round in 0..rounds {
        for j in 0..k {
            let spec = &cfg.contenders[(round + j) % k];
            let label = if rounds > 1 {
                format!(
                    "[round {}/{rounds}, {}/{k}] {} ",
                    round + 1,
                    j + 1,
                    spec.name()
                )
            } else {
                format!("[{}/{k}] {} ", j + 1, spec.name())
            };
            let mut r = run_one(trace, builder, cfg, spec, &label).await;
            r.round = (rounds > 1).then_some(round + 1);
            out.push(r);
        }
    }
    out
}

/// Runs one contender on a fresh fleet.
pub async fn run_one(
    trace: &Trace,
    builder: &PromptBuilder,
    cfg: &CompareConfig,
    spec: &ContenderSpec,
    label: &str,
) -> ContenderResult {
    let fleet = match Fleet::start(cfg.fleet.clone()).await {
        Ok(f) => f,
        Err(e) => return ContenderResult::failed(spec, format!("starting the fleet: {e}")),
    };
    let result = run_on_fleet(trace, builder, cfg, spec, &fleet, label).await;
    fleet.shutdown().await;
    result.unwrap_or_else(|e| ContenderResult::failed(spec, e))
}

/// Applies a kvgate contender's bracketed overrides to its gateway config: `gossip.KEY=VALUE`
/// to the `[gossip]` section and `routing.KEY=VALUE` to the `[routing]` section (keys relative
/// to them; routing's values as the gateway runs them, in wall time), every other key to the
/// routing policy's section (the keys of `offline --set`).
fn apply_contender_overrides(
    c: &mut kvgate::config::Config,
    overrides: &[String],
) -> Result<(), String> {
    use crate::offline::policies::{apply_json_overrides, apply_overrides_to};
    let overrides: Vec<&str> = overrides.iter().map(|o| o.trim()).collect();
    // The overrides under `prefix`, with it taken off (keys relative to its section).
    let under = |prefix: &str| -> Vec<String> {
        overrides
            .iter()
            .filter_map(|o| o.strip_prefix(prefix).map(str::to_string))
            .collect()
    };
    // Keys under these prefixes set those sections; every other key sets the policy.
    const GOSSIP: &str = "gossip.";
    const ROUTING: &str = "routing.";
    let (gossip, routing) = (under(GOSSIP), under(ROUTING));
    let policy: Vec<String> = overrides
        .iter()
        .filter(|o| ![GOSSIP, ROUTING].iter().any(|p| o.starts_with(p)))
        .map(|o| o.to_string())
        .collect();
    let err = |e: crate::offline::OfflineError| e.to_string();
    if !routing.is_empty() {
        c.routing = apply_json_overrides(&c.routing, &routing, "routing").map_err(err)?;
    }
    if !policy.is_empty() {
        c.routing.policy = apply_overrides_to(&c.routing.policy, &policy).map_err(err)?;
    }
    if !gossip.is_empty() {
        c.gossip = apply_json_overrides(&c.gossip, &gossip, "gossip").map_err(err)?;
    }
    Ok(())
}

async fn start_router(
    cfg: &CompareConfig,
    spec: &ContenderSpec,
    workers: &[String],
    fleet: &Fleet,
) -> Result<(Router, Vec<String>, Option<String>, Option<String>), String> {
    match spec {
        ContenderSpec::Kvgate {
            policy,
            overrides,
            replicas,
            ..
        } => {
            let mut c = gateway::config_for(
                &cfg.kvgate_base,
                *policy,
                &fleet.instances(),
                &cfg.fleet.model,
            );
            apply_contender_overrides(&mut c, overrides)?;
            let g = gateway::InProcessGateway::start_replicas(
                c,
                *replicas as usize,
                cfg.fleet.time_scale,
            )
            .await
            .map_err(|e| e.to_string())?;
            let urls = g.iter().map(|g| g.url.clone()).collect();
            Ok((
                Router::Kvgate(g),
                urls,
                Some(env!("CARGO_PKG_VERSION").to_string()),
                None,
            ))
        }
        ContenderSpec::External {
            name,
            command,
            version_command,
        } => {
            let vars = TemplateVars {
                python: cfg.python.clone(),
                port: external::free_port().map_err(|e| e.to_string())?,
                metrics_port: external::free_port().map_err(|e| e.to_string())?,
                workers: workers.to_vec(),
                model: cfg.fleet.model.clone(),
            };
            let version = match version_command {
                Some(v) => external::version(&vars.apply(v)).await,
                None => None,
            };
            let cmd = vars.apply(command);
            std::fs::create_dir_all(&cfg.log_dir)
                .map_err(|e| format!("{}: {e}", cfg.log_dir.display()))?;
            let safe: String = name
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let log = cfg.log_dir.join(format!("{safe}.log"));
            let r = external::ExternalRouter::start(&cmd, &log).map_err(|e| e.to_string())?;
            let url = format!("http://127.0.0.1:{}", vars.port);
            Ok((Router::External(Box::new(r)), vec![url], version, Some(cmd)))
        }
        ContenderSpec::Endpoint { url, .. } => Err(format!(
            "an existing endpoint ({url}) cannot be run on a fresh fleet; use `replay`"
        )),
    }
}

async fn run_on_fleet(
    trace: &Trace,
    builder: &PromptBuilder,
    cfg: &CompareConfig,
    spec: &ContenderSpec,
    fleet: &Fleet,
    label: &str,
) -> Result<ContenderResult, String> {
    let infos = fleet.instances();
    let workers: Vec<String> = infos.iter().map(|i| i.url.clone()).collect();
    let names: Vec<String> = infos.iter().map(|i| i.name.clone()).collect();
    let presets: Vec<String> = infos.iter().map(|i| i.preset.clone()).collect();
    let (mut router, urls, version, command) = start_router(cfg, spec, &workers, fleet).await?;
    let client = reqwest::Client::new();
    let measured = async {
        let ready = async {
            for url in &urls {
                ready::wait_ready(
                    &client,
                    url,
                    &workers,
                    &cfg.fleet.model,
                    builder.api(),
                    cfg.ready_timeout,
                )
                .await?;
            }
            Ok::<_, ready::NotReady>(())
        };
        // An external router that exits (bad flags, missing binary) fails now, not at the timeout.
        let exited = async {
            loop {
                tokio::time::sleep(Duration::from_millis(300)).await;
                if let Router::External(e) = &mut router {
                    if !e.is_running() {
                        return format!("router exited during start-up; see {}", e.log.display());
                    }
                }
            }
        };
        tokio::select! {
            r = ready => r.map_err(|e| e.to_string())?,
            msg = exited => return Err(msg),
        }
        let before = fleet_metrics::snapshot(&client, &workers, 0.0)
            .await
            .map_err(|e| e.to_string())?;
        let sampler =
            fleet_metrics::Sampler::start(client.clone(), workers.clone(), cfg.sample_interval);
        let rcfg = ReplayConfig {
            base_url: urls[0].clone(),
            replica_urls: urls[1..].to_vec(),
            ..cfg.replay.clone()
        };
        let out = replay::run(trace, builder, &rcfg, label).await;
        let mut samples = sampler.finish().await;
        let out = out.map_err(|e| e.to_string())?;
        // Engines update counters when a request finishes, before the last bytes reach us.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after = fleet_metrics::snapshot(&client, &workers, out.wall_s)
            .await
            .map_err(|e| e.to_string())?;
        samples.insert(
            0,
            fleet_metrics::FleetSnapshot {
                at_s: 0.0,
                ..before.clone()
            },
        );
        Ok::<_, String>((out, before, after, samples))
    }
    .await;
    router.stop().await;
    let (out, before, after, samples) = measured?;
    let scale = if cfg.model_time {
        cfg.fleet.time_scale
    } else {
        1.0
    };
    let mut delta = fleet_metrics::delta(&before, &after);
    // The simulated engines measure in model seconds; the summary's unit is `scale`'s.
    delta.engine_ttft_mean_s = delta
        .engine_ttft_mean_s
        .map(|t| t / cfg.fleet.time_scale * scale);
    let mut summary = summarise(&out, Some(&delta), &names);
    summary.goodput = cfg.ttft_slo_s.map(|s| goodput(&out, s / scale));
    summary.follow_ups = crate::report::follow_ups::follow_ups(&trace.requests, &out.records);
    summary.scale_time(scale);
    let mut series = fleet_metrics::series(&samples);
    for p in &mut series {
        p.at_s *= scale;
    }
    let mut ttft_sorted: Vec<f64> = out
        .records
        .iter()
        .filter(|r| matches!(r.outcome, replay::Outcome::Ok))
        .filter_map(|r| r.ttft_s)
        .map(|t| t * scale)
        .collect();
    ttft_sorted.sort_by(f64::total_cmp);
    Ok(ContenderResult {
        name: spec.name().to_string(),
        round: None,
        spec: spec.clone(),
        version,
        command,
        error: None,
        summary: Some(summary),
        fleet: Some(delta),
        engines: names,
        engine_presets: presets,
        series,
        ttft_sorted,
        records: if cfg.keep_records {
            out.records
        } else {
            Vec::new()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::apply_contender_overrides;
    use kvgate::config::Config;

    #[test]
    fn gossip_and_routing_keys_set_their_sections_and_the_rest_the_policy() {
        let base = Config::default();
        let mut c = base.clone();
        let o = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        apply_contender_overrides(
            &mut c,
            &o(&[
                "gossip.push_on_change=true",
                " gossip.push_gap_ms=5",
                "kvgate.decode_weight=0.25",
                "routing.rates.pool_weight=1000",
            ]),
        )
        .expect("valid overrides");
        assert!(c.gossip.push_on_change);
        assert_eq!(c.gossip.push_gap_ms, 5);
        assert_eq!(c.routing.policy.kvgate.decode_weight, 0.25);
        assert_eq!(c.routing.rates.pool_weight, 1000.0);
        assert_eq!(c.routing.decode_rates, base.routing.decode_rates);
        assert_eq!(c.gossip.load_interval_ms, base.gossip.load_interval_ms);

        let mut c = base.clone();
        let err = apply_contender_overrides(&mut c, &o(&["gossip.no_such_key=1"]))
            .expect_err("unknown gossip key");
        assert!(err.contains("no_such_key"), "{err}");
        let err = apply_contender_overrides(&mut c, &o(&["routing.rates.no_such_key=1"]))
            .expect_err("unknown routing key");
        assert!(err.contains("no_such_key"), "{err}");
        let err = apply_contender_overrides(&mut c, &o(&["gossip.push_gap_ms=\"soon\""]))
            .expect_err("ill-typed value");
        assert!(err.contains("gossip"), "{err}");
    }
}
