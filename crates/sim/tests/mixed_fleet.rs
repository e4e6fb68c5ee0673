//! A fleet of two engine classes served over HTTP: every engine reports its own preset and
//! capacity, and the slower class spends more modelled time on the same request.

mod common;

use std::time::Duration;

use common::*;
use kvgate_sim::fleet::FleetConfig;
use serde_json::{json, Value};

async fn stats(client: &reqwest::Client, url: &str) -> Value {
    client
        .get(format!("{url}/admin/stats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Polls an engine's counters until it has finished `n` requests (the HTTP answer can reach the
/// client just before the engine publishes its counters).
async fn finished(client: &reqwest::Client, url: &str, n: u64) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let s = stats(client, url).await;
        if s["stats"]["requests_finished"].as_u64() == Some(n) {
            return s;
        }
        assert!(tokio::time::Instant::now() < deadline, "{s}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_fleet_serves_each_engine_with_its_own_class() {
    let cfg = FleetConfig {
        fleet: Some("llama3-8b-h100:1,llama3-8b-a100-40gb:2".parse().unwrap()),
        time_scale: 50.0,
        kv_events: false,
        replay: false,
        ..FleetConfig::default()
    };
    let fleet = start(cfg).await;
    let infos = fleet.instances();
    let presets: Vec<&str> = infos.iter().map(|i| i.preset.as_str()).collect();
    assert_eq!(
        presets,
        [
            "llama3-8b-h100",
            "llama3-8b-a100-40gb",
            "llama3-8b-a100-40gb"
        ]
    );
    let caps: Vec<u64> = infos.iter().map(|i| i.capacity_blocks).collect();
    assert_eq!(caps, [24_576, 8_192, 8_192]);
    assert!(infos.iter().all(|i| i.block_size == 16));

    let client = reqwest::Client::new();
    // The engines' own metrics say the same.
    for (info, blocks) in infos.iter().zip(["24576", "8192", "8192"]) {
        let text = metrics(&client, &info.url).await;
        assert!(
            text.contains(&format!("num_gpu_blocks=\"{blocks}\"")),
            "{}: {text}",
            info.name
        );
    }

    // The same request, alone, on the H100 engine and on an A100 engine.
    let body = json!({"model": "m", "prompt": "every word counts ".repeat(700),
                      "max_tokens": 8, "stream": false});
    let mut busy = Vec::new();
    for info in &infos[..2] {
        let (status, reply) = post(
            &client,
            &format!("{}/v1/completions", info.url),
            body.clone(),
        )
        .await;
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["usage"]["completion_tokens"], 8);
        let s = finished(&client, &info.url, 1).await;
        busy.push(s["stats"]["busy_us"].as_u64().unwrap());
    }
    // Modelled step time, not wall time: ~3× in prefill and ~1.6× in decode.
    let ratio = busy[1] as f64 / busy[0] as f64;
    assert!((1.8..3.6).contains(&ratio), "busy {busy:?}");
    fleet.shutdown().await;
}
