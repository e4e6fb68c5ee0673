//! `"completion_tokens"` in upstream response bytes (`kvgate::proxy::usage::CompletionTokens`,
//! which charges an answer's output to the token rate limit): the same count in one frame, in
//! fuzzer-chosen frames, byte by byte and (short inputs) over every cut in two; equal to the
//! reference scan of the whole input (`fuzz/src/usage.rs`); and, when serde_json reads the
//! input as one JSON document, equal to its last `completion_tokens` member's value.
//!
//! Input: a count `n`, then `n` frame lengths, then the response bytes (`usage::input`).
#![no_main]

use kvgate::proxy::usage::CompletionTokens;
use kvgate_fuzz::{splits, usage};
use libfuzzer_sys::fuzz_target;

/// Inputs up to this long are also cut in two at every offset.
const EVERY_CUT: usize = 256;

fn fed<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> Option<u64> {
    let mut s = CompletionTokens::default();
    for p in pieces {
        s.feed(p);
    }
    s.found()
}

fuzz_target!(|data: &[u8]| {
    let (cuts, body) = usage::input(data);
    let whole = fed([body]);
    assert_eq!(whole, usage::scan(body), "the reference scan");
    assert_eq!(
        fed(splits::pieces(body, cuts)),
        whole,
        "frames cut at {cuts:?}"
    );
    assert_eq!(fed(body.chunks(1)), whole, "byte by byte");
    if body.len() <= EVERY_CUT {
        for at in 0..=body.len() {
            let (a, b) = body.split_at(at);
            assert_eq!(fed([a, b]), whole, "cut at {at}");
        }
    }
    if let Some(want) = usage::via_serde(body) {
        assert_eq!(whole, want, "serde_json's tree");
    }
});
