//! Gossip datagram decoding on arbitrary bytes (`kvgate_gossip::wire`): the envelope opener and
//! every payload decoder never panic, and what they allocate stays within a small multiple of
//! the input's length (a lying count cannot make a receiver allocate more).
#![no_main]

use kvgate_gossip::wire::envelope::{Keys, OVERHEAD};
use kvgate_gossip::wire::payload::{
    decode_chunk, decode_delta, decode_load, decode_load_sized, decode_resend,
    decode_snapshot_request, decode_usage, Entry, LoadShare, Usage,
};
use libfuzzer_sys::fuzz_target;
use std::mem::size_of;

fn entries_bytes(e: &Vec<Entry>) -> usize {
    e.capacity() * size_of::<Entry>() + e.iter().map(|x| x.hashes.capacity() * 8).sum::<usize>()
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, p)) = data.split_first() else {
        return;
    };
    // Decoders allocate at most this much: every entry takes ≥ 11 bytes, a load share ≥ 12.
    let bound = 5 * p.len() + 64;
    match sel % 8 {
        0 => {
            let keys = Keys::new("fuzz", b"secret");
            let mut payload = Vec::new();
            if keys.open(p, 65_536, &mut payload).is_ok() {
                panic!(
                    "forged datagram authenticated ({} bytes)",
                    payload.len() + OVERHEAD
                );
            }
        }
        1 => {
            if let Ok(d) = decode_delta(p) {
                assert!(d.stride > 0);
                assert!(entries_bytes(&d.entries) <= bound);
            }
        }
        2 => {
            if let Ok((_, e)) = decode_chunk(p) {
                assert!(entries_bytes(&e) <= bound);
            }
        }
        3 => {
            if let Ok(l) = decode_load(p) {
                assert!(l.capacity() * size_of::<LoadShare>() <= bound);
            }
        }
        4 => {
            let _ = decode_snapshot_request(p);
        }
        5 => {
            let _ = decode_resend(p);
        }
        6 => {
            if let Ok(l) = decode_load_sized(p) {
                assert!(l.capacity() * size_of::<LoadShare>() <= bound);
            }
        }
        _ => {
            // Every usage entry takes ≥ 10 bytes.
            if let Ok(u) = decode_usage(p) {
                assert!(u.capacity() * size_of::<Usage>() <= bound);
            }
        }
    }
});
