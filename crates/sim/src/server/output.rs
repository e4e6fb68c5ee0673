//! Deterministic generated text: token `i` of a request is a word picked by a seeded hash of
//! (seed, prompt, i), so the same request always gets the same answer and each token is exactly
//! one output token.

use xxhash_rust::xxh3::xxh3_64_with_seed;

const WORDS: [&str; 64] = [
    "the", "cache", "block", "token", "route", "fleet", "engine", "queue", "prefix", "model",
    "fast", "warm", "cold", "batch", "step", "load", "hit", "miss", "prompt", "reply", "stream",
    "first", "time", "level", "score", "pick", "node", "share", "hash", "chain", "store", "event",
    "decode", "fill", "page", "keep", "evict", "reuse", "plan", "act", "check", "result", "value",
    "small", "large", "early", "late", "again", "then", "now", "here", "there", "with", "from",
    "into", "over", "under", "more", "less", "best", "good", "same", "next", "done",
];

/// The text of output token `i` for a request whose prompt hashes to `prompt_key`.
pub fn token_text(seed: u64, prompt_key: u64, i: u32) -> String {
    let mut buf = [0u8; 12];
    buf[..8].copy_from_slice(&prompt_key.to_le_bytes());
    buf[8..].copy_from_slice(&i.to_le_bytes());
    let h = xxh3_64_with_seed(&buf, seed);
    format!(" {}", WORDS[(h % WORDS.len() as u64) as usize])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_seeded() {
        assert_eq!(token_text(1, 2, 3), token_text(1, 2, 3));
        let a: Vec<String> = (0..32).map(|i| token_text(1, 2, i)).collect();
        let b: Vec<String> = (0..32).map(|i| token_text(9, 2, i)).collect();
        assert_ne!(a, b);
        assert!(a.iter().all(|t| t.starts_with(' ')));
    }
}
