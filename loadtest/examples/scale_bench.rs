//! Scaling a discovered fleet under load: the conversation trace (or a synthetic workload)
//! replayed through kvgate while its pool's discovery source goes from 8 to 12 to 6 simulated
//! engines. Reports failed requests, how long each new instance took to get its first request,
//! and the prompt-cache hit ratio per time window (its dip at each change and its recovery).
//!
//! ```sh
//! cargo run --release -p kvgate-loadtest --example scale_bench -- \
//!     --trace ../shared/traces/conversation_trace.jsonl --rate 6 --seconds 90
//! ```
//!
//! The fleet changes arrive through the gateway's discovery seam ([`AppState::set_source`]) as
//! whole endpoint sets, exactly as a Kubernetes or DNS source publishes them.

use anyhow::{Context, Result};
use kvgate::app::AppState;
use kvgate::config::Config;
use kvgate_discovery::{Endpoint, EndpointSet, SourceKind};
use kvgate_loadtest::prompt::{ApiKind, PromptBuilder};
use kvgate_loadtest::replay::{self, Arrivals, Outcome, ReplayConfig};
use kvgate_loadtest::trace::Trace;
use std::time::{Duration, Instant};
use tokio::sync::watch;

struct Args {
    trace: String,
    rate: f64,
    seconds: f64,
    window_s: f64,
}

fn args() -> Result<Args> {
    let mut a = Args {
        trace: "../shared/traces/conversation_trace.jsonl".into(),
        rate: 6.0,
        seconds: 90.0,
        window_s: 5.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--trace" => a.trace = val()?,
            "--rate" => a.rate = val()?.parse()?,
            "--seconds" => a.seconds = val()?.parse()?,
            "--window" => a.window_s = val()?.parse()?,
            other => anyhow::bail!("unknown flag {other} (--trace, --rate, --seconds, --window)"),
        }
    }
    Ok(a)
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = args()?;
    let sim = kvgate_sim::Fleet::start(kvgate_sim::FleetConfig {
        engines: 12,
        ..Default::default()
    })
    .await
    .context("simulated fleet")?;
    let infos = sim.instances().to_vec();
    let endpoints: Vec<Endpoint> = infos
        .iter()
        .map(|i| {
            let mut e = Endpoint::new(i.name.clone(), i.url.clone());
            e.kv_events = i.kv_events_endpoint.clone();
            e.kv_replay = i.replay_endpoint.clone();
            e
        })
        .collect();

    let mut cfg = Config::default();
    cfg.server.listen = "127.0.0.1:0".into();
    let mut pool = kvgate::config::PoolConfig::serving(infos[0].model.clone(), vec![]);
    pool.block_size = Some(infos[0].block_size);
    pool.tokenizer = Some("builtin".into());
    pool.discovery.source = SourceKind::Dns;
    pool.discovery.name = Some("engines.bench.invalid".into());
    pool.discovery.port = Some(8000);
    pool.discovery.drain_grace_ms = 10_000;
    cfg.pools = vec![pool];
    let state = AppState::new(cfg).context("gateway")?;
    let (tx, rx) = watch::channel(EndpointSet::default());
    state.set_source(0, rx);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let gw = tokio::spawn(kvgate::app::run(listener, state.clone(), async move {
        let _ = stop_rx.await;
    }));

    let publish = |n: usize, version: u64| {
        tx.send_replace(EndpointSet::new(version, endpoints[..n].to_vec()));
    };
    publish(8, 1);

    let trace = Trace::load(&a.trace).with_context(|| a.trace.clone())?;
    let builder = PromptBuilder::builtin(ApiKind::Chat, trace.block_tokens, 7)?;
    let mut rc = ReplayConfig::new(base.clone(), infos[0].model.clone());
    rc.arrivals = Arrivals::Poisson {
        rate: a.rate,
        seed: 11,
    };
    rc.max_duration = Some(Duration::from_secs_f64(a.seconds));
    rc.request_timeout = Duration::from_secs(120);
    rc.drain_timeout = Duration::from_secs(60);
    rc.progress = false;

    let t0 = Instant::now();
    let changes = {
        let third = a.seconds / 3.0;
        let state = state.clone();
        let tx = tx.clone();
        let endpoints = endpoints.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(third)).await;
            let up = t0.elapsed().as_secs_f64();
            tx.send_replace(EndpointSet::new(2, endpoints[..12].to_vec()));
            tokio::time::sleep(Duration::from_secs_f64(third)).await;
            let down = t0.elapsed().as_secs_f64();
            tx.send_replace(EndpointSet::new(3, endpoints[..6].to_vec()));
            let _ = state;
            (up, down)
        })
    };
    let out = replay::run(&trace, &builder, &rc, "scale").await?;
    let (up_at, down_at) = changes.await?;
    // The replay's clock starts at its first send; the change times are on `t0`, a few ms before.
    let mut failed = 0usize;
    let mut first_on: std::collections::BTreeMap<String, f64> = Default::default();
    // Windows of send time: nothing is sent after `seconds`.
    let windows = (a.seconds / a.window_s).ceil().max(1.0) as usize;
    let mut hit = vec![(0u64, 0u64); windows];
    let mut per_instance: std::collections::BTreeMap<String, usize> = Default::default();
    for r in &out.records {
        if !matches!(r.outcome, Outcome::Ok) {
            failed += 1;
            continue;
        }
        if let Some(name) = &r.instance {
            let e = first_on.entry(name.clone()).or_insert(r.sent_at_s);
            *e = e.min(r.sent_at_s);
            *per_instance.entry(name.clone()).or_default() += 1;
        }
        let w = ((r.sent_at_s / a.window_s) as usize).min(windows - 1);
        hit[w].0 += u64::from(r.cached_tokens.unwrap_or(0));
        hit[w].1 += u64::from(r.prompt_tokens.unwrap_or(r.input_length));
    }
    println!(
        "requests {} failed {} unfinished {} wall {:.1} s; fleet 8 → 12 at {:.1} s → 6 at {:.1} s",
        out.records.len(),
        failed,
        out.unfinished,
        out.wall_s,
        up_at,
        down_at
    );
    for name in infos[8..12].iter().map(|i| &i.name) {
        match first_on.get(name) {
            Some(t) => println!(
                "  {name}: first request {:.2} s after it was added",
                t - up_at
            ),
            None => println!("  {name}: no request"),
        }
    }
    println!("  requests per instance: {per_instance:?}");
    println!(
        "hit ratio by {:.0} s window (cached / prompt tokens):",
        a.window_s
    );
    for (i, (c, p)) in hit.iter().enumerate() {
        let ratio = if *p == 0 { 0.0 } else { *c as f64 / *p as f64 };
        let mark = {
            let (s, e) = (i as f64 * a.window_s, (i + 1) as f64 * a.window_s);
            if (s..e).contains(&up_at) {
                "  <- 8 → 12"
            } else if (s..e).contains(&down_at) {
                "  <- 12 → 6"
            } else {
                ""
            }
        };
        println!("  {:>5.0} s  {:.3}{mark}", i as f64 * a.window_s, ratio);
    }
    let _ = stop_tx.send(());
    let _ = gw.await;
    sim.shutdown().await;
    if failed > 0 {
        anyhow::bail!("{failed} requests failed");
    }
    Ok(())
}
