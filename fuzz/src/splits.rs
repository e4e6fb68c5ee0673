//! Cutting an input into the pieces a fuzzer chose.

/// Splits `data` into pieces whose lengths are taken from `cuts` (each byte one length, 0 for an
/// empty piece); whatever is left is the last piece.
pub fn pieces<'a>(data: &'a [u8], cuts: &[u8]) -> Vec<&'a [u8]> {
    let mut out = Vec::with_capacity(cuts.len() + 1);
    let mut rest = data;
    for &c in cuts {
        let n = usize::from(c).min(rest.len());
        let (a, b) = rest.split_at(n);
        out.push(a);
        rest = b;
    }
    out.push(rest);
    out
}
