//! Placement index at 1M and 10M (block, instance) entries over 8 instances:
//! `match_prefix` of a fully held 512-block prompt (8K tokens) and of a miss, and `predict` of a
//! fresh 64-block chain (at the cap, so each insert also evicts).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use kvgate_core::index::{IndexConfig, PlacementIndex, PrefixMatches};
use kvgate_core::policy::util::mix;
use kvgate_core::{InstanceId, Source};
use std::hint::black_box;

fn chain(seed: u64, len: usize) -> Vec<u64> {
    (0..len as u64)
        .map(|i| mix(seed.wrapping_mul(0x1_0000_0001) ^ i))
        .collect()
}

fn filled(entries: usize) -> PlacementIndex {
    let ix = PlacementIndex::new(IndexConfig {
        shards: 64,
        max_entries: entries,
        default_instance_capacity: entries,
    });
    let mut s = 0u64;
    while ix.len() < entries {
        ix.predict(
            InstanceId((s % 8) as u32),
            &chain(s, 1024),
            Source::Local,
            u64::MAX / 2,
            0,
        );
        s += 1;
    }
    ix
}

fn index(c: &mut Criterion) {
    let mut g = c.benchmark_group("index");
    for entries in [1usize << 20, 10 << 20] {
        let ix = filled(entries);
        let held = chain(1_000_000_007, 512);
        for i in 0..2 {
            ix.predict(InstanceId(i), &held, Source::Local, u64::MAX / 2, 0);
        }
        let miss = chain(2_000_000_011, 512);
        let mut out = PrefixMatches::default();
        g.bench_function(BenchmarkId::new("match_512_blocks_hit", entries), |b| {
            b.iter(|| {
                ix.match_prefix(black_box(&held), 1, &mut out);
                black_box(out.best())
            })
        });
        // A 4 KiB prompt at the default 256-byte text blocks.
        let short = &held[..16];
        g.bench_function(BenchmarkId::new("match_16_blocks_hit", entries), |b| {
            b.iter(|| {
                ix.match_prefix(black_box(short), 1, &mut out);
                black_box(out.best())
            })
        });
        g.bench_function(BenchmarkId::new("match_miss", entries), |b| {
            b.iter(|| {
                ix.match_prefix(black_box(&miss), 1, &mut out);
                black_box(out.rows.len())
            })
        });
        let mut s = 3_000_000_000u64;
        g.bench_function(BenchmarkId::new("predict_64_blocks", entries), |b| {
            b.iter(|| {
                s += 1;
                let hs = chain(s, 64);
                ix.predict(
                    InstanceId((s % 8) as u32),
                    black_box(&hs),
                    Source::Local,
                    u64::MAX / 2,
                    1,
                );
            })
        });
        println!(
            "index {entries} entries: {:.1} bytes/entry",
            ix.stats().memory_bytes as f64 / ix.len() as f64
        );
    }
    g.finish();
}

criterion_group!(benches, index);
criterion_main!(benches);
