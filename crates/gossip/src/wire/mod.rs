//! The wire format: an encrypted, authenticated envelope around compact binary payloads.
//!
//! ```text
//! datagram = header ciphertext tag[16]
//! header   = version:u8 kind:u8 cluster_tag:u64 sender:u64 counter:u64 wall_ms:u64 nonce[12]
//! sealed   = ChaCha20-Poly1305(HKDF-SHA256(secret), nonce, aad = len(cluster_id) cluster_id header)
//! ```
//! All fixed-width integers are little-endian; variable ones are LEB128 varints.
//!
//! Invariants:
//! - Nothing in a payload is looked at before the envelope's size, version, cluster tag, AEAD tag,
//!   timestamp window and replay window have all passed ([`envelope::Keys::open`], then [`envelope::ReplayGuard`]).
//! - Every decoder is total: any byte string yields a value or a [`Malformed`] error, never a panic,
//!   and never allocates more than the input's length justifies.

pub mod envelope;
pub mod payload;

/// What a datagram carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A SWIM (foca) membership packet.
    Membership = 1,
    /// A batch of this sender's new routing decisions.
    Delta = 2,
    /// The sender's per-instance in-flight load and health observations (full state, idempotent).
    Load = 3,
    /// "Send me a snapshot of your own live predictions."
    SnapshotRequest = 4,
    /// One chunk of a snapshot.
    SnapshotChunk = 5,
    /// "Resend delta batches `from..=to`; I missed them."
    ResendRequest = 6,
    /// The sender's cumulative usage per rate-limited tenant (full state, idempotent).
    Usage = 7,
    /// [`Kind::Load`] with the sizes of the requests each share counts as decoding (a kind of its
    /// own: replicas that predate it drop it as an unknown kind).
    LoadSized = 8,
}

impl Kind {
    /// Parses a kind byte.
    pub fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Membership,
            2 => Kind::Delta,
            3 => Kind::Load,
            4 => Kind::SnapshotRequest,
            5 => Kind::SnapshotChunk,
            6 => Kind::ResendRequest,
            7 => Kind::Usage,
            8 => Kind::LoadSized,
            _ => return None,
        })
    }
    /// Bounded metric label.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Membership => "membership",
            Kind::Delta => "delta",
            Kind::Load => "load",
            Kind::SnapshotRequest => "snapshot_request",
            Kind::SnapshotChunk => "snapshot_chunk",
            Kind::ResendRequest => "resend_request",
            Kind::Usage => "usage",
            Kind::LoadSized => "load_sized",
        }
    }
}

/// A payload that does not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed gossip payload")]
pub struct Malformed;

/// Appends `v` as a LEB128 varint.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Bytes `v` takes as a varint.
pub fn varint_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// A bounds-checked cursor over a payload.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }
    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }
    /// Takes `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if n > self.buf.len() {
            return Err(Malformed);
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    /// One byte.
    pub fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }
    /// A little-endian u64.
    pub fn u64(&mut self) -> Result<u64, Malformed> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    /// A LEB128 varint of at most 10 bytes.
    pub fn varint(&mut self) -> Result<u64, Malformed> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = self.u8()?;
            let chunk = u64::from(b & 0x7f);
            if i == 9 && chunk > 1 {
                return Err(Malformed);
            }
            v |= chunk << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Malformed)
    }
    /// Fails unless everything was consumed.
    pub fn finish(self) -> Result<(), Malformed> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(Malformed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_round_trip_and_len() {
        for v in [0u64, 1, 127, 128, 300, 1 << 35, u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            assert_eq!(b.len(), varint_len(v), "{v}");
            let mut r = Reader::new(&b);
            assert_eq!(r.varint(), Ok(v));
            assert_eq!(r.finish(), Ok(()));
        }
    }

    #[test]
    fn varint_rejects_overlong_and_truncated() {
        assert_eq!(Reader::new(&[0x80; 11]).varint(), Err(Malformed));
        assert_eq!(Reader::new(&[0x80]).varint(), Err(Malformed));
        let mut over = vec![0xff; 9];
        over.push(0x02);
        assert_eq!(Reader::new(&over).varint(), Err(Malformed));
    }
}
