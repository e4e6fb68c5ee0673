//! The built-in `cl100k_base` encoder gives exactly `tiktoken-rs`'s ids
//! (`encode_with_special_tokens`, and `encode_ordinary` where no special token occurs), and its
//! pre-tokenizer exactly the pieces of `fancy-regex` running tiktoken-rs's pattern: on random
//! strings rich in the pattern's corner cases, and on large real texts (the recorded vLLM
//! capture's prompts, a `tokenizer.json`, this repository's docs and sources).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kvgate_tokenizer::cl100k::{Cl100k, SPECIAL_TOKENS, TIKTOKEN_PATTERN};
use kvgate_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use proptest::prelude::*;

fn cl() -> &'static Cl100k {
    Cl100k::get().unwrap()
}

fn reference() -> &'static tiktoken_rs::CoreBPE {
    tiktoken_rs::cl100k_base_singleton()
}

fn reference_pieces(text: &str) -> Vec<&str> {
    static RE: OnceLock<fancy_regex::Regex> = OnceLock::new();
    RE.get_or_init(|| fancy_regex::Regex::new(TIKTOKEN_PATTERN).unwrap())
        .find_iter(text)
        .map(|m| m.unwrap().as_str())
        .collect()
}

/// Compares everything; an `Err` names the first difference.
fn compare(text: &str) -> Result<(), String> {
    let pieces: Vec<&str> = cl().pieces(text).collect();
    let expected_pieces = reference_pieces(text);
    if pieces != expected_pieces {
        let i = pieces
            .iter()
            .zip(&expected_pieces)
            .position(|(a, b)| a != b)
            .unwrap_or(pieces.len().min(expected_pieces.len()));
        return Err(format!(
            "piece {i}: {:?} vs tiktoken's {:?}",
            pieces.get(i),
            expected_pieces.get(i)
        ));
    }
    let ids = cl().encode(text);
    let expected = reference().encode_with_special_tokens(text);
    if ids != expected {
        let i = ids.iter().zip(&expected).position(|(a, b)| a != b);
        return Err(format!(
            "ids differ at {i:?} ({} vs {})",
            ids.len(),
            expected.len()
        ));
    }
    if !SPECIAL_TOKENS.iter().any(|(s, _)| text.contains(s))
        && reference().encode_ordinary(text) != ids
    {
        return Err("encode_ordinary differs".into());
    }
    let tok = Tokenizer::builtin().unwrap();
    if tok.encode(text, false).unwrap() != ids || tok.count(text) != ids.len() {
        return Err("Tokenizer::encode / count differ".into());
    }
    if tok.decode(&ids).unwrap() != text {
        return Err("does not decode back".into());
    }
    Ok(())
}

/// Characters from every class the pattern tells apart, and their boundaries.
fn rich_char() -> impl Strategy<Value = char> {
    prop_oneof![
        // ASCII, weighted towards what the pattern treats specially.
        3 => prop::sample::select(vec![
            'a', 'Z', 's', 'S', 't', 'd', 'm', 'l', 'L', 'v', 'e', 'E', 'r', 'x', '0', '7', '9',
            '\'', ' ', ' ', ' ', '\t', '\n', '\n', '\r', '\u{b}', '\u{c}', '.', ',', '!', '<',
            '|', '>', '-', '_', '"', '(', '{', '/', '\\', '\u{0}', '\u{1f}', '\u{7f}',
        ]),
        // Non-ASCII letters, marks, numbers, spaces, symbols, specials.
        2 => prop::sample::select(vec![
            'é', 'ß', 'ſ', 'K', 'İ', 'ı', 'Ω', 'ж', '中', 'の', '한', 'ع', '\u{301}', '\u{308}',
            '\u{20dd}', 'Ⅻ', '½', '٣', '१', '𝟙', '①', '\u{a0}', '\u{85}', '\u{2028}', '\u{2029}',
            '\u{3000}', '\u{200a}', '\u{1680}', '\u{200b}', '\u{200d}', '\u{feff}', '🚀', '👨',
            '❤', '\u{fe0f}', '🇫', '→', '∑', '\u{fffd}', '\u{ffff}', '\u{e000}', '\u{10ffff}',
            '𐐀', '𝔸',
        ]),
        // Anything.
        1 => any::<char>(),
    ]
}

fn rich_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        8 => prop::collection::vec(rich_char(), 1..12).prop_map(String::from_iter),
        1 => prop::sample::select(vec![
            "<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
            "<|endofprompt|>", "<|end|>\n", "<|user|>\n", "<|", "|>", "'ll", "'RE", "\r\n",
            "   \n", "\n  ", "1234567", "don't", " \u{a0}",
        ]).prop_map(str::to_owned),
    ];
    prop::collection::vec(piece, 0..16).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_rich_strings_encode_like_tiktoken(text in rich_text()) {
        prop_assert_eq!(compare(&text), Ok(()), "{:?}", text);
    }

    #[test]
    fn random_unicode_strings_encode_like_tiktoken(text in "\\PC{0,40}|.{0,40}") {
        prop_assert_eq!(compare(&text), Ok(()), "{:?}", text);
    }
}

/// Every `.md`, `.rs`, `.toml` and `.json` file under `dir`, skipping build outputs.
fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        if p.is_dir() {
            if name != "target" && name != ".git" && name != "corpus" && name != "artifacts" {
                collect(&p, out);
            }
        } else if matches!(
            p.extension().and_then(|x| x.to_str()),
            Some("md" | "rs" | "toml" | "json")
        ) {
            out.push(p);
        }
    }
}

#[test]
fn large_real_texts_encode_like_tiktoken() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let data = manifest.join("tests/data");
    let mut texts: Vec<(String, String)> = Vec::new();

    // The vLLM capture: the raw file, every prompt, and every chat rendered by the built-in
    // template.
    let capture = std::fs::read_to_string(data.join("capture.json")).unwrap();
    let cap: serde_json::Value = serde_json::from_str(&capture).unwrap();
    let template = ChatTemplate::builtin();
    for (i, req) in cap["requests"].as_array().unwrap().iter().enumerate() {
        let body = &req["request"];
        if let Some(prompt) = body["prompt"].as_str() {
            texts.push((format!("capture prompt {i}"), prompt.to_owned()));
        }
        if body["messages"].is_array() {
            let msgs = ChatMessage::from_openai_list(&body["messages"]).unwrap();
            let rendered = template.render(&msgs, true, None).unwrap();
            texts.push((format!("capture chat {i}"), rendered));
        }
    }
    texts.push(("capture.json".into(), capture));

    // The repository's own docs, sources and data files (prose, code, JSON with byte-level
    // Unicode from tokenizer.json).
    let mut files = Vec::new();
    collect(&manifest.join("../.."), &mut files);
    files.sort();
    let mut total = 0;
    for f in &files {
        if let Ok(text) = std::fs::read_to_string(f) {
            total += text.len();
            texts.push((f.display().to_string(), text));
        }
    }
    assert!(
        files.len() > 100 && total > 1_000_000,
        "{} files, {total} bytes",
        files.len()
    );

    let mut tokens = 0;
    for (name, text) in &texts {
        if let Err(e) = compare(text) {
            panic!("{name}: {e}");
        }
        tokens += cl().count(text);
    }
    eprintln!(
        "{} texts, {total} bytes of files, {tokens} tokens",
        texts.len()
    );
    assert!(tokens > 300_000, "{tokens}");
}
