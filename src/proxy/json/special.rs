//! Finding where a JSON string's plain run ends: the first `"`, `\` or raw control character
//! (below 0x20, an error inside a string).
//!
//! Invariants:
//! - [`find`] returns the first such byte's offset, or `None`, on every path; tests compare
//!   each path with a byte-by-byte reference on random bytes at every alignment and length.
//! - With AVX2 (detected at run time, cached by std) one pass tests all three at once; without
//!   it, `memchr2` finds the first quote or backslash and a vectorizable fold checks the run
//!   before it for control characters.
//!
//! Why: a ~32 KiB prompt is one long string; two passes over it (memchr2, then the control
//! check) cost about as much as hashing its blocks (`loadtest/callgrind.sh`).

/// The index of the first byte of `word` (little-endian) that is `"`, `\\` or below 0x20.
///
/// Each test is the classic "has a zero byte" trick, whose borrows can only mark bytes above a
/// true match; the lowest marked byte over all three tests is therefore exact.
#[inline]
pub(super) fn in_word(word: u64) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero_in = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let quote = zero_in(word ^ (ONES * u64::from(b'"')));
    let backslash = zero_in(word ^ (ONES * u64::from(b'\\')));
    let control = word.wrapping_sub(ONES * 0x20) & !word & HIGH;
    let found = quote | backslash | control;
    (found != 0).then(|| found.trailing_zeros() as usize / 8)
}

fn is_special(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

/// Offset of the first `"`, `\\` or byte below 0x20 in `bytes`.
pub(super) fn find(bytes: &[u8]) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above).
        return unsafe { avx2::find(bytes) };
    }
    portable(bytes)
}

fn portable(bytes: &[u8]) -> Option<usize> {
    let end = memchr::memchr2(b'"', b'\\', bytes).unwrap_or(bytes.len());
    let plain = &bytes[..end];
    // A fold without early exit vectorizes; the rare control character then finds its offset.
    if plain.iter().fold(false, |seen, &b| seen | (b < 0x20)) {
        return plain.iter().position(|&b| b < 0x20);
    }
    (end < bytes.len()).then_some(end)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::is_special;
    use std::arch::x86_64::*;

    /// Bit `i` set when byte `i` of the 32 at `v` is special.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn mask(v: __m256i) -> __m256i {
        let quote = _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'"' as i8));
        let backslash = _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'\\' as i8));
        // Unsigned b <= 0x1f exactly when min(b, 0x1f) == b.
        let control = _mm256_cmpeq_epi8(_mm256_min_epu8(v, _mm256_set1_epi8(0x1f)), v);
        _mm256_or_si256(_mm256_or_si256(quote, backslash), control)
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn find(bytes: &[u8]) -> Option<usize> {
        let mut at = 0;
        while let Some(two) = bytes.get(at..at + 64) {
            // SAFETY: `two` holds 64 bytes; unaligned loads.
            let (a, b) = unsafe {
                (
                    _mm256_loadu_si256(two.as_ptr().cast()),
                    _mm256_loadu_si256(two.as_ptr().add(32).cast()),
                )
            };
            let (ma, mb) = (mask(a), mask(b));
            let any = _mm256_or_si256(ma, mb);
            if _mm256_testz_si256(any, any) == 0 {
                let low = _mm256_movemask_epi8(ma) as u32 as u64;
                let high = _mm256_movemask_epi8(mb) as u32 as u64;
                return Some(at + (low | high << 32).trailing_zeros() as usize);
            }
            at += 64;
        }
        if let Some(one) = bytes.get(at..at + 32) {
            // SAFETY: `one` holds 32 bytes; unaligned load.
            let m = mask(unsafe { _mm256_loadu_si256(one.as_ptr().cast()) });
            let bits = _mm256_movemask_epi8(m) as u32;
            if bits != 0 {
                return Some(at + bits.trailing_zeros() as usize);
            }
            at += 32;
        }
        bytes[at..]
            .iter()
            .position(|&b| is_special(b))
            .map(|i| at + i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(bytes: &[u8]) -> Option<usize> {
        bytes.iter().position(|&b| is_special(b))
    }

    #[test]
    fn every_path_finds_the_first_special_byte_at_every_offset() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for len in 0..200 {
            for _ in 0..20 {
                // Mostly plain printable bytes and UTF-8 continuation bytes, with a special one
                // placed at a random offset (or none).
                let mut v: Vec<u8> = (0..len)
                    .map(|_| match next() % 4 {
                        0 => 0x80 | (next() as u8 & 0x3f),
                        _ => b' ' + (next() % 95) as u8,
                    })
                    .filter(|&b| !is_special(b))
                    .collect();
                if !v.is_empty() && next() % 4 != 0 {
                    let i = next() as usize % v.len();
                    v[i] = [b'"', b'\\', 0x00, 0x1f, b'\n'][next() as usize % 5];
                }
                for start in 0..v.len().min(3) {
                    let s = &v[start..];
                    assert_eq!(find(s), reference(s), "{s:?}");
                    assert_eq!(portable(s), reference(s), "{s:?}");
                }
            }
        }
        // Bytes that sit just around the tested ranges are plain.
        for b in [0x20u8, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xff] {
            assert_eq!(find(&[b; 100]), None, "{b:#x}");
        }
    }
}
