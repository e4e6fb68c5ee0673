//! The built-in `cl100k_base` encoder (`kvgate_tokenizer::cl100k`) against tiktoken-rs on
//! arbitrary UTF-8: the same pieces as `fancy-regex` running tiktoken-rs's pattern, the same ids
//! as `encode_with_special_tokens` (and `encode_ordinary` where no special token occurs), a count
//! equal to the ids' length, and a decode back to the text.
#![no_main]

use std::sync::OnceLock;

use kvgate_tokenizer::cl100k::{Cl100k, SPECIAL_TOKENS, TIKTOKEN_PATTERN};
use libfuzzer_sys::fuzz_target;

fn reference_pieces(text: &str) -> Vec<&str> {
    static RE: OnceLock<fancy_regex::Regex> = OnceLock::new();
    RE.get_or_init(|| fancy_regex::Regex::new(TIKTOKEN_PATTERN).expect("tiktoken's pattern"))
        .find_iter(text)
        .map(|m| m.expect("tiktoken's pattern runs").as_str())
        .collect()
}

fuzz_target!(|text: &str| {
    let cl = Cl100k::get().expect("the built-in vocabulary loads");
    let reference = tiktoken_rs::cl100k_base_singleton();
    let pieces: Vec<&str> = cl.pieces(text).collect();
    assert_eq!(pieces, reference_pieces(text), "pieces of {text:?}");
    let ids = cl.encode(text);
    assert_eq!(
        ids,
        reference.encode_with_special_tokens(text),
        "ids of {text:?}"
    );
    if !SPECIAL_TOKENS.iter().any(|(s, _)| text.contains(s)) {
        assert_eq!(
            ids,
            reference.encode_ordinary(text),
            "ordinary ids of {text:?}"
        );
        assert_eq!(cl.encode_ordinary(text), ids, "encode_ordinary of {text:?}");
    }
    assert_eq!(cl.count(text), ids.len(), "count of {text:?}");
    let mut bytes = Vec::new();
    for &id in &ids {
        bytes.extend_from_slice(cl.token_bytes(id).expect("an id the encoder gave"));
    }
    assert_eq!(bytes, text.as_bytes(), "decode of {text:?}");
});
