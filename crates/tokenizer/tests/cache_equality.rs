//! The prefix cache changes nothing: cached and whole encoding give the same token ids (so the
//! same block hashes, which are a function of the ids) on the recorded vLLM capture and on
//! random conversations growing turn by turn, for every tokenizer family with a split rule.

use std::path::PathBuf;

use kvgate_tokenizer::{ChatMessage, ChatTemplate, TokenMode, Tokenizer};
use proptest::prelude::*;
use serde_json::Value;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn hf() -> Tokenizer {
    Tokenizer::from_file(&data_dir().join("tokenizer.json")).unwrap()
}

/// A template that puts the test tokenizer's added tokens between messages, so the HF rule
/// finds splits.
const HF_SPECIAL_TEMPLATE: &str = "{% for m in messages %}<|begin_of_text|>{{ m['role'] }}\n{{ m['content'] }}<|end_of_text|>{% endfor %}{% if add_generation_prompt %}<|begin_of_text|>assistant\n{% endif %}";

/// (name, whole, cached) pairs for every family.
fn modes() -> Vec<(&'static str, TokenMode, TokenMode)> {
    let builtin = TokenMode::builtin().unwrap();
    let model = TokenMode::from_model_dir(&data_dir()).unwrap();
    let special = TokenMode::new(
        hf(),
        ChatTemplate::from_jinja(HF_SPECIAL_TEMPLATE, None, None).unwrap(),
    );
    let hf_builtin = TokenMode::new(hf(), ChatTemplate::builtin());
    [
        ("builtin", builtin),
        ("model_dir", model),
        ("hf_special", special),
        ("hf_builtin_template", hf_builtin),
    ]
    .into_iter()
    .map(|(n, m)| (n, m.clone(), m.with_cache(1 << 20)))
    .collect()
}

#[test]
fn capture_requests_encode_the_same_cached() {
    let bytes = std::fs::read(data_dir().join("capture.json")).unwrap();
    let cap: Value = serde_json::from_slice(&bytes).unwrap();
    let mut checked = 0;
    for (name, whole, cached) in modes() {
        for req in cap["requests"].as_array().unwrap() {
            if req["path"] != "/v1/chat/completions" {
                continue;
            }
            let msgs = ChatMessage::from_openai_list(&req["request"]["messages"]).unwrap();
            // Twice: once filling the cache, once from it.
            for _ in 0..2 {
                assert_eq!(
                    cached.chat_tokens(&msgs).unwrap(),
                    whole.chat_tokens(&msgs).unwrap(),
                    "{name}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 8, "{checked}");
}

#[test]
fn builtin_and_special_templates_do_hit() {
    for (name, _, cached) in modes() {
        let mut msgs = vec![ChatMessage::new("system", "Be brief.")];
        for i in 0..4 {
            msgs.push(ChatMessage::new("user", format!("question {i}")));
            cached.chat_tokens(&msgs).unwrap();
        }
        let s = cached.cache_stats().unwrap();
        match name {
            // The capture's template emits no added token and the builtin markers are plain
            // text to the HF tokenizer: no split, so nothing is cached.
            "model_dir" | "hf_builtin_template" => assert_eq!(s.hits + s.misses, 0, "{name}"),
            _ => assert!(s.hits >= 3, "{name}: {s:?}"),
        }
    }
}

/// Message text that stresses the split rules: unicode, whitespace at the edges, newlines, and
/// strings that look like (or are) template markers and special tokens.
fn content() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-zA-Z0-9 .,!?']{0,12}",
        "\\PC{0,6}",
        Just("\n".to_owned()),
        Just("\r\n".to_owned()),
        Just("  ".to_owned()),
        Just("<|end|>\n".to_owned()),
        Just("<|end|>\n<|user|>".to_owned()),
        Just("<|end|>".to_owned()),
        Just("<|endoftext|>".to_owned()),
        Just("<|begin_of_text|>".to_owned()),
        Just("<|end_of_text|>".to_owned()),
        Just("<|".to_owned()),
        Just("|>".to_owned()),
        Just("🚀é".to_owned()),
        Just("'s".to_owned()),
    ];
    proptest::collection::vec(piece, 0..8).prop_map(|v| v.concat())
}

fn role() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("system".to_owned()),
        Just("user".to_owned()),
        Just("assistant".to_owned()),
        Just("tool".to_owned()),
        "[a-z\n<|>]{0,5}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn growing_conversations_encode_the_same_cached(
        turns in proptest::collection::vec((role(), content()), 1..10)
    ) {
        for (name, whole, cached) in modes() {
            let mut msgs = Vec::new();
            for (r, c) in &turns {
                msgs.push(ChatMessage::new(r.clone(), c.clone()));
                let a = cached.chat_tokens(&msgs).unwrap();
                let b = whole.chat_tokens(&msgs).unwrap();
                prop_assert_eq!(a, b, "{} after {} turns", name, msgs.len());
            }
        }
    }

    #[test]
    fn split_texts_concatenate_to_the_whole(
        parts in proptest::collection::vec(content(), 1..6)
    ) {
        // The rule itself on arbitrary text, not only on rendered templates.
        let text = parts.concat();
        for tok in [Tokenizer::builtin().unwrap(), hf()] {
            let Some(splits) = tok.safe_splits(&text) else { continue };
            let mut ids = Vec::new();
            let mut start = 0;
            for &p in splits.iter().chain(std::iter::once(&text.len())) {
                ids.extend(tok.encode(&text[start..p], false).unwrap());
                start = p;
            }
            prop_assert_eq!(ids, tok.encode(&text, false).unwrap(), "{}", tok.name());
        }
    }
}
