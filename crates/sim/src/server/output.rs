//! Deterministic generated text: token `i` of a request is a word picked by a seeded hash of
//! (seed, prompt, i), so the same request always gets the same answer and each token is exactly
//! one output token.
//!
//! With a tokenizer, the vocabulary keeps only words that are one token each way (encode and
//! decode), so the generated token ids are known: the engine caches blocks of generated tokens
//! under them, and a next turn that sends the answer back re-tokenizes to the same ids.

use kvgate_tokenizer::TokenMode;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The words generated text is made of, with their token ids when known.
#[derive(Debug, Clone)]
pub struct OutputVocab {
    words: Vec<(Option<u32>, String)>,
}

impl OutputVocab {
    /// Words that are single tokens under `tm` (or all words without ids if too few are).
    pub fn new(tm: &TokenMode) -> Self {
        let single: Vec<(Option<u32>, String)> = WORDS
            .iter()
            .filter_map(|w| {
                let text = format!(" {w}");
                let ids = tm.tokenizer.encode(&text, false).ok()?;
                match ids.as_slice() {
                    [id] if tm.tokenizer.decode(&[*id]).ok().as_deref() == Some(text.as_str()) => {
                        Some((Some(*id), text))
                    }
                    _ => None,
                }
            })
            .collect();
        if single.len() >= 8 {
            OutputVocab { words: single }
        } else {
            OutputVocab::plain()
        }
    }

    /// All words, no token ids.
    pub fn plain() -> Self {
        OutputVocab {
            words: WORDS.iter().map(|w| (None, format!(" {w}"))).collect(),
        }
    }

    fn pick(&self, seed: u64, prompt_key: u64, i: u32) -> &(Option<u32>, String) {
        let mut buf = [0u8; 12];
        buf[..8].copy_from_slice(&prompt_key.to_le_bytes());
        buf[8..].copy_from_slice(&i.to_le_bytes());
        let h = xxh3_64_with_seed(&buf, seed);
        &self.words[(h % self.words.len() as u64) as usize]
    }

    /// Text of output token `i`.
    pub fn text(&self, seed: u64, prompt_key: u64, i: u32) -> &str {
        &self.pick(seed, prompt_key, i).1
    }

    /// Token ids of the first `n` output tokens, when the vocabulary knows them.
    pub fn ids(&self, seed: u64, prompt_key: u64, n: u32) -> Option<Vec<u32>> {
        (0..n).map(|i| self.pick(seed, prompt_key, i).0).collect()
    }
}

const WORDS: [&str; 64] = [
    "the", "cache", "block", "token", "route", "fleet", "engine", "queue", "prefix", "model",
    "fast", "warm", "cold", "batch", "step", "load", "hit", "miss", "prompt", "reply", "stream",
    "first", "time", "level", "score", "pick", "node", "share", "hash", "chain", "store", "event",
    "decode", "fill", "page", "keep", "evict", "reuse", "plan", "act", "check", "result", "value",
    "small", "large", "early", "late", "again", "then", "now", "here", "there", "with", "from",
    "into", "over", "under", "more", "less", "best", "good", "same", "next", "done",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_seeded() {
        let v = OutputVocab::new(&TokenMode::builtin().unwrap());
        assert_eq!(v.text(1, 2, 3), v.text(1, 2, 3));
        let a: Vec<&str> = (0..32).map(|i| v.text(1, 2, i)).collect();
        let b: Vec<&str> = (0..32).map(|i| v.text(9, 2, i)).collect();
        assert_ne!(a, b);
        assert!(a.iter().all(|t| t.starts_with(' ')));
        // With the built-in tokenizer every id is known and re-tokenizes to itself.
        let ids = v.ids(1, 2, 32).unwrap();
        let text: String = a.concat();
        assert_eq!(
            TokenMode::builtin()
                .unwrap()
                .tokenizer
                .encode(&text, false)
                .unwrap(),
            ids
        );
        assert!(OutputVocab::plain().ids(1, 2, 3).is_none());
    }
}
