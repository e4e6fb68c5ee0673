//! KV cache events as the engine model produces them, before any wire encoding.
//!
//! Invariants: one `BlockStored` per request per step (all blocks that became full and cached in
//! that step, in chain order, `parent_block_hash` = the block before the first one); one
//! `BlockRemoved` per evicted block, emitted before the `BlockStored` that reused its space.

use serde::Serialize;

/// The storage tier a block event refers to (vLLM's `medium`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Medium {
    /// Accelerator memory (`"GPU"`).
    Gpu,
    /// Host-memory offload tier (`"CPU"`).
    Cpu,
}

impl Medium {
    /// The wire string vLLM uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Medium::Gpu => "GPU",
            Medium::Cpu => "CPU",
        }
    }
}

/// One KV cache event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum KvEvent {
    /// Full blocks became cached.
    BlockStored {
        /// The engine's hashes of the stored blocks, in chain order.
        block_hashes: Vec<u64>,
        /// The hash of the block before `block_hashes[0]`; `None` when the chain starts at token 0.
        parent_block_hash: Option<u64>,
        /// Token ids of all stored blocks (empty when the request carried none).
        token_ids: Vec<u32>,
        /// Tokens per block.
        block_size: u32,
        /// Tier the blocks are stored in.
        medium: Medium,
    },
    /// Blocks were evicted from a tier.
    BlockRemoved {
        /// The engine's hashes of the removed blocks.
        block_hashes: Vec<u64>,
        /// Tier the blocks were removed from.
        medium: Medium,
    },
    /// The whole prefix cache was reset.
    AllBlocksCleared,
}
