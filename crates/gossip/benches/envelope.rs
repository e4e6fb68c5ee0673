//! Cost of the gossip envelope (ChaCha20-Poly1305 with HKDF-derived keys): sealing and opening a
//! delta batch of typical sizes, opening under a previous key during a rotation (one failed tag
//! first), and refusing a tampered datagram (what an attacker without the key can make a
//! replica spend). Payloads are real delta encodings of 512-block decisions.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvgate_gossip::wire::envelope::{Header, Keys, OVERHEAD};
use kvgate_gossip::wire::payload::{encode_delta, EntriesBuilder};
use kvgate_gossip::wire::Kind;
use std::hint::black_box;

/// A delta batch of `decisions` decisions of `hashes` hashes each.
fn delta(decisions: usize, hashes: usize) -> Vec<u8> {
    let mut b = EntriesBuilder::new(1_700_000_000_000, 60_000);
    let mut h = 0x9E37_79B9_7F4A_7C15u64;
    for d in 0..decisions {
        let chain: Vec<u64> = (0..hashes)
            .map(|_| {
                h = h.rotate_left(17).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                h
            })
            .collect();
        b.push(d as u64 * 7919, 1_700_000_000_000, 120_000, &chain);
    }
    let mut out = Vec::new();
    encode_delta(42, 16, b, &mut out);
    out
}

fn envelope(c: &mut Criterion) {
    let keys = Keys::new("bench", b"bench-secret-0123456789");
    let rotating = Keys::with_previous(
        "bench",
        b"next-secret-0123456789",
        &[b"bench-secret-0123456789"],
    );
    let header = Header {
        kind: Kind::Delta,
        sender: 0xA1,
        counter: 1,
        wall_ms: 1_700_000_000_000,
    };
    // One checkpointed decision (stride 16: 33 hashes), a 25 ms flush of six of them, one
    // decision with every hash (512), and a full 60 KiB batch.
    let cases = [
        ("1x33", delta(1, 33)),
        ("6x33", delta(6, 33)),
        ("1x512", delta(1, 512)),
        ("14x512", delta(14, 512)),
    ];
    let mut g = c.benchmark_group("envelope");
    for (name, payload) in &cases {
        let mut sealed = Vec::new();
        keys.seal(&header, payload, &mut sealed);
        assert_eq!(sealed.len(), payload.len() + OVERHEAD);
        let label = format!("{name}/{}B", payload.len());
        g.throughput(Throughput::Bytes(payload.len() as u64));
        let mut out = Vec::new();
        g.bench_with_input(BenchmarkId::new("seal", &label), payload, |b, p| {
            b.iter(|| {
                keys.seal(black_box(&header), black_box(p), &mut out);
                black_box(out.len())
            })
        });
        g.bench_with_input(BenchmarkId::new("open", &label), &sealed, |b, d| {
            b.iter(|| black_box(keys.open(black_box(d), 65_536, &mut out).is_ok()))
        });
        g.bench_with_input(
            BenchmarkId::new("open_previous_key", &label),
            &sealed,
            |b, d| b.iter(|| black_box(rotating.open(black_box(d), 65_536, &mut out).is_ok())),
        );
        let mut tampered = sealed.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        g.bench_with_input(
            BenchmarkId::new("reject_tampered", &label),
            &tampered,
            |b, d| b.iter(|| black_box(keys.open(black_box(d), 65_536, &mut out).is_err())),
        );
    }
    g.finish();
}

criterion_group!(benches, envelope);
criterion_main!(benches);
