//! The sample datagrams of the wire-format golden files: one or more of every kind, encoded by the
//! compiled release's own encoders and sealed under a fixed cluster and secret.
//!
//! This file is compiled by the current test (`main.rs`) and, unchanged, against earlier releases
//! by `regenerate.sh`, so it uses only API every release since the first with usage datagrams
//! has (the earliest golden file's): that is what lets one golden file per release say what that
//! release sent. Samples added here must keep to it (a kind a release lacks belongs in `main.rs`,
//! as `load_sized` does).

use kvgate_gossip::membership::NodeIdentity;
use kvgate_gossip::wire::envelope::{Header, Keys};
use kvgate_gossip::wire::payload::{
    encode_chunk, encode_delta, encode_load, encode_resend, encode_snapshot_request, encode_usage,
    ChunkHeader, EntriesBuilder, Entry, LoadShare,
};
use kvgate_gossip::wire::Kind;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::num::NonZeroU32;

/// The cluster every sample is sealed for.
pub const CLUSTER: &str = "golden";
/// The secret every sample is sealed under.
pub const SECRET: &[u8] = b"golden-secret-0123456789";
/// The sender id in every sample's header.
pub const SENDER: u64 = 0x5eed_0000_0000_0001;
/// The wall clock of the first sample's header; the n-th (from 1) carries `WALL_MS + n`.
pub const WALL_MS: u64 = 1_700_000_000_000;
/// Where the announcing replica of the membership sample listens.
pub const ANNOUNCER: &str = "10.0.0.1:7946";
/// The seed address it announces to.
pub const SEED: &str = "10.0.0.2:7946";

/// The load shares of the `load` sample: typical, empty, and every field at its widest.
pub fn load_shares() -> Vec<LoadShare> {
    let share = |instance_key, in_flight, pending_prefill_tokens, decoding, healthy| {
        #[allow(clippy::needless_update)]
        LoadShare {
            instance_key,
            in_flight,
            pending_prefill_tokens,
            decoding,
            healthy,
            ..Default::default()
        }
    };
    vec![
        share(0x1111_2222_3333_4444, 3, 4096, 2, Some(true)),
        share(2, 0, 0, 0, None),
        share(u64::MAX, u32::MAX, u64::MAX, u32::MAX, Some(false)),
    ]
}

/// The usage sample's entries.
pub const USAGE: [(u64, u64, u64); 2] = [(1, 2, 3), (u64::MAX, 0, 1 << 40)];
/// The snapshot request sample's id.
pub const SNAPSHOT_REQUEST_ID: u64 = 0x0123_4567_89ab_cdef;
/// The resend request sample's range.
pub const RESEND: (u64, u64) = (10, 300);

/// The decisions of the entry samples: one, decided 100 ms before `base_wall_ms` (0: unknown,
/// as in snapshots), and with `with_retraction` a second whose ttl of 0 takes a decision back.
pub fn decisions(base_wall_ms: u64, with_retraction: bool) -> Vec<Entry> {
    let decided_wall_ms = base_wall_ms.saturating_sub(100);
    let mut d = vec![Entry {
        instance_key: 0x1111_2222_3333_4444,
        decided_wall_ms,
        ttl_ms: 120_000,
        hashes: vec![1, u64::MAX, 0xdead_beef],
    }];
    if with_retraction {
        d.push(Entry {
            instance_key: 5,
            decided_wall_ms,
            ttl_ms: 0,
            hashes: vec![42],
        });
    }
    d
}

fn entries(base_wall_ms: u64, with_retraction: bool) -> EntriesBuilder {
    let mut e = EntriesBuilder::new(base_wall_ms, 60_000);
    for d in decisions(base_wall_ms, with_retraction) {
        e.push(d.instance_key, d.decided_wall_ms, d.ttl_ms, &d.hashes);
    }
    e
}

/// The membership protocol as a replica runs it.
pub type Membership =
    foca::Foca<NodeIdentity, foca::PostcardCodec, rand::rngs::StdRng, foca::NoCustomBroadcast>;

/// A replica's membership protocol, listening at `at` with node id `node`.
pub fn member(at: &str, node: u64) -> Membership {
    let me = NodeIdentity {
        addr: addr(at),
        node,
        epoch: WALL_MS * 1000,
        bump: 0,
    };
    let config = foca::Config::new_lan(NonZeroU32::MIN.saturating_add(7));
    foca::Foca::new(me, config, rand::make_rng(), foca::PostcardCodec)
}

/// The membership sample: a replica's first announce to a seed, as foca encodes it.
pub fn announce() -> Vec<u8> {
    let mut foca = member(ANNOUNCER, SENDER);
    let mut rt = foca::AccumulatingRuntime::new();
    foca.announce(NodeIdentity::seed(addr(SEED)), &mut rt)
        .expect("announcing to a seed");
    let (_, data) = rt.to_send().expect("an announce to send");
    data.to_vec()
}

/// An address constant as a socket address.
pub fn addr(s: &str) -> SocketAddr {
    s.parse().expect("a literal socket address")
}

/// Every sample this release and all earlier ones since wire version 2 can send: a name, its
/// kind and its payload.
pub fn payloads() -> Vec<(&'static str, Kind, Vec<u8>)> {
    let mut out = Vec::new();
    let mut p = Vec::new();
    encode_delta(7, 1, entries(WALL_MS, true), &mut p);
    out.push(("delta", Kind::Delta, p.clone()));
    encode_delta(8, 16, entries(WALL_MS, false), &mut p);
    out.push(("delta_checkpoints", Kind::Delta, p.clone()));
    let chunk = ChunkHeader {
        request_id: SNAPSHOT_REQUEST_ID,
        chunk: 2,
        last: true,
    };
    encode_chunk(chunk, entries(0, false), &mut p);
    out.push(("snapshot_chunk", Kind::SnapshotChunk, p.clone()));
    encode_load(&load_shares(), &mut p);
    out.push(("load", Kind::Load, p.clone()));
    encode_snapshot_request(SNAPSHOT_REQUEST_ID, &mut p);
    out.push(("snapshot_request", Kind::SnapshotRequest, p.clone()));
    encode_resend(RESEND.0, RESEND.1, &mut p);
    out.push(("resend_request", Kind::ResendRequest, p.clone()));
    encode_usage(&USAGE, &mut p);
    out.push(("usage", Kind::Usage, p.clone()));
    out.push(("membership_announce", Kind::Membership, announce()));
    out
}

/// Seals each payload (the n-th from 1 with counter n and wall clock `WALL_MS + n`) and renders
/// one line per sample: `name kind payload_hex datagram_hex`.
pub fn render(samples: &[(&'static str, Kind, Vec<u8>)]) -> String {
    let keys = Keys::new(CLUSTER, SECRET);
    let mut out = String::new();
    let mut datagram = Vec::new();
    for (n, (name, kind, payload)) in samples.iter().enumerate() {
        let counter = n as u64 + 1;
        let h = Header {
            kind: *kind,
            sender: SENDER,
            counter,
            wall_ms: WALL_MS + counter,
        };
        keys.seal(&h, payload, &mut datagram);
        let _ = writeln!(
            out,
            "{name} {} {} {}",
            *kind as u8,
            hex(payload),
            hex(&datagram)
        );
    }
    out
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter()
        .fold(String::with_capacity(2 * b.len()), |mut s, x| {
            let _ = write!(s, "{x:02x}");
            s
        })
}
