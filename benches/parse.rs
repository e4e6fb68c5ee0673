//! Request-body parsing: what the gateway spends reading the routing fields of a chat request,
//! for a small body and a ~32 KiB one (the two bodies of `loadtest/overhead.sh`).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvgate::proxy::parse::{parse, Endpoint};

fn bodies() -> Vec<(&'static str, Vec<u8>)> {
    let small = br#"{"model": "m", "messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Say hello."}], "max_tokens": 16}"#.to_vec();
    let text: String = "The quick brown fox jumps over the lazy dog. "
        .repeat(800)
        .chars()
        .take(32 * 1024 - 200)
        .collect();
    let large = format!(
        r#"{{"model": "m", "messages": [{{"role": "user", "content": "{text}"}}], "max_tokens": 16}}"#
    )
    .into_bytes();
    vec![("small", small), ("large_32k", large)]
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse_chat");
    for (name, body) in bodies() {
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(name), &body, |b, body| {
            b.iter(|| parse(Endpoint::Chat, std::hint::black_box(body)).map(|r| r.stream))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
