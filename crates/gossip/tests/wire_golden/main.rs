//! Golden wire samples: what each release sends, pinned, and read by this one.
//!
//! Replicas of different releases gossip with each other during every rolling upgrade, so the
//! wire format crosses releases as well as processes. Each file here holds one release's sealed
//! samples of every kind it sends (`samples.rs`); `current.txt` is this release's and the others
//! were written by earlier releases (`regenerate.sh <ref> <file>`). Against every file:
//! - each datagram opens under the shared secret with its header intact (the envelope has not
//!   changed), and its payload decodes to the sample's values: this release reads what that one
//!   sent;
//! - this release encodes every sample that release has byte for byte as it did: that release
//!   reads what this one sends exactly as it read its own (a `load_sized` datagram, which it
//!   predates, it drops as an unknown kind, and it is sent `load` as well until it is heard
//!   sending sizes: `flush.rs`);
//! - its membership announce is accepted by this release's membership protocol.
//!
//! An intended format change rewrites `current.txt` (`KVGATE_UPDATE_GOLDEN=1 cargo test -p
//! kvgate-gossip --test wire_golden`), and the earlier files then say which releases it breaks.

mod samples;

use kvgate_gossip::wire::envelope::{Keys, OVERHEAD};
use kvgate_gossip::wire::payload::{
    decode_chunk, decode_delta, decode_load, decode_load_sized, decode_resend,
    decode_snapshot_request, decode_usage, encode_load_sized, DecodeSizes, LoadShare,
};
use kvgate_gossip::wire::Kind;
use samples::*;

/// Every release's golden file: (file, contents).
const RELEASES: [(&str, &str); 3] = [
    ("current.txt", include_str!("current.txt")),
    (
        "before_load_sized.txt",
        include_str!("before_load_sized.txt"),
    ),
    ("first_with_usage.txt", include_str!("first_with_usage.txt")),
];

struct Sample {
    name: String,
    kind: u8,
    payload: Vec<u8>,
    datagram: Vec<u8>,
}

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn parse(file: &str, text: &str) -> Vec<Sample> {
    let samples: Vec<Sample> = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(
                f.len(),
                4,
                "{file}: a line is `name kind payload datagram`: {l}"
            );
            Sample {
                name: f[0].to_owned(),
                kind: f[1].parse().expect("a kind byte"),
                payload: unhex(f[2]),
                datagram: unhex(f[3]),
            }
        })
        .collect();
    assert!(!samples.is_empty(), "{file} holds no samples");
    samples
}

/// The sizes the `load_sized` sample gives its shares: the first and last decoding, the empty
/// one none (sent as zeros).
fn sized_shares() -> Vec<LoadShare> {
    let mut shares = load_shares();
    shares[0].sizes = Some(DecodeSizes {
        context_tokens: 2 * 9_000,
        output_tokens: 2 * 300,
    });
    shares[1].sizes = Some(DecodeSizes::default());
    shares[2].sizes = Some(DecodeSizes {
        context_tokens: u64::MAX,
        output_tokens: u64::MAX,
    });
    shares
}

/// This release's samples: every earlier one's, and what only this release sends.
fn this_release() -> Vec<(&'static str, Kind, Vec<u8>)> {
    let mut all = payloads();
    let mut p = Vec::new();
    encode_load_sized(&sized_shares(), &mut p);
    all.push(("load_sized", Kind::LoadSized, p));
    all
}

#[test]
fn the_current_file_is_this_releases_samples() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/wire_golden/current.txt");
    if std::env::var_os("KVGATE_UPDATE_GOLDEN").is_some() {
        std::fs::write(path, render(&this_release())).expect("writing current.txt");
        return; // checked by the next run, which compiles the file in
    }
    // Every kind has a sample, so a new kind cannot go unpinned.
    let file = parse("current.txt", RELEASES[0].1);
    for kind in (0..=u8::MAX).filter_map(Kind::from_u8) {
        assert!(
            file.iter().any(|s| s.kind == kind as u8),
            "current.txt has no {} sample: add one (samples.rs, or this file for a new kind) \
             and rewrite it with KVGATE_UPDATE_GOLDEN=1",
            kind.label()
        );
    }
    let names: Vec<&str> = file.iter().map(|s| s.name.as_str()).collect();
    let ours: Vec<&str> = this_release().iter().map(|s| s.0).collect();
    assert_eq!(
        names, ours,
        "current.txt is stale: rewrite it with KVGATE_UPDATE_GOLDEN=1"
    );
}

#[test]
fn every_releases_datagrams_open_with_their_headers() {
    let keys = Keys::new(CLUSTER, SECRET);
    for (file, text) in RELEASES {
        for (n, s) in parse(file, text).iter().enumerate() {
            let mut plain = Vec::new();
            let h = keys
                .open(&s.datagram, 65_536, &mut plain)
                .unwrap_or_else(|e| panic!("{file} {}: refused ({})", s.name, e.label()));
            let counter = n as u64 + 1;
            assert_eq!(h.kind as u8, s.kind, "{file} {}: kind", s.name);
            assert_eq!(h.sender, SENDER, "{file} {}: sender", s.name);
            assert_eq!(h.counter, counter, "{file} {}: counter", s.name);
            assert_eq!(
                h.wall_ms,
                WALL_MS + counter,
                "{file} {}: wall clock",
                s.name
            );
            assert_eq!(plain, s.payload, "{file} {}: payload", s.name);
            assert_eq!(
                s.datagram.len(),
                s.payload.len() + OVERHEAD,
                "{file} {}",
                s.name
            );
            // Another cluster or secret still refuses it.
            let other = Keys::new(CLUSTER, b"another-secret-0123456789");
            assert!(other.open(&s.datagram, 65_536, &mut plain).is_err());
        }
    }
}

#[test]
fn this_release_sends_every_earlier_kind_byte_for_byte() {
    let ours = this_release();
    for (file, text) in RELEASES {
        for s in parse(file, text) {
            let mine = ours
                .iter()
                .find(|o| o.0 == s.name)
                .unwrap_or_else(|| panic!("{file} {}: this release no longer sends it", s.name));
            assert_eq!(mine.1 as u8, s.kind, "{file} {}: kind byte", s.name);
            assert_eq!(
                hex(&mine.2),
                hex(&s.payload),
                "{file} {}: this release encodes it differently",
                s.name
            );
        }
    }
}

#[test]
fn every_releases_payloads_decode_to_the_samples_values() {
    for (file, text) in RELEASES {
        for s in parse(file, text) {
            let p = &s.payload;
            let what = format!("{file} {}", s.name);
            match s.name.as_str() {
                "delta" => {
                    let d = decode_delta(p).expect(&what);
                    assert_eq!((d.seq, d.stride), (7, 1), "{what}");
                    assert_eq!(d.entries, decisions(WALL_MS, true), "{what}");
                }
                "delta_checkpoints" => {
                    let d = decode_delta(p).expect(&what);
                    assert_eq!((d.seq, d.stride), (8, 16), "{what}");
                    assert_eq!(d.entries, decisions(WALL_MS, false), "{what}");
                }
                "snapshot_chunk" => {
                    let (h, e) = decode_chunk(p).expect(&what);
                    assert_eq!(
                        (h.request_id, h.chunk, h.last),
                        (SNAPSHOT_REQUEST_ID, 2, true)
                    );
                    assert_eq!(e, decisions(0, false), "{what}");
                }
                "load" => assert_eq!(decode_load(p).expect(&what), load_shares(), "{what}"),
                "load_sized" => {
                    assert_eq!(decode_load_sized(p).expect(&what), sized_shares(), "{what}")
                }
                "snapshot_request" => {
                    assert_eq!(
                        decode_snapshot_request(p),
                        Ok(SNAPSHOT_REQUEST_ID),
                        "{what}"
                    )
                }
                "resend_request" => assert_eq!(decode_resend(p), Ok(RESEND), "{what}"),
                "usage" => assert_eq!(decode_usage(p).expect(&what), USAGE.to_vec(), "{what}"),
                "membership_announce" => {} // below
                other => panic!("{file}: no expectation for sample {other}"),
            }
        }
    }
}

#[test]
fn every_releases_announce_is_answered_by_this_release() {
    for (file, text) in RELEASES {
        let s = parse(file, text)
            .into_iter()
            .find(|s| s.name == "membership_announce")
            .unwrap_or_else(|| panic!("{file} has no membership announce"));
        let mut foca = member(SEED, 0x5eed_0000_0000_0002);
        let mut rt = foca::AccumulatingRuntime::new();
        foca.handle_data(&s.payload, &mut rt)
            .unwrap_or_else(|e| panic!("{file}: announce refused: {e}"));
        let announcer: Vec<_> = foca.iter_members().map(|m| m.id().clone()).collect();
        assert_eq!(announcer.len(), 1, "{file}: the announcer joined");
        assert_eq!(announcer[0].addr, addr(ANNOUNCER), "{file}");
        assert_eq!(announcer[0].node, SENDER, "{file}");
        let (to, _) = rt.to_send().unwrap_or_else(|| panic!("{file}: no reply"));
        assert_eq!(
            to.addr,
            addr(ANNOUNCER),
            "{file}: the reply goes to the announcer"
        );
    }
}
