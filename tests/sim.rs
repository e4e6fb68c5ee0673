//! The gateway in front of in-process simulated engines, in token mode: repeated prefixes land
//! where they are cached, and the engine's own counters confirm the hit.

mod common;

use common::*;
use kvgate::config::{InstanceConfig, PoolConfig};

async fn start_fleet() -> kvgate_sim::Fleet {
    let cfg = kvgate_sim::FleetConfig {
        engines: 3,
        time_scale: 20.0,
        kv_events: false,
        replay: false,
        ..Default::default()
    };
    kvgate_sim::Fleet::start(cfg)
        .await
        .expect("simulated fleet")
}

fn fleet_config(infos: &[kvgate_sim::SimInstanceInfo]) -> kvgate::config::Config {
    let mut cfg = config_for(&[]);
    cfg.pools = vec![PoolConfig {
        model: infos[0].model.clone(),
        block_size: Some(infos[0].block_size),
        tokenizer: Some("builtin".into()),
        chat_template: None,
        flavour: Default::default(),
        instances: infos
            .iter()
            .map(|i| InstanceConfig {
                name: Some(i.name.clone()),
                url: i.url.clone(),
                kv_events: None,
                kv_replay: None,
                kv_topic: None,
                capacity_blocks: Some(i.capacity_blocks),
            })
            .collect(),
        max_instances: None,
        discovery: Default::default(),
    }];
    cfg
}

#[tokio::test]
async fn repeated_prefix_lands_on_the_instance_that_caches_it() {
    repeated_prefix(usize::MAX).await;
}

/// The same, with every prompt tokenized off the serving thread.
#[tokio::test]
async fn prompts_tokenized_off_the_serving_thread_route_alike() {
    repeated_prefix(0).await;
}

/// Three prompts sharing a long system prompt, with bodies of at least `offload_min_bytes`
/// tokenized on a blocking thread.
async fn repeated_prefix(offload_min_bytes: usize) {
    let fleet = start_fleet().await;
    let infos = fleet.instances();
    let mut cfg = fleet_config(&infos);
    cfg.routing.tokenize.offload_min_bytes = offload_min_bytes;
    // Sequential requests: router-tracked load says everything is idle. Scraped engine load lags
    // (a scrape during request 1 still shows it queued until the next scrape), so leave it out to
    // test cache affinity alone.
    cfg.load.enabled = false;
    let gw = Gateway::start(cfg).await;
    let system = "You are a meticulous assistant. ".repeat(40);
    let mut chosen = Vec::new();
    let mut cached = Vec::new();
    for q in ["first question", "second question", "third question"] {
        let body = serde_json::json!({
            "model": infos[0].model,
            "max_tokens": 4,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
        });
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        chosen.push(
            r.headers()["x-kvgate-instance"]
                .to_str()
                .unwrap()
                .to_string(),
        );
        let matched: u32 = r.headers()["x-kvgate-matched-blocks"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let v: serde_json::Value = r.json().await.unwrap();
        cached.push((
            matched,
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0),
        ));
    }
    let decisions: serde_json::Value = client()
        .get(gw.url("/admin/decisions"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(chosen[1], chosen[0], "{chosen:?} {cached:?} {decisions}");
    assert_eq!(chosen[2], chosen[0], "{chosen:?}");
    assert_eq!(cached[0], (0, 0));
    assert!(cached[1].0 > 10, "gateway predicted no match: {cached:?}");
    assert!(cached[1].1 > 100, "engine reports no cache hit: {cached:?}");

    // The second and third requests found the system message's token ids in the token cache,
    // and `/metrics` says so.
    let text = client()
        .get(gw.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(name) && l.contains("pool=\""))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1.0)
    };
    assert!(value("kvgate_tokenizer_cache_hits_total") >= 2.0, "{text}");
    assert!(
        value("kvgate_tokenizer_cache_misses_total") >= 1.0,
        "{text}"
    );
    assert!(value("kvgate_tokenizer_cache_bytes") > 0.0, "{text}");

    // Streaming through the gateway ends with [DONE].
    let body = serde_json::json!({
        "model": infos[0].model, "stream": true, "max_tokens": 3,
        "messages": [{"role": "user", "content": "stream please"}],
    });
    let text = client()
        .post(gw.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    drop(gw);
    fleet.shutdown().await;
}

#[tokio::test]
async fn streams_teach_each_instance_its_decode_speed() {
    let fleet = start_fleet().await;
    let infos = fleet.instances();
    let gw = Gateway::start(fleet_config(&infos)).await;
    let before: serde_json::Value =
        serde_json::from_str(&gw.get_text("/admin/instances").await).expect("instances json");
    for n in 0..12 {
        let body = serde_json::json!({
            "model": infos[0].model, "stream": true, "max_tokens": 24,
            "messages": [{"role": "user", "content": format!("count to twenty-four, take {n}")}],
        });
        let text = client()
            .post(gw.url("/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .expect("stream")
            .text()
            .await
            .expect("stream body");
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    }
    // The simulated engines run 20× faster than a real H100-class one (a decode step of well
    // under a millisecond of wall time), far from the configured 10 ms starting point.
    let start = before["instances"][0]["decode_rates"]["step_ms"]
        .as_f64()
        .expect("step_ms");
    let after: serde_json::Value =
        serde_json::from_str(&gw.get_text("/admin/instances").await).expect("instances json");
    let steps: Vec<f64> = after["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .filter_map(|i| i["decode_rates"]["step_ms"].as_f64())
        .collect();
    assert_eq!(steps.len(), infos.len(), "{after}");
    assert!(
        steps.iter().all(|&s| s < start / 2.0),
        "decode steps not learned: {start} -> {steps:?}"
    );
    drop(gw);
    fleet.shutdown().await;
}
