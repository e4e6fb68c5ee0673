//! Replays a short trace through an in-process kvgate in front of an in-process simulated fleet
//! and checks the report's figures against the engines' own counters.

use std::time::Duration;

use kvgate_core::policy::PolicyName;
use kvgate_loadtest::compare::gateway::{config_for, InProcessGateway};
use kvgate_loadtest::compare::ready::wait_ready;
use kvgate_loadtest::fleet_metrics::{sum_metric, FleetDelta};
use kvgate_loadtest::prompt::{ApiKind, PromptBuilder};
use kvgate_loadtest::replay::{self, Arrivals, ReplayConfig};
use kvgate_loadtest::report::summary::{summarise, ShareSource};
use kvgate_loadtest::trace::{Trace, TraceRequest};
use kvgate_sim::{Fleet, FleetConfig};

const BLOCK: u32 = 64;

/// 30 requests in 3 s: ten conversations of three turns, all behind one shared system block.
fn trace() -> Trace {
    let mut reqs = Vec::new();
    let mut next_id = 1u64;
    for conv in 0..10u64 {
        let mut ids = vec![0u64];
        for turn in 0..3u64 {
            ids.push(next_id);
            next_id += 1;
            ids.push(next_id);
            next_id += 1;
            let input = (ids.len() as u32 - 1) * BLOCK + 20;
            reqs.push(TraceRequest {
                timestamp_ms: turn * 1000 + conv * 90,
                input_length: input,
                output_length: 4 + (conv as u32 % 3),
                hash_ids: ids.clone(),
            });
        }
    }
    Trace::from_requests(reqs, BLOCK).unwrap()
}

async fn scrape(client: &reqwest::Client, url: &str) -> (f64, f64, f64) {
    let page = client
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    (
        sum_metric(&page, "vllm:prefix_cache_hits_total").unwrap(),
        sum_metric(&page, "vllm:prefix_cache_queries_total").unwrap(),
        sum_metric(&page, "vllm:request_success_total").unwrap_or(0.0),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_matches_engine_counters() {
    let fleet = Fleet::start(FleetConfig {
        engines: 3,
        time_scale: 20.0,
        ..FleetConfig::default()
    })
    .await
    .unwrap();
    let infos = fleet.instances();
    let workers: Vec<String> = infos.iter().map(|i| i.url.clone()).collect();
    let model = FleetConfig::default().model;
    let cfg = config_for(
        &kvgate::config::Config::default(),
        PolicyName::Kvgate,
        &infos,
        &model,
    );
    let gw = InProcessGateway::start(cfg).await.unwrap();
    let client = reqwest::Client::new();
    wait_ready(
        &client,
        &gw.url,
        &workers,
        &model,
        ApiKind::Chat,
        Duration::from_secs(15),
    )
    .await
    .unwrap();

    let mut before = Vec::new();
    for w in &workers {
        before.push(scrape(&client, w).await);
    }
    let trace = trace();
    let builder = PromptBuilder::builtin(ApiKind::Chat, BLOCK, 1).unwrap();
    let rcfg = ReplayConfig {
        arrivals: Arrivals::Trace { speed_up: 1.0 },
        max_duration: Some(Duration::from_secs(15)),
        concurrency: 16,
        request_timeout: Duration::from_secs(15),
        drain_timeout: Duration::from_secs(15),
        progress: false,
        ..ReplayConfig::new(gw.url.clone(), model.clone())
    };
    let out = replay::run(&trace, &builder, &rcfg, "").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut after = Vec::new();
    for w in &workers {
        after.push(scrape(&client, w).await);
    }
    let mut delta = FleetDelta::default();
    for (b, a) in before.iter().zip(&after) {
        delta.prefix_hits += a.0 - b.0;
        delta.prefix_queries += a.1 - b.1;
        delta.requests_per_engine.push(a.2 - b.2);
    }
    delta.hit_ratio = delta.prefix_hits / delta.prefix_queries;
    let names: Vec<String> = infos.iter().map(|i| i.name.clone()).collect();
    let s = summarise(&out, Some(&delta), &names);

    assert_eq!(s.sent, 30, "{s:?}");
    assert_eq!(s.ok, 30, "errors {:?}, rejected {}", s.errors, s.rejected);
    assert_eq!(s.error_total, 0);
    assert_eq!(
        s.output_mismatch, 0,
        "every request got exactly output_length tokens"
    );
    assert_eq!(s.ttft.count, 30);
    // Request counts add up: the engines finished exactly the replayed requests.
    let engine_total: f64 = delta.requests_per_engine.iter().sum();
    assert_eq!(engine_total, 30.0, "{:?}", delta.requests_per_engine);
    // Prompt tokens the engines were asked to look up equal what the responses reported.
    let reported_prompt: u32 = out.records.iter().filter_map(|r| r.prompt_tokens).sum();
    assert_eq!(delta.prefix_queries, f64::from(reported_prompt));
    // Synthesised prompts hit input_length exactly under the engines' tokenizer.
    for r in &out.records {
        assert_eq!(r.prompt_tokens, Some(r.input_length), "request {}", r.index);
    }
    // The hit ratio in the report is the engines' one, and agrees with the per-response counts.
    let hr = s.hit_ratio.unwrap();
    assert!((hr - delta.prefix_hits / delta.prefix_queries).abs() < 1e-12);
    assert!(hr > 0.2, "shared prefixes and growing turns must hit: {hr}");
    let reported = s.hit_ratio_reported.unwrap();
    assert!(
        (reported - hr).abs() < 1e-9,
        "reported {reported} vs engines {hr}"
    );
    // Per-instance share from the gateway's header matches the engines' request counts.
    assert_eq!(s.share_source, ShareSource::Header);
    for (i, name) in names.iter().enumerate() {
        let share = s.instance_share.get(name).copied().unwrap_or(0.0);
        assert!(
            (share - delta.requests_per_engine[i] / 30.0).abs() < 1e-9,
            "{name}: header share {share} vs engine count {}",
            delta.requests_per_engine[i]
        );
    }
    gw.stop().await;
    fleet.shutdown().await;
}
