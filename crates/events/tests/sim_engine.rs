//! Against the simulated engine (crate `kvgate-sim`: a vLLM-like prefix cache publishing KV
//! events over ZMQ with replay): every request is credited by the index exactly as the engine
//! reports it cached, through evictions; an engine restart stops old credits; a silenced stream
//! is flagged.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{credited_in, index};
use kvgate_core::InstanceId;
use kvgate_events::{EventSource, EventsConfig, EventsHandle};
use kvgate_sim::{EngineOverrides, Fleet, FleetConfig, SimInstanceInfo};
use serde_json::{json, Value};

const I: InstanceId = InstanceId(0);

async fn fleet(encoding: kvgate_sim::EventEncoding) -> (Fleet, SimInstanceInfo) {
    let cfg = FleetConfig {
        engines: 1,
        event_encoding: encoding,
        engine: EngineOverrides {
            block_size: Some(16),
            num_gpu_blocks: Some(40),
            ..EngineOverrides::default()
        },
        ..FleetConfig::default()
    };
    let fleet = Fleet::start(cfg).await.unwrap();
    let info = fleet.instances().remove(0);
    (fleet, info)
}

fn events(info: &SimInstanceInfo) -> (EventsHandle, Arc<kvgate_core::index::PlacementIndex>) {
    let idx = index();
    let mut src = EventSource::new(
        I,
        "sim-0",
        info.kv_events_endpoint.clone().unwrap(),
        info.model.clone(),
        info.block_size,
    );
    src.replay_endpoint = info.replay_endpoint.clone();
    let cfg = EventsConfig {
        silence_threshold_ms: 300,
        silence_min_requests: 2,
        ..EventsConfig::default()
    };
    let origin = Instant::now();
    let clock = Arc::new(move || origin.elapsed().as_millis() as u64 + 1);
    let h = EventsHandle::start(&cfg, vec![src], idx.clone(), clock).unwrap();
    (h, idx)
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the index stops changing (the engine's events for finished requests arrived).
async fn settle(h: &EventsHandle) {
    let mut last = h.status()[0].last_seq;
    let mut stable_since = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(5);
    while stable_since.elapsed() < Duration::from_millis(150) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = h.status()[0].last_seq;
        if now != last {
            last = now;
            stable_since = Instant::now();
        }
    }
}

async fn complete(client: &reqwest::Client, info: &SimInstanceInfo, prompt: &[u32]) -> u64 {
    let body = json!({"model": info.model, "prompt": prompt, "max_tokens": 1, "temperature": 0});
    let r: Value = client
        .post(format!("{}/v1/completions", info.url))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    r["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {r}"))
}

async fn admin(client: &reqwest::Client, info: &SimInstanceInfo, faults: Value) {
    let r = client
        .post(format!("{}/admin/faults", info.url))
        .json(&faults)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
}

fn prompt(seed: u32, shared: &[u32], n: usize) -> Vec<u32> {
    let mut p = shared.to_vec();
    p.extend((0..n as u32).map(|i| 1000 + (seed * 7919 + i * 31) % 20_000));
    p
}

async fn credits_match_the_engine(encoding: kvgate_sim::EventEncoding) {
    let (fleet, info) = fleet(encoding).await;
    let (h, idx) = events(&info);
    until("connected", || h.status()[0].connected).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let client = reqwest::Client::new();
    let bs = info.block_size;
    let system: Vec<u32> = (500..500 + 100).collect();
    let mut prompts = Vec::new();
    // Shared system prompt, then distinct requests that overflow the 40-block cache.
    for i in 0..8 {
        prompts.push(prompt(i, &system, 150));
    }
    let mut checked = 0;
    let mut hits = 0;
    for round in 0..2 {
        for p in &prompts {
            settle(&h).await;
            let ours = credited_in(&idx, I, &info.model, bs, p);
            let engine = complete(&client, &info, p).await;
            assert_eq!(
                u64::from(ours * bs),
                engine,
                "round {round}: index credit vs engine cached tokens"
            );
            checked += 1;
            hits += u64::from(engine > 0);
        }
    }
    assert_eq!(checked, 16);
    assert!(hits > 0, "the shared system prompt was never credited");
    let st = &h.status()[0];
    assert!(st.blocks_removed > 0, "the small cache evicted");
    assert_eq!(st.orphan_blocks, 0);
    assert_eq!(st.gaps, 0);

    // Restart: the engine forgets everything, announces nothing about it, and seq restarts.
    let p0 = prompts[7].clone();
    settle(&h).await;
    assert!(credited_in(&idx, I, &info.model, bs, &p0) > 0);
    admin(&client, &info, json!({"restart": true})).await;
    complete(&client, &info, &prompt(99, &[], 64)).await;
    until("restart detected", || h.status()[0].restarts == 1).await;
    settle(&h).await;
    assert_eq!(credited_in(&idx, I, &info.model, bs, &p0), 0);
    assert_eq!(complete(&client, &info, &p0).await, 0);

    // Silence: the engine stops publishing while requests keep coming.
    settle(&h).await;
    admin(&client, &info, json!({"stop_events": true})).await;
    for i in 0..3 {
        h.note_dispatch(I);
        complete(&client, &info, &prompt(200 + i, &[], 64)).await;
    }
    until("silence flagged", || h.is_silent(I)).await;
    assert_eq!(idx.instance_entries(I), 0);
    drop(h);
    fleet.shutdown().await;
}

#[tokio::test]
async fn map_encoded_engine() {
    credits_match_the_engine(kvgate_sim::EventEncoding::Map).await;
}

#[tokio::test]
async fn legacy_encoded_engine() {
    credits_match_the_engine(kvgate_sim::EventEncoding::Legacy).await;
}
