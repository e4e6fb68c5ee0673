//! Chains of long blocks (a parent and a block together over 240 bytes, e.g. text mode's
//! 256-byte blocks): XXH3-64's long path, vectorized with AVX2 where the CPU has it.
//!
//! Invariants:
//! - [`chain_blocks`] gives, block after block, exactly
//!   `xxh3_64_with_seed(parent.to_le_bytes() || block, HASH_SEED)` with each result the next
//!   block's parent; tests check it bit for bit against xxhash-rust for every length from the
//!   shortest long input to several XXH3 blocks, and for both code paths.
//! - The AVX2 path reads the parent and the block where they lie (only the first stripe, which
//!   straddles the two, is assembled on the stack), so a block is never copied. It is chosen at
//!   run time (`is_x86_feature_detected!`, cached by std), once per call.
//! - Without AVX2 the parent and block are copied into one scratch buffer and hashed by
//!   xxhash-rust with the secret derived from the seed once, at compile time.
//!
//! Why by hand: xxhash-rust picks its vector width at compile time, and release builds target
//! baseline x86-64 (SSE2); on a ~32 KiB prompt (128 blocks of 256 bytes) its long path was the
//! largest single cost of a request after the index (`loadtest/callgrind.sh`).

use super::{HASH_SEED, XXH3_MID_MAX};
use crate::BlockHash;
use xxhash_rust::const_xxh3::const_custom_default_secret;
use xxhash_rust::xxh3::xxh3_64_with_secret;

/// XXH3's secret for [`HASH_SEED`], as `xxh3_64_with_seed` derives it for inputs over 240 bytes.
pub(super) const LONG_SECRET: [u8; SECRET_LEN] = const_custom_default_secret(HASH_SEED);

const SECRET_LEN: usize = 192;
const STRIPE: usize = 64;
/// Stripes per XXH3 block: the secret advances 8 bytes a stripe until 64 bytes remain.
const STRIPES_PER_BLOCK: usize = (SECRET_LEN - STRIPE) / 8;
const BLOCK_LEN: usize = STRIPE * STRIPES_PER_BLOCK;
const SECRET_LASTACC_START: usize = 7;
const SECRET_MERGEACCS_START: usize = 11;

const PRIME32_1: u64 = 0x9E37_79B1;
const PRIME32_2: u64 = 0x85EB_CA77;
const PRIME32_3: u64 = 0xC2B2_AE3D;
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;

/// True when `block_bytes`-byte blocks (plus the 8-byte parent) take XXH3's long path.
pub(super) fn is_long(block_bytes: usize) -> bool {
    8 + block_bytes > XXH3_MID_MAX
}

/// Hashes `bytes` (whole blocks of `block_bytes`, [`is_long`]) chained from `parent`, appending
/// each block's hash to `out`; returns the last hash (or `parent` when `bytes` is empty).
/// `scratch` is used only without AVX2.
pub(super) fn chain_blocks(
    mut parent: BlockHash,
    bytes: &[u8],
    block_bytes: usize,
    out: &mut Vec<BlockHash>,
    scratch: &mut Vec<u8>,
) -> BlockHash {
    debug_assert!(is_long(block_bytes));
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        for block in bytes.chunks_exact(block_bytes) {
            // SAFETY: the CPU has AVX2 (checked above).
            parent = unsafe { avx2::chained(parent, block) };
            out.push(parent);
        }
        return parent;
    }
    for block in bytes.chunks_exact(block_bytes) {
        parent = copied(parent, block, scratch);
        out.push(parent);
    }
    parent
}

/// The portable path: parent and block copied into `scratch`, hashed by xxhash-rust.
fn copied(parent: BlockHash, block: &[u8], scratch: &mut Vec<u8>) -> BlockHash {
    scratch.clear();
    scratch.extend_from_slice(&parent.to_le_bytes());
    scratch.extend_from_slice(block);
    xxh3_64_with_secret(scratch, &LONG_SECRET)
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(w)
}

/// XXH3's final merge of the eight accumulators of an input of `len` bytes.
fn merge(acc: &[u64; 8], len: usize) -> u64 {
    let s = &LONG_SECRET[SECRET_MERGEACCS_START..];
    let mut h = (len as u64).wrapping_mul(PRIME64_1);
    for i in 0..4 {
        let lo = acc[2 * i] ^ read_u64(s, 16 * i);
        let hi = acc[2 * i + 1] ^ read_u64(s, 16 * i + 8);
        let p = u128::from(lo) * u128::from(hi);
        h = h.wrapping_add((p as u64) ^ ((p >> 64) as u64));
    }
    h ^= h >> 37;
    h = h.wrapping_mul(0x1656_6791_9E37_79F9);
    h ^ (h >> 32)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// `xxh3_64_with_seed(parent.to_le_bytes() || block, HASH_SEED)` for a long input.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn chained(parent: BlockHash, block: &[u8]) -> BlockHash {
        match <&[u8; 256]>::try_from(block) {
            Ok(block) => input_264(parent, block),
            Err(_) => long_input(parent, block),
        }
    }

    /// Text mode's default block (256 bytes behind the parent), unrolled: input stripes at 0,
    /// 64, 128 and 192 against secret offsets 0, 8, 16 and 24, then the last stripe (input 200)
    /// against secret offset 121.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn input_264(parent: BlockHash, block: &[u8; 256]) -> BlockHash {
        let mut first = [0u8; STRIPE];
        first[..8].copy_from_slice(&parent.to_le_bytes());
        first[8..].copy_from_slice(&block[..STRIPE - 8]);
        let mut acc = initial();
        accumulate(&mut acc, &first, &LONG_SECRET);
        accumulate(&mut acc, &block[56..120], &LONG_SECRET[8..]);
        accumulate(&mut acc, &block[120..184], &LONG_SECRET[16..]);
        accumulate(&mut acc, &block[184..248], &LONG_SECRET[24..]);
        accumulate(
            &mut acc,
            &block[192..],
            &LONG_SECRET[SECRET_LEN - STRIPE - SECRET_LASTACC_START..],
        );
        finish(acc, 264)
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    fn initial() -> [__m256i; 2] {
        [
            _mm256_setr_epi64x(
                PRIME32_3 as i64,
                PRIME64_1 as i64,
                PRIME64_2 as i64,
                PRIME64_3 as i64,
            ),
            _mm256_setr_epi64x(
                PRIME64_4 as i64,
                PRIME32_2 as i64,
                PRIME64_5 as i64,
                PRIME32_1 as i64,
            ),
        ]
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    fn finish(acc: [__m256i; 2], len: usize) -> BlockHash {
        let mut lanes = [0u64; 8];
        // SAFETY: `lanes` is 64 bytes; unaligned stores.
        unsafe {
            _mm256_storeu_si256(lanes.as_mut_ptr().cast(), acc[0]);
            _mm256_storeu_si256(lanes.as_mut_ptr().add(4).cast(), acc[1]);
        }
        merge(&lanes, len)
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    fn long_input(parent: BlockHash, block: &[u8]) -> BlockHash {
        let len = 8 + block.len();
        debug_assert!(len > XXH3_MID_MAX);
        // The input's first stripe straddles the parent and the block; every later stripe
        // starts at input offset 64·k ≥ 64, i.e. at block offset 64·k − 8.
        let mut first = [0u8; STRIPE];
        first[..8].copy_from_slice(&parent.to_le_bytes());
        first[8..].copy_from_slice(&block[..STRIPE - 8]);
        let stripe = |at: usize| -> &[u8] {
            if at == 0 {
                &first
            } else {
                &block[at - 8..at - 8 + STRIPE]
            }
        };
        let mut acc = initial();
        let blocks = (len - 1) / BLOCK_LEN;
        for b in 0..blocks {
            for s in 0..STRIPES_PER_BLOCK {
                accumulate(
                    &mut acc,
                    stripe(b * BLOCK_LEN + s * STRIPE),
                    &LONG_SECRET[s * 8..],
                );
            }
            scramble(&mut acc, &LONG_SECRET[SECRET_LEN - STRIPE..]);
        }
        let base = blocks * BLOCK_LEN;
        for s in 0..(len - 1 - base) / STRIPE {
            accumulate(&mut acc, stripe(base + s * STRIPE), &LONG_SECRET[s * 8..]);
        }
        // The last stripe ends with the input (offset len − 64 ≥ 177, inside the block).
        accumulate(
            &mut acc,
            &block[block.len() - STRIPE..],
            &LONG_SECRET[SECRET_LEN - STRIPE - SECRET_LASTACC_START..],
        );
        finish(acc, len)
    }

    /// One stripe: `acc[i ^ 1] += data[i]; acc[i] += lo32(data[i] ^ key[i]) · hi32(…)`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn accumulate(acc: &mut [__m256i; 2], data: &[u8], secret: &[u8]) {
        assert!(data.len() >= STRIPE && secret.len() >= STRIPE);
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: both slices hold at least 64 bytes (asserted); unaligned loads.
            let (d, k) = unsafe {
                (
                    _mm256_loadu_si256(data.as_ptr().add(32 * i).cast()),
                    _mm256_loadu_si256(secret.as_ptr().add(32 * i).cast()),
                )
            };
            let dk = _mm256_xor_si256(d, k);
            let product = _mm256_mul_epu32(dk, _mm256_srli_epi64::<32>(dk));
            let swapped = _mm256_shuffle_epi32::<0b01_00_11_10>(d);
            *a = _mm256_add_epi64(product, _mm256_add_epi64(*a, swapped));
        }
    }

    /// End of an XXH3 block: `acc = (acc ^ (acc >> 47) ^ key) · PRIME32_1`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn scramble(acc: &mut [__m256i; 2], secret: &[u8]) {
        assert!(secret.len() >= STRIPE);
        let prime = _mm256_set1_epi32(PRIME32_1 as i32);
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: `secret` holds at least 64 bytes (asserted); unaligned load.
            let k = unsafe { _mm256_loadu_si256(secret.as_ptr().add(32 * i).cast()) };
            let x = _mm256_xor_si256(_mm256_xor_si256(*a, _mm256_srli_epi64::<47>(*a)), k);
            let lo = _mm256_mul_epu32(x, prime);
            let hi = _mm256_mul_epu32(_mm256_srli_epi64::<32>(x), prime);
            *a = _mm256_add_epi64(lo, _mm256_slli_epi64::<32>(hi));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xxhash_rust::xxh3::xxh3_64_with_seed;

    fn reference(parent: BlockHash, block: &[u8]) -> BlockHash {
        let mut input = parent.to_le_bytes().to_vec();
        input.extend_from_slice(block);
        xxh3_64_with_seed(&input, HASH_SEED)
    }

    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn both_paths_equal_xxh3_with_seed_for_every_long_length() {
        // From the shortest long input (233 + 8 = 241 bytes) past three XXH3 blocks, so the
        // scramble, the partial last block and the last stripe's overlap all vary.
        for n in 233..=3200 {
            let block = bytes(n, n as u64);
            let parent = 0x0123_4567_89ab_cdef ^ n as u64;
            let want = reference(parent, &block);
            let mut scratch = Vec::new();
            assert_eq!(
                copied(parent, &block, &mut scratch),
                want,
                "copied, {n} bytes"
            );
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2.
                assert_eq!(
                    unsafe { avx2::chained(parent, &block) },
                    want,
                    "avx2, {n} bytes"
                );
            }
        }
    }

    #[test]
    fn a_chain_is_each_block_hashed_behind_the_last() {
        for bb in [233, 256, 1016, 1024, 2000] {
            let text = bytes(bb * 5 + 7, bb as u64);
            let mut out = Vec::new();
            let last = chain_blocks(42, &text, bb, &mut out, &mut Vec::new());
            let mut parent = 42;
            let want: Vec<_> = text
                .chunks_exact(bb)
                .map(|b| {
                    parent = reference(parent, b);
                    parent
                })
                .collect();
            assert_eq!(out, want, "{bb}-byte blocks");
            assert_eq!(last, parent);
        }
        assert_eq!(
            chain_blocks(42, &[], 256, &mut Vec::new(), &mut Vec::new()),
            42
        );
    }

    proptest::proptest! {
        #[test]
        fn random_long_blocks_hash_as_xxh3_with_seed(
            parent: u64,
            block in proptest::collection::vec(proptest::num::u8::ANY, 233..2100),
        ) {
            let mut out = Vec::new();
            chain_blocks(parent, &block, block.len(), &mut out, &mut Vec::new());
            proptest::prop_assert_eq!(out, vec![reference(parent, &block)]);
        }
    }
}
