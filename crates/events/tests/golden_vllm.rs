//! Golden test on a real vLLM 0.32 KV event stream (tests/data/capture.json): decode every frame
//! exactly, re-hash every stored block under kvgate's own token-mode chain from the requests that
//! caused it, and credit each request exactly as vLLM did.

use std::path::PathBuf;
use std::sync::Arc;

use kvgate_core::hash::{token_chain, Namespace};
use kvgate_core::index::{IndexConfig, PlacementIndex, PrefixMatches};
use kvgate_core::InstanceId;
use kvgate_events::decode::{decode_batch, DecodeLimits, Dialect, KvEvent};
use kvgate_events::metrics::StreamMetrics;
use kvgate_events::{Now, SeqVerdict, StreamIngest, StreamParams};
use kvgate_tokenizer::{ChatMessage, TokenMode};
use serde_json::Value;

const BLOCK: u32 = 32;
const MODEL: &str = "tiny";
const INST: InstanceId = InstanceId(3);

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn capture() -> Value {
    serde_json::from_slice(&std::fs::read(data().join("capture.json")).unwrap()).unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn request_tokens(mode: &TokenMode, req: &Value) -> Option<Vec<u32>> {
    let body = &req["request"];
    match req["path"].as_str().unwrap() {
        "/v1/chat/completions" => {
            let msgs = ChatMessage::from_openai_list(&body["messages"]).unwrap();
            Some(mode.chat_tokens(&msgs).unwrap())
        }
        "/v1/completions" => Some(
            mode.completion_tokens(body["prompt"].as_str().unwrap())
                .unwrap(),
        ),
        _ => None,
    }
}

fn index() -> Arc<PlacementIndex> {
    Arc::new(PlacementIndex::new(IndexConfig {
        shards: 16,
        max_entries: 1 << 20,
        default_instance_capacity: 1 << 16,
    }))
}

fn ingest(index: &Arc<PlacementIndex>) -> StreamIngest {
    StreamIngest::new(
        StreamParams {
            instance: INST,
            name: Arc::from("vllm-0"),
            dp_rank: 0,
            model: MODEL.into(),
            block_size: BLOCK,
            dialect: Dialect::Vllm,
            max_tracked_blocks: 1 << 16,
            limits: DecodeLimits::default(),
            sole_stream: true,
        },
        index.clone(),
        StreamMetrics::new("vllm-0"),
    )
}

fn now(ms: u64) -> Now {
    Now {
        mono_ms: ms,
        unix_s: 1_796_022_570.0,
    }
}

#[test]
fn every_frame_decodes_to_what_vllm_sent() {
    let cap = capture();
    let frames = cap["frames"].as_array().unwrap();
    assert_eq!(frames.len(), 6);
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(f["seq"].as_u64().unwrap(), i as u64);
        let batch = decode_batch(
            &hex(f["payload_hex"].as_str().unwrap()),
            Dialect::Vllm,
            &DecodeLimits::default(),
        )
        .unwrap();
        let want = &f["decoded"];
        assert_eq!(batch.ts, want[0].as_f64().unwrap());
        assert_eq!(batch.dp_rank, Some(want[2].as_u64().unwrap() as u32));
        assert_eq!(batch.unknown_events, 0);
        let want_events = want[1].as_array().unwrap();
        assert_eq!(batch.events.len(), want_events.len());
        for (got, w) in batch.events.iter().zip(want_events) {
            let hashes = |v: &Value| -> Vec<u64> {
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|h| h.as_u64().unwrap())
                    .collect()
            };
            match got {
                KvEvent::BlockStored(s) => {
                    assert_eq!(w["type"], "BlockStored");
                    assert_eq!(s.block_hashes, hashes(&w["block_hashes"]));
                    assert_eq!(s.parent, w["parent_block_hash"].as_u64());
                    let toks: Vec<u32> = w["token_ids"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|t| t.as_u64().unwrap() as u32)
                        .collect();
                    assert_eq!(s.token_ids, toks);
                    assert_eq!(s.block_size, BLOCK);
                    assert_eq!(s.medium.as_deref(), Some("GPU"));
                    assert_eq!(s.group_idx, Some(0));
                    assert_eq!(s.kv_cache_spec_kind.as_deref(), Some("full_attention"));
                    assert_eq!(s.lora_id, None);
                }
                KvEvent::BlockRemoved(r) => {
                    assert_eq!(w["type"], "BlockRemoved");
                    assert_eq!(r.block_hashes, hashes(&w["block_hashes"]));
                    assert_eq!(r.medium.as_deref(), Some("GPU"));
                }
                KvEvent::AllBlocksCleared => assert_eq!(w["type"], "AllBlocksCleared"),
            }
        }
    }
}

/// The frame vLLM published while serving each request (none: fully cached, a reset call, or no
/// full block). `AllBlocksCleared` rides on the request after the reset.
const FRAME_OF_REQUEST: [Option<usize>; 8] = [
    Some(0),
    None,
    Some(1),
    Some(2),
    Some(3),
    Some(4),
    None,
    Some(5),
];

#[test]
fn stream_applied_to_the_index_credits_requests_exactly_as_vllm() {
    let mode = TokenMode::from_model_dir(&data()).unwrap();
    let cap = capture();
    let frames = cap["frames"].as_array().unwrap();
    let requests = cap["requests"].as_array().unwrap();
    let idx = index();
    let mut ing = ingest(&idx);
    let ns = Namespace {
        model: MODEL,
        lora: None,
        cache_salt: None,
    };
    let mut out = PrefixMatches::default();
    let mut credited = Vec::new();
    let mut t = 1;
    for (i, req) in requests.iter().enumerate() {
        t += 10;
        if let Some(tokens) = request_tokens(&mode, req) {
            // What kvgate credits this instance with, before the request runs.
            let chain = token_chain(&ns, &tokens, BLOCK as usize);
            idx.match_prefix(&chain, t, &mut out);
            let cached_tokens = out.get(INST).total() * BLOCK;
            let vllm = req["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap();
            assert_eq!(u64::from(cached_tokens), vllm, "request {i}");
            credited.push(cached_tokens);
            // Every block the request's events announce is indexed under the request's own chain.
            if let Some(f) = FRAME_OF_REQUEST[i] {
                let seq = frames[f]["seq"].as_u64().unwrap();
                let expect = if f == 0 {
                    SeqVerdict::First
                } else {
                    SeqVerdict::Next
                };
                assert_eq!(ing.check_seq(seq), expect);
                let payload = hex(frames[f]["payload_hex"].as_str().unwrap());
                ing.apply_payload(seq, &payload, now(t)).unwrap();
                let batch =
                    decode_batch(&payload, Dialect::Vllm, &DecodeLimits::default()).unwrap();
                for e in &batch.events {
                    if let KvEvent::BlockStored(s) = e {
                        for h in &s.block_hashes {
                            let kv = ing.kv_hash_of(*h).expect("stored block is tracked");
                            assert!(chain.contains(&kv), "request {i}: foreign hash");
                        }
                    }
                }
            }
        } else if let Some(f) = FRAME_OF_REQUEST[i] {
            panic!("non-generation request {i} mapped to frame {f}");
        }
    }
    assert_eq!(credited, vec![0, 448, 0, 0, 0, 192, 0]);

    // After the reset's AllBlocksCleared, nothing is credited any more.
    let first = request_tokens(&mode, &requests[0]).unwrap();
    idx.match_prefix(&token_chain(&ns, &first, BLOCK as usize), t + 1, &mut out);
    assert_eq!(out.get(INST).total(), 0);
    assert_eq!(idx.instance_entries(INST), 0);
    let st = ing.status();
    assert_eq!(st.blocks_stored, 14 + 12 + 15 + 13 + 8);
    assert_eq!(st.blocks_removed, 16);
    assert_eq!(st.orphan_blocks, 0);
    assert_eq!(st.ignored_events, 0);
    assert_eq!(st.block_size_mismatch, None);
}

#[test]
fn index_mirrors_the_engine_cache_at_every_step() {
    // 48 blocks of cache: after frame 3, vLLM holds 14 + 12 + 15 + 13 - 8 = 46 blocks.
    let cap = capture();
    let idx = index();
    let mut ing = ingest(&idx);
    let mut held = Vec::new();
    for f in cap["frames"].as_array().unwrap() {
        let payload = hex(f["payload_hex"].as_str().unwrap());
        ing.apply_payload(f["seq"].as_u64().unwrap(), &payload, now(1))
            .unwrap();
        held.push(idx.instance_entries(INST));
    }
    assert_eq!(held, vec![14, 26, 41, 46, 46, 0]);
}
