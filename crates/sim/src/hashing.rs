//! The simulated engine's own block hashes.
//!
//! Deliberately *not* kvgate's hash: like a real vLLM (whose hash is a SHA-256 over pickled
//! tuples), the engine's hashes are opaque to the gateway, which must re-hash the `token_ids` of
//! each `BlockStored` event with its own chain. Chain: `h_i = xxh3_64(ENGINE_SEED, h_{i-1} LE ||
//! tokens_i LE u32)`, with `h_{-1}` derived from the cache salt (vLLM's extra keys), only over
//! full blocks.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of the engine hash (distinct from the gateway's).
pub const ENGINE_SEED: u64 = 0x5349_4d5f_454e_4731;

/// The chain root for an optional cache salt.
pub fn engine_root(cache_salt: Option<&str>) -> u64 {
    match cache_salt {
        None => xxh3_64_with_seed(b"kvgate-sim/none", ENGINE_SEED),
        Some(s) => {
            let mut buf = b"kvgate-sim/salt:".to_vec();
            buf.extend_from_slice(s.as_bytes());
            xxh3_64_with_seed(&buf, ENGINE_SEED)
        }
    }
}

/// One link of the chain: the hash of a block of `tokens` following `parent`.
pub fn engine_chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut buf = Vec::with_capacity(8 + 4 * tokens.len());
    buf.extend_from_slice(&parent.to_le_bytes());
    for t in tokens {
        buf.extend_from_slice(&t.to_le_bytes());
    }
    xxh3_64_with_seed(&buf, ENGINE_SEED)
}

/// Hashes of the full blocks of `tokens` (a trailing partial block is ignored).
pub fn engine_block_hashes(tokens: &[u32], block_size: u32, cache_salt: Option<&str>) -> Vec<u64> {
    let bs = block_size.max(1) as usize;
    let mut out = Vec::with_capacity(tokens.len() / bs);
    let mut parent = engine_root(cache_salt);
    for chunk in tokens.chunks_exact(bs) {
        parent = engine_chain_hash(parent, chunk);
        out.push(parent);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_properties() {
        let t: Vec<u32> = (0..40).collect();
        let h = engine_block_hashes(&t, 16, None);
        assert_eq!(h.len(), 2);
        assert_eq!(engine_block_hashes(&t[..32], 16, None), h);
        assert_ne!(engine_block_hashes(&t, 16, Some("x")), h);
        let mut u = t.clone();
        u[0] = 99;
        let h2 = engine_block_hashes(&u, 16, None);
        assert_ne!(h2[0], h[0]);
        assert_ne!(h2[1], h[1], "a change propagates down the chain");
    }
}
