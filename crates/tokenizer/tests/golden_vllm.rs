//! Golden test against a real vLLM 0.32 capture (tests/data/capture.json, copied from a recorded
//! run): the token ids kvgate computes for each request must be exactly the ids vLLM announced in
//! its `BlockStored` events, and the prompt lengths must match vLLM's reported usage.

use std::collections::HashMap;
use std::path::PathBuf;

use kvgate_tokenizer::{ChatMessage, ChatTemplate, TokenMode, Tokenizer};
use serde_json::Value;

const BLOCK_SIZE: usize = 32;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn capture() -> Value {
    let bytes = std::fs::read(data_dir().join("capture.json")).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// Token ids of one recorded request as kvgate computes them, `None` for non-generation calls.
fn request_tokens(mode: &TokenMode, req: &Value) -> Option<Vec<u32>> {
    let body = &req["request"];
    match req["path"].as_str().unwrap() {
        "/v1/chat/completions" => {
            let messages = ChatMessage::from_openai_list(&body["messages"]).unwrap();
            Some(mode.chat_tokens(&messages).unwrap())
        }
        "/v1/completions" => Some(
            mode.completion_tokens(body["prompt"].as_str().unwrap())
                .unwrap(),
        ),
        _ => None,
    }
}

fn u64_of(v: &Value) -> u64 {
    v.as_u64().unwrap()
}

#[test]
fn model_dir_loading_matches_explicit_construction() {
    let mode = TokenMode::from_model_dir(&data_dir()).unwrap();
    assert_eq!(mode.tokenizer.bos_token_id(), Some(0));
    assert!(!mode.template.is_builtin());
    let tok = Tokenizer::from_file(&data_dir().join("tokenizer.json")).unwrap();
    let src = std::fs::read_to_string(data_dir().join("chat_template.jinja")).unwrap();
    let explicit = TokenMode::new(tok, ChatTemplate::from_jinja(&src, None, None).unwrap());
    let msgs = [ChatMessage::new("user", "hello there")];
    assert_eq!(
        mode.chat_tokens(&msgs).unwrap(),
        explicit.chat_tokens(&msgs).unwrap()
    );
}

#[test]
fn prompt_lengths_match_vllm_usage() {
    let mode = TokenMode::from_model_dir(&data_dir()).unwrap();
    let cap = capture();
    let mut checked = 0;
    for req in cap["requests"].as_array().unwrap() {
        let Some(tokens) = request_tokens(&mode, req) else {
            continue;
        };
        let expected = u64_of(&req["usage"]["prompt_tokens"]) as usize;
        assert_eq!(tokens.len(), expected, "request {}", req["path"]);
        checked += 1;
    }
    assert_eq!(checked, 7);
}

#[test]
fn completions_start_with_bos_and_chats_do_not() {
    let mode = TokenMode::from_model_dir(&data_dir()).unwrap();
    assert_eq!(mode.completion_tokens("hello").unwrap()[0], 0);
    let chat = mode
        .chat_tokens(&[ChatMessage::new("user", "hello")])
        .unwrap();
    assert_ne!(chat[0], 0);
}

#[test]
fn block_stored_token_ids_are_reproduced_exactly() {
    let mode = TokenMode::from_model_dir(&data_dir()).unwrap();
    let cap = capture();
    let requests: Vec<Option<Vec<u32>>> = cap["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| request_tokens(&mode, r))
        .collect();
    // engine hash -> number of tokens up to and including that block.
    let mut depth: HashMap<u64, usize> = HashMap::new();
    let mut matched_requests = Vec::new();
    let mut stored_blocks = 0;
    for frame in cap["frames"].as_array().unwrap() {
        for event in frame["decoded"][1].as_array().unwrap() {
            if event["type"] != "BlockStored" {
                continue;
            }
            assert_eq!(u64_of(&event["block_size"]) as usize, BLOCK_SIZE);
            let start = match event["parent_block_hash"].as_u64() {
                None => 0,
                Some(parent) => depth[&parent],
            };
            let ids: Vec<u32> = event["token_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| u64_of(v) as u32)
                .collect();
            let hashes = event["block_hashes"].as_array().unwrap();
            assert_eq!(ids.len(), hashes.len() * BLOCK_SIZE);
            // The first request (in order) whose tokens contain these ids at that offset.
            let found = requests.iter().position(|r| {
                r.as_ref()
                    .and_then(|t| t.get(start..start + ids.len()))
                    .is_some_and(|slice| slice == ids.as_slice())
            });
            let Some(found) = found else {
                panic!("no request reproduces the event at offset {start}");
            };
            matched_requests.push(found);
            for (i, h) in hashes.iter().enumerate() {
                depth.insert(u64_of(h), start + (i + 1) * BLOCK_SIZE);
            }
            stored_blocks += hashes.len();
        }
    }
    // Request 1 repeats request 0's prefix (fully cached: no event); request 5 repeats request 0
    // after evictions and stores only its evicted tail; request 7 has no full block.
    assert_eq!(matched_requests, vec![0, 2, 3, 4, 0]);
    assert_eq!(stored_blocks, 14 + 12 + 15 + 13 + 8);
    // Request 5 is the same chat as request 0 and the stored tail starts at block 6 (192 tokens).
    assert_eq!(requests[5], requests[0]);
}
