//! Fidelity against a real vLLM 0.32 (CPU) capture: same engine shape (block 32, 48 blocks, the
//! model's tokenizer.json and chat template), same requests in the same order; compare what hit
//! the prefix cache and the shape of the KV event stream. See docs/simulator.md.

mod common;

use std::time::Duration;

use common::*;
use kvgate_sim::fleet::{EngineOverrides, FleetConfig};
use kvgate_sim::kv_events::{encode_batch, EventEncoding};
use kvgate_sim::model::{KvEvent, Medium};
use serde_json::Value;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/vllm-0.32-cpu");

fn capture() -> Value {
    serde_json::from_str(&std::fs::read_to_string(format!("{DIR}/capture.json")).unwrap()).unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// (type, number of hashes) per event, per frame.
fn shape(frames: &[Vec<Value>]) -> Vec<Vec<(String, usize)>> {
    frames
        .iter()
        .map(|evs| {
            evs.iter()
                .map(|e| {
                    let n = e
                        .get("block_hashes")
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len);
                    (e["type"].as_str().unwrap().to_string(), n)
                })
                .collect()
        })
        .collect()
}

/// For every `BlockRemoved`, the (store ordinal, index) of the block it removes.
fn removal_identity(frames: &[Vec<Value>]) -> Vec<(usize, usize)> {
    let mut at = std::collections::HashMap::new();
    let mut stores = 0;
    let mut out = Vec::new();
    for e in frames.iter().flatten() {
        match e["type"].as_str().unwrap() {
            "BlockStored" => {
                for (i, h) in u64s(&e["block_hashes"]).into_iter().enumerate() {
                    at.insert(h, (stores, i));
                }
                stores += 1;
            }
            "BlockRemoved" => {
                for h in u64s(&e["block_hashes"]) {
                    out.push(at[&h]);
                }
            }
            _ => at.clear(),
        }
    }
    out
}

/// Our encoder, fed the captured events, reproduces vLLM's payload bytes exactly.
#[test]
fn encoder_reproduces_captured_payloads() {
    let cap = capture();
    for f in cap["frames"].as_array().unwrap() {
        let d = &f["decoded"];
        let events: Vec<KvEvent> = d[1]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| match e["type"].as_str().unwrap() {
                "BlockStored" => KvEvent::BlockStored {
                    block_hashes: u64s(&e["block_hashes"]),
                    parent_block_hash: e["parent_block_hash"].as_u64(),
                    token_ids: e["token_ids"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_u64().unwrap() as u32)
                        .collect(),
                    block_size: e["block_size"].as_u64().unwrap() as u32,
                    medium: Medium::Gpu,
                },
                "BlockRemoved" => KvEvent::BlockRemoved {
                    block_hashes: u64s(&e["block_hashes"]),
                    medium: Medium::Gpu,
                },
                _ => KvEvent::AllBlocksCleared,
            })
            .collect();
        let ts = d[0].as_f64().unwrap();
        let got = encode_batch(ts, &events, Some(0), EventEncoding::Map);
        assert_eq!(
            got,
            hex(f["payload_hex"].as_str().unwrap()),
            "frame seq {}",
            f["seq"]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_requests_same_hits_and_event_shape() {
    let cap = capture();
    let cfg = FleetConfig {
        engines: 1,
        model: "tiny".into(),
        preset: "tiny-cpu".into(),
        time_scale: 20.0,
        tokenizer_dir: Some(DIR.into()),
        engine: EngineOverrides {
            block_size: Some(32),
            num_gpu_blocks: Some(48),
            ..Default::default()
        },
        ..FleetConfig::default()
    };
    let fleet = start(cfg).await;
    let inst = fleet.instances()[0].clone();
    let mut sub = subscribe(inst.kv_events_endpoint.as_deref().unwrap()).await;
    let c = reqwest::Client::new();

    // Per request: frames it caused (vLLM published at most one per request here).
    let mut ours: Vec<Vec<Vec<Value>>> = Vec::new();
    let mut cached = Vec::new();
    for r in cap["requests"].as_array().unwrap() {
        let path = r["path"].as_str().unwrap();
        let url = format!("{}{path}", inst.url);
        if path == "/reset_prefix_cache" {
            assert_eq!(c.post(&url).send().await.unwrap().status().as_u16(), 200);
            cached.push(None);
        } else {
            let (s, resp) = post(&c, &url, r["request"].clone()).await;
            assert_eq!(s, 200, "{resp}");
            assert_eq!(
                resp["usage"]["prompt_tokens"], r["usage"]["prompt_tokens"],
                "prompt token counts match vLLM's for {path}"
            );
            cached.push(resp["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64());
        }
        let frames = collect(&mut sub, Duration::from_millis(300), 100).await;
        ours.push(frames.into_iter().map(|f| f.events).collect());
    }

    let want_cached: Vec<Option<u64>> = cap["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64())
        .collect();
    println!("cached_tokens sim  = {cached:?}");
    println!("cached_tokens vLLM = {want_cached:?}");

    // vLLM's frames in order; map them to requests: requests that published nothing are the
    // ones whose `ours` entry must be empty too.
    let theirs: Vec<Vec<Value>> = cap["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["decoded"][1].as_array().unwrap().clone())
        .collect();
    let ours_flat: Vec<Vec<Value>> = ours.iter().flatten().cloned().collect();
    println!("event shape sim  = {:?}", shape(&ours_flat));
    println!("event shape vLLM = {:?}", shape(&theirs));
    let silent: Vec<usize> = ours
        .iter()
        .enumerate()
        .filter(|(_, f)| f.is_empty())
        .map(|(i, _)| i)
        .collect();
    println!("requests publishing nothing (sim): {silent:?}");

    // Token ids in stored events equal vLLM's (same tokenizer, template and special-token rules).
    let their_tokens: Vec<Vec<u64>> = theirs
        .iter()
        .flatten()
        .filter(|e| e["type"] == "BlockStored")
        .map(|e| u64s(&e["token_ids"]))
        .collect();
    let our_tokens: Vec<Vec<u64>> = ours_flat
        .iter()
        .flatten()
        .filter(|e| e["type"] == "BlockStored")
        .map(|e| u64s(&e["token_ids"]))
        .collect();
    assert_eq!(our_tokens, their_tokens, "stored token ids are vLLM's");
    // Which blocks were evicted: (n-th store, position in it) for every removal, in order.
    assert_eq!(
        removal_identity(&ours_flat),
        removal_identity(&theirs),
        "same blocks evicted in the same order"
    );

    assert_eq!(cached, want_cached, "cached tokens per request");
    assert_eq!(shape(&ours_flat), shape(&theirs), "event stream shape");
    assert_eq!(
        silent,
        vec![1, 6],
        "request 2 (full hit) and the reset publish nothing"
    );
    fleet.shutdown().await;
}
