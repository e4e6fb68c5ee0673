//! Stopping a fleet: every engine loop ends (idle or in the middle of a step), requests in flight
//! end as aborted instead of hanging, and nothing waits for the stop timeout.

mod common;

use std::time::Duration;

use common::*;
use kvgate_sim::fleet::{EngineOverrides, FleetConfig};
use serde_json::json;

fn cfg(engines: usize) -> FleetConfig {
    FleetConfig {
        engines,
        // Real time: a request asking for many tokens keeps its engine stepping for minutes.
        time_scale: 1.0,
        engine: EngineOverrides {
            num_gpu_blocks: Some(4096),
            ..Default::default()
        },
        ..FleetConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_busy_engines_stop_cleanly() {
    let fleet = start(cfg(4)).await;
    let urls: Vec<String> = fleet.instances().into_iter().map(|i| i.url).collect();
    let client = reqwest::Client::new();
    // Engines 0 and 1 busy with long requests (one streamed, one not); 2 and 3 idle.
    let mut pending = Vec::new();
    for (i, stream) in [(0usize, false), (1, true)] {
        let c = client.clone();
        let url = format!("{}/v1/completions", urls[i]);
        pending.push(tokio::spawn(async move {
            let body = json!({"model": "m", "prompt": "a long one ".repeat(200),
                              "max_tokens": 20_000, "stream": stream});
            match c.post(&url).json(&body).send().await {
                Ok(r) => {
                    let status = r.status().as_u16();
                    // The body ends (or breaks) once the engine stops.
                    let _ = r.bytes().await;
                    Some(status)
                }
                Err(_) => None,
            }
        }));
    }
    // Wait until both engines are running their request.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let running: u32 = fleet.engines()[..2]
            .iter()
            .map(|e| e.state.core.snapshot.lock().load.running)
            .sum();
        if running == 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "requests never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Generous bound: a clean stop takes milliseconds; the per-engine timeout is 2 s.
    let failed = tokio::time::timeout(Duration::from_secs(10), fleet.shutdown_checked())
        .await
        .expect("fleet shutdown hung");
    assert_eq!(failed, 0, "engine loops that had to be abandoned");

    // The in-flight requests end (aborted) instead of waiting for tokens that never come.
    let mut statuses = Vec::new();
    for p in pending {
        let status = tokio::time::timeout(Duration::from_secs(10), p)
            .await
            .expect("an in-flight request hung after shutdown")
            .expect("request task");
        statuses.push(status);
    }
    // Not streamed: an error response; streamed: headers were out, the body ended early.
    assert_eq!(statuses, vec![Some(500), Some(200)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_fleet_stops_without_abandoning_loops() {
    for _ in 0..2 {
        let fleet = start(cfg(6)).await;
        let failed = tokio::time::timeout(Duration::from_secs(10), fleet.shutdown_checked())
            .await
            .expect("fleet shutdown hung");
        assert_eq!(failed, 0);
    }
}
