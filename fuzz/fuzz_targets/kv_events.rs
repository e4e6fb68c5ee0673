//! KV-event batch decoding (`kvgate_events::decode_batch`) against `rmpv`: whenever rmpv reads
//! the payload as one msgpack value, kvgate accepts it exactly when the reference decoding of
//! that value (from the decoder's documented shapes) does, with the same batch; whatever rmpv
//! cannot read (malformed, truncated, trailing bytes) kvgate rejects. Never panics. One known
//! difference is allowed: rmpv reads the reserved marker 0xc1 as nil, kvgate refuses it.
#![no_main]

use kvgate_events::msgpack::MsgError;
use kvgate_events::{decode_batch, DecodeError, DecodeLimits, Dialect};
use kvgate_fuzz::msgpack::{batch, depth};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, payload)) = data.split_first() else {
        return;
    };
    let dialect = if sel & 1 == 0 {
        Dialect::Vllm
    } else {
        Dialect::Sglang
    };
    let limits = DecodeLimits::default();
    let got = decode_batch(payload, dialect, &limits);
    let mut cursor = payload;
    let value = rmpv::decode::read_value(&mut cursor);
    let value = match value {
        Ok(v) if cursor.is_empty() => v,
        Ok(_) => {
            assert!(
                got.is_err(),
                "accepted trailing bytes after the batch: {got:?}"
            );
            return;
        }
        Err(e) => {
            assert!(
                got.is_err(),
                "accepted what rmpv cannot read ({e}): {got:?}"
            );
            return;
        }
    };
    let want = batch(&value, dialect);
    match (got, want) {
        (Ok(mut g), Ok(mut w)) => {
            // NaN timestamps compare by bits.
            assert_eq!(g.ts.to_bits(), w.ts.to_bits(), "ts");
            g.ts = 0.0;
            w.ts = 0.0;
            assert_eq!(g, w, "{value}");
        }
        (Err(_), Err(_)) => {}
        (Err(DecodeError::Msgpack(MsgError::TooDeep(n))), Ok(_)) => {
            assert!(depth(&value) > n, "TooDeep at depth {}", depth(&value));
        }
        (Err(DecodeError::TooLong { .. }), Ok(_)) => {}
        // rmpv reads the reserved marker 0xc1 as nil; the msgpack spec says it is never used,
        // and kvgate refuses it.
        (Err(DecodeError::Msgpack(MsgError::Invalid(at))), Ok(_)) => {
            assert_eq!(payload.get(at).copied(), Some(0xc1));
        }
        // The same marker where a typed value (an integer, a string) was expected.
        (Err(DecodeError::Msgpack(MsgError::Type { at, marker, .. })), Ok(_)) if marker == 0xc1 => {
            assert_eq!(payload.get(at).copied(), Some(0xc1));
        }
        (got, want) => panic!("decode_batch {got:?} vs reference {want:?} for {value}"),
    }
});
