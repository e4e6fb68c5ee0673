//! Ingestion throughput: decode + re-hash + apply realistic vLLM batches (map encoding, block size
//! 16, 16 blocks per `BlockStored`, chained prompts of 64 blocks, each later evicted) to a
//! placement index. Reported as blocks stored per second (every stored block is also removed).

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvgate_core::index::{IndexConfig, PlacementIndex};
use kvgate_core::InstanceId;
use kvgate_events::decode::{DecodeLimits, Dialect};
use kvgate_events::metrics::StreamMetrics;
use kvgate_events::{Now, StreamIngest, StreamParams};

const BS: usize = 16;
const BLOCKS_PER_EVENT: usize = 16;
const EVENTS_PER_PROMPT: usize = 4;
const PROMPTS: usize = 64;

fn put_u(v: &mut Vec<u8>, x: u64) {
    v.push(0xcf);
    v.extend_from_slice(&x.to_be_bytes());
}

fn put_s(v: &mut Vec<u8>, s: &str) {
    v.push(0xa0 | s.len() as u8);
    v.extend_from_slice(s.as_bytes());
}

fn put_arr(v: &mut Vec<u8>, n: usize) {
    v.push(0xdd);
    v.extend_from_slice(&(n as u32).to_be_bytes());
}

/// vLLM-like engine hash: any well-spread 64-bit value.
fn engine_hash(prompt: usize, block: usize) -> u64 {
    ((prompt as u64) << 32 | block as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

fn stored_batch(prompt: usize, event: usize) -> Vec<u8> {
    let mut v = Vec::new();
    put_arr(&mut v, 3);
    v.push(0xcb);
    v.extend_from_slice(&1.7e9f64.to_be_bytes());
    put_arr(&mut v, 1);
    v.push(0x80 | 9);
    put_s(&mut v, "type");
    put_s(&mut v, "BlockStored");
    put_s(&mut v, "block_hashes");
    let first = event * BLOCKS_PER_EVENT;
    put_arr(&mut v, BLOCKS_PER_EVENT);
    for b in first..first + BLOCKS_PER_EVENT {
        put_u(&mut v, engine_hash(prompt, b));
    }
    put_s(&mut v, "parent_block_hash");
    if first == 0 {
        v.push(0xc0);
    } else {
        put_u(&mut v, engine_hash(prompt, first - 1));
    }
    put_s(&mut v, "token_ids");
    put_arr(&mut v, BLOCKS_PER_EVENT * BS);
    for t in 0..BLOCKS_PER_EVENT * BS {
        // Realistic token ids need 2-3 bytes each.
        let id = ((prompt * 7919 + first * BS + t) % 100_000) as u64 + 300;
        if id < 65_536 {
            v.push(0xcd);
            v.extend_from_slice(&(id as u16).to_be_bytes());
        } else {
            v.push(0xce);
            v.extend_from_slice(&(id as u32).to_be_bytes());
        }
    }
    put_s(&mut v, "block_size");
    v.push(BS as u8);
    put_s(&mut v, "medium");
    put_s(&mut v, "GPU");
    put_s(&mut v, "lora_id");
    v.push(0xc0);
    put_s(&mut v, "group_idx");
    v.push(0);
    put_s(&mut v, "kv_cache_spec_kind");
    put_s(&mut v, "full_attention");
    v.push(0);
    v
}

fn removed_batch(prompt: usize) -> Vec<u8> {
    let n = EVENTS_PER_PROMPT * BLOCKS_PER_EVENT;
    let mut v = Vec::new();
    put_arr(&mut v, 3);
    v.push(0xcb);
    v.extend_from_slice(&1.7e9f64.to_be_bytes());
    put_arr(&mut v, n);
    for b in (0..n).rev() {
        v.push(0x80 | 4);
        put_s(&mut v, "type");
        put_s(&mut v, "BlockRemoved");
        put_s(&mut v, "block_hashes");
        put_arr(&mut v, 1);
        put_u(&mut v, engine_hash(prompt, b));
        put_s(&mut v, "medium");
        put_s(&mut v, "GPU");
        put_s(&mut v, "group_idx");
        v.push(0);
    }
    v.push(0);
    v
}

fn bench(c: &mut Criterion) {
    let mut payloads = Vec::new();
    for p in 0..PROMPTS {
        for e in 0..EVENTS_PER_PROMPT {
            payloads.push(stored_batch(p, e));
        }
    }
    // Evictions lag by a few prompts, so the index holds a working set while ingesting.
    let mut schedule = Vec::new();
    for p in 0..PROMPTS {
        for e in 0..EVENTS_PER_PROMPT {
            schedule.push(payloads[p * EVENTS_PER_PROMPT + e].clone());
        }
        if p >= 8 {
            schedule.push(removed_batch(p - 8));
        }
    }
    for p in PROMPTS - 8..PROMPTS {
        schedule.push(removed_batch(p));
    }
    let blocks = (PROMPTS * EVENTS_PER_PROMPT * BLOCKS_PER_EVENT) as u64;
    let bytes: usize = schedule.iter().map(Vec::len).sum();
    eprintln!(
        "schedule: {} messages, {} bytes, {blocks} blocks stored and removed",
        schedule.len(),
        bytes
    );
    let index = Arc::new(PlacementIndex::new(IndexConfig {
        shards: 64,
        max_entries: 1 << 22,
        default_instance_capacity: 1 << 20,
    }));
    let mut ingest = StreamIngest::new(
        StreamParams {
            instance: InstanceId(0),
            name: Arc::from("bench"),
            dp_rank: 0,
            model: "bench-model".into(),
            block_size: BS as u32,
            dialect: Dialect::Vllm,
            max_tracked_blocks: 1 << 20,
            limits: DecodeLimits::default(),
            sole_stream: true,
        },
        index.clone(),
        StreamMetrics::new("bench"),
    );
    let mut seq = 0u64;
    let mut group = c.benchmark_group("ingest");
    group.throughput(Throughput::Elements(blocks));
    group.bench_function("decode_rehash_apply_blocks", |b| {
        b.iter(|| {
            for p in &schedule {
                let now = Now {
                    mono_ms: seq,
                    unix_s: 1.7e9,
                };
                ingest
                    .apply_payload(seq, p, now)
                    .expect("bench payloads decode");
                seq += 1;
            }
        })
    });
    group.finish();
    assert_eq!(index.instance_entries(InstanceId(0)), 0);
}

criterion_group!(benches, bench);
criterion_main!(benches);
