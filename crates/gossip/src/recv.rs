//! The receive loop: open (decrypt and authenticate), de-duplicate, dispatch.
//!
//! Invariants:
//! - A datagram reaches a decoder only after [`Keys::open`](crate::wire::envelope::Keys::open) and
//!   the replay guard accepted it; every failure is counted by reason and dropped, never
//!   propagated.
//! - The receive buffer is one byte larger than the accepted maximum, so an oversized datagram is
//!   seen as oversized instead of silently truncated.

use crate::membership::MembershipInput;
use crate::node::{wall_ms, Inner, MAX_RESEND_SPAN};
use crate::wire::envelope::{Header, Reject, ReplayGuard};
use crate::wire::{payload, Kind};
use crate::{metrics as m, snapshot};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::watch;

/// Receives until shutdown.
pub(crate) async fn run(inner: Arc<Inner>, mut shutdown: watch::Receiver<bool>) {
    let max = inner.cfg.max_message_bytes;
    let mut buf = vec![0u8; max + 1];
    let mut guard = ReplayGuard::new(inner.cfg.max_clock_skew_ms);
    // Decrypted payload, reused across datagrams.
    let mut plain = Vec::with_capacity(max);
    loop {
        let (n, src) = tokio::select! {
            r = inner.transport.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(e) => {
                    // ICMP port-unreachable surfaces here on some platforms; keep receiving.
                    tracing::debug!(error = %e, "gossip: recv");
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        handle(&inner, &buf[..n], src, &mut guard, &mut plain).await;
    }
}

async fn handle(
    inner: &Arc<Inner>,
    d: &[u8],
    src: SocketAddr,
    guard: &mut ReplayGuard,
    plain: &mut Vec<u8>,
) {
    inner
        .stats
        .bytes_in
        .fetch_add(d.len() as u64, Ordering::Relaxed);
    let h = match inner.keys.open(d, inner.cfg.max_message_bytes, plain) {
        Ok(x) => x,
        Err(r) => {
            metrics::counter!(m::BYTES_TOTAL, "direction" => "in").increment(d.len() as u64);
            return inner.reject(r);
        }
    };
    m::datagram(h.kind.label(), "in", d.len());
    if h.sender == inner.node_id {
        return inner.reject(Reject::Own);
    }
    if let Err(r) = guard.check(&h, wall_ms()) {
        return inner.reject(r);
    }
    inner.stats.messages_in.fetch_add(1, Ordering::Relaxed);
    inner.heard(h.sender, src, d.len());
    if dispatch(inner, &h, plain, src).await.is_err() {
        inner.reject(Reject::Malformed);
    }
}

async fn dispatch(
    inner: &Arc<Inner>,
    h: &Header,
    p: &[u8],
    src: SocketAddr,
) -> Result<(), crate::wire::Malformed> {
    match h.kind {
        Kind::Membership => {
            if inner
                .membership_tx
                .try_send(MembershipInput::Data(p.to_vec()))
                .is_err()
            {
                inner.count_reject("backlog");
            }
        }
        Kind::Delta => {
            let payload::Delta {
                seq,
                stride,
                entries,
            } = payload::decode_delta(p)?;
            inner.apply_entries(h.sender, &entries, stride, true);
            if let Some((from, to)) = inner.track_seq(h.sender, seq) {
                if to - from < MAX_RESEND_SPAN {
                    let mut buf = Vec::new();
                    payload::encode_resend(from, to, &mut buf);
                    inner
                        .send_sealed(Kind::ResendRequest, &buf, &[(h.sender, src)])
                        .await;
                } else {
                    inner.request_snapshot(h.sender, src).await;
                }
            }
        }
        Kind::Load => {
            let shares = payload::decode_load(p)?;
            inner.set_shares(h.sender, shares);
        }
        Kind::Usage => {
            let usage = payload::decode_usage(p)?;
            if let Some(sink) = inner.usage_sink.get() {
                sink(h.sender, &usage);
            }
        }
        Kind::SnapshotRequest => {
            let request_id = payload::decode_snapshot_request(p)?;
            snapshot::serve(inner, h.sender, src, request_id);
        }
        Kind::SnapshotChunk => {
            let (ch, entries) = payload::decode_chunk(p)?;
            inner.apply_entries(h.sender, &entries, 1, false);
            let now = inner.now();
            let mut peers = inner.peers.lock();
            if let Some(peer) = peers.get_mut(&h.sender) {
                if let Some((id, _, attempts)) = peer.snapshot {
                    if id == ch.request_id {
                        peer.snapshot = if ch.last {
                            peer.repairs += 1;
                            None
                        } else {
                            Some((id, now, attempts))
                        };
                    }
                }
            }
        }
        Kind::ResendRequest => {
            let (from, to) = payload::decode_resend(p)?;
            let batches = if to - from < MAX_RESEND_SPAN {
                inner.log.lock().range(from, to)
            } else {
                None
            };
            match batches {
                Some(b) => {
                    for payload in b {
                        inner
                            .send_sealed(Kind::Delta, &payload, &[(h.sender, src)])
                            .await;
                    }
                }
                // Too old for the log: the snapshot covers it.
                None => snapshot::serve(inner, h.sender, src, 0),
            }
        }
    }
    Ok(())
}
