//! Encode speed on a ~128K-token text, for both tokenizer kinds.

use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvgate_tokenizer::Tokenizer;

/// Varied English-and-code text repeated until it is about `tokens` tokens long.
fn text_of(tok: &Tokenizer, tokens: usize) -> String {
    let unit =
        "The router hashes each prompt into blocks; fn score(x: u64) -> f64 { x as f64 * 0.5 } \
                Caching saves prefill time, 1234567 tokens/s, naïve café — ünïcode. ";
    let per_unit = tok.count(unit).max(1);
    let mut text = String::new();
    for i in 0..tokens.div_ceil(per_unit) {
        text.push_str(unit);
        text.push_str(&i.to_string());
        text.push(' ');
    }
    text
}

fn bench(c: &mut Criterion) {
    let builtin = Tokenizer::builtin().unwrap();
    let hf = Tokenizer::from_file(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer.json"),
    )
    .unwrap();
    let mut group = c.benchmark_group("encode_128k_tokens");
    group.sample_size(10);
    for (name, tok) in [("cl100k_base", &builtin), ("tokenizer_json_bpe4k", &hf)] {
        let text = text_of(tok, 128 * 1024);
        let n = tok.count(&text);
        eprintln!("{name}: {} bytes -> {n} tokens", text.len());
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(format!("{name}/encode"), |b| {
            b.iter(|| tok.encode(&text, false).unwrap().len())
        });
        group.bench_function(format!("{name}/count"), |b| b.iter(|| tok.count(&text)));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
