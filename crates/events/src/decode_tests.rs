//! Edge cases of the decoder, on hand-built msgpack.

use super::*;

/// A tiny msgpack writer for building test inputs.
#[derive(Default)]
struct W(Vec<u8>);

impl W {
    fn arr(mut self, n: usize) -> Self {
        self.0.push(0xdd);
        self.0.extend_from_slice(&(n as u32).to_be_bytes());
        self
    }
    fn map(mut self, n: usize) -> Self {
        self.0.push(0xdf);
        self.0.extend_from_slice(&(n as u32).to_be_bytes());
        self
    }
    fn u(mut self, v: u64) -> Self {
        self.0.push(0xcf);
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn i(mut self, v: i64) -> Self {
        self.0.push(0xd3);
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn f(mut self, v: f64) -> Self {
        self.0.push(0xcb);
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn s(mut self, v: &str) -> Self {
        self.0.push(0xdb);
        self.0.extend_from_slice(&(v.len() as u32).to_be_bytes());
        self.0.extend_from_slice(v.as_bytes());
        self
    }
    fn bin(mut self, v: &[u8]) -> Self {
        self.0.push(0xc6);
        self.0.extend_from_slice(&(v.len() as u32).to_be_bytes());
        self.0.extend_from_slice(v);
        self
    }
    fn nil(mut self) -> Self {
        self.0.push(0xc0);
        self
    }
    fn toks(self, t: &[u32]) -> Self {
        let mut w = self.arr(t.len());
        for &x in t {
            w = w.u(u64::from(x));
        }
        w
    }
}

fn dec(bytes: &[u8]) -> Result<EventBatch, DecodeError> {
    decode_batch(bytes, Dialect::Vllm, &DecodeLimits::default())
}

fn stored(b: &EventBatch, i: usize) -> &BlockStored {
    match &b.events[i] {
        KvEvent::BlockStored(s) => s,
        other => panic!("event {i} is {other:?}"),
    }
}

#[test]
fn empty_batches() {
    let b = dec(&W::default().arr(3).f(1.5).arr(0).nil().0).unwrap();
    assert_eq!(b.ts, 1.5);
    assert!(b.events.is_empty());
    assert_eq!(b.dp_rank, None);
    let b = dec(&W::default().arr(2).u(7).arr(0).0).unwrap();
    assert_eq!(b.ts, 7.0);
    assert!(dec(&W::default().arr(0).0).is_err());
    assert!(dec(&[]).is_err());
}

#[test]
fn unknown_event_types_and_shapes_are_skipped() {
    let bytes = W::default()
        .arr(3)
        .f(1.0)
        .arr(5)
        .arr(3)
        .s("BlockPinned")
        .arr(1)
        .u(1)
        .map(1)
        .s("x")
        .u(2)
        .map(2)
        .s("type")
        .s("SomethingNew")
        .s("payload")
        .arr(2)
        .nil()
        .nil()
        .u(42)
        .arr(0)
        .arr(1)
        .s("AllBlocksCleared")
        .u(3)
        .0;
    let b = dec(&bytes).unwrap();
    assert_eq!(b.events, vec![KvEvent::AllBlocksCleared]);
    assert_eq!(b.unknown_events, 4);
    assert_eq!(b.dp_rank, Some(3));
}

#[test]
fn huge_signed_and_byte_hashes() {
    let digest: Vec<u8> = (1..=32).collect();
    let bytes = W::default()
        .arr(3)
        .f(1.0)
        .arr(1)
        .arr(5)
        .s("BlockStored")
        .arr(3)
        .u(u64::MAX)
        .i(-2)
        .bin(&digest)
        .bin(&digest[..4])
        .toks(&[5; 48])
        .u(16)
        .nil()
        .0;
    let b = dec(&bytes).unwrap();
    let s = stored(&b, 0);
    assert_eq!(
        s.block_hashes,
        vec![u64::MAX, (-2i64) as u64, 0x191a_1b1c_1d1e_1f20]
    );
    assert_eq!(s.parent, Some(0x0102_0304));
    assert_eq!(s.block_size, 16);
    assert_eq!(s.medium, None);
    assert_eq!(fold(&digest, Dialect::Sglang), 0x0102_0304_0506_0708);
}

#[test]
fn map_events_default_missing_fields_and_ignore_unknown_ones() {
    let bytes = W::default()
        .map(3)
        .s("ts")
        .f(2.0)
        .s("events")
        .arr(2)
        .map(5)
        .s("type")
        .s("BlockStored")
        .s("block_hashes")
        .arr(1)
        .u(9)
        .s("token_ids")
        .toks(&[1, 2])
        .s("block_size")
        .u(2)
        .s("future_field")
        .map(1)
        .s("a")
        .arr(1)
        .nil()
        .map(2)
        .s("block_hashes")
        .arr(1)
        .u(9)
        .s("type")
        .s("BlockRemoved")
        .s("data_parallel_rank")
        .u(1)
        .0;
    let b = dec(&bytes).unwrap();
    assert_eq!(b.ts, 2.0);
    assert_eq!(b.dp_rank, Some(1));
    let s = stored(&b, 0);
    assert_eq!(s.block_hashes, vec![9]);
    assert_eq!(s.parent, None);
    assert_eq!(s.group_idx, None);
    assert_eq!(s.kv_cache_spec_kind, None);
    assert_eq!(
        b.events[1],
        KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![9],
            medium: None,
            group_idx: None
        })
    );
}

#[test]
fn sglang_positional_with_medium_and_metadata_map() {
    // [tag, hashes, parent, tokens, block_size, lora_id, medium, {metadata}]
    let bytes = W::default()
        .arr(3)
        .f(3.0)
        .arr(2)
        .arr(8)
        .s("BlockStored")
        .arr(1)
        .i(-5)
        .i(-6)
        .toks(&[1, 2, 3, 4])
        .u(4)
        .nil()
        .s("CPU")
        .map(1)
        .s("k")
        .s("v")
        .arr(3)
        .s("BlockRemoved")
        .arr(1)
        .i(-5)
        .s("CPU")
        .u(0)
        .0;
    let b = decode_batch(&bytes, Dialect::Sglang, &DecodeLimits::default()).unwrap();
    let s = stored(&b, 0);
    assert_eq!(s.block_hashes, vec![(-5i64) as u64]);
    assert_eq!(s.parent, Some((-6i64) as u64));
    assert_eq!(s.medium.as_deref(), Some("CPU"));
    assert_eq!(s.lora_name, None);
    match &b.events[1] {
        KvEvent::BlockRemoved(r) => assert_eq!(r.medium.as_deref(), Some("CPU")),
        e => panic!("{e:?}"),
    }
}

#[test]
fn limits_are_enforced() {
    let limits = DecodeLimits {
        max_payload_bytes: 256,
        max_events: 1,
        max_hashes: 2,
        max_tokens: 4,
        max_depth: 4,
    };
    let big = vec![0u8; 257];
    assert!(matches!(
        decode_batch(&big, Dialect::Vllm, &limits),
        Err(DecodeError::TooLarge {
            size: 257,
            limit: 256
        })
    ));
    let two = W::default().arr(2).f(1.0).arr(2).arr(0).arr(0).0;
    assert!(matches!(
        decode_batch(&two, Dialect::Vllm, &limits),
        Err(DecodeError::TooLong {
            what: "batch events",
            ..
        })
    ));
    let toks = W::default()
        .arr(2)
        .f(1.0)
        .arr(1)
        .arr(4)
        .s("BlockStored")
        .arr(1)
        .u(1)
        .nil()
        .toks(&[1, 2, 3, 4, 5])
        .0;
    assert!(matches!(
        decode_batch(&toks, Dialect::Vllm, &limits),
        Err(DecodeError::TooLong {
            what: "token_ids",
            ..
        })
    ));
    let deep = W::default()
        .arr(2)
        .f(1.0)
        .arr(1)
        .arr(1)
        .arr(1)
        .arr(1)
        .arr(1)
        .arr(1)
        .arr(1)
        .nil()
        .0;
    assert!(matches!(
        decode_batch(&deep, Dialect::Vllm, &limits),
        Err(DecodeError::Msgpack(MsgError::TooDeep(4)))
    ));
}

#[test]
fn wrong_types_are_errors_not_panics() {
    // Token id too large, negative block size, hash of wrong type, batch of wrong type.
    let cases = [
        W::default()
            .arr(2)
            .f(1.0)
            .arr(1)
            .arr(4)
            .s("BlockStored")
            .arr(1)
            .u(1)
            .nil()
            .arr(1)
            .u(1 << 40)
            .0,
        W::default()
            .arr(2)
            .f(1.0)
            .arr(1)
            .arr(5)
            .s("BlockStored")
            .arr(0)
            .nil()
            .arr(0)
            .i(-1)
            .0,
        W::default()
            .arr(2)
            .f(1.0)
            .arr(1)
            .arr(2)
            .s("BlockRemoved")
            .arr(1)
            .f(1.0)
            .0,
        W::default().s("hello").0,
        W::default().arr(2).s("ts").arr(0).0,
    ];
    for c in cases {
        assert!(dec(&c).is_err(), "{c:x?}");
    }
}

#[test]
fn every_truncation_and_garbage_fails_cleanly() {
    let full = W::default()
        .arr(3)
        .f(1.0)
        .arr(2)
        .arr(12)
        .s("BlockStored")
        .arr(2)
        .u(1)
        .u(2)
        .nil()
        .toks(&[7; 32])
        .u(16)
        .nil()
        .s("GPU")
        .nil()
        .arr(2)
        .nil()
        .nil()
        .u(0)
        .s("full_attention")
        .nil()
        .map(2)
        .s("type")
        .s("BlockRemoved")
        .s("block_hashes")
        .arr(1)
        .u(2)
        .u(0)
        .0;
    assert_eq!(dec(&full).unwrap().events.len(), 2);
    for cut in 0..full.len() {
        assert!(dec(&full[..cut]).is_err(), "prefix of {cut} bytes decoded");
    }
    // Deterministic pseudo-random garbage and bit flips: any result but a panic is fine.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..2000 {
        let len = (next() % 96) as usize;
        let garbage: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let _ = dec(&garbage);
        let mut flipped = full.clone();
        let at = (next() as usize) % flipped.len();
        flipped[at] = next() as u8;
        let _ = dec(&flipped);
    }
}

#[test]
fn extra_keys_are_collected_or_flagged_opaque() {
    let event = |extra: W| {
        let mut w = W::default()
            .arr(3)
            .f(1.0)
            .arr(1)
            .map(4)
            .s("type")
            .s("BlockStored")
            .s("block_hashes")
            .arr(2)
            .u(1)
            .u(2)
            .s("token_ids")
            .toks(&[1, 2])
            .s("extra_keys");
        w.0.extend_from_slice(&extra.0);
        w.nil().0
    };
    let b = dec(&event(W::default().arr(2).nil().nil())).unwrap();
    assert!(stored(&b, 0).extra_key_strings.is_empty());
    assert!(!stored(&b, 0).extra_keys_opaque);
    let b = dec(&event(
        W::default().arr(2).arr(2).s("lora").s("salt").s("lora"),
    ))
    .unwrap();
    assert_eq!(
        stored(&b, 0).extra_key_strings,
        vec!["lora", "salt", "lora"]
    );
    assert!(!stored(&b, 0).extra_keys_opaque);
    // A multimodal key as a (hash, offset) pair is not a plain string.
    let b = dec(&event(W::default().arr(1).arr(1).arr(2).s("mm").u(3))).unwrap();
    assert!(stored(&b, 0).extra_keys_opaque);
    let b = dec(&event(W::default().u(5))).unwrap();
    assert!(stored(&b, 0).extra_keys_opaque);
}

/// Found by `fuzz/fuzz_targets/kv_events.rs`: a batch followed by more bytes was accepted.
#[test]
fn trailing_bytes_after_the_batch_are_rejected() {
    let batch = W::default().arr(3).f(1.5).arr(0).nil().0;
    assert!(dec(&batch).is_ok());
    for tail in [&[0xc0u8][..], &[0x00], &batch] {
        let bytes = [&batch[..], tail].concat();
        match dec(&bytes) {
            Err(DecodeError::Shape(m)) => assert!(m.contains("trailing"), "{m}"),
            other => panic!("{tail:?}: {other:?}"),
        }
    }
}
