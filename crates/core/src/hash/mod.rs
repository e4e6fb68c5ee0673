//! Block hashing: prompts → chains of stable 64-bit block hashes.
//!
//! Invariants:
//! - `h_0 = xxh3_64_with_seed(HASH_SEED, root || block_0)`, `h_i = xxh3_64_with_seed(HASH_SEED, h_{i-1} || block_i)`
//!   (little-endian `u64` of the parent followed by the block's bytes / token ids as LE `u32`).
//! - The root mixes model, LoRA adapter and `cache_salt`, so two namespaces never share a block:
//!   `root = xxh3_64_with_seed(HASH_SEED, "kvgate/ns/v1\0" || field(model) || field(lora) || field(salt))`
//!   where `field(None) = 0x00` and `field(Some(s)) = 0x01 || len(s) as LE u64 || s`.
//! - Only full blocks are hashed; a trailing partial block contributes nothing.
//! - The common 72-byte inputs (16 tokens or 64 bytes per block) take an unrolled XXH3 path that
//!   tests check bit-for-bit against `xxh3_64_with_seed`.
//! - Inputs longer than 240 bytes (text blocks from 233 bytes, token blocks from 59 ids) are hashed
//!   with the secret XXH3 derives from [`HASH_SEED`], computed once at compile time rather than on
//!   every call: for those lengths `xxh3_64_with_secret(x, derived)` is `xxh3_64_with_seed(x, seed)`
//!   by XXH3's definition, and tests check it bit-for-bit. Text blocks of that size are hashed
//!   where they lie, vectorized with AVX2 when the CPU has it (`long.rs`).
//! - Outputs are pinned by golden tests: changing them is a wire-format break (gossip, events).

mod long;

use crate::BlockHash;
use long::LONG_SECRET;
use xxhash_rust::xxh3::{xxh3_64_with_secret, xxh3_64_with_seed};

/// Fixed seed for every block hash kvgate emits. Part of the wire format.
pub const HASH_SEED: u64 = 0x6b76_6761_7465_0001;

/// Inputs longer than this take XXH3's long path (where the seed only derives the secret).
const XXH3_MID_MAX: usize = 240;

/// `xxh3_64_with_seed(input, HASH_SEED)`, without deriving the secret per call on long inputs.
#[inline]
fn seeded_hash(input: &[u8]) -> u64 {
    if input.len() > XXH3_MID_MAX {
        xxh3_64_with_secret(input, &LONG_SECRET)
    } else {
        xxh3_64_with_seed(input, HASH_SEED)
    }
}

/// What separates cache namespaces: requests in different namespaces never share blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Namespace<'a> {
    /// The model name as the client sent it (the pool's served model).
    pub model: &'a str,
    /// LoRA adapter name, if any.
    pub lora: Option<&'a str>,
    /// The request's `cache_salt`, if any.
    pub cache_salt: Option<&'a str>,
}

/// The chain root for a namespace: the "parent" of block 0.
///
/// Each field is length-prefixed and absent optional fields are distinguished from empty ones, so
/// no two distinct namespaces render to the same bytes (e.g. model `"a"` + LoRA `"b"` never equals
/// model `"ab"`).
pub fn namespace_root(ns: &Namespace<'_>) -> BlockHash {
    let mut buf =
        Vec::with_capacity(32 + ns.model.len() + opt_len(ns.lora) + opt_len(ns.cache_salt));
    buf.extend_from_slice(ROOT_DOMAIN);
    push_field(&mut buf, Some(ns.model));
    push_field(&mut buf, ns.lora);
    push_field(&mut buf, ns.cache_salt);
    xxh3_64_with_seed(&buf, HASH_SEED)
}

/// Domain tag of the root encoding; versioned so a format change cannot silently collide.
const ROOT_DOMAIN: &[u8] = b"kvgate/ns/v1\0";

fn opt_len(s: Option<&str>) -> usize {
    s.map_or(0, str::len)
}

/// Appends `0x00` for an absent field, or `0x01`, the LE `u64` length and the bytes.
fn push_field(buf: &mut Vec<u8>, field: Option<&str>) {
    match field {
        None => buf.push(0),
        Some(s) => {
            buf.push(1);
            buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
            buf.extend_from_slice(s.as_bytes());
        }
    }
}

/// Text mode: hash `text` in blocks of `block_bytes` bytes, chained from `root`, appending to `out`.
///
/// A `block_bytes` of 0 yields no blocks (there is no meaningful block of size zero).
pub fn hash_text_blocks(
    root: BlockHash,
    text: &[u8],
    block_bytes: usize,
    out: &mut Vec<BlockHash>,
) {
    if block_bytes == 0 {
        return;
    }
    out.reserve(text.len() / block_bytes);
    if block_bytes == 64 {
        let mut parent = root;
        for block in text.chunks_exact(64) {
            let mut w = [0u64; 9];
            w[0] = parent;
            for (dst, b) in w[1..].iter_mut().zip(block.chunks_exact(8)) {
                let mut le = [0u8; 8];
                le.copy_from_slice(b);
                *dst = u64::from_le_bytes(le);
            }
            parent = xxh3_72(&w);
            out.push(parent);
        }
        return;
    }
    if long::is_long(block_bytes) {
        long::chain_blocks(root, text, block_bytes, out, &mut Vec::new());
        return;
    }
    // One scratch buffer per call: parent (8 bytes) followed by the block's bytes.
    let mut buf = vec![0u8; 8 + block_bytes];
    let mut parent = root;
    for block in text.chunks_exact(block_bytes) {
        let (head, body) = buf.split_at_mut(8);
        head.copy_from_slice(&parent.to_le_bytes());
        body.copy_from_slice(block);
        parent = seeded_hash(&buf);
        out.push(parent);
    }
}

/// Token mode: hash `tokens` in blocks of `block_tokens` ids, chained from `parent`, appending to `out`.
///
/// Tokens are encoded as little-endian `u32`, so the output is the same on every platform.
/// A `block_tokens` of 0 yields no blocks.
pub fn hash_token_blocks(
    parent: BlockHash,
    tokens: &[u32],
    block_tokens: usize,
    out: &mut Vec<BlockHash>,
) {
    if block_tokens == 0 {
        return;
    }
    out.reserve(tokens.len() / block_tokens);
    if block_tokens == 16 {
        let mut parent = parent;
        for block in tokens.chunks_exact(16) {
            let mut w = [0u64; 9];
            w[0] = parent;
            for (dst, pair) in w[1..].iter_mut().zip(block.chunks_exact(2)) {
                *dst = u64::from(pair[0]) | u64::from(pair[1]) << 32;
            }
            parent = xxh3_72(&w);
            out.push(parent);
        }
        return;
    }
    // One fixed-size scratch buffer: parent, then the block's ids; filled in place per block.
    let mut buf = vec![0u8; 8 + 4 * block_tokens];
    let mut parent = parent;
    for block in tokens.chunks_exact(block_tokens) {
        let (head, body) = buf.split_at_mut(8);
        head.copy_from_slice(&parent.to_le_bytes());
        for (dst, t) in body.chunks_exact_mut(4).zip(block) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        parent = seeded_hash(&buf);
        out.push(parent);
    }
}

/// The default XXH3 secret's first 96 bytes as little-endian words (all a 72-byte input uses).
const XXH3_SECRET: [u64; 12] = [
    0xbe4b_a423_396c_feb8,
    0x1cad_21f7_2c81_017c,
    0xdb97_9083_e96d_d4de,
    0x1f67_b3b7_a4a4_4072,
    0x78e5_c0cc_4ee6_79cb,
    0x2172_ffcc_7dd0_5a82,
    0x8e24_43f7_7446_08b8,
    0x4c26_3a81_e690_35e0,
    0xcb00_c391_bb52_283c,
    0xa32e_531b_8b65_d088,
    0x4ef9_0da2_9748_6471,
    0xd8ac_dea9_46ef_1938,
];
const XXH3_PRIME64_1: u64 = 0x9e37_79b1_85eb_ca87;

/// XXH3-64 with [`HASH_SEED`] of one 72-byte input given as nine little-endian words (a parent
/// hash and a 64-byte block): exactly `xxh3_64_with_seed(bytes, HASH_SEED)`, unrolled for that
/// length. Only the first mix depends on the parent, so consecutive blocks of a chain overlap.
#[inline(always)]
fn xxh3_72(w: &[u64; 9]) -> u64 {
    #[inline(always)]
    fn mix16(lo: u64, hi: u64, k: usize) -> u64 {
        let lo = lo ^ XXH3_SECRET[2 * k].wrapping_add(HASH_SEED);
        let hi = hi ^ XXH3_SECRET[2 * k + 1].wrapping_sub(HASH_SEED);
        let p = u128::from(lo) * u128::from(hi);
        (p as u64) ^ ((p >> 64) as u64)
    }
    // The 17..=128-byte path of XXH3 at length 72: input offsets 32, 24, 16, 40, 0, 56 against
    // secret offsets 64, 80, 32, 48, 0, 16.
    let rest = mix16(w[4], w[5], 4)
        .wrapping_add(mix16(w[3], w[4], 5))
        .wrapping_add(mix16(w[2], w[3], 2))
        .wrapping_add(mix16(w[5], w[6], 3))
        .wrapping_add(mix16(w[7], w[8], 1))
        .wrapping_add(72u64.wrapping_mul(XXH3_PRIME64_1));
    let mut h = rest.wrapping_add(mix16(w[0], w[1], 0));
    h ^= h >> 37;
    h = h.wrapping_mul(0x1656_6791_9e37_79f9);
    h ^ (h >> 32)
}

/// Convenience: the full text-mode chain of `text` in namespace `ns`.
pub fn text_chain(ns: &Namespace<'_>, text: &[u8], block_bytes: usize) -> Vec<BlockHash> {
    let mut out = Vec::new();
    hash_text_blocks(namespace_root(ns), text, block_bytes, &mut out);
    out
}

/// Convenience: the full token-mode chain of `tokens` in namespace `ns`.
pub fn token_chain(ns: &Namespace<'_>, tokens: &[u32], block_tokens: usize) -> Vec<BlockHash> {
    let mut out = Vec::new();
    hash_token_blocks(namespace_root(ns), tokens, block_tokens, &mut out);
    out
}

/// Text mode's block chain of a canonical rendering, hashed as the rendering is produced:
/// [`TextChain::finish`] equals [`hash_text_blocks`] of the bytes pushed, in order, however they
/// were split into pushes, without holding the rendering (only a partial block is kept).
#[derive(Clone, Debug)]
pub struct TextChain {
    parent: BlockHash,
    block_bytes: usize,
    /// Bytes of the block being filled (fewer than `block_bytes`).
    pending: Vec<u8>,
    /// Scratch for one block's hash input: the parent, then the block.
    scratch: Vec<u8>,
    hashes: Vec<BlockHash>,
    len: usize,
}

impl TextChain {
    /// A chain from `root` in blocks of `block_bytes` (0: no blocks), with room for the hashes
    /// of `expected_bytes`.
    pub fn new(root: BlockHash, block_bytes: usize, expected_bytes: usize) -> Self {
        Self {
            parent: root,
            block_bytes,
            pending: Vec::new(),
            scratch: Vec::new(),
            hashes: Vec::with_capacity(expected_bytes.checked_div(block_bytes).unwrap_or(0)),
            len: 0,
        }
    }

    /// Appends rendered bytes.
    pub fn push_bytes(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len();
        let bb = self.block_bytes;
        if bb == 0 {
            return;
        }
        if !self.pending.is_empty() {
            let need = bb - self.pending.len();
            if bytes.len() < need {
                self.pending.extend_from_slice(bytes);
                return;
            }
            let (head, rest) = bytes.split_at(need);
            let mut block = std::mem::take(&mut self.pending);
            block.extend_from_slice(head);
            self.hash_full(&block);
            block.clear();
            self.pending = block;
            bytes = rest;
        }
        let full = bytes.len() - bytes.len() % bb;
        self.hash_full(&bytes[..full]);
        if full < bytes.len() {
            if self.pending.capacity() == 0 {
                self.pending.reserve_exact(bb);
            }
            self.pending.extend_from_slice(&bytes[full..]);
        }
    }

    /// Hashes `bytes`, a whole number of blocks.
    fn hash_full(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let bb = self.block_bytes;
        if bb == 64 {
            hash_text_blocks(self.parent, bytes, 64, &mut self.hashes);
        } else if long::is_long(bb) {
            self.parent =
                long::chain_blocks(self.parent, bytes, bb, &mut self.hashes, &mut self.scratch);
        } else {
            if self.scratch.is_empty() {
                self.scratch.resize(8 + bb, 0);
            }
            for block in bytes.chunks_exact(bb) {
                let (head, body) = self.scratch.split_at_mut(8);
                head.copy_from_slice(&self.parent.to_le_bytes());
                body.copy_from_slice(block);
                self.parent = seeded_hash(&self.scratch);
                self.hashes.push(self.parent);
            }
        }
        if let Some(&last) = self.hashes.last() {
            self.parent = last;
        }
    }

    /// Bytes rendered so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing was rendered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chain of the full blocks pushed (a trailing partial block contributes nothing).
    pub fn finish(self) -> Vec<BlockHash> {
        self.hashes
    }
}

/// Where text mode's canonical rendering goes: kept ([`CanonicalPrompt`]) or hashed as it is
/// produced ([`TextChain`]). Both receive the same bytes for the same calls.
pub trait CanonicalSink {
    /// Appends rendered bytes.
    fn push_bytes(&mut self, bytes: &[u8]);
    /// Appends one chat message (role, then content).
    fn push_message(&mut self, role: &str, content: &str) {
        self.push_record(role.as_bytes(), content.as_bytes());
    }
    /// Appends a non-message part (e.g. `tools` JSON) under a label.
    fn push_part(&mut self, label: &str, bytes: &[u8]) {
        self.push_record(label.as_bytes(), bytes);
    }
    /// Appends a completions prompt verbatim.
    fn push_prompt(&mut self, prompt: &str) {
        self.push_bytes(prompt.as_bytes());
    }
    /// One record: head, a unit separator, body, a record separator.
    fn push_record(&mut self, head: &[u8], body: &[u8]) {
        self.push_bytes(head);
        self.push_bytes(&[UNIT_SEP]);
        self.push_bytes(body);
        self.push_bytes(&[RECORD_SEP]);
    }
}

impl CanonicalSink for TextChain {
    fn push_bytes(&mut self, bytes: &[u8]) {
        TextChain::push_bytes(self, bytes);
    }
}

impl CanonicalSink for CanonicalPrompt {
    fn push_bytes(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }
    fn push_message(&mut self, role: &str, content: &str) {
        CanonicalPrompt::push_message(self, role, content);
    }
    fn push_part(&mut self, label: &str, bytes: &[u8]) {
        CanonicalPrompt::push_part(self, label, bytes);
    }
    fn push_prompt(&mut self, prompt: &str) {
        CanonicalPrompt::push_prompt(self, prompt);
    }
}

/// Separates a role (or label) from its content.
pub const UNIT_SEP: u8 = 0x1f;
/// Ends one message or part.
pub const RECORD_SEP: u8 = 0x1e;

/// Text mode's canonical rendering of a request: the bytes that are cut into blocks.
///
/// Chat: each message as `role`, a unit separator, its content, a record separator, in order, with
/// tools / system parts rendered the same way; completions: the prompt bytes. Built incrementally so
/// the gateway can render straight from the parsed request without intermediate strings.
#[derive(Clone, Debug, Default)]
pub struct CanonicalPrompt {
    buf: Vec<u8>,
}

impl CanonicalPrompt {
    /// An empty rendering.
    pub fn new() -> Self {
        Self::default()
    }
    /// An empty rendering with room for `bytes` rendered bytes.
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            buf: Vec::with_capacity(bytes),
        }
    }
    /// The rendered size of a record (a message or a part) of these lengths.
    pub fn record_len(head: usize, body: usize) -> usize {
        head + body + 2
    }
    /// Appends one chat message (role, then content).
    pub fn push_message(&mut self, role: &str, content: &str) {
        self.push_record(role.as_bytes(), content.as_bytes());
    }
    /// Appends a non-message part (e.g. `tools` JSON) under a label.
    pub fn push_part(&mut self, label: &str, bytes: &[u8]) {
        self.push_record(label.as_bytes(), bytes);
    }
    /// Appends one chat message whose content arrives in pieces (an array of text parts):
    /// renders exactly as [`CanonicalPrompt::push_message`] of the concatenated pieces.
    pub fn push_message_parts<'p>(&mut self, role: &str, parts: impl IntoIterator<Item = &'p str>) {
        self.buf.extend_from_slice(role.as_bytes());
        self.buf.push(UNIT_SEP);
        for p in parts {
            self.buf.extend_from_slice(p.as_bytes());
        }
        self.buf.push(RECORD_SEP);
    }
    /// Length of the rendering in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    /// True when nothing was rendered.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    /// Clears the rendering, keeping its allocation.
    pub fn clear(&mut self) {
        self.buf.clear();
    }
    /// Takes the rendered bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
    fn push_record(&mut self, head: &[u8], body: &[u8]) {
        self.buf.reserve(Self::record_len(head.len(), body.len()));
        self.buf.extend_from_slice(head);
        self.buf.push(UNIT_SEP);
        self.buf.extend_from_slice(body);
        self.buf.push(RECORD_SEP);
    }
    /// Appends a completions prompt verbatim.
    pub fn push_prompt(&mut self, prompt: &str) {
        self.buf.extend_from_slice(prompt.as_bytes());
    }
    /// The rendered bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: Namespace<'static> = Namespace {
        model: "m",
        lora: None,
        cache_salt: None,
    };

    /// Deterministic pseudo-random words for the equivalence checks.
    fn words(state: &mut u64) -> u64 {
        *state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        *state ^ (*state >> 29)
    }

    #[test]
    fn unrolled_72_byte_hash_equals_xxh3() {
        let mut st = 7u64;
        for _ in 0..20_000 {
            let mut w = [0u64; 9];
            for x in &mut w {
                *x = words(&mut st);
            }
            let bytes: Vec<u8> = w.iter().flat_map(|x| x.to_le_bytes()).collect();
            assert_eq!(xxh3_72(&w), xxh3_64_with_seed(&bytes, HASH_SEED));
        }
    }

    #[test]
    fn precomputed_long_secret_equals_the_seeded_hash() {
        let mut st = 5u64;
        let bytes: Vec<u8> = (0..4096).map(|_| words(&mut st) as u8).collect();
        for len in (0..=1100).chain([2048, 4096]) {
            let x = &bytes[..len];
            assert_eq!(
                seeded_hash(x),
                xxh3_64_with_seed(x, HASH_SEED),
                "{len} bytes"
            );
        }
        // Through the chains: every text and token block size around the long-path boundary.
        let toks: Vec<u32> = (0..4000).map(|_| words(&mut st) as u32).collect();
        let root = namespace_root(&NS);
        for size in [200, 232, 233, 234, 256, 1000] {
            let mut fast = Vec::new();
            hash_text_blocks(root, &bytes, size, &mut fast);
            let mut parent = root;
            let slow: Vec<u64> = bytes
                .chunks_exact(size)
                .map(|b| {
                    let mut buf = parent.to_le_bytes().to_vec();
                    buf.extend_from_slice(b);
                    parent = xxh3_64_with_seed(&buf, HASH_SEED);
                    parent
                })
                .collect();
            assert_eq!(fast, slow, "text blocks of {size}");
        }
        for size in [32, 58, 59, 60, 64, 256] {
            let mut fast = Vec::new();
            hash_token_blocks(root, &toks, size, &mut fast);
            let mut parent = root;
            let slow: Vec<u64> = toks
                .chunks_exact(size)
                .map(|b| {
                    let mut buf = parent.to_le_bytes().to_vec();
                    buf.extend(b.iter().flat_map(|t| t.to_le_bytes()));
                    parent = xxh3_64_with_seed(&buf, HASH_SEED);
                    parent
                })
                .collect();
            assert_eq!(fast, slow, "token blocks of {size}");
        }
    }

    #[test]
    fn specialised_block_sizes_equal_the_generic_encoding() {
        let mut st = 11u64;
        let toks: Vec<u32> = (0..16 * 50).map(|_| words(&mut st) as u32).collect();
        let text: Vec<u8> = (0..64 * 50 + 13).map(|_| words(&mut st) as u8).collect();
        let root = namespace_root(&NS);
        let (mut fast, mut slow) = (Vec::new(), Vec::new());
        hash_token_blocks(root, &toks, 16, &mut fast);
        let mut parent = root;
        for b in toks.chunks_exact(16) {
            let mut buf = parent.to_le_bytes().to_vec();
            buf.extend(b.iter().flat_map(|t| t.to_le_bytes()));
            parent = xxh3_64_with_seed(&buf, HASH_SEED);
            slow.push(parent);
        }
        assert_eq!(fast, slow);
        fast.clear();
        slow.clear();
        hash_text_blocks(root, &text, 64, &mut fast);
        let mut parent = root;
        for b in text.chunks_exact(64) {
            let mut buf = parent.to_le_bytes().to_vec();
            buf.extend_from_slice(b);
            parent = xxh3_64_with_seed(&buf, HASH_SEED);
            slow.push(parent);
        }
        assert_eq!(fast, slow);
        assert_eq!(fast.len(), 50);
    }

    #[test]
    fn golden_roots() {
        assert_eq!(namespace_root(&Namespace::default()), GOLDEN_ROOT_EMPTY);
        assert_eq!(namespace_root(&NS), GOLDEN_ROOT_M);
        let full = Namespace {
            model: "m",
            lora: Some("l"),
            cache_salt: Some("s"),
        };
        assert_eq!(namespace_root(&full), GOLDEN_ROOT_FULL);
    }

    #[test]
    fn golden_chains() {
        let toks: Vec<u32> = (1..=40).collect();
        assert_eq!(token_chain(&NS, &toks, 16), GOLDEN_TOKENS.to_vec());
        let text = b"The quick brown fox jumps over the lazy dog!";
        assert_eq!(text_chain(&NS, text, 16), GOLDEN_TEXT.to_vec());
    }

    #[test]
    fn only_full_blocks_and_zero_block_size() {
        let toks: Vec<u32> = (0..47).collect();
        assert_eq!(token_chain(&NS, &toks, 16).len(), 2);
        assert!(token_chain(&NS, &toks, 0).is_empty());
        assert!(text_chain(&NS, b"abc", 0).is_empty());
        assert!(text_chain(&NS, b"abc", 4).is_empty());
    }

    #[test]
    fn namespace_fields_do_not_alias() {
        let a = Namespace {
            model: "ab",
            lora: None,
            cache_salt: None,
        };
        let b = Namespace {
            model: "a",
            lora: Some("b"),
            cache_salt: None,
        };
        let c = Namespace {
            model: "a",
            lora: None,
            cache_salt: Some("b"),
        };
        let d = Namespace {
            model: "a",
            lora: Some(""),
            cache_salt: None,
        };
        let e = Namespace {
            model: "a",
            lora: None,
            cache_salt: None,
        };
        let roots = [a, b, c, d, e].map(|n| namespace_root(&n));
        for i in 0..roots.len() {
            for j in i + 1..roots.len() {
                assert_ne!(roots[i], roots[j], "{i} vs {j}");
            }
        }
    }

    #[test]
    fn text_chain_equals_hashing_the_rendering() {
        let mut st = 3u64;
        let text: Vec<u8> = (0..5000).map(|_| words(&mut st) as u8).collect();
        let root = namespace_root(&NS);
        for bb in [0, 1, 7, 64, 256, 300] {
            let mut whole = Vec::new();
            hash_text_blocks(root, &text, bb, &mut whole);
            for _ in 0..20 {
                let mut chain = TextChain::new(root, bb, text.len());
                let mut rest = &text[..];
                while !rest.is_empty() {
                    let n = (words(&mut st) % 700) as usize % (rest.len() + 1);
                    let (piece, tail) = rest.split_at(n);
                    chain.push_bytes(piece);
                    rest = tail;
                }
                assert_eq!(chain.len(), text.len());
                assert_eq!(chain.finish(), whole, "blocks of {bb}");
            }
        }
        // The same calls through both sinks: the rendering's chain.
        let long = "x".repeat(1000);
        let mut canon = CanonicalPrompt::new();
        let mut chain = TextChain::new(root, 64, 0);
        fn render(s: &mut impl CanonicalSink, long: &str) {
            s.push_part("tools", b"[{\"type\":\"function\"}]");
            s.push_message("system", "be brief");
            s.push_message("user", long);
            s.push_prompt(long);
        }
        render(&mut canon, &long);
        render(&mut chain, &long);
        assert_eq!(chain.len(), canon.len());
        let mut want = Vec::new();
        hash_text_blocks(root, canon.as_bytes(), 64, &mut want);
        assert_eq!(chain.finish(), want);
    }

    #[test]
    fn canonical_rendering() {
        let mut p = CanonicalPrompt::new();
        p.push_message("system", "be brief");
        p.push_message_parts("user", ["hel", "lo"]);
        p.push_part("tools", b"[]");
        assert_eq!(
            p.as_bytes(),
            b"system\x1fbe brief\x1euser\x1fhello\x1etools\x1f[]\x1e"
        );
        let mut q = CanonicalPrompt::new();
        q.push_message("system", "be brief");
        q.push_message("user", "hello");
        assert!(
            p.as_bytes().starts_with(q.as_bytes()),
            "a later turn extends the earlier one"
        );
    }

    // Pinned wire format. These values were also reproduced with the reference XXH3 implementation
    // (python `xxhash.xxh3_64_intdigest`) from the encoding described in the module docs.
    const GOLDEN_ROOT_EMPTY: u64 = 0xfae9_c40e_2482_bda7;
    const GOLDEN_ROOT_M: u64 = 0xb1cb_b1de_3ce9_e3f0;
    const GOLDEN_ROOT_FULL: u64 = 0xd36c_de17_5963_ca97;
    const GOLDEN_TOKENS: [u64; 2] = [0x2cce_1d21_6b39_5b8b, 0x1fc7_559f_6f1b_ccaf];
    const GOLDEN_TEXT: [u64; 2] = [0x6f3f_3ada_c601_d2f3, 0x7b23_f6fe_7549_6118];
}
