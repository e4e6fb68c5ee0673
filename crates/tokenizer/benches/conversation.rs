//! Chat token mode on long conversations, whole vs through the prefix cache: a ~100K-token
//! conversation growing by ~1K tokens a turn (40 turns), and unrelated 8K / 100K prompts (every
//! request a miss: the cache's overhead).

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use kvgate_tokenizer::{ChatMessage, TokenMode};

/// A message of about `tokens` cl100k tokens, distinct per `seed`.
fn message(seed: usize, tokens: usize) -> String {
    let unit = "The router hashes each prompt into blocks; fn score(x: u64) -> f64 { x * 0.5 } \
                Caching saves prefill time, naïve café — ünïcode. ";
    // 42 cl100k tokens per unit with its number.
    let mut s = String::new();
    for i in 0..tokens.div_ceil(42) {
        s.push_str(unit);
        s.push_str(&(seed * 100_000 + i).to_string());
        s.push(' ');
    }
    s
}

/// `turns` conversations, the last one about `total` tokens, each the previous plus ~1K tokens.
fn growing(total: usize, turns: usize) -> Vec<Vec<ChatMessage>> {
    let base = total - turns * 1024;
    let mut msgs = vec![ChatMessage::new("system", message(0, base))];
    let mut out = Vec::new();
    for t in 0..turns {
        let role = if t % 2 == 0 { "user" } else { "assistant" };
        msgs.push(ChatMessage::new(role, message(t + 1, 1024)));
        out.push(msgs.clone());
    }
    out
}

fn bench(c: &mut Criterion) {
    let whole = TokenMode::builtin().unwrap();
    let convo = growing(100 * 1024, 40);
    let last = convo.last().unwrap();
    eprintln!(
        "last turn: {} tokens",
        whole.chat_tokens(last).unwrap().len()
    );
    let mut g = c.benchmark_group("conversation_100k_plus_1k_per_turn");
    g.sample_size(10);
    // Per request: the last turn, with the cache warm from the 39 turns before it.
    g.bench_function("whole", |b| {
        b.iter(|| whole.chat_tokens(last).unwrap().len())
    });
    g.bench_function("cached", |b| {
        b.iter_batched(
            || {
                // Same tokenizer: building and dropping cl100k_base is not what is measured.
                let cached = TokenMode::new(whole.tokenizer.clone(), whole.template.clone())
                    .with_cache(256 << 20);
                for turn in &convo[..convo.len() - 1] {
                    cached.chat_tokens(turn).unwrap();
                }
                cached
            },
            // Returned, so the cache is dropped outside the measurement.
            |cached| {
                let n = cached.chat_tokens(last).unwrap().len();
                (cached, n)
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();

    let mut g = c.benchmark_group("unrelated_prompts");
    g.sample_size(10);
    for tokens in [8 * 1024, 100 * 1024] {
        // Distinct prompts: every request misses (a user message per ~1K tokens gives the
        // cache real segments to fill).
        let prompts: Vec<Vec<ChatMessage>> = (0..8)
            .map(|p| {
                (0..tokens / 1024)
                    .map(|i| ChatMessage::new("user", message(p * 1000 + i, 1024)))
                    .collect()
            })
            .collect();
        let cached =
            TokenMode::new(whole.tokenizer.clone(), whole.template.clone()).with_cache(256 << 20);
        let mut i = 0;
        g.bench_function(format!("{}k/whole", tokens / 1024), |b| {
            b.iter(|| {
                i += 1;
                whole.chat_tokens(&prompts[i % 8]).unwrap().len()
            })
        });
        let mut salt = 0u64;
        g.bench_function(format!("{}k/cached_miss", tokens / 1024), |b| {
            b.iter_batched(
                || {
                    salt += 1;
                    let mut p = prompts[salt as usize % 8].clone();
                    p[0].content.insert_str(0, &salt.to_string());
                    p
                },
                |p| cached.chat_tokens(&p).unwrap().len(),
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
