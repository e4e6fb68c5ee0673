//! [`TokenCache`]: token ids of chat-prompt prefixes, so a conversation that grows turn by turn
//! costs only its new text.
//!
//! # The rule
//!
//! The rendered chat text is cut at *safe splits*: byte offsets `p` where
//! `encode(text) == encode(text[..p]) ++ encode(text[p..])` provably holds. Each segment between
//! two splits is cached under a 128-bit XXH3 hash chained over every segment before it, so a
//! cached segment is reused only when all the text before it is identical. The text after the
//! last split (typically the generation prompt) is always encoded fresh. Where a tokenizer's
//! rule does not hold, [`crate::Tokenizer::safe_splits`] returns `None` and the whole text is
//! encoded as before. Per tokenizer family:
//!
//! - **built-in `cl100k_base`** ([`crate::cl100k`], tiktoken's ids): a split just after
//!   `<|end|>\n` when the next byte is `<` (the built-in template's end of a message). cl100k's
//!   pre-tokenization pattern ends the letters piece at `d`, takes `|>\n` as one punctuation
//!   piece (`[\r\n]*` stops at `<`), and BPE never merges across pieces; no cl100k special
//!   token contains `\n<`, so no special-token match spans the split either.
//! - **Hugging Face `tokenizer.json`**: a split just after every added token matched in the text
//!   (leftmost-longest, as the added vocabulary splits before normalization and
//!   pre-tokenization, so pieces on either side are processed independently). Used only when the
//!   file has no normalizer, no truncation, no padding, a `ByteLevel` (or no) pre-tokenizer, and
//!   every added token has `normalized`, `lstrip`, `rstrip` and `single_word` off: each of those
//!   could make a piece depend on its neighbours.
//! - **anything else** (a Jinja template with the built-in tokenizer, other HF settings): no
//!   splits, full encoding.
//!
//! Completion prompts are not cached (a BOS and a single free-form text).
//!
//! # Bounds and sharing
//!
//! Capacity is in bytes (4 per cached id plus a fixed per-entry overhead); `quick_cache`'s sharded
//! CLOCK-Pro evicts beyond it. Serving threads share one cache without a global lock. Hits,
//! misses and evictions are counted per segment ([`TokenCache::stats`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, Weighter};

/// Bytes charged per entry on top of its ids (key, `Arc` header, cache slot).
const ENTRY_OVERHEAD: u64 = 64;

/// Counters of one cache.
#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

/// A snapshot of the cache's counters and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Segments found in the cache.
    pub hits: u64,
    /// Segments encoded because they were not cached.
    pub misses: u64,
    /// Segments evicted to stay within capacity.
    pub evictions: u64,
    /// Bytes currently charged.
    pub bytes: u64,
    /// Segments currently held.
    pub entries: u64,
}

#[derive(Clone)]
struct ByteWeight;

impl Weighter<u128, Arc<[u32]>> for ByteWeight {
    fn weight(&self, _key: &u128, val: &Arc<[u32]>) -> u64 {
        val.len() as u64 * 4 + ENTRY_OVERHEAD
    }
}

#[derive(Clone)]
struct CountEvictions(Arc<Counters>);

impl Lifecycle<u128, Arc<[u32]>> for CountEvictions {
    type RequestState = ();
    fn on_evict(&self, _state: &mut (), _key: u128, _val: Arc<[u32]>) {
        self.0.evictions.fetch_add(1, Ordering::Relaxed);
    }
}

/// A bounded, concurrent cache of prefix-segment token ids.
pub struct TokenCache {
    cache: Cache<u128, Arc<[u32]>, ByteWeight, DefaultHashBuilder, CountEvictions>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCache")
            .field("stats", &self.stats())
            .finish()
    }
}

impl TokenCache {
    /// A cache holding up to `capacity_bytes` (at least one entry's overhead).
    pub fn new(capacity_bytes: u64) -> Self {
        let capacity = capacity_bytes.max(ENTRY_OVERHEAD);
        // One entry per message of about 1K tokens is the expected shape.
        let items = usize::try_from(capacity / (4096 + ENTRY_OVERHEAD))
            .unwrap_or(usize::MAX)
            .clamp(16, 1 << 20);
        let counters = Arc::new(Counters::default());
        let cache = Cache::with(
            items,
            capacity,
            ByteWeight,
            DefaultHashBuilder::default(),
            CountEvictions(counters.clone()),
        );
        Self { cache, counters }
    }

    /// Encodes `text` cut at `splits` (ascending offsets of safe splits inside `text`), using
    /// `encode` for every segment not cached and for the tail after the last split.
    pub(crate) fn encode<E>(
        &self,
        text: &str,
        splits: &[usize],
        mut encode: impl FnMut(&str) -> Result<Vec<u32>, E>,
    ) -> Result<Vec<u32>, E> {
        let mut out = Vec::new();
        let mut key: u128 = 0;
        let mut start = 0;
        for &end in splits {
            let segment = &text[start..end];
            key = chain(key, segment);
            match self.cache.get(&key) {
                Some(ids) => {
                    self.counters.hits.fetch_add(1, Ordering::Relaxed);
                    out.extend_from_slice(&ids);
                }
                None => {
                    self.counters.misses.fetch_add(1, Ordering::Relaxed);
                    let ids = encode(segment)?;
                    out.extend_from_slice(&ids);
                    self.cache.insert(key, ids.into());
                }
            }
            start = end;
        }
        if start < text.len() || splits.is_empty() {
            out.extend(encode(&text[start..])?);
        }
        Ok(out)
    }

    /// Counters and size now.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.counters.hits.load(Ordering::Relaxed),
            misses: self.counters.misses.load(Ordering::Relaxed),
            evictions: self.counters.evictions.load(Ordering::Relaxed),
            bytes: self.cache.weight(),
            entries: self.cache.len() as u64,
        }
    }
}

/// The key of a segment: XXH3-128 over the previous key and the segment's bytes, so equal keys
/// mean (up to a 2^-128 collision) equal text from the start of the prompt.
fn chain(prev: u128, segment: &str) -> u128 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&prev.to_le_bytes());
    h.update(segment.as_bytes());
    h.digest128()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(s: &str) -> Result<Vec<u32>, ()> {
        Ok(s.bytes().map(u32::from).collect())
    }

    #[test]
    fn reuses_segments_only_after_identical_text() {
        let c = TokenCache::new(1 << 20);
        let a = c.encode("abcdef", &[2, 4], enc).unwrap();
        assert_eq!(a, enc("abcdef").unwrap());
        assert_eq!(c.stats().misses, 2);
        let b = c.encode("abcdxy", &[2, 4], enc).unwrap();
        assert_eq!(b, enc("abcdxy").unwrap());
        assert_eq!(c.stats().hits, 2);
        // Same second segment after a different first one: not reused.
        c.encode("xxcdef", &[2, 4], enc).unwrap();
        assert_eq!(c.stats().hits, 2);
        assert_eq!(c.stats().misses, 4);
    }

    #[test]
    fn stays_within_capacity_and_counts_evictions() {
        let c = TokenCache::new(4 * 1024);
        let text = "x".repeat(200 * 100);
        let splits: Vec<usize> = (1..100).map(|i| i * 200).collect();
        c.encode(&text, &splits, enc).unwrap();
        let s = c.stats();
        assert!(s.bytes <= 4 * 1024, "{s:?}");
        assert!(s.evictions > 0, "{s:?}");
    }
}
