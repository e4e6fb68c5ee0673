//! End-to-end benchmark of replica gossip (issue targets): N kvgate replicas (the real gateway,
//! in this process, on 127.0.0.1 ephemeral ports) in front of simulated engines
//! (`kvgate_sim::Fleet`), under open-loop load of ~8K-token prompts sent to random replicas.
//!
//! For each configuration (`--configs`, e.g. `4,1,4i`: 4 gossiping replicas, 1 gateway, 4
//! independent replicas) it starts a fresh fleet and fresh replicas, warms up, then measures for
//! `--secs`: the achieved rate, the in-flight spread over instances (max / mean), and, with gossip,
//! placement convergence (see `probe.rs` for the definitions) and gossip bytes per replica. With
//! gossip it then stops the last replica while the load continues, starts a fresh one (empty index,
//! new ports) and times until it holds the placements of recent probes routed by the others.
//!
//! ```sh
//! cargo run --release -p kvgate-loadtest --example cluster_bench -- --rate 1000 --secs 20
//! ```
//!
//! Prompts are token-id arrays with `max_tokens = 1` so neither side tokenizes, and the engines
//! run at `--time-scale` (virtual durations divided by it) so 8 simulated engines can absorb the
//! rate; the gateway hashes 16-token blocks (512 blocks per 8K-token prompt) as in token mode.
//! Engines publish no KV events: every placement a replica learns comes from its own decisions
//! or from gossip, which is what is measured. Bounded: `rate × (warm-up + secs + restart)`
//! requests, at most `--max-in-flight` concurrent.

mod driver;
mod probe;
mod replica;
mod upstream;
mod workload;

use anyhow::Context;
use clap::Parser;
use driver::{Counters, Drive, Target, Targets};
use kvgate_sim::{Fleet, FleetConfig};
use probe::{Convergence, Recent, Spread};
use replica::{Replica, ReplicaSpec};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use workload::{Shape, Workload};

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Configurations: `N` = N gossiping replicas (1 = a single gateway), `Ni` = N independent.
    #[arg(long, default_value = "4,1,4i", value_delimiter = ',')]
    configs: Vec<String>,
    /// Simulated engines.
    #[arg(long, default_value_t = 8)]
    engines: usize,
    /// Total requests per second over all replicas.
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
    /// Measured seconds (after warm-up).
    #[arg(long, default_value_t = 15)]
    secs: u64,
    /// Warm-up seconds (not measured).
    #[arg(long, default_value_t = 3)]
    warmup: u64,
    /// Engine time scale (virtual durations are divided by it).
    #[arg(long, default_value_t = 200.0)]
    time_scale: f64,
    /// Tokens of a first prompt (shared system prompt included).
    #[arg(long, default_value_t = 8192)]
    prompt_tokens: usize,
    /// Tokens of each of the shared system prompts.
    #[arg(long, default_value_t = 1024)]
    system_tokens: usize,
    /// Shared system prompts.
    #[arg(long, default_value_t = 16)]
    system_prompts: usize,
    /// Tokens appended per follow-up turn.
    #[arg(long, default_value_t = 256)]
    turn_tokens: usize,
    /// Turns per conversation.
    #[arg(long, default_value_t = 4)]
    turns: usize,
    /// Probability that a request starts a new conversation.
    #[arg(long, default_value_t = 0.4)]
    new_fraction: f64,
    /// Probe prompts per second (convergence samples).
    #[arg(long, default_value_t = 20.0)]
    probe_rate: f64,
    /// Concurrency bound of the load generator.
    #[arg(long, default_value_t = 2048)]
    max_in_flight: usize,
    /// `gossip.checkpoint_stride`.
    #[arg(long, default_value_t = 16)]
    stride: usize,
    /// Keep a dead replica's placements until their TTL (`forget_dead_peer_placements = false`).
    #[arg(long)]
    keep_dead_placements: bool,
    /// `gossip.push_on_change` (`true` or `false`; the gateway's default when absent).
    #[arg(long, action = clap::ArgAction::Set, default_value_t = kvgate::config::Config::default().gossip.push_on_change)]
    push_on_change: bool,
    /// `gossip.share_load_sizes` (`true` or `false`; the gateway's default when absent).
    #[arg(long, action = clap::ArgAction::Set, default_value_t = kvgate::config::Config::default().gossip.share_load_sizes)]
    share_load_sizes: bool,
    /// `routing.policy.kvgate.concurrency_weight` (the gateway's default when absent).
    #[arg(long, default_value_t = kvgate::config::Config::default().routing.policy.kvgate.concurrency_weight)]
    concurrency_weight: f64,
    /// Skip the restart measurement.
    #[arg(long)]
    no_restart: bool,
    /// Probe prompts checked after a restart.
    #[arg(long, default_value_t = 300)]
    catch_up_prompts: usize,
    /// Engines: `sim` (simulated vLLM engines) or `light` (a FIFO server per instance holding each
    /// request for `--light-service-us`, for rates the simulator cannot absorb on this machine).
    #[arg(long, default_value = "sim")]
    upstream: String,
    /// Service time of a `light` engine, µs; 0 = the time that makes the offered rate load the
    /// engines to `--light-utilisation`.
    #[arg(long, default_value_t = 0)]
    light_service_us: u64,
    /// Utilisation of `light` engines at the offered rate (with `--light-service-us 0`).
    #[arg(long, default_value_t = 0.8)]
    light_utilisation: f64,
}

enum Engines {
    Sim(Fleet),
    Light(upstream::Upstreams),
}

impl Engines {
    async fn start(a: &Args) -> anyhow::Result<Engines> {
        match a.upstream.as_str() {
            "sim" => {
                let mut fc = FleetConfig {
                    engines: a.engines,
                    model: "m".into(),
                    time_scale: a.time_scale,
                    kv_events: false,
                    replay: false,
                    default_max_tokens: 1,
                    ..FleetConfig::default()
                };
                fc.engine.max_model_len = Some(65_536);
                Ok(Engines::Sim(
                    Fleet::start(fc)
                        .await
                        .context("starting the simulated fleet")?,
                ))
            }
            "light" => Ok(Engines::Light(
                upstream::Upstreams::start(a.engines, light_service(a)).await?,
            )),
            other => anyhow::bail!("--upstream {other:?}: expected sim or light"),
        }
    }
    fn urls(&self) -> Vec<String> {
        match self {
            Engines::Sim(f) => f.instances().iter().map(|i| i.url.clone()).collect(),
            Engines::Light(u) => u.urls.clone(),
        }
    }
    async fn shutdown(self) {
        match self {
            Engines::Sim(f) => f.shutdown().await,
            Engines::Light(u) => u.shutdown(),
        }
    }
}

#[derive(Default)]
struct Outcome {
    name: String,
    achieved: f64,
    failed: u64,
    shed: u64,
    mean_latency_ms: f64,
    cpu_cores: f64,
    spread_mean: f64,
    spread_p99: f64,
    avg_spread: f64,
    mean_in_flight: f64,
    conv: Option<Convergence>,
    bytes_out: Vec<f64>,
    bytes_in: Vec<f64>,
    catch_up: Option<probe::CatchUp>,
    cross_follow_ups: u64,
    cross_same: u64,
    follow_ups: u64,
    same: u64,
    prompt_tokens: u64,
    cached_tokens: u64,
    follow_up_prompt_tokens: u64,
    follow_up_cached_tokens: u64,
}

fn light_service(a: &Args) -> Duration {
    if a.light_service_us > 0 {
        return Duration::from_micros(a.light_service_us);
    }
    Duration::from_secs_f64(a.light_utilisation * a.engines as f64 / a.rate.max(1.0))
}

fn cpu_secs() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

async fn run_config(a: &Args, name: &str) -> anyhow::Result<Outcome> {
    let independent = name.ends_with('i');
    let n: usize = name
        .trim_end_matches('i')
        .parse()
        .with_context(|| format!("bad config {name:?}"))?;
    let gossip = n > 1 && !independent;
    let fleet = Engines::start(a).await?;
    let spec = ReplicaSpec {
        scrape_engines: a.upstream == "sim",
        urls: fleet.urls(),
        model: "m".into(),
        gossip,
        stride: a.stride,
        forget_dead: !a.keep_dead_placements,
        push_on_change: a.push_on_change,
        share_load_sizes: a.share_load_sizes,
        concurrency_weight: a.concurrency_weight,
    };
    let mut replicas: Vec<Replica> = Vec::new();
    for _ in 0..n {
        let seeds: Vec<_> = replicas.iter().filter_map(|r| r.gossip_addr()).collect();
        replicas.push(Replica::start(&spec, &seeds).await?);
    }
    if gossip {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !replicas.iter().all(|r| r.live_peers() == n - 1) {
            anyhow::ensure!(Instant::now() < deadline, "the cluster did not form");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let states: Vec<_> = replicas.iter().map(|r| r.state.clone()).collect();
    let targets: Targets = Arc::new(RwLock::new(
        replicas
            .iter()
            .enumerate()
            .map(|(index, r)| Target {
                index,
                url: r.completions_url(),
                state: r.state.clone(),
            })
            .collect(),
    ));
    let restart = gossip && !a.no_restart;
    let warm = Duration::from_secs(a.warmup);
    let measure = Duration::from_secs(a.secs);
    let extra = if restart {
        Duration::from_secs(8)
    } else {
        Duration::ZERO
    };
    let t0 = Instant::now();
    let counters = Arc::new(Counters::default());
    let (probe_tx, probe_rx) = tokio::sync::mpsc::channel(1024);
    let recent: Recent = Arc::default();
    let probe_task = tokio::spawn(probe::convergence(states.clone(), probe_rx, recent.clone()));
    let shape = Shape {
        system_prompts: a.system_prompts,
        system_tokens: a.system_tokens,
        first_tokens: a.prompt_tokens.saturating_sub(a.system_tokens),
        turn_tokens: a.turn_tokens,
        turns: a.turns,
        new_fraction: a.new_fraction,
        max_open: 4096,
    };
    let drive = Drive {
        rate: a.rate,
        duration: warm + measure + extra,
        probe_rate: if gossip { a.probe_rate } else { 0.0 },
        max_in_flight: a.max_in_flight,
        probe_window: (t0 + warm, t0 + warm + measure),
    };
    let load = tokio::spawn(driver::run(
        drive,
        targets.clone(),
        Workload::new(shape, "m", 42),
        probe_tx,
        counters.clone(),
    ));

    tokio::time::sleep_until((t0 + warm).into()).await;
    let bytes0: Vec<(u64, u64)> = replicas.iter().map(|r| r.gossip_bytes()).collect();
    let (ok0, cpu0, lat0) = (
        counters.ok.load(Ordering::Relaxed),
        cpu_secs(),
        counters.latency_us.load(Ordering::Relaxed),
    );
    let quality = |c: &driver::Counters| {
        [
            c.cross_follow_ups.load(Ordering::Relaxed),
            c.cross_same_instance.load(Ordering::Relaxed),
            c.follow_ups.load(Ordering::Relaxed),
            c.same_instance.load(Ordering::Relaxed),
            c.prompt_tokens.load(Ordering::Relaxed),
            c.cached_tokens.load(Ordering::Relaxed),
            c.follow_up_prompt_tokens.load(Ordering::Relaxed),
            c.follow_up_cached_tokens.load(Ordering::Relaxed),
        ]
    };
    let quality0 = quality(&counters);
    let mut spread = Spread::default();
    let end = t0 + warm + measure;
    let mut tick = tokio::time::interval(probe::SPREAD_EVERY);
    while Instant::now() < end {
        tick.tick().await;
        spread.sample(&states);
    }
    let secs = measure.as_secs_f64();
    let ok = counters.ok.load(Ordering::Relaxed) - ok0;
    // Routing quality over the measured window only: neither the warm-up nor the restart.
    let q: Vec<u64> = quality(&counters)
        .iter()
        .zip(quality0)
        .map(|(now, before)| now - before)
        .collect();
    let mut out = Outcome {
        name: if gossip {
            format!("{n} replicas, gossip")
        } else if n == 1 {
            "1 gateway".into()
        } else {
            format!("{n} replicas, independent")
        },
        achieved: ok as f64 / secs,
        cpu_cores: (cpu_secs() - cpu0) / secs,
        mean_latency_ms: (counters.latency_us.load(Ordering::Relaxed) - lat0) as f64
            / 1e3
            / ok.max(1) as f64,
        mean_in_flight: spread.mean_in_flight(),
        cross_follow_ups: q[0],
        cross_same: q[1],
        follow_ups: q[2],
        same: q[3],
        prompt_tokens: q[4],
        cached_tokens: q[5],
        follow_up_prompt_tokens: q[6],
        follow_up_cached_tokens: q[7],
        ..Outcome::default()
    };
    for (r, (o0, i0)) in replicas.iter().zip(&bytes0) {
        let (o1, i1) = r.gossip_bytes();
        out.bytes_out.push((o1 - o0) as f64 / secs);
        out.bytes_in.push((i1 - i0) as f64 / secs);
    }
    out.spread_mean = spread.ratios.iter().sum::<f64>() / spread.ratios.len().max(1) as f64;
    out.spread_p99 = pct(&mut spread.ratios.clone(), 0.99);
    let m = &spread.mean_per_instance;
    out.avg_spread = m.iter().cloned().fold(0.0, f64::max) / spread.mean_in_flight().max(1e-9);

    if restart {
        let victim = n - 1;
        targets
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|t| t.index != victim);
        // Let the probes still being watched settle before choosing what must be caught up on.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let wanted: Vec<_> = {
            let r = recent.lock().unwrap_or_else(|e| e.into_inner());
            r.iter()
                .rev()
                .filter(|(origin, id, h, _)| {
                    *origin != victim && probe::holder(&states[*origin], h) == Some(*id)
                })
                .take(a.catch_up_prompts)
                .map(|(origin, id, h, _)| (*origin, *id, h.clone()))
                .collect()
        };
        let old = replicas.pop().context("victim")?;
        old.stop().await;
        let seeds: Vec<_> = replicas.iter().filter_map(|r| r.gossip_addr()).collect();
        let fresh = Replica::start(&spec, &seeds).await?;
        targets
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(Target {
                index: victim,
                url: fresh.completions_url(),
                state: fresh.state.clone(),
            });
        out.catch_up =
            Some(probe::catch_up(&fresh.state, &states, &wanted, Duration::from_secs(15)).await);
        replicas.push(fresh);
    }
    load.await.context("load task")?;
    out.failed = counters.failed.load(Ordering::Relaxed);
    out.shed = counters.shed.load(Ordering::Relaxed);
    let conv = probe_task.await.context("probe task")?;
    if gossip {
        out.conv = Some(conv);
    }
    for r in replicas {
        r.stop().await;
    }
    fleet.shutdown().await;
    Ok(out)
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("not reached".into(), |d| {
        format!("{:.2} s", d.as_secs_f64())
    })
}

fn print(a: &Args, outs: &mut [Outcome]) {
    let engines = match a.upstream.as_str() {
        "light" => format!(
            "{} light engines (FIFO, {:.1} ms per request)",
            a.engines,
            light_service(a).as_secs_f64() * 1e3
        ),
        _ => format!(
            "{} simulated engines (time scale {})",
            a.engines, a.time_scale
        ),
    };
    println!(
        "\n{engines}, {:.0} req/s offered, ~{}-token prompts (token ids, max_tokens 1), {} s measured, checkpoint stride {}, forget_dead_peer_placements = {}, share_load_sizes = {}\n",
        a.rate, a.prompt_tokens, a.secs, a.stride, !a.keep_dead_placements, a.share_load_sizes
    );
    println!("| configuration | achieved req/s | failed / shed | mean latency | process CPU | in-flight per instance (mean) | max/mean in-flight (mean of samples, p99) | time-avg max/mean | cross-replica follow-ups on the previous instance | all follow-ups on the previous instance | engine prefix-cache hit ratio (all; follow-up turns) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for o in outs.iter() {
        println!(
            "| {} | {:.0} | {} / {} | {:.1} ms | {:.2} cores | {:.2} | {:.2}, {:.2} | {:.2} | {} | {} | {}; {} |",
            o.name,
            o.achieved,
            o.failed,
            o.shed,
            o.mean_latency_ms,
            o.cpu_cores,
            o.mean_in_flight,
            o.spread_mean,
            o.spread_p99,
            o.avg_spread,
            if o.cross_follow_ups > 0 {
                format!(
                    "{:.1} % of {}",
                    100.0 * o.cross_same as f64 / o.cross_follow_ups as f64,
                    o.cross_follow_ups
                )
            } else {
                "–".into()
            },
            share(o.same, o.follow_ups),
            share(o.cached_tokens, o.prompt_tokens),
            share(o.follow_up_cached_tokens, o.follow_up_prompt_tokens),
        );
    }
    for o in outs.iter_mut() {
        let Some(c) = o.conv.as_mut() else { continue };
        let pairs = c.from_send_ms.len();
        println!("\n{}: convergence over {} (probe, other replica) pairs ({} not converged in {} s, {} on another instance, {} probes undecided)", o.name, pairs, c.timeouts, probe::PROBE_TIMEOUT.as_secs(), c.other_instance, c.undecided);
        println!("| measured from | p50 | p90 | p99 | max |\n|---|---:|---:|---:|---:|");
        for (label, v) in [
            ("request sent", &mut c.from_send_ms),
            ("origin's decision", &mut c.from_decision_ms),
        ] {
            println!(
                "| {label} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms |",
                pct(v, 0.5),
                pct(v, 0.9),
                pct(v, 0.99),
                pct(v, 1.0)
            );
        }
        let kb = |v: &[f64]| {
            v.iter()
                .map(|b| format!("{:.0}", b / 1e3))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        println!(
            "gossip KB/s per replica: out {} ; in {}",
            kb(&o.bytes_out),
            kb(&o.bytes_in)
        );
        if let Some(c) = &o.catch_up {
            println!(
                "restarted replica (fresh index, new ports, started right after the old one stopped): of {} recent placements of the others, held 99 % after {}, all after {} ({} held, {} evicted by their origin meanwhile)",
                c.total,
                ms(c.t99),
                ms(c.all),
                c.held,
                c.evicted
            );
        }
    }
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut outs = Vec::new();
    for c in &a.configs {
        eprintln!("running {c} ...");
        outs.push(rt.block_on(run_config(&a, c))?);
    }
    print(&a, &mut outs);
    Ok(())
}

/// `part` of `whole` as a percentage with its base, or a dash when there is none.
fn share(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "–".into();
    }
    format!("{:.1} % of {whole}", 100.0 * part as f64 / whole as f64)
}
