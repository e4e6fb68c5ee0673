//! Payload encodings.
//!
//! ```text
//! delta          = seq:varint stride:varint entries   (stride 1: every block hash; above:
//!                  checkpoints, see `crate::checkpoints`)
//! snapshot_chunk = request_id:u64 chunk:varint last:u8 entries
//! entries        = base_wall_ms:varint (0 = unknown) n:varint entry*n
//! entry          = instance_key:u64 age_ms:varint ttl_ms:varint count:varint hash:u64*count
//! load           = n:varint (instance_key:u64 in_flight:varint pending_prefill:varint
//!                            decoding:varint health:u8)*n
//! load_sized     = n:varint (instance_key:u64 in_flight:varint pending_prefill:varint
//!                            decoding:varint health:u8 context_tokens:varint
//!                            output_tokens:varint)*n
//! snapshot_req   = request_id:u64
//! resend_req     = from:varint to:varint
//! usage          = n:varint (tenant_key:u64 requests:varint tokens:varint)*n
//! ```
//! A usage datagram carries cumulative totals since the sender started, so it is idempotent:
//! receivers charge only what grew (`kvgate_core::ratelimit::PeerLedger`).
//! `load_sized` is `load` with the sizes of each instance's decoding requests; receivers read
//! both, and replicas that predate it drop it as an unknown kind.
//! In a delta, an entry with `ttl_ms` 0 takes a decision back (its request never reached the
//! instance): receivers drop their predictions and checkpoints of those hashes there. Receivers
//! that predate retractions ignore it, as they ignore any expired entry.
//!
//! Block hashes are XXH3 outputs, uniformly random, so they are sent as raw 8 bytes: no encoding
//! shrinks them. Everything else is a varint.
//!
//! Invariants: decoders check every count against the bytes left before allocating, so a lying
//! count cannot make a receiver allocate more than the datagram's size.

use super::{put_varint, varint_len, Malformed, Reader};
use kvgate_core::BlockHash;

/// One decision (or a slice of one): `instance_key` will hold `hashes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Wire key of the instance ([`crate::instance_key`]).
    pub instance_key: u64,
    /// Origin wall clock (ms since epoch) when the decision was made; 0 = unknown (snapshots).
    pub decided_wall_ms: u64,
    /// Remaining time-to-live at encoding.
    pub ttl_ms: u64,
    /// Block hashes.
    pub hashes: Vec<BlockHash>,
}

/// Bytes an entry header takes at most (key + three 10-byte varints).
pub const ENTRY_HEADER_MAX: usize = 8 + 3 * 10;
/// Bytes an `entries` header takes at most.
pub const ENTRIES_HEADER_MAX: usize = 2 * 10;

/// Incrementally builds an `entries` section within a byte budget, splitting entries that do not
/// fit (predictions are per block, so a split entry means the same as the whole).
pub struct EntriesBuilder {
    base_wall_ms: u64,
    budget: usize,
    body: Vec<u8>,
    count: u64,
}

impl EntriesBuilder {
    /// A builder whose output (header included) stays within `budget` bytes.
    pub fn new(base_wall_ms: u64, budget: usize) -> Self {
        Self {
            base_wall_ms,
            budget,
            body: Vec::new(),
            count: 0,
        }
    }

    /// True when nothing was added.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn used(&self) -> usize {
        ENTRIES_HEADER_MAX + self.body.len()
    }

    /// Adds as many of `hashes` as fit; returns how many were taken (0 = full, start another).
    pub fn push(&mut self, key: u64, decided_wall_ms: u64, ttl_ms: u64, hashes: &[u64]) -> usize {
        let age = if decided_wall_ms == 0 {
            0
        } else {
            self.base_wall_ms.saturating_sub(decided_wall_ms)
        };
        let left = self.budget.saturating_sub(self.used());
        if left < ENTRY_HEADER_MAX + 8 || hashes.is_empty() {
            return 0;
        }
        let n = hashes.len().min((left - ENTRY_HEADER_MAX) / 8);
        self.body.extend_from_slice(&key.to_le_bytes());
        put_varint(&mut self.body, age);
        put_varint(&mut self.body, ttl_ms);
        put_varint(&mut self.body, n as u64);
        self.body.reserve(n * 8);
        for h in &hashes[..n] {
            self.body.extend_from_slice(&h.to_le_bytes());
        }
        self.count += 1;
        n
    }

    /// Appends the finished section to `out`.
    pub fn finish_into(self, out: &mut Vec<u8>) {
        put_varint(out, self.base_wall_ms);
        put_varint(out, self.count);
        out.extend_from_slice(&self.body);
    }
}

/// Decodes an `entries` section, consuming the rest of `r`.
pub fn decode_entries(r: &mut Reader<'_>) -> Result<Vec<Entry>, Malformed> {
    let base = r.varint()?;
    let n = r.varint()?;
    // Smallest entry: 8-byte key + three 1-byte varints.
    if n > (r.remaining() / 11) as u64 {
        return Err(Malformed);
    }
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let instance_key = r.u64()?;
        let age = r.varint()?;
        let ttl_ms = r.varint()?;
        let count = r.varint()?;
        if count > (r.remaining() / 8) as u64 {
            return Err(Malformed);
        }
        let mut hashes = Vec::with_capacity(count as usize);
        for _ in 0..count {
            hashes.push(r.u64()?);
        }
        let decided_wall_ms = if base == 0 {
            0
        } else {
            base.saturating_sub(age)
        };
        out.push(Entry {
            instance_key,
            decided_wall_ms,
            ttl_ms,
            hashes,
        });
    }
    Ok(out)
}

/// A decoded delta batch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    /// Per-sender batch sequence number.
    pub seq: u64,
    /// 1 = entries carry every block hash; n > 1 = checkpoint hashes at stride n.
    pub stride: u64,
    /// The decisions.
    pub entries: Vec<Entry>,
}

/// Encodes a delta batch.
pub fn encode_delta(seq: u64, stride: u64, entries: EntriesBuilder, out: &mut Vec<u8>) {
    out.clear();
    put_varint(out, seq);
    put_varint(out, stride);
    entries.finish_into(out);
}

/// Decodes a delta batch.
pub fn decode_delta(p: &[u8]) -> Result<Delta, Malformed> {
    let mut r = Reader::new(p);
    let seq = r.varint()?;
    let stride = r.varint()?;
    if stride == 0 {
        return Err(Malformed);
    }
    let entries = decode_entries(&mut r)?;
    r.finish()?;
    Ok(Delta {
        seq,
        stride,
        entries,
    })
}

/// Header of a snapshot chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    /// Echo of the request's id.
    pub request_id: u64,
    /// Chunk number from 0.
    pub chunk: u64,
    /// True on the final chunk.
    pub last: bool,
}

/// Bytes a chunk header takes at most.
pub const CHUNK_HEADER_MAX: usize = 8 + 10 + 1;

/// Encodes a snapshot chunk.
pub fn encode_chunk(h: ChunkHeader, entries: EntriesBuilder, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&h.request_id.to_le_bytes());
    put_varint(out, h.chunk);
    out.push(u8::from(h.last));
    entries.finish_into(out);
}

/// Decodes a snapshot chunk.
pub fn decode_chunk(p: &[u8]) -> Result<(ChunkHeader, Vec<Entry>), Malformed> {
    let mut r = Reader::new(p);
    let request_id = r.u64()?;
    let chunk = r.varint()?;
    let last = match r.u8()? {
        0 => false,
        1 => true,
        _ => return Err(Malformed),
    };
    let e = decode_entries(&mut r)?;
    r.finish()?;
    Ok((
        ChunkHeader {
            request_id,
            chunk,
            last,
        },
        e,
    ))
}

/// One instance's load and health as seen by the sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LoadShare {
    /// Wire key of the instance.
    pub instance_key: u64,
    /// Requests the sender has in flight there.
    pub in_flight: u32,
    /// Uncached prefill tokens the sender dispatched there that have not produced a first token.
    pub pending_prefill_tokens: u64,
    /// The sender's requests there that are decoding.
    pub decoding: u32,
    /// The sender's health observation: None = no opinion.
    pub healthy: Option<bool>,
    /// The sizes of the `decoding` requests: None from a `load` datagram, which predates them.
    pub sizes: Option<DecodeSizes>,
}

/// The sizes of the requests a [`LoadShare`] counts as decoding, in total.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DecodeSizes {
    /// Their context tokens (each: its prompt plus half its expected output).
    pub context_tokens: u64,
    /// Their expected output tokens.
    pub output_tokens: u64,
}

/// The most bytes one share takes in a `load_sized` datagram (a `load` one takes 20 fewer).
pub const MAX_LOAD_SHARE_BYTES: usize = 8 + 5 + 10 + 5 + 1 + 10 + 10;

/// Encodes a `load` message (counts only: what replicas that predate sizes read).
pub fn encode_load(shares: &[LoadShare], out: &mut Vec<u8>) {
    encode_shares(shares, false, out);
}

/// Encodes a `load_sized` message: a `load` message whose shares end with their decoding
/// requests' sizes (0 when a share has none).
pub fn encode_load_sized(shares: &[LoadShare], out: &mut Vec<u8>) {
    encode_shares(shares, true, out);
}

fn encode_shares(shares: &[LoadShare], sized: bool, out: &mut Vec<u8>) {
    out.clear();
    put_varint(out, shares.len() as u64);
    for s in shares {
        out.extend_from_slice(&s.instance_key.to_le_bytes());
        put_varint(out, u64::from(s.in_flight));
        put_varint(out, s.pending_prefill_tokens);
        put_varint(out, u64::from(s.decoding));
        out.push(match s.healthy {
            None => 0,
            Some(true) => 1,
            Some(false) => 2,
        });
        if sized {
            let z = s.sizes.unwrap_or_default();
            put_varint(out, z.context_tokens);
            put_varint(out, z.output_tokens);
        }
    }
}

/// Decodes a `load` message (its shares have no sizes).
pub fn decode_load(p: &[u8]) -> Result<Vec<LoadShare>, Malformed> {
    decode_shares(p, false)
}

/// Decodes a `load_sized` message (every share has sizes).
pub fn decode_load_sized(p: &[u8]) -> Result<Vec<LoadShare>, Malformed> {
    decode_shares(p, true)
}

fn decode_shares(p: &[u8], sized: bool) -> Result<Vec<LoadShare>, Malformed> {
    let mut r = Reader::new(p);
    let n = r.varint()?;
    // A share takes at least 12 bytes (the key, three one-byte varints, health), 14 with sizes.
    let least = if sized { 14 } else { 12 };
    if n > (r.remaining() / least) as u64 {
        return Err(Malformed);
    }
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let instance_key = r.u64()?;
        let in_flight = u32::try_from(r.varint()?).map_err(|_| Malformed)?;
        let pending_prefill_tokens = r.varint()?;
        let decoding = u32::try_from(r.varint()?).map_err(|_| Malformed)?;
        let healthy = match r.u8()? {
            0 => None,
            1 => Some(true),
            2 => Some(false),
            _ => return Err(Malformed),
        };
        let sizes = if sized {
            Some(DecodeSizes {
                context_tokens: r.varint()?,
                output_tokens: r.varint()?,
            })
        } else {
            None
        };
        out.push(LoadShare {
            instance_key,
            in_flight,
            pending_prefill_tokens,
            decoding,
            healthy,
            sizes,
        });
    }
    r.finish()?;
    Ok(out)
}

/// Encodes a snapshot request.
pub fn encode_snapshot_request(request_id: u64, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&request_id.to_le_bytes());
}

/// Decodes a snapshot request.
pub fn decode_snapshot_request(p: &[u8]) -> Result<u64, Malformed> {
    let mut r = Reader::new(p);
    let id = r.u64()?;
    r.finish()?;
    Ok(id)
}

/// Encodes a resend request for delta batches `from..=to`.
pub fn encode_resend(from: u64, to: u64, out: &mut Vec<u8>) {
    out.clear();
    put_varint(out, from);
    put_varint(out, to);
}

/// Decodes a resend request; `from <= to` is enforced.
pub fn decode_resend(p: &[u8]) -> Result<(u64, u64), Malformed> {
    let mut r = Reader::new(p);
    let from = r.varint()?;
    let to = r.varint()?;
    r.finish()?;
    if from > to {
        return Err(Malformed);
    }
    Ok((from, to))
}

/// Most usage entries in one datagram (each at most 28 bytes: well inside a datagram).
pub const MAX_USAGE_ENTRIES: usize = 1024;

/// One tenant's cumulative usage at the sender: `(tenant_key, requests, tokens)`.
pub type Usage = (u64, u64, u64);

/// Encodes at most [`MAX_USAGE_ENTRIES`] of `usage` (the caller chunks longer lists).
pub fn encode_usage(usage: &[Usage], out: &mut Vec<u8>) {
    out.clear();
    let usage = &usage[..usage.len().min(MAX_USAGE_ENTRIES)];
    put_varint(out, usage.len() as u64);
    for &(tenant, requests, tokens) in usage {
        out.extend_from_slice(&tenant.to_le_bytes());
        put_varint(out, requests);
        put_varint(out, tokens);
    }
}

/// Decodes a usage payload.
pub fn decode_usage(p: &[u8]) -> Result<Vec<Usage>, Malformed> {
    let mut r = Reader::new(p);
    let n = r.varint()?;
    // Smallest entry: 8-byte key + two 1-byte varints.
    if n > MAX_USAGE_ENTRIES as u64 || n > (r.remaining() / 10) as u64 {
        return Err(Malformed);
    }
    let mut out = Vec::with_capacity(n as usize);
    for _ in 0..n {
        out.push((r.u64()?, r.varint()?, r.varint()?));
    }
    r.finish()?;
    Ok(out)
}

/// Bytes one decision of `n` new blocks costs on the wire inside a batch (no envelope).
pub fn entry_wire_bytes(age_ms: u64, ttl_ms: u64, n: usize) -> usize {
    8 + varint_len(age_ms) + varint_len(ttl_ms) + varint_len(n as u64) + 8 * n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_round_trips_and_rejects_lying_counts() {
        let u = vec![(1, 2, 3), (u64::MAX, 0, u64::MAX)];
        let mut b = Vec::new();
        encode_usage(&u, &mut b);
        assert_eq!(decode_usage(&b), Ok(u));
        assert_eq!(decode_usage(&[0xff, 0x01]), Err(Malformed));
        b.push(0);
        assert_eq!(decode_usage(&b), Err(Malformed), "trailing bytes");
    }

    #[test]
    fn delta_round_trip_and_split() {
        let hashes: Vec<u64> = (0..1000u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let mut b = EntriesBuilder::new(10_000, 4096);
        let taken = b.push(42, 9_990, 5_000, &hashes);
        assert!(taken > 0 && taken < 1000, "split at the budget: {taken}");
        assert_eq!(b.push(43, 9_990, 5_000, &hashes[taken..]), 0, "full");
        let mut out = Vec::new();
        encode_delta(9, 1, b, &mut out);
        assert!(out.len() <= 4096 + 20);
        let d = decode_delta(&out).unwrap();
        assert_eq!((d.seq, d.stride), (9, 1));
        let e = d.entries;
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].instance_key, 42);
        assert_eq!(e[0].decided_wall_ms, 9_990);
        assert_eq!(e[0].ttl_ms, 5_000);
        assert_eq!(e[0].hashes, hashes[..taken]);
    }

    #[test]
    fn entry_cost_matches_formula() {
        let hashes = [1u64; 64];
        let mut b = EntriesBuilder::new(1_000_000, 60_000);
        b.push(1, 999_990, 120_000, &hashes);
        let mut out = Vec::new();
        b.finish_into(&mut out);
        let header = varint_len(1_000_000) + varint_len(1);
        assert_eq!(out.len(), header + entry_wire_bytes(10, 120_000, 64));
    }

    #[test]
    fn load_and_requests_round_trip() {
        let shares = vec![
            LoadShare {
                instance_key: 1,
                in_flight: 3,
                pending_prefill_tokens: 9000,
                decoding: 2,
                healthy: Some(true),
                sizes: None,
            },
            LoadShare {
                instance_key: 2,
                healthy: Some(false),
                ..Default::default()
            },
        ];
        let mut out = Vec::new();
        encode_load(&shares, &mut out);
        assert_eq!(decode_load(&out), Ok(shares.clone()));
        assert_eq!(out.len(), 1 + 13 + 12, "no sizes in a load datagram");
        let sized: Vec<LoadShare> = shares
            .iter()
            .map(|s| LoadShare {
                sizes: Some(DecodeSizes {
                    context_tokens: u64::from(s.decoding) * 35_000,
                    output_tokens: u64::MAX,
                }),
                ..*s
            })
            .collect();
        encode_load_sized(&sized, &mut out);
        assert_eq!(decode_load_sized(&out), Ok(sized));
        assert!(
            decode_load(&out).is_err(),
            "the kinds are not interchangeable"
        );
        let widest = [LoadShare {
            instance_key: u64::MAX,
            in_flight: u32::MAX,
            pending_prefill_tokens: u64::MAX,
            decoding: u32::MAX,
            healthy: Some(false),
            sizes: Some(DecodeSizes {
                context_tokens: u64::MAX,
                output_tokens: u64::MAX,
            }),
        }];
        encode_load_sized(&widest, &mut out);
        assert_eq!(out.len(), 1 + MAX_LOAD_SHARE_BYTES);
        encode_snapshot_request(77, &mut out);
        assert_eq!(decode_snapshot_request(&out), Ok(77));
        encode_resend(3, 9, &mut out);
        assert_eq!(decode_resend(&out), Ok((3, 9)));
        encode_resend(9, 3, &mut out);
        assert_eq!(decode_resend(&out), Err(Malformed));
        let mut b = EntriesBuilder::new(0, 1000);
        b.push(5, 0, 10, &[1, 2, 3]);
        encode_chunk(
            ChunkHeader {
                request_id: 1,
                chunk: 2,
                last: true,
            },
            b,
            &mut out,
        );
        let (h, e) = decode_chunk(&out).unwrap();
        assert!(h.last && h.chunk == 2 && h.request_id == 1);
        assert_eq!(e[0].decided_wall_ms, 0);
        assert_eq!(e[0].hashes, vec![1, 2, 3]);
    }

    #[test]
    fn lying_counts_and_garbage_rejected() {
        // Claims 2^40 entries in 3 bytes.
        let mut p = Vec::new();
        put_varint(&mut p, 1);
        put_varint(&mut p, 1);
        put_varint(&mut p, 5);
        put_varint(&mut p, 1 << 40);
        assert_eq!(decode_delta(&p), Err(Malformed));
        assert_eq!(decode_delta(&[1, 0, 0, 0]), Err(Malformed), "stride 0");
        // Deterministic pseudo-random garbage never panics.
        let mut x: u64 = 0x1234_5678;
        for len in 0..300 {
            let g: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = decode_delta(&g);
            let _ = decode_chunk(&g);
            let _ = decode_load(&g);
            let _ = decode_resend(&g);
        }
    }
}
