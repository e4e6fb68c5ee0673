//! Sealing and opening datagrams: HMAC-SHA256 authentication, cluster isolation, replay limits.
//!
//! Invariants:
//! - The MAC covers the cluster id (length-prefixed) and every byte before the tag, so a datagram
//!   from another cluster or with any flipped bit is rejected, even under the same secret.
//! - Checks run cheapest first and the MAC is compared in constant time.
//! - Replay: a datagram is accepted only if its timestamp is within `max_skew_ms` of the local
//!   wall clock and its `(sender, counter)` was not accepted before (sliding 64-counter window per
//!   sender, like IPsec's). The sender table is bounded; an evicted sender falls back to the
//!   timestamp window alone.

use super::Kind;
use ahash::AHashMap;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Wire format version.
pub const VERSION: u8 = 1;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 1 + 1 + 8 + 8 + 8 + 8;
/// Bytes of the MAC tag after the payload.
pub const TAG_LEN: usize = 32;
/// Envelope overhead per datagram.
pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;
/// Bound on the replay table.
const MAX_SENDERS: usize = 4096;

/// Why a datagram was dropped. Labels are a fixed set (metric-safe).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reject {
    /// Larger than the configured maximum.
    TooBig,
    /// Shorter than an empty envelope.
    TooShort,
    /// Unknown version byte.
    Version,
    /// Unknown kind byte.
    Kind,
    /// Another cluster's tag.
    Cluster,
    /// MAC mismatch: wrong secret or tampered.
    Auth,
    /// Timestamp outside the accepted window.
    Stale,
    /// Already accepted (or too far behind the window).
    Replay,
    /// The payload did not decode.
    Malformed,
    /// Valid, but from ourselves (e.g. a seed that resolves to this replica).
    Own,
}

impl Reject {
    /// Bounded metric label.
    pub fn label(self) -> &'static str {
        match self {
            Reject::TooBig => "too_big",
            Reject::TooShort => "too_short",
            Reject::Version => "version",
            Reject::Kind => "kind",
            Reject::Cluster => "cluster",
            Reject::Auth => "auth",
            Reject::Stale => "stale",
            Reject::Replay => "replay",
            Reject::Malformed => "malformed",
            Reject::Own => "own",
        }
    }
}

/// The authenticated header of an accepted datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the payload is.
    pub kind: Kind,
    /// The sender's node id (random per process start).
    pub sender: u64,
    /// The sender's per-process datagram counter (strictly increasing).
    pub counter: u64,
    /// The sender's wall clock at sealing, ms since the UNIX epoch.
    pub wall_ms: u64,
}

/// Keyed MAC state for one cluster; cloned per datagram (cheap: two SHA-256 states).
#[derive(Clone)]
pub struct Keys {
    mac: HmacSha256,
    cluster_tag: u64,
}

impl Keys {
    /// Keys for `cluster_id` under `secret`.
    pub fn new(cluster_id: &str, secret: &[u8]) -> Self {
        // HMAC accepts keys of any length; this cannot fail.
        let mut mac = <HmacSha256 as Mac>::new_from_slice(secret)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(&(cluster_id.len() as u32).to_le_bytes());
        mac.update(cluster_id.as_bytes());
        Self {
            mac,
            cluster_tag: xxhash_rust::xxh3::xxh3_64_with_seed(cluster_id.as_bytes(), 0x6b76_6761),
        }
    }

    /// Appends a sealed datagram carrying `payload` to `out` (cleared first).
    pub fn seal(&self, h: &Header, payload: &[u8], out: &mut Vec<u8>) {
        out.clear();
        out.reserve(OVERHEAD + payload.len());
        out.push(VERSION);
        out.push(h.kind as u8);
        out.extend_from_slice(&self.cluster_tag.to_le_bytes());
        out.extend_from_slice(&h.sender.to_le_bytes());
        out.extend_from_slice(&h.counter.to_le_bytes());
        out.extend_from_slice(&h.wall_ms.to_le_bytes());
        out.extend_from_slice(payload);
        let mut mac = self.mac.clone();
        mac.update(out);
        out.extend_from_slice(&mac.finalize().into_bytes());
    }

    /// Checks size, version, kind, cluster and MAC; returns the header and payload. Replay and
    /// timestamp checks are [`ReplayGuard`]'s.
    pub fn open<'a>(&self, d: &'a [u8], max_len: usize) -> Result<(Header, &'a [u8]), Reject> {
        if d.len() > max_len {
            return Err(Reject::TooBig);
        }
        if d.len() < OVERHEAD {
            return Err(Reject::TooShort);
        }
        if d[0] != VERSION {
            return Err(Reject::Version);
        }
        let kind = Kind::from_u8(d[1]).ok_or(Reject::Kind)?;
        let u64_at = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&d[at..at + 8]);
            u64::from_le_bytes(a)
        };
        if u64_at(2) != self.cluster_tag {
            return Err(Reject::Cluster);
        }
        let (body, tag) = d.split_at(d.len() - TAG_LEN);
        let mut mac = self.mac.clone();
        mac.update(body);
        mac.verify_slice(tag).map_err(|_| Reject::Auth)?;
        let h = Header {
            kind,
            sender: u64_at(10),
            counter: u64_at(18),
            wall_ms: u64_at(26),
        };
        Ok((h, &body[HEADER_LEN..]))
    }
}

struct Window {
    /// Highest counter accepted.
    top: u64,
    /// Bit i set = counter `top - i` accepted.
    seen: u64,
    /// Local wall ms of the last accepted datagram, for eviction.
    last: u64,
}

/// Per-sender replay windows plus the timestamp window.
pub struct ReplayGuard {
    max_skew_ms: u64,
    senders: AHashMap<u64, Window>,
}

impl ReplayGuard {
    /// A guard accepting timestamps within `max_skew_ms` of the local clock.
    pub fn new(max_skew_ms: u64) -> Self {
        Self {
            max_skew_ms,
            senders: AHashMap::new(),
        }
    }

    /// Accepts `h` once, at local wall time `now_ms`.
    pub fn check(&mut self, h: &Header, now_ms: u64) -> Result<(), Reject> {
        if h.wall_ms.abs_diff(now_ms) > self.max_skew_ms {
            return Err(Reject::Stale);
        }
        if !self.senders.contains_key(&h.sender) && self.senders.len() >= MAX_SENDERS {
            self.evict_oldest();
        }
        let w = self.senders.entry(h.sender).or_insert(Window {
            top: 0,
            seen: 0,
            last: now_ms,
        });
        w.last = now_ms;
        if h.counter > w.top {
            let shift = h.counter - w.top;
            w.seen = if shift >= 64 { 0 } else { w.seen << shift };
            w.seen |= 1;
            w.top = h.counter;
            return Ok(());
        }
        let behind = w.top - h.counter;
        if behind >= 64 {
            return Err(Reject::Replay);
        }
        let bit = 1u64 << behind;
        if w.seen & bit != 0 {
            return Err(Reject::Replay);
        }
        w.seen |= bit;
        Ok(())
    }

    fn evict_oldest(&mut self) {
        if let Some(k) = self
            .senders
            .iter()
            .min_by_key(|(_, w)| w.last)
            .map(|(k, _)| *k)
        {
            self.senders.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(counter: u64, wall_ms: u64) -> Header {
        Header {
            kind: Kind::Delta,
            sender: 7,
            counter,
            wall_ms,
        }
    }

    #[test]
    fn seal_open_round_trip() {
        let k = Keys::new("c1", b"0123456789abcdef");
        let mut d = Vec::new();
        k.seal(&hdr(1, 1000), b"hello", &mut d);
        assert_eq!(d.len(), OVERHEAD + 5);
        let (h, p) = k.open(&d, 65_000).unwrap();
        assert_eq!(h, hdr(1, 1000));
        assert_eq!(p, b"hello");
    }

    #[test]
    fn wrong_secret_cluster_or_tamper_rejected() {
        let k = Keys::new("c1", b"0123456789abcdef");
        let mut d = Vec::new();
        k.seal(&hdr(1, 1000), b"hello", &mut d);
        let other_secret = Keys::new("c1", b"fedcba9876543210");
        assert_eq!(other_secret.open(&d, 65_000).err(), Some(Reject::Auth));
        let other_cluster = Keys::new("c2", b"0123456789abcdef");
        assert_eq!(other_cluster.open(&d, 65_000).err(), Some(Reject::Cluster));
        for i in 0..d.len() {
            let mut t = d.clone();
            t[i] ^= 0x01;
            assert!(k.open(&t, 65_000).is_err(), "bit flip at {i} accepted");
        }
        assert_eq!(k.open(&d[..10], 65_000).err(), Some(Reject::TooShort));
        assert_eq!(k.open(&d, 10).err(), Some(Reject::TooBig));
    }

    #[test]
    fn replay_window() {
        let mut g = ReplayGuard::new(1_000);
        assert_eq!(g.check(&hdr(5, 10_000), 10_000), Ok(()));
        assert_eq!(g.check(&hdr(5, 10_000), 10_000), Err(Reject::Replay));
        assert_eq!(g.check(&hdr(3, 10_000), 10_000), Ok(()), "late but new");
        assert_eq!(g.check(&hdr(3, 10_000), 10_000), Err(Reject::Replay));
        assert_eq!(g.check(&hdr(200, 10_000), 10_000), Ok(()));
        assert_eq!(
            g.check(&hdr(100, 10_000), 10_000),
            Err(Reject::Replay),
            "behind window"
        );
        assert_eq!(g.check(&hdr(201, 8_000), 10_000), Err(Reject::Stale));
        assert_eq!(g.check(&hdr(201, 12_000), 10_000), Err(Reject::Stale));
    }
}
