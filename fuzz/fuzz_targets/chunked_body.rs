//! The upstream body decoder (`kvgate::client::body::Decoder`) over fuzzer-chosen splits of the
//! input: chunked bodies decode to what a simple whole-input reference decoder gives (data,
//! where the body ends, or that it is malformed / incomplete); fixed-length and close-delimited
//! bodies pass exactly their bytes.
#![no_main]

use arbitrary::Arbitrary;
use bytes::BytesMut;
use kvgate::client::body::{Decoder, Step, MAX_LINE_BYTES, MAX_TRAILER_BYTES};
use kvgate::client::wire::Framing;
use kvgate_fuzz::chunked::{chunked, Outcome};
use kvgate_fuzz::splits;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input<'a> {
    /// 0..: chunked; a length for `Length`; close-delimited.
    framing: u8,
    length: u16,
    cuts: Vec<u8>,
    body: &'a [u8],
}

/// Feeds `pieces` to a decoder as reads would arrive: data yielded, how it ended, bytes left.
fn decode(framing: Framing, pieces: &[&[u8]]) -> (Vec<u8>, Outcome, Vec<u8>) {
    let mut d = Decoder::new(framing);
    let mut buf = BytesMut::new();
    let mut data = Vec::new();
    let total: usize = pieces.iter().map(|p| p.len()).sum();
    let mut fed = 0;
    let mut pieces = pieces.iter();
    // Every step consumes bytes or asks for more, so this ends; the bound makes sure.
    for _ in 0..4 * total + 2 * pieces.len() + 16 {
        match d.step(&mut buf) {
            Ok(Step::Data(b)) => {
                assert!(!b.is_empty(), "empty data step");
                data.extend_from_slice(&b);
            }
            Ok(Step::Again) => {}
            Ok(Step::End) => {
                assert!(d.is_done());
                let mut rest = buf.to_vec();
                pieces.for_each(|p| rest.extend_from_slice(p));
                return (data, Outcome::End(fed - buf.len()), rest);
            }
            Ok(Step::NeedMore) => match pieces.next() {
                Some(p) => {
                    buf.extend_from_slice(p);
                    fed += p.len();
                }
                None => return (data, Outcome::Incomplete, buf.to_vec()),
            },
            Err(_) => return (data, Outcome::Error, Vec::new()),
        }
    }
    panic!("decoder made no progress");
}

fuzz_target!(|input: Input<'_>| {
    let pieces = splits::pieces(input.body, &input.cuts);
    let framing = match input.framing % 4 {
        0 | 1 => Framing::Chunked,
        2 => Framing::Length(u64::from(input.length)),
        _ => Framing::UntilClose,
    };
    let (data, outcome, rest) = decode(framing, &pieces);
    let whole = decode(framing, &[input.body]);
    assert_eq!(
        (&data, outcome),
        (&whole.0, whole.1),
        "split changed the result"
    );
    match framing {
        Framing::Chunked => {
            let (want, want_outcome) = chunked(input.body, MAX_LINE_BYTES, MAX_TRAILER_BYTES);
            assert_eq!(
                outcome,
                want_outcome,
                "{:?}",
                String::from_utf8_lossy(input.body)
            );
            assert_eq!(data, want, "data");
            if let Outcome::End(n) = outcome {
                assert_eq!(rest, &input.body[n..], "bytes after the body");
            }
        }
        Framing::Length(_) => {
            let n = usize::from(input.length);
            let ended = input.body.len() >= n;
            assert_eq!(data, &input.body[..n.min(input.body.len())]);
            assert_eq!(outcome == Outcome::End(n), ended, "{outcome:?}");
        }
        _ => {
            assert_eq!(data, input.body);
            assert_eq!(outcome, Outcome::Incomplete);
        }
    }
});
