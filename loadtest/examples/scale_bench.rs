//! Scaling a Kubernetes-discovered fleet under load: the conversation trace (or a synthetic
//! workload) replayed through kvgate while its pool (`source = "kubernetes"`, service mode)
//! follows a fake Kubernetes API server whose EndpointSlices go from 8 to 12 to 6 simulated
//! engines. Reports failed requests, how long each new instance took to be listed by the gateway
//! and to get its first request, and the prompt-cache hit ratio per time window (its dip at each
//! change and its recovery).
//!
//! ```sh
//! cargo run --release -p kvgate-loadtest --example scale_bench -- \
//!     --trace ../shared/traces/conversation_trace.jsonl --rate 6 --seconds 60
//! ```
//!
//! The changes travel the whole production path: EndpointSlice `ADDED` / `DELETED` watch
//! events from the fake API server (`kvgate_discovery::fake_api`), the kubernetes source's
//! list + watch, the published endpoint set, and the gateway's fleet reconcile.

use anyhow::{Context, Result};
use kvgate::app::AppState;
use kvgate::config::Config;
use kvgate_discovery::fake_api::{slice, FakeApi, WatchTx, NS, PODS, SLICES};
use kvgate_discovery::SourceKind;
use kvgate_loadtest::prompt::{ApiKind, PromptBuilder};
use kvgate_loadtest::replay::{self, Arrivals, Outcome, ReplayConfig};
use kvgate_loadtest::trace::Trace;
use kvgate_sim::SimInstanceInfo as InstanceInfo;
use std::time::{Duration, Instant};

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

/// The EndpointSlice of simulated engine `i` (one slice per engine: each listens on its own
/// port, as slices of different ports would), ready or gone.
fn engine_slice(info: &InstanceInfo, rv: u64) -> serde_json::Value {
    // The sim's URLs are http://127.0.0.1:PORT.
    let port = info
        .url
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or(0);
    slice(
        &info.name,
        &rv.to_string(),
        port,
        &[("127.0.0.1", &info.name, true, false)],
    )
}

/// Sends `kind` events for `infos` and waits (up to 10 s) until the gateway serves `want`
/// instances; returns when the events were sent and how long the gateway took to list them.
async fn change(
    watch: &WatchTx,
    state: &AppState,
    kind: &str,
    infos: &[InstanceInfo],
    rv: &mut u64,
    want: usize,
    t0: Instant,
) -> (f64, Option<f64>) {
    let at = t0.elapsed().as_secs_f64();
    for info in infos {
        *rv += 1;
        watch.event(kind, engine_slice(info, *rv));
    }
    let listed = serving_within(state, want, Duration::from_secs(10)).await;
    (at, listed.map(|d| d.as_secs_f64()))
}

/// How long until pool 0 serves exactly `want` instances, polled up to `deadline`.
async fn serving_within(state: &AppState, want: usize, deadline: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < deadline {
        if state.fleet.view().serving().count() == want {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    None
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

    let api = FakeApi::start().await.context("fake API server")?;
    let mut rv = 1u64;
    api.list(
        SLICES,
        "1",
        infos[..8].iter().map(|i| engine_slice(i, 1)).collect(),
    );
    let slices = api.watch(SLICES);
    api.list(PODS, "1", vec![]);

    let mut cfg = Config::default();
    cfg.server.listen = "127.0.0.1:0".into();
    // No admin listener on the default fixed port.
    cfg.server.admin_listen = kvgate::config::ADMIN_ON_MAIN.into();
    let mut pool = kvgate::config::PoolConfig::serving(infos[0].model.clone(), vec![]);
    pool.block_size = Some(infos[0].block_size);
    pool.tokenizer = Some("builtin".into());
    pool.discovery.source = SourceKind::Kubernetes;
    pool.discovery.api_server = Some(api.url());
    pool.discovery.namespace = Some(NS.into());
    pool.discovery.service = Some("vllm".into());
    pool.discovery.drain_grace_ms = 10_000;
    cfg.pools = vec![pool];
    let state = AppState::new(cfg).context("gateway")?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let gw = tokio::spawn(kvgate::app::run(listener, state.clone(), async move {
        let _ = stop_rx.await;
    }));
    serving_within(&state, 8, Duration::from_secs(10))
        .await
        .context("the gateway never listed the first 8 engines")?;

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
        let infos = infos.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs_f64(third)).await;
            let up = change(&slices, &state, "ADDED", &infos[8..12], &mut rv, 12, t0).await;
            tokio::time::sleep(Duration::from_secs_f64(third)).await;
            let down = change(&slices, &state, "DELETED", &infos[6..12], &mut rv, 6, t0).await;
            // The watch stream stays open until the run ends.
            (up, down, slices)
        })
    };
    let out = replay::run(&trace, &builder, &rc, "scale").await?;
    let ((up_at, up_listed), (down_at, down_listed), _slices) = changes.await?;
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
    let ms = |d: Option<f64>| {
        d.map_or("not within 10 s".to_string(), |d| {
            format!("{:.1} ms", d * 1e3)
        })
    };
    println!(
        "  watch events to the gateway's fleet: 8 → 12 in {}, 12 → 6 in {}",
        ms(up_listed),
        ms(down_listed)
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
