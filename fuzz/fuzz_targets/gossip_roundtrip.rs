//! Gossip encode → seal → open → decode round trip of arbitrary structured messages
//! (`kvgate_gossip::wire`): every message comes back as sent (entries split to the builder's
//! budget, which the encoding respects), and any single changed byte fails authentication.
#![no_main]

use arbitrary::Arbitrary;
use kvgate_gossip::wire::envelope::{Header, Keys};
use kvgate_gossip::wire::payload::*;
use kvgate_gossip::wire::Kind;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Decision {
    key: u64,
    decided_wall_ms: u64,
    ttl_ms: u64,
    hashes: Vec<u64>,
}

#[derive(Arbitrary, Debug)]
struct Share {
    key: u64,
    in_flight: u32,
    pending: u64,
    decoding: u32,
    healthy: Option<bool>,
    /// Context and output tokens of the decoding requests, sent in `load_sized`.
    sizes: (u64, u64),
}

#[derive(Arbitrary, Debug)]
enum Msg {
    Delta {
        seq: u64,
        stride: u64,
        base: u64,
        budget: u16,
        decisions: Vec<Decision>,
    },
    Chunk {
        request_id: u64,
        chunk: u64,
        last: bool,
        budget: u16,
        decisions: Vec<Decision>,
    },
    Load(Vec<Share>),
    LoadSized(Vec<Share>),
    Snapshot(u64),
    Resend(u64, u64),
}

#[derive(Arbitrary, Debug)]
struct Input {
    msg: Msg,
    sender: u64,
    counter: u64,
    wall_ms: u64,
    flip: u16,
    flip_bits: u8,
}

/// Fills a builder; the entries a decoder must return.
fn build(base: u64, budget: u16, ds: &[Decision]) -> (EntriesBuilder, Vec<Entry>) {
    let mut b = EntriesBuilder::new(base, usize::from(budget));
    let mut want = Vec::new();
    for d in ds {
        let n = b.push(d.key, d.decided_wall_ms, d.ttl_ms, &d.hashes);
        assert!(n <= d.hashes.len());
        if n == 0 {
            continue;
        }
        // Times travel as an age against the batch's base: unknown (0) or future decisions
        // arrive as the base itself; with no base, as unknown.
        let decided = if base == 0 {
            0
        } else if d.decided_wall_ms == 0 || d.decided_wall_ms > base {
            base
        } else {
            d.decided_wall_ms
        };
        want.push(Entry {
            instance_key: d.key,
            decided_wall_ms: decided,
            ttl_ms: d.ttl_ms,
            hashes: d.hashes[..n].to_vec(),
        });
    }
    (b, want)
}

fuzz_target!(|input: Input| {
    let mut payload = Vec::new();
    let kind = match &input.msg {
        Msg::Delta {
            seq,
            stride,
            base,
            budget,
            decisions,
        } => {
            let stride = (*stride).max(1);
            let (b, want) = build(*base, *budget, decisions);
            let mut section = Vec::new();
            build(*base, *budget, decisions).0.finish_into(&mut section);
            if usize::from(*budget) >= ENTRIES_HEADER_MAX {
                assert!(section.len() <= usize::from(*budget), "entries over budget");
            }
            encode_delta(*seq, stride, b, &mut payload);
            let d = decode_delta(&payload).expect("own delta decodes");
            assert_eq!((d.seq, d.stride, d.entries), (*seq, stride, want));
            Kind::Delta
        }
        Msg::Chunk {
            request_id,
            chunk,
            last,
            budget,
            decisions,
        } => {
            let (b, want) = build(0, *budget, decisions);
            let h = ChunkHeader {
                request_id: *request_id,
                chunk: *chunk,
                last: *last,
            };
            encode_chunk(h, b, &mut payload);
            assert_eq!(
                decode_chunk(&payload).expect("own chunk decodes"),
                (h, want)
            );
            Kind::SnapshotChunk
        }
        Msg::Load(shares) | Msg::LoadSized(shares) => {
            let sized = matches!(input.msg, Msg::LoadSized(_));
            let shares: Vec<LoadShare> = shares
                .iter()
                .map(|s| LoadShare {
                    instance_key: s.key,
                    in_flight: s.in_flight,
                    pending_prefill_tokens: s.pending,
                    decoding: s.decoding,
                    healthy: s.healthy,
                    sizes: sized.then_some(DecodeSizes {
                        context_tokens: s.sizes.0,
                        output_tokens: s.sizes.1,
                    }),
                })
                .collect();
            if sized {
                encode_load_sized(&shares, &mut payload);
                assert!(payload.len() <= 1 + 10 + shares.len() * MAX_LOAD_SHARE_BYTES);
                assert_eq!(decode_load_sized(&payload).expect("own load decodes"), shares);
                Kind::LoadSized
            } else {
                encode_load(&shares, &mut payload);
                assert_eq!(decode_load(&payload).expect("own load decodes"), shares);
                Kind::Load
            }
        }
        Msg::Snapshot(id) => {
            encode_snapshot_request(*id, &mut payload);
            assert_eq!(decode_snapshot_request(&payload), Ok(*id));
            Kind::SnapshotRequest
        }
        Msg::Resend(a, b) => {
            let (from, to) = ((*a).min(*b), (*a).max(*b));
            encode_resend(from, to, &mut payload);
            assert_eq!(decode_resend(&payload), Ok((from, to)));
            Kind::ResendRequest
        }
    };
    let keys = Keys::new("fuzz-cluster", b"fuzz-secret");
    let header = Header {
        kind,
        sender: input.sender,
        counter: input.counter,
        wall_ms: input.wall_ms,
    };
    let mut sealed = Vec::new();
    keys.seal(&header, &payload, &mut sealed);
    let mut opened = Vec::new();
    let h = keys
        .open(&sealed, usize::MAX, &mut opened)
        .expect("own datagram opens");
    assert_eq!((h, &opened[..]), (header, &payload[..]));
    if input.flip_bits != 0 {
        let at = usize::from(input.flip) % sealed.len();
        sealed[at] ^= input.flip_bits;
        assert!(
            keys.open(&sealed, usize::MAX, &mut opened).is_err(),
            "changed byte {at} still opens"
        );
    }
    assert!(Keys::new("other-cluster", b"fuzz-secret")
        .open(&sealed, usize::MAX, &mut opened)
        .is_err());
});
