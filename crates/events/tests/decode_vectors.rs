//! The shared golden vectors: a legacy-array batch and a map batch encoding the same three events,
//! and the original (v0.9) two-element batch.

use std::path::PathBuf;

use kvgate_events::decode::{
    decode_batch, BlockRemoved, BlockStored, DecodeLimits, Dialect, EventBatch, KvEvent,
};

fn data(name: &str) -> Vec<u8> {
    std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(name),
    )
    .unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn dec(b: &[u8]) -> EventBatch {
    decode_batch(b, Dialect::Vllm, &DecodeLimits::default()).unwrap()
}

fn expected_three() -> Vec<KvEvent> {
    vec![
        KvEvent::BlockStored(BlockStored {
            block_hashes: vec![3236607068019569386, 2758186210834249151],
            parent: None,
            token_ids: (1..=32).collect(),
            block_size: 16,
            lora_id: None,
            medium: Some("GPU".into()),
            lora_name: None,
            group_idx: Some(0),
            kv_cache_spec_kind: Some("full_attention".into()),
            extra_key_strings: vec![],
            extra_keys_opaque: false,
        }),
        KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![2758186210834249151],
            medium: Some("GPU".into()),
            group_idx: Some(0),
        }),
        KvEvent::AllBlocksCleared,
    ]
}

#[test]
fn legacy_and_map_batches_decode_to_the_same_events() {
    let vectors: serde_json::Value = serde_json::from_slice(&data("event_vectors.json")).unwrap();
    for (file, key) in [
        ("legacy_batch.msgpack", "legacy_array_events(vLLM<#42892)"),
        ("map_batch.msgpack", "map_events(vLLM>=#42892,e.g.v0.26+)"),
    ] {
        let bytes = data(file);
        assert_eq!(bytes, hex(vectors[key]["hex"].as_str().unwrap()), "{file}");
        let b = dec(&bytes);
        assert_eq!(b.ts, 1700000000.5);
        assert_eq!(b.dp_rank, Some(0));
        assert_eq!(b.unknown_events, 0);
        assert_eq!(b.events, expected_three(), "{file}");
    }
}

#[test]
fn original_two_element_batch() {
    let vectors: serde_json::Value = serde_json::from_slice(&data("event_vectors.json")).unwrap();
    let b = dec(&hex(vectors["v0.9.0_original"]["hex"].as_str().unwrap()));
    assert_eq!(b.dp_rank, None);
    assert_eq!(
        b.events,
        vec![
            KvEvent::BlockStored(BlockStored {
                block_hashes: vec![123],
                parent: None,
                token_ids: (0..16).collect(),
                block_size: 16,
                ..Default::default()
            }),
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: vec![123],
                medium: None,
                group_idx: None,
            }),
        ]
    );
}

#[test]
fn vector_truncations_never_decode() {
    for file in ["legacy_batch.msgpack", "map_batch.msgpack"] {
        let bytes = data(file);
        for cut in 0..bytes.len() {
            assert!(
                decode_batch(&bytes[..cut], Dialect::Vllm, &DecodeLimits::default()).is_err(),
                "{file} cut at {cut}"
            );
        }
    }
}
