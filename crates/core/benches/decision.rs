//! A complete routing decision: hash the prompt (token mode, 16 tokens per block), match it in an
//! index of 1M entries, build candidates and run the `kvgate` policy. Also the policy alone with
//! 8, 64 and 1 000 candidates.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use kvgate_core::hash::{hash_token_blocks, namespace_root, Namespace};
use kvgate_core::index::{IndexConfig, InstanceMatch, PlacementIndex, PrefixMatches};
use kvgate_core::load::{InstanceRates, RouterLoad};
use kvgate_core::policy::util::mix;
use kvgate_core::policy::{build_policy, Candidate, PolicyConfig, RouteRequest};
use kvgate_core::{InstanceId, Source};
use std::hint::black_box;

fn candidate(i: u32, matched: InstanceMatch) -> Candidate {
    Candidate {
        id: InstanceId(i),
        matched,
        load: RouterLoad {
            in_flight: i % 7,
            pending_prefill_tokens: u64::from(i % 5) * 3000,
            decoding: i % 3,
            ..RouterLoad::default()
        },
        engine: None,
        rates: InstanceRates {
            prefill_tokens_per_s: 8000.0,
            decode_interference_ms: 0.5,
        },
        decode: Default::default(),
        cache_capacity_blocks: None,
    }
}

fn full_decision(c: &mut Criterion) {
    let ns = Namespace {
        model: "bench-model",
        lora: None,
        cache_salt: None,
    };
    let root = namespace_root(&ns);
    let ix = PlacementIndex::new(IndexConfig {
        shards: 64,
        max_entries: 4 << 20,
        default_instance_capacity: 4 << 20,
    });
    let mut s = 0u64;
    while ix.len() < 1 << 20 {
        let hs: Vec<u64> = (0..1024u64).map(|k| mix(s << 32 ^ k)).collect();
        ix.predict(
            InstanceId((s % 8) as u32),
            &hs,
            Source::Local,
            u64::MAX / 2,
            0,
        );
        s += 1;
    }
    let policy = build_policy(&PolicyConfig::default());
    let mut g = c.benchmark_group("decision");
    for tokens in [8192usize, 131_072] {
        let ids: Vec<u32> = (0..tokens as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % 150_000)
            .collect();
        // Three instances hold a prefix of this prompt: 3/4, 1/2 and all of it.
        let mut full = Vec::new();
        hash_token_blocks(root, &ids, 16, &mut full);
        ix.predict(
            InstanceId(1),
            &full[..full.len() * 3 / 4],
            Source::Local,
            u64::MAX / 2,
            0,
        );
        ix.predict(
            InstanceId(4),
            &full[..full.len() / 2],
            Source::Local,
            u64::MAX / 2,
            0,
        );
        ix.predict(InstanceId(6), &full, Source::Local, u64::MAX / 2, 0);
        let mut hashes = Vec::with_capacity(tokens / 16);
        let mut out = PrefixMatches::default();
        let mut cands = Vec::with_capacity(8);
        g.bench_function(
            BenchmarkId::new("hash_match_kvgate_8_instances", tokens),
            |b| {
                b.iter(|| {
                    hashes.clear();
                    hash_token_blocks(root, black_box(&ids), 16, &mut hashes);
                    ix.match_prefix(&hashes, 1, &mut out);
                    cands.clear();
                    cands.extend((0..8).map(|i| candidate(i, out.get(InstanceId(i)))));
                    let req = RouteRequest {
                        hashes: &hashes,
                        tokens_per_block: 16,
                        prompt_tokens: tokens as u32,
                        expected_output_tokens: 100,
                        kv_block_tokens: 16,
                        text: b"",
                        seed: 42,
                        concurrent_decisions: 0.0,
                        now: 1,
                    };
                    black_box(policy.decide(&req, &cands).map(|d| d.chosen))
                })
            },
        );
    }
    g.finish();
}

fn scoring(c: &mut Criterion) {
    let policy = build_policy(&PolicyConfig::default());
    let hashes: Vec<u64> = (0..512).collect();
    let mut g = c.benchmark_group("kvgate_scoring");
    for n in [8u32, 64, 1000] {
        let cands: Vec<Candidate> = (0..n)
            .map(|i| {
                candidate(
                    i,
                    InstanceMatch {
                        instance: InstanceId(i),
                        gpu: (i * 37) % 512,
                        cpu: i % 4,
                        disk: 0,
                        fresh: 0,
                    },
                )
            })
            .collect();
        let req = RouteRequest {
            hashes: &hashes,
            tokens_per_block: 16,
            prompt_tokens: 8192,
            expected_output_tokens: 100,
            kv_block_tokens: 16,
            text: b"",
            seed: 7,
            concurrent_decisions: 0.0,
            now: 0,
        };
        g.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| black_box(policy.decide(&req, black_box(&cands)).map(|d| d.chosen)))
        });
    }
    g.finish();
}

criterion_group!(benches, full_decision, scoring);
criterion_main!(benches);
