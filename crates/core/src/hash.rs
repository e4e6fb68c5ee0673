//! Block hashing: prompts → chains of stable 64-bit block hashes.
//!
//! Invariants:
//! - `h_0 = xxh3_64_with_seed(HASH_SEED, root || block_0)`, `h_i = xxh3_64_with_seed(HASH_SEED, h_{i-1} || block_i)`
//!   (little-endian `u64` of the parent followed by the block's bytes / token ids as LE `u32`).
//! - The root mixes model, LoRA adapter and `cache_salt`, so two namespaces never share a block.
//! - Only full blocks are hashed; a trailing partial block contributes nothing.
//! - Outputs are pinned by golden tests: changing them is a wire-format break (gossip, events).

use crate::BlockHash;

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
pub fn namespace_root(ns: &Namespace<'_>) -> BlockHash {
    let _ = ns;
    todo!("kvgate-core: namespace_root")
}

/// Text mode: hash `text` in blocks of `block_bytes` bytes, chained from `root`, appending to `out`.
pub fn hash_text_blocks(root: BlockHash, text: &[u8], block_bytes: usize, out: &mut Vec<BlockHash>) {
    let _ = (root, text, block_bytes, out);
    todo!("kvgate-core: hash_text_blocks")
}

/// Token mode: hash `tokens` in blocks of `block_tokens` ids, chained from `parent`, appending to `out`.
pub fn hash_token_blocks(parent: BlockHash, tokens: &[u32], block_tokens: usize, out: &mut Vec<BlockHash>) {
    let _ = (parent, tokens, block_tokens, out);
    todo!("kvgate-core: hash_token_blocks")
}

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
        let _ = (role, content);
        todo!("kvgate-core: CanonicalPrompt::push_message")
    }
    /// Appends a non-message part (e.g. `tools` JSON) under a label.
    pub fn push_part(&mut self, label: &str, bytes: &[u8]) {
        let _ = (label, bytes);
        todo!("kvgate-core: CanonicalPrompt::push_part")
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
