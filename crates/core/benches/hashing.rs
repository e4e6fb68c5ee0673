//! Block hashing cost: token mode (16 tokens per block) and text mode (64 bytes per block,
//! about 4 bytes per token) at 1K, 8K and 128K tokens.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvgate_core::hash::{hash_text_blocks, hash_token_blocks, namespace_root, Namespace};
use std::hint::black_box;

fn hashing(c: &mut Criterion) {
    let root = namespace_root(&Namespace {
        model: "bench-model",
        lora: None,
        cache_salt: None,
    });
    let mut g = c.benchmark_group("hash");
    for tokens in [1024usize, 8192, 131_072] {
        let ids: Vec<u32> = (0..tokens as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % 150_000)
            .collect();
        let text: Vec<u8> = (0..tokens * 4).map(|i| b'a' + (i % 26) as u8).collect();
        let mut out = Vec::with_capacity(tokens / 16);
        g.throughput(Throughput::Elements(tokens as u64));
        g.bench_with_input(BenchmarkId::new("tokens", tokens), &ids, |b, ids| {
            b.iter(|| {
                out.clear();
                hash_token_blocks(root, black_box(ids), 16, &mut out);
                black_box(out.len())
            })
        });
        g.bench_with_input(BenchmarkId::new("text", tokens), &text, |b, text| {
            b.iter(|| {
                out.clear();
                hash_text_blocks(root, black_box(text), 64, &mut out);
                black_box(out.len())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, hashing);
criterion_main!(benches);
