//! SSE event counting (`kvgate::proxy::body::Events`): the count is the same however the stream
//! is split into frames, and equals the reference count over the whole stream.
#![no_main]

use arbitrary::Arbitrary;
use kvgate::proxy::body::Events;
use kvgate_fuzz::{splits, sse};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    cuts: Vec<u8>,
    stream: &'a [u8],
}

fuzz_target!(|input: Input<'_>| {
    let want = sse::count(input.stream);
    let mut whole = Events::default();
    whole.feed(input.stream);
    assert_eq!(whole.tokens(), want, "one frame");
    let mut split = Events::default();
    for piece in splits::pieces(input.stream, &input.cuts) {
        split.feed(piece);
    }
    assert_eq!(split.tokens(), want, "frames cut at {:?}", input.cuts);
    let mut bytewise = Events::default();
    for b in input.stream {
        bytewise.feed(std::slice::from_ref(b));
    }
    assert_eq!(bytewise.tokens(), want, "byte by byte");
});
