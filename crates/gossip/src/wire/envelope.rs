//! Sealing and opening datagrams: ChaCha20-Poly1305 encryption and authentication, cluster
//! isolation, key rotation, replay limits.
//!
//! Invariants:
//! - Every datagram is sealed with ChaCha20-Poly1305 under a key derived from the configured
//!   secret by HKDF-SHA256 (fixed `info`), so the payload is confidential and any flipped bit,
//!   truncation or wrong key fails the tag. The associated data is the cluster id
//!   (length-prefixed) and the whole clear header, so a datagram from another cluster is rejected
//!   even under the same secret, and no header field can be changed.
//! - Nonces are 96 random bits from the thread CSPRNG (OS-seeded ChaCha), fresh per datagram. A
//!   counter would need state that survives restarts to stay unique under one key (the node id is
//!   random per start, the counter restarts at 0); random nonces need none. Collision odds stay
//!   negligible at gossip rates (n² / 2⁹⁷: below 2⁻²⁰ after 2³⁸ datagrams, a year at 10,000/s
//!   under one key); rotating the secret resets them.
//! - Sealing uses the current key only; opening tries the current key, then each previous one
//!   ([`Keys::with_previous`]), so a cluster can roll a new secret without dropping a datagram.
//! - Checks run cheapest first; a tag is verified before anything is decrypted or decoded.
//! - Replay: a datagram is accepted only if its timestamp is within `max_skew_ms` of the local
//!   wall clock and its `(sender, counter)` was not accepted before (sliding 64-counter window per
//!   sender, like IPsec's). The sender table is bounded; an evicted sender falls back to the
//!   timestamp window alone. Both fields are authenticated as associated data.

use super::Kind;
use ahash::AHashMap;
use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{ChaCha20Poly1305, Key, KeyInit, Nonce, Tag};
use hkdf::Hkdf;
use sha2::Sha256;

/// Wire format version (1 was HMAC-SHA256 in clear).
pub const VERSION: u8 = 2;
/// Bytes of the nonce, last field of the header.
pub const NONCE_LEN: usize = 12;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 1 + 1 + 8 + 8 + 8 + 8 + NONCE_LEN;
/// Bytes of the Poly1305 tag after the payload.
pub const TAG_LEN: usize = 16;
/// Envelope overhead per datagram.
pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;
/// Bound on the replay table.
const MAX_SENDERS: usize = 4096;
/// HKDF `info`: binds derived keys to this protocol and cipher.
const KDF_INFO: &[u8] = b"kvgate gossip v2 chacha20-poly1305";

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
    /// AEAD tag mismatch under every accepted key: wrong secret, tampered or truncated.
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

/// Derives the AEAD key of `secret`.
fn derive(secret: &[u8]) -> ChaCha20Poly1305 {
    let mut okm = [0u8; 32];
    // 32 bytes is far below HKDF-SHA256's 255·32 limit; this cannot fail.
    Hkdf::<Sha256>::new(None, secret)
        .expand(KDF_INFO, &mut okm)
        .unwrap_or_else(|_| unreachable!("32 bytes is a valid HKDF-SHA256 length"));
    ChaCha20Poly1305::new(Key::from_slice(&okm))
}

/// Cipher state for one cluster: the current key and the previous ones still accepted.
#[derive(Clone)]
pub struct Keys {
    current: ChaCha20Poly1305,
    previous: Vec<ChaCha20Poly1305>,
    /// `len(cluster_id) cluster_id`, the first part of every datagram's associated data.
    aad_prefix: Vec<u8>,
    cluster_tag: u64,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("current", &"<redacted>")
            .field("previous", &self.previous.len())
            .field("cluster_tag", &self.cluster_tag)
            .finish()
    }
}

impl Keys {
    /// Keys for `cluster_id` under `secret` alone.
    pub fn new(cluster_id: &str, secret: &[u8]) -> Self {
        Self::with_previous(cluster_id, secret, &[])
    }

    /// Keys sealing under `secret` and opening under it or any of `previous`.
    pub fn with_previous(cluster_id: &str, secret: &[u8], previous: &[&[u8]]) -> Self {
        let mut aad_prefix = Vec::with_capacity(4 + cluster_id.len());
        aad_prefix.extend_from_slice(&(cluster_id.len() as u32).to_le_bytes());
        aad_prefix.extend_from_slice(cluster_id.as_bytes());
        Self {
            current: derive(secret),
            previous: previous.iter().map(|s| derive(s)).collect(),
            aad_prefix,
            cluster_tag: xxhash_rust::xxh3::xxh3_64_with_seed(cluster_id.as_bytes(), 0x6b76_6761),
        }
    }

    fn aad(&self, header: &[u8]) -> Vec<u8> {
        let mut a = Vec::with_capacity(self.aad_prefix.len() + header.len());
        a.extend_from_slice(&self.aad_prefix);
        a.extend_from_slice(header);
        a
    }

    /// Writes a sealed datagram carrying `payload` to `out` (cleared first).
    pub fn seal(&self, h: &Header, payload: &[u8], out: &mut Vec<u8>) {
        let nonce: [u8; NONCE_LEN] = rand::random();
        out.clear();
        out.reserve(OVERHEAD + payload.len());
        out.push(VERSION);
        out.push(h.kind as u8);
        out.extend_from_slice(&self.cluster_tag.to_le_bytes());
        out.extend_from_slice(&h.sender.to_le_bytes());
        out.extend_from_slice(&h.counter.to_le_bytes());
        out.extend_from_slice(&h.wall_ms.to_le_bytes());
        out.extend_from_slice(&nonce);
        let aad = self.aad(out);
        out.extend_from_slice(payload);
        let tag = self
            .current
            .encrypt_in_place_detached(Nonce::from_slice(&nonce), &aad, &mut out[HEADER_LEN..])
            // Only fails for payloads beyond 256 GiB; datagrams are at most 64 KiB.
            .unwrap_or_else(|_| unreachable!("datagram payloads are far below the AEAD limit"));
        out.extend_from_slice(&tag);
    }

    /// Checks size, version, kind, cluster and the AEAD tag (current key, then previous ones) and
    /// decrypts the payload into `out` (cleared first); returns the header. Replay and timestamp
    /// checks are [`ReplayGuard`]'s.
    pub fn open(&self, d: &[u8], max_len: usize, out: &mut Vec<u8>) -> Result<Header, Reject> {
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
        let (header, rest) = d.split_at(HEADER_LEN);
        let (ct, tag) = rest.split_at(rest.len() - TAG_LEN);
        let nonce = Nonce::from_slice(&header[HEADER_LEN - NONCE_LEN..]);
        let tag = Tag::from_slice(tag);
        let aad = self.aad(header);
        out.clear();
        out.extend_from_slice(ct);
        // The tag is verified before decryption, so a failed attempt leaves `out` as it was.
        let opened = std::iter::once(&self.current)
            .chain(&self.previous)
            .any(|k| k.decrypt_in_place_detached(nonce, &aad, out, tag).is_ok());
        if !opened {
            out.clear();
            return Err(Reject::Auth);
        }
        Ok(Header {
            kind,
            sender: u64_at(10),
            counter: u64_at(18),
            wall_ms: u64_at(26),
        })
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

    fn open(k: &Keys, d: &[u8], max: usize) -> Result<(Header, Vec<u8>), Reject> {
        let mut out = Vec::new();
        k.open(d, max, &mut out).map(|h| (h, out))
    }

    #[test]
    fn seal_open_round_trip_and_payload_is_encrypted() {
        let k = Keys::new("c1", b"0123456789abcdef");
        let mut d = Vec::new();
        k.seal(&hdr(1, 1000), b"hello hello hello", &mut d);
        assert_eq!(d.len(), OVERHEAD + 17);
        assert!(!d.windows(5).any(|w| w == b"hello"), "payload in clear");
        let (h, p) = open(&k, &d, 65_000).unwrap();
        assert_eq!(h, hdr(1, 1000));
        assert_eq!(p, b"hello hello hello");
        let mut d2 = Vec::new();
        k.seal(&hdr(1, 1000), b"hello hello hello", &mut d2);
        assert_ne!(d, d2, "nonce reused");
    }

    #[test]
    fn wrong_secret_cluster_or_tamper_rejected() {
        let k = Keys::new("c1", b"0123456789abcdef");
        let mut d = Vec::new();
        k.seal(&hdr(1, 1000), b"hello", &mut d);
        let other_secret = Keys::new("c1", b"fedcba9876543210");
        assert_eq!(open(&other_secret, &d, 65_000).err(), Some(Reject::Auth));
        let other_cluster = Keys::new("c2", b"0123456789abcdef");
        assert_eq!(
            open(&other_cluster, &d, 65_000).err(),
            Some(Reject::Cluster)
        );
        for i in 0..d.len() {
            let mut t = d.clone();
            t[i] ^= 0x01;
            assert!(open(&k, &t, 65_000).is_err(), "bit flip at {i} accepted");
        }
        assert_eq!(open(&k, &d[..10], 65_000).err(), Some(Reject::TooShort));
        assert_eq!(
            open(&k, &d[..d.len() - 1], 65_000).err(),
            Some(Reject::Auth)
        );
        assert_eq!(open(&k, &d, 10).err(), Some(Reject::TooBig));
    }

    #[test]
    fn previous_keys_open_but_never_seal() {
        let old = Keys::new("c1", b"old-secret-0123456789");
        let new = Keys::new("c1", b"new-secret-0123456789");
        // Step 1: new key accepted as previous, old still current.
        let step1 =
            Keys::with_previous("c1", b"old-secret-0123456789", &[b"new-secret-0123456789"]);
        // Step 2: new key current, old accepted as previous.
        let step2 =
            Keys::with_previous("c1", b"new-secret-0123456789", &[b"old-secret-0123456789"]);
        let mut d = Vec::new();
        for sealer in [&old, &step1] {
            sealer.seal(&hdr(1, 1000), b"x", &mut d);
            assert!(open(&step1, &d, 65_000).is_ok());
            assert!(open(&step2, &d, 65_000).is_ok());
            assert_eq!(
                open(&new, &d, 65_000).err(),
                Some(Reject::Auth),
                "sealed with previous"
            );
        }
        for sealer in [&new, &step2] {
            sealer.seal(&hdr(1, 1000), b"x", &mut d);
            assert!(open(&step1, &d, 65_000).is_ok());
            assert!(open(&step2, &d, 65_000).is_ok());
            assert_eq!(open(&old, &d, 65_000).err(), Some(Reject::Auth));
        }
        assert!(!format!("{step2:?}").contains("secret"));
    }

    proptest::proptest! {
        #[test]
        fn open_inverts_seal_and_any_mutation_fails(
            payload in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
            sender: u64, counter: u64, wall: u64,
            at: proptest::sample::Index, flip in 1u8..=255,
        ) {
            let k = Keys::new("c1", b"0123456789abcdef");
            let h = Header { kind: Kind::Load, sender, counter, wall_ms: wall };
            let mut d = Vec::new();
            k.seal(&h, &payload, &mut d);
            let (h2, p2) = open(&k, &d, 65_000).unwrap();
            proptest::prop_assert_eq!(h2, h);
            proptest::prop_assert_eq!(p2, payload);
            let i = at.index(d.len());
            d[i] ^= flip;
            proptest::prop_assert!(open(&k, &d, 65_000).is_err());
        }
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

    #[test]
    fn replay_table_is_bounded_and_evicts_the_longest_silent_sender() {
        let mut g = ReplayGuard::new(1_000_000);
        let h = |sender: u64, counter: u64| Header {
            sender,
            ..hdr(counter, 10_000)
        };
        for s in 0..MAX_SENDERS as u64 {
            assert_eq!(g.check(&h(s, 1), 10_000 + s), Ok(()));
        }
        assert_eq!(
            g.check(&h(1, 1), 20_000),
            Err(Reject::Replay),
            "sender 1 is fresh"
        );
        assert_eq!(g.check(&h(u64::MAX, 1), 20_001), Ok(()));
        assert_eq!(g.senders.len(), MAX_SENDERS);
        // Sender 0, silent longest, was evicted: only the timestamp window guards it now.
        assert_eq!(
            g.check(&h(0, 1), 20_002),
            Ok(()),
            "evicted window forgotten"
        );
        assert_eq!(g.senders.len(), MAX_SENDERS);
    }
}
