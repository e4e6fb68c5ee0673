//! One encode of an unrelated chat prompt (the `conversation` bench's messages, rendered by the
//! built-in template), with the built-in encoder or with tiktoken-rs, for instruction counts:
//!
//! ```sh
//! cargo build --release -p kvgate-tokenizer --example callgrind_encode
//! valgrind --tool=callgrind --collect-atstart=no --toggle-collect='callgrind_encode::measured' \
//!     target/release/examples/callgrind_encode new 102400
//! ```
//!
//! `new` is `Tokenizer::builtin()`, `tiktoken` is `tiktoken-rs`'s `encode_with_special_tokens`
//! (what the built-in tokenizer used before). Both are loaded and warmed on another prompt
//! first, so only the encoding is counted.

use kvgate_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

/// A message of about `tokens` cl100k tokens, distinct per `seed` (as in benches/conversation.rs).
fn message(seed: usize, tokens: usize) -> String {
    let unit = "The router hashes each prompt into blocks; fn score(x: u64) -> f64 { x * 0.5 } \
                Caching saves prefill time, naïve café — ünïcode. ";
    let mut s = String::new();
    for i in 0..tokens.div_ceil(42) {
        s.push_str(unit);
        s.push_str(&(seed * 100_000 + i).to_string());
        s.push(' ');
    }
    s
}

fn prompt(seed: usize, tokens: usize) -> String {
    let msgs: Vec<ChatMessage> = (0..tokens / 1024)
        .map(|i| ChatMessage::new("user", message(seed * 1000 + i, 1024)))
        .collect();
    ChatTemplate::builtin()
        .render(&msgs, true, None)
        .unwrap_or_default()
}

#[inline(never)]
fn measured(encode: &dyn Fn(&str) -> usize, text: &str) -> usize {
    encode(text)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "new".into());
    let tokens: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(8192);
    let tok = Tokenizer::builtin().expect("the built-in tokenizer loads");
    let tiktoken = tiktoken_rs::cl100k_base_singleton();
    let encode: Box<dyn Fn(&str) -> usize> = match which.as_str() {
        "tiktoken" => Box::new(|t: &str| tiktoken.encode_with_special_tokens(t).len()),
        _ => Box::new(|t: &str| tok.encode(t, false).map(|ids| ids.len()).unwrap_or(0)),
    };
    encode(&prompt(1, 8192));
    let text = prompt(2, tokens);
    let n = measured(&*encode, &text);
    println!("{which}: {} bytes -> {n} tokens", text.len());
}
