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

pub(crate) async fn handle(
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
            inner.apply_entries(h.sender, &entries, stride, Some(seq));
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
            inner.set_shares(h.sender, shares, false);
        }
        Kind::LoadSized => {
            let shares = payload::decode_load_sized(p)?;
            inner.set_shares(h.sender, shares, true);
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
            inner.apply_entries(h.sender, &entries, 1, None);
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

#[cfg(test)]
mod tests {
    //! The order of a replica's decisions and retractions as its peers apply them, whatever the
    //! flush boundaries, materialization and resends in between: sans-I/O, datagrams moved by hand.

    use super::*;
    use crate::flush;
    use crate::testkit::{config, Replica};
    use kvgate_core::{BlockHash, InstanceId};

    const BAD: u32 = 0;
    const GOOD: u32 = 2;

    fn prompt() -> Vec<BlockHash> {
        (1_000..1_048).collect() // 48 blocks: checkpoints at 15, 31, 47 with stride 16
    }

    fn pair(stride: usize) -> (Replica, Replica) {
        let a = Replica::new(0xA1, 7001, config(stride));
        let b = Replica::new(0xB1, 7002, config(stride));
        a.knows(&b);
        b.knows(&a);
        (a, b)
    }

    async fn deliver(to: &Replica, from: &Replica, datagrams: &[Vec<u8>]) {
        let mut guard = ReplayGuard::new(to.inner.cfg.max_clock_skew_ms);
        let mut plain = Vec::new();
        for d in datagrams {
            handle(&to.inner, d, from.inner.addr, &mut guard, &mut plain).await;
        }
    }

    /// The gateway's sequence for an attempt refused with 503 and retried: decide on `BAD`,
    /// take it back, decide on `GOOD`; with a flush between the first decision and the rest.
    async fn refused_then_retried(a: &Replica, p: &[BlockHash]) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        flush::enqueue(&a.inner, InstanceId(BAD), p, 0, 0, false);
        flush::flush_decisions(&a.inner).await;
        let first = a.take_sent();
        flush::enqueue(&a.inner, InstanceId(BAD), p, 0, 0, true);
        flush::enqueue(&a.inner, InstanceId(GOOD), p, 0, 0, false);
        flush::flush_decisions(&a.inner).await;
        (first, a.take_sent())
    }

    #[tokio::test]
    async fn a_retraction_takes_back_what_the_peer_materialized_from_checkpoints() {
        let (a, b) = pair(16);
        let p = prompt();
        let (first, rest) = refused_then_retried(&a, &p).await;
        deliver(&b, &a, &first).await;
        // A prompt arrives at B between the two flushes: the checkpoints become predictions.
        assert_eq!(b.holds(BAD, &p), 48, "B learned the first decision");
        deliver(&b, &a, &rest).await;
        assert_eq!(b.holds(GOOD, &p), 48, "B learned the retry's decision");
        assert_eq!(b.holds(BAD, &p), 0, "B still predicts the refusing engine");
    }

    #[tokio::test]
    async fn a_resent_decision_behind_its_retraction_stays_retracted() {
        for stride in [1, 16] {
            let (a, b) = pair(stride);
            let p = prompt();
            let (first, rest) = refused_then_retried(&a, &p).await;
            // The first batch is lost and resent after the second arrived.
            deliver(&b, &a, &rest).await;
            deliver(&b, &a, &first).await;
            assert_eq!(b.holds(GOOD, &p), 48, "stride {stride}");
            assert_eq!(
                b.holds(BAD, &p),
                0,
                "stride {stride}: the late decision came back"
            );

            // A later decision for the same blocks there (the engine serves again) applies.
            flush::enqueue(&a.inner, InstanceId(BAD), &p, 0, 0, false);
            flush::flush_decisions(&a.inner).await;
            deliver(&b, &a, &a.take_sent()).await;
            assert_eq!(
                b.holds(BAD, &p),
                48,
                "stride {stride}: a newer decision is applied"
            );
        }
    }

    #[tokio::test]
    async fn decision_and_retraction_in_one_batch_cancel() {
        for stride in [1, 16] {
            let (a, b) = pair(stride);
            let p = prompt();
            flush::enqueue(&a.inner, InstanceId(BAD), &p, 0, 0, false);
            flush::enqueue(&a.inner, InstanceId(BAD), &p, 0, 0, true);
            flush::enqueue(&a.inner, InstanceId(GOOD), &p, 0, 0, false);
            flush::flush_decisions(&a.inner).await;
            let sent = a.take_sent();
            assert_eq!(sent.len(), 1, "one batch");
            deliver(&b, &a, &sent).await;
            assert_eq!(b.holds(BAD, &p), 0, "stride {stride}");
            assert_eq!(b.holds(GOOD, &p), 48, "stride {stride}");
        }
    }
}
