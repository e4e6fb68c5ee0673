//! A simulated engine end to end: HTTP (streaming, usage), KV events over ZMQ matching the cache,
//! replay, and the restart fault.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use kvgate_sim::fleet::{EngineOverrides, FleetConfig};
use serde_json::{json, Value};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

fn cfg(blocks: u32) -> FleetConfig {
    FleetConfig {
        engines: 1,
        preset: "llama3-8b-h100".into(),
        time_scale: 50.0,
        engine: EngineOverrides {
            num_gpu_blocks: Some(blocks),
            ..Default::default()
        },
        ..FleetConfig::default()
    }
}

fn prompt(word: &str, n: usize) -> String {
    (0..n).map(|i| format!("{word} {i} ")).collect()
}

/// Applies GPU events to a set of engine hashes.
fn fold(frames: &[Frame], set: &mut BTreeSet<u64>) {
    for f in frames {
        for e in &f.events {
            let hashes = || {
                e["block_hashes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|h| h.as_u64().unwrap())
            };
            match e["type"].as_str().unwrap() {
                "BlockStored" => set.extend(hashes()),
                "BlockRemoved" => {
                    for h in hashes() {
                        assert!(set.remove(&h), "removal of a block never stored");
                    }
                }
                "AllBlocksCleared" => set.clear(),
                other => panic!("unknown event {other}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_match_cache_and_repeat_hits() {
    let fleet = start(cfg(16)).await;
    let inst = fleet.instances()[0].clone();
    let mut sub = subscribe(inst.kv_events_endpoint.as_deref().unwrap()).await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/completions", inst.url);

    let a = prompt("alpha", 40);
    let (s, r1) = post(
        &c,
        &url,
        json!({"model": "m", "prompt": a, "max_tokens": 3}),
    )
    .await;
    assert_eq!(s, 200, "{r1}");
    let prompt_tokens = r1["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 100);
    assert_eq!(r1["usage"]["completion_tokens"], 3);
    assert_eq!(r1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    // The repeat, streamed with usage: every full block but the one holding the last token hits.
    let (chunks, done) = stream(
        &c,
        &url,
        json!({"prompt": a, "max_tokens": 5, "stream": true, "stream_options": {"include_usage": true}}),
    )
    .await;
    assert!(done);
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        usage["usage"]["prompt_tokens_details"]["cached_tokens"],
        (prompt_tokens - 1) / 16 * 16
    );
    let texts: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["choices"].as_array().is_some_and(|a| !a.is_empty()))
        .collect();
    assert_eq!(texts.len(), 5, "one chunk per output token");
    assert_eq!(texts[4]["choices"][0]["finish_reason"], "length");

    // Two other prompts overflow the 16-block cache and force evictions.
    for w in ["beta", "gamma"] {
        let (s, _) = post(&c, &url, json!({"prompt": prompt(w, 40), "max_tokens": 2})).await;
        assert_eq!(s, 200);
    }
    let frames = collect(&mut sub, Duration::from_millis(600), 1000).await;
    assert!(!frames.is_empty());
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(f.seq, i as u64, "seq counts from 0 without gaps");
    }
    let stored: Vec<&Value> = frames
        .iter()
        .flat_map(|f| &f.events)
        .filter(|e| e["type"] == "BlockStored")
        .collect();
    let removed = frames
        .iter()
        .flat_map(|f| &f.events)
        .filter(|e| e["type"] == "BlockRemoved")
        .count();
    assert!(removed > 0, "a 16-block cache must evict");
    assert_eq!(stored[0]["parent_block_hash"], Value::Null);
    assert_eq!(stored[0]["block_size"], 16);
    assert_eq!(stored[0]["medium"], "GPU");
    // The event's token ids are the prompt's tokens, as /tokenize (with special tokens) gives them.
    let (_, tok) = post(&c, &format!("{}/tokenize", inst.url), json!({"prompt": a})).await;
    let ids: Vec<u64> = tok["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let n = stored[0]["block_hashes"].as_array().unwrap().len();
    let ev_ids: Vec<u64> = stored[0]["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(n, ids.len() / 16);
    assert_eq!(ev_ids, ids[..n * 16].to_vec());

    let mut set = BTreeSet::new();
    fold(&frames, &mut set);
    let (_, cache) = c
        .get(format!("{}/admin/cache", inst.url))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .map(|v| (0, v))
        .unwrap();
    let truth: BTreeSet<u64> = cache["gpu"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_u64().unwrap())
        .collect();
    assert_eq!(set, truth, "the event stream reproduces the cache");

    // Replay from seq 1 over a DEALER socket: every buffered batch, byte for byte, then the end marker.
    let mut dealer = DealerSocket::new();
    dealer
        .connect(inst.replay_endpoint.as_deref().unwrap())
        .await
        .unwrap();
    let req = ZmqMessage::try_from(vec![
        bytes::Bytes::new(),
        bytes::Bytes::copy_from_slice(&1u64.to_be_bytes()),
    ])
    .unwrap();
    dealer.send(req).await.unwrap();
    let mut replayed = Vec::new();
    loop {
        let m = tokio::time::timeout(Duration::from_secs(5), dealer.recv())
            .await
            .unwrap()
            .unwrap()
            .into_vec();
        assert_eq!(m.len(), 3, "delimiter, seq, payload");
        if m[1][..] == [0xff; 8] {
            assert!(m[2].is_empty());
            break;
        }
        replayed.push((
            u64::from_be_bytes(m[1][..].try_into().unwrap()),
            m[2].clone(),
        ));
    }
    let want: Vec<(u64, bytes::Bytes)> = frames
        .iter()
        .skip(1)
        .map(|f| (f.seq, f.payload.clone()))
        .collect();
    assert_eq!(replayed, want);

    // Metrics agree with the usage reported.
    let m = metrics(&c, &inst.url).await;
    assert!(m.contains("vllm:prefix_cache_hits_total"));
    assert!(m.contains("vllm:cache_config_info{block_size=\"16\""));
    assert!(m.contains("num_gpu_blocks=\"16\"} 1"));
    assert!(m.contains(&format!(
        "vllm:prefix_cache_hits_total{{engine=\"0\",model_name=\"kvgate-sim\"}} {}",
        (prompt_tokens - 1) / 16 * 16
    )));
    assert!(m.contains(
        "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"kvgate-sim\"} 4"
    ));
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_fault_resets_seq_without_all_blocks_cleared() {
    let fleet = start(cfg(64)).await;
    let inst = fleet.instances()[0].clone();
    let mut sub = subscribe(inst.kv_events_endpoint.as_deref().unwrap()).await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", inst.url);
    let body = json!({"messages": [{"role": "system", "content": prompt("sys", 30)}, {"role": "user", "content": "hi"}], "max_tokens": 2});
    for _ in 0..2 {
        assert_eq!(post(&c, &url, body.clone()).await.0, 200);
    }
    let (s, r) = post(&c, &url, body.clone()).await;
    assert_eq!(s, 200);
    assert!(
        r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    let before = collect(&mut sub, Duration::from_millis(400), 100).await;
    assert_eq!(
        before.len(),
        1,
        "repeats add no full block and publish nothing"
    );

    let (s, f) = post(
        &c,
        &format!("{}/admin/faults", inst.url),
        json!({"restart": true}),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(f["restart"], false);
    let (_, r) = post(&c, &url, body.clone()).await;
    assert_eq!(
        r["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "cache is cold after a restart"
    );
    let after = collect(&mut sub, Duration::from_millis(400), 100).await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].seq, 0, "a restarted engine counts from 0 again");
    assert!(after[0]
        .events
        .iter()
        .all(|e| e["type"] != "AllBlocksCleared"));

    // Reset: AllBlocksCleared only comes with the next step.
    let r = c
        .post(format!("{}/reset_prefix_cache", inst.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(collect(&mut sub, Duration::from_millis(300), 10)
        .await
        .is_empty());
    post(
        &c,
        &url,
        json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}),
    )
    .await;
    let next = collect(&mut sub, Duration::from_millis(400), 10).await;
    assert_eq!(next[0].events[0]["type"], "AllBlocksCleared");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn surfaces_errors_and_faults() {
    let mut conf = cfg(64);
    conf.flavour = kvgate_sim::Flavour::Sglang;
    conf.kv_events = false;
    let fleet = start(conf).await;
    let base = fleet.instances()[0].url.clone();
    let c = reqwest::Client::new();
    // Bad input → 400 in SGLang's flat error shape.
    let (s, e) = post(
        &c,
        &format!("{base}/v1/chat/completions"),
        json!({"messages": "nope"}),
    )
    .await;
    assert_eq!(s, 400);
    assert_eq!(e["object"], "error");
    let (s, _) = post(
        &c,
        &format!("{base}/v1/completions"),
        json!({"prompt": "x", "max_tokens": 0}),
    )
    .await;
    assert_eq!(s, 400);
    let (s, _) = post(
        &c,
        &format!("{base}/v1/completions"),
        json!({"prompt": "x", "max_tokens": 999999}),
    )
    .await;
    assert_eq!(s, 400);
    // SGLang worker surface.
    for p in [
        "/get_server_info",
        "/server_info",
        "/get_model_info",
        "/model_info",
        "/get_load",
        "/v1/loads",
        "/v1/models",
        "/health",
    ] {
        assert_eq!(
            c.get(format!("{base}{p}"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16(),
            200,
            "{p}"
        );
    }
    let m = metrics(&c, &base).await;
    assert!(m.contains("sglang:num_running_reqs") && m.contains("sglang:cache_hit_rate"));
    // Always-5xx fault, then back to normal.
    let (s, _) = post(
        &c,
        &format!("{base}/admin/faults"),
        json!({"always_5xx": true}),
    )
    .await;
    assert_eq!(s, 200);
    let (s, _) = post(
        &c,
        &format!("{base}/v1/completions"),
        json!({"prompt": "x", "max_tokens": 1}),
    )
    .await;
    assert_eq!(s, 500);
    let (s, _) = post(&c, &format!("{base}/admin/faults"), json!({"bogus": 1})).await;
    assert_eq!(s, 400);
    post(&c, &format!("{base}/admin/faults"), json!({})).await;
    let (s, r) = post(
        &c,
        &format!("{base}/v1/completions"),
        json!({"prompt": "x", "max_tokens": 4, "ignore_eos": true}),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(r["usage"]["completion_tokens"], 4);
    // Dropped connections mid-stream.
    post(
        &c,
        &format!("{base}/admin/faults"),
        json!({"drop_rate": 1.0}),
    )
    .await;
    let r = c
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": "x", "max_tokens": 8, "stream": true}))
        .send()
        .await
        .unwrap();
    assert!(r.text().await.is_err(), "the stream must break");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_frees_blocks() {
    let mut conf = cfg(512);
    conf.time_scale = 1.0;
    let fleet = start(conf).await;
    let base = fleet.instances()[0].url.clone();
    let c = reqwest::Client::new();
    let r = c
        .post(format!("{base}/v1/completions"))
        .json(&json!({"prompt": prompt("long", 20), "max_tokens": 2000, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut r = r;
    let first = tokio::time::timeout(Duration::from_secs(5), r.chunk())
        .await
        .unwrap()
        .unwrap();
    assert!(first.is_some());
    let load = |v: Value| v["load"]["running"].as_u64().unwrap();
    let mut running = 0;
    for _ in 0..50 {
        let st = c
            .get(format!("{base}/admin/stats"))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap();
        running = load(st);
        if running == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(running, 1);
    drop(r);
    let mut freed = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let st = c
            .get(format!("{base}/admin/stats"))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap();
        if load(st.clone()) == 0 && st["stats"]["requests_aborted"] == 1 {
            freed = true;
            break;
        }
    }
    assert!(freed, "the aborted request left the batch");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_scale_divides_durations() {
    // 100 decode steps of ~9.2 ms (llama3-8b-h100) ≈ 0.93 simulated seconds; at time scale 10
    // the wall time is ~0.09 s. Sleeps never end early, so the lower bound is strict; the upper
    // bound is loose for a busy machine.
    let mut conf = cfg(1024);
    conf.time_scale = 10.0;
    conf.kv_events = false;
    let fleet = start(conf).await;
    let base = fleet.instances()[0].url.clone();
    let c = reqwest::Client::new();
    let t = std::time::Instant::now();
    let (s, _) = post(
        &c,
        &format!("{base}/v1/completions"),
        json!({"prompt": "x", "max_tokens": 100}),
    )
    .await;
    let wall = t.elapsed().as_secs_f64();
    assert_eq!(s, 200);
    assert!(wall >= 0.085, "{wall}");
    assert!(wall < 2.0, "{wall}");
    let st = c
        .get(format!("{base}/admin/stats"))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    let busy_s = st["stats"]["busy_us"].as_f64().unwrap() / 1e6;
    assert!((0.85..1.05).contains(&busy_s), "{busy_s}");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_turn_hits_the_previous_answer() {
    let mut conf = cfg(1024);
    conf.kv_events = false;
    let fleet = start(conf).await;
    let url = format!("{}/v1/chat/completions", fleet.instances()[0].url);
    let c = reqwest::Client::new();
    let mut messages = vec![
        json!({"role": "system", "content": prompt("rules", 15)}),
        json!({"role": "user", "content": "first question"}),
    ];
    let (s, r1) = post(&c, &url, json!({"messages": messages, "max_tokens": 64})).await;
    assert_eq!(s, 200);
    let p1 = r1["usage"]["prompt_tokens"].as_u64().unwrap();
    let answer = r1["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    messages.push(json!({"role": "assistant", "content": answer}));
    messages.push(json!({"role": "user", "content": "second question"}));
    let (s, r2) = post(&c, &url, json!({"messages": messages, "max_tokens": 4})).await;
    assert_eq!(s, 200);
    let cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // Beyond the first prompt's full blocks: blocks of the generated answer hit too.
    assert!(
        cached >= (p1 + 63) / 16 * 16 - 16,
        "cached {cached}, first prompt {p1}"
    );
    assert!(cached > p1 / 16 * 16, "cached {cached}, first prompt {p1}");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_to_a_bound_subscriber_by_vllms_rule() {
    // A plain tcp://host:port endpoint means "connect" for vLLM: the subscriber binds.
    let mut sub = zeromq::SubSocket::new();
    let ep = zeromq::Socket::bind(&mut sub, "tcp://127.0.0.1:0")
        .await
        .unwrap()
        .to_string();
    sub.subscribe("").await.unwrap();
    let mut conf = cfg(64);
    conf.kv_events_endpoint = Some(ep.clone());
    conf.replay = false;
    let fleet = start(conf).await;
    let inst = fleet.instances()[0].clone();
    assert_eq!(inst.kv_events_endpoint.as_deref(), Some(ep.as_str()));
    tokio::time::sleep(Duration::from_millis(800)).await;
    let c = reqwest::Client::new();
    let (s, _) = post(
        &c,
        &format!("{}/v1/completions", inst.url),
        json!({"prompt": prompt("z", 20), "max_tokens": 1}),
    )
    .await;
    assert_eq!(s, 200);
    let frames = collect(&mut sub, Duration::from_millis(800), 10).await;
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].seq, 0);
    assert_eq!(frames[0].events[0]["type"], "BlockStored");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_events_fault_silences_the_publisher() {
    let fleet = start(cfg(256)).await;
    let inst = fleet.instances()[0].clone();
    let mut sub = subscribe(inst.kv_events_endpoint.as_deref().unwrap()).await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/completions", inst.url);
    post(
        &c,
        &format!("{}/admin/faults", inst.url),
        json!({"stop_events": true}),
    )
    .await;
    let (s, _) = post(
        &c,
        &url,
        json!({"prompt": prompt("quiet", 20), "max_tokens": 1}),
    )
    .await;
    assert_eq!(s, 200);
    assert!(collect(&mut sub, Duration::from_millis(400), 10)
        .await
        .is_empty());
    post(&c, &format!("{}/admin/faults", inst.url), json!({})).await;
    post(
        &c,
        &url,
        json!({"prompt": prompt("loud", 20), "max_tokens": 1}),
    )
    .await;
    let frames = collect(&mut sub, Duration::from_millis(400), 10).await;
    assert_eq!(frames.len(), 1);
    assert_eq!(
        frames[0].seq, 0,
        "discarded batches take no sequence number"
    );
    fleet.shutdown().await;
}

/// The engine's own TTFT runs from the request's receipt, as vLLM's does: a request that
/// arrives while a long prefill step runs waits for that step, and the histogram counts the
/// wait (the loop takes new requests only between steps). So the engine's TTFT sums to nearly
/// what the client measured, the rest being the HTTP path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_ttft_counts_the_wait_for_the_running_step() {
    let fleet = start(FleetConfig {
        time_scale: 1.0,
        ..cfg(4096)
    })
    .await;
    let inst = fleet.instances()[0].clone();
    let c = reqwest::Client::new();
    let url = format!("{}/v1/completions", inst.url);
    let send = |prompt: String| {
        let body = json!({"model": "m", "prompt": prompt, "max_tokens": 2, "stream": true});
        let sent = std::time::Instant::now();
        let req = c.post(&url).json(&body).send();
        async move {
            let resp = req.await.unwrap();
            assert_eq!(resp.status(), 200);
            (sent, resp)
        }
    };
    let first_chunk = |(sent, mut resp): (std::time::Instant, reqwest::Response)| async move {
        let _ = resp.chunk().await.unwrap();
        let ttft = sent.elapsed().as_secs_f64();
        while resp.chunk().await.unwrap().is_some() {}
        ttft
    };
    // A prompt of thousands of tokens: one prefill step of a few hundred ms at this scale. The
    // engine answers with headers once the request is queued, so the short one is sent while
    // that step runs.
    let long = send(prompt("long", 2000)).await;
    let long = tokio::spawn(first_chunk(long));
    let short = first_chunk(send("short".to_string()).await).await;
    let long = long.await.unwrap();
    let m = metrics(&c, &inst.url).await;
    let value = |name: &str| -> f64 {
        m.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    let count = value("vllm:time_to_first_token_seconds_count");
    let sum = value("vllm:time_to_first_token_seconds_sum");
    assert_eq!(count, 2.0, "{m}");
    // The short request waited behind most of the long one's step: counted from the step's end
    // instead, the sum would be little more than the long request's own TTFT.
    assert!(short > 0.5 * long, "short {short} long {long}");
    assert!(
        sum > 0.8 * (long + short) && sum <= long + short,
        "engine sum {sum}, client {long} + {short}"
    );
    fleet.shutdown().await;
}
