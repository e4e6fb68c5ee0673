//! The gateway ingesting KV events from simulated engines: `/admin/index` shows each stream, and
//! once predictions have expired a shared prefix is still credited — from the engine's events —
//! exactly as the engine reports it cached.

mod common;

use common::*;
use kvgate::config::{InstanceConfig, PoolConfig};
use std::time::{Duration, Instant};

#[tokio::test]
async fn events_keep_the_index_exact_after_predictions_expire() {
    let fleet = kvgate_sim::Fleet::start(kvgate_sim::FleetConfig {
        engines: 2,
        time_scale: 20.0,
        ..Default::default()
    })
    .await
    .expect("simulated fleet");
    let infos = fleet.instances();
    let mut cfg = config_for(&[]);
    cfg.routing.predicted_ttl_ms = 100;
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
                kv_events: i.kv_events_endpoint.clone(),
                kv_replay: i.replay_endpoint.clone(),
                kv_topic: None,
                capacity_blocks: Some(i.capacity_blocks),
            })
            .collect(),
        max_instances: None,
        discovery: Default::default(),
    }];
    let gw = Gateway::start(cfg).await;
    let index = || async {
        client()
            .get(gw.url("/admin/index"))
            .send()
            .await
            .unwrap()
            .json::<serde_json::Value>()
            .await
            .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = index().await;
        let streams = v["events"].as_array().cloned().unwrap_or_default();
        if streams.len() == 2 && streams.iter().all(|s| s["connected"] == true) {
            break;
        }
        assert!(Instant::now() < deadline, "streams never connected: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    let system = "You are a meticulous assistant. ".repeat(40);
    let ask = |q: &'static str| {
        let body = serde_json::json!({
            "model": infos[0].model, "max_tokens": 2,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
        });
        let url = gw.url("/v1/chat/completions");
        async move {
            let r = client().post(url).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let instance = r.headers()["x-kvgate-instance"]
                .to_str()
                .unwrap()
                .to_string();
            let matched: u64 = r.headers()["x-kvgate-matched-blocks"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            let v: serde_json::Value = r.json().await.unwrap();
            let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0);
            (instance, matched, cached)
        }
    };
    let (first, _, _) = ask("first question").await;
    // Wait for the engine's events, then for the dispatch prediction to expire.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = index().await;
        if v["stats"]["entries_by_source"][0].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no event-sourced entries: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (second, matched, cached) = ask("second question").await;
    assert_eq!(second, first);
    assert!(matched > 10, "no credit from events: {matched}");
    assert_eq!(matched * u64::from(infos[0].block_size), cached);
    let v = index().await;
    let stream = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["instance"] == first.as_str())
        .unwrap()
        .clone();
    assert!(stream["blocks_stored"].as_u64().unwrap() >= matched);
    assert_eq!(stream["block_size_mismatch"], serde_json::Value::Null);
    assert_eq!(stream["silent"], false);
    fleet.shutdown().await;
}
