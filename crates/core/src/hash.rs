//! Block hashing: prompts → chains of stable 64-bit block hashes.
//!
//! Invariants:
//! - `h_0 = xxh3_64_with_seed(HASH_SEED, root || block_0)`, `h_i = xxh3_64_with_seed(HASH_SEED, h_{i-1} || block_i)`
//!   (little-endian `u64` of the parent followed by the block's bytes / token ids as LE `u32`).
//! - The root mixes model, LoRA adapter and `cache_salt`, so two namespaces never share a block:
//!   `root = xxh3_64_with_seed(HASH_SEED, "kvgate/ns/v1\0" || field(model) || field(lora) || field(salt))`
//!   where `field(None) = 0x00` and `field(Some(s)) = 0x01 || len(s) as LE u64 || s`.
//! - Only full blocks are hashed; a trailing partial block contributes nothing.
//! - Outputs are pinned by golden tests: changing them is a wire-format break (gossip, events).

use crate::BlockHash;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Fixed seed for every block hash kvgate emits. Part of the wire format.
pub const HASH_SEED: u64 = 0x6b76_6761_7465_0001;

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
    // One scratch buffer per call: parent (8 bytes) followed by the block's bytes.
    let mut buf = vec![0u8; 8 + block_bytes];
    let mut parent = root;
    for block in text.chunks_exact(block_bytes) {
        let (head, body) = buf.split_at_mut(8);
        head.copy_from_slice(&parent.to_le_bytes());
        body.copy_from_slice(block);
        parent = xxh3_64_with_seed(&buf, HASH_SEED);
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
    // One fixed-size scratch buffer: parent, then the block's ids; filled in place per block.
    let mut buf = vec![0u8; 8 + 4 * block_tokens];
    let mut parent = parent;
    for block in tokens.chunks_exact(block_tokens) {
        let (head, body) = buf.split_at_mut(8);
        head.copy_from_slice(&parent.to_le_bytes());
        for (dst, t) in body.chunks_exact_mut(4).zip(block) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        parent = xxh3_64_with_seed(&buf, HASH_SEED);
        out.push(parent);
    }
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
        self.buf.reserve(head.len() + body.len() + 2);
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
