//! The flush loop: every `flush_interval_ms`, pending decisions become delta batches pushed to
//! every live peer; every `load_interval_ms` (when changed, or at least every second) the load and
//! health shares are pushed; a few times a second, housekeeping. With `push_on_change`, a
//! change of this replica's load also wakes it to push both at once.
//!
//! Invariants:
//! - Decisions and retractions leave in the order they were recorded: one queue, drained whole
//!   by this one task into batches numbered in that order (receivers keep the order across
//!   batches, see `retracted`).
//! - Each batch fits one datagram (`max_message_bytes`), gets the next sequence number and enters
//!   the bounded resend log before it is sent.
//! - A decision's TTL on the wire is the configured prediction TTL minus its age at sending, so a
//!   delayed batch never extends a prediction.
//! - Pushes on change are at least `push_gap_ms` apart: at most `1000 / push_gap_ms` a second
//!   besides the ticks, however often the load changes.
//! - With `share_load_sizes`, every load state goes to every live peer as `load_sized`, and to a
//!   peer not heard sending `load_sized` within `peer_ttl_ms` as `load` first (a replica that
//!   predates sizes reads only that one).

use crate::checkpoints::checkpoint_positions;
use crate::node::{wall_ms, Inner, PendingDecision};
use crate::wire::envelope::OVERHEAD;
use crate::wire::payload::{self, DecodeSizes, EntriesBuilder, LoadShare, MAX_LOAD_SHARE_BYTES};
use crate::wire::Kind;
use kvgate_core::{BlockHash, InstanceId, Millis};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Heartbeat of load shares even when unchanged (peers expire them after `peer_ttl_ms`).
const LOAD_HEARTBEAT_MS: u64 = 1_000;
/// Housekeeping period.
const HOUSEKEEPING_MS: u64 = 250;

/// Runs until shutdown, then flushes once more.
pub(crate) async fn run(inner: Arc<Inner>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_millis(inner.cfg.flush_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let gap = Duration::from_millis(inner.cfg.push_gap_ms);
    let mut last_load = 0u64;
    let mut last_house = 0u64;
    loop {
        let pushed = tokio::select! {
            _ = tick.tick() => false,
            _ = inner.changed.notified(), if inner.cfg.push_on_change => true,
            _ = shutdown.changed() => {
                flush_decisions(&inner).await;
                break;
            }
        };
        flush_decisions(&inner).await;
        let now = inner.now();
        if pushed {
            // Sent only if changed; the periodic load tick keeps its own cadence.
            flush_load(&inner, now).await;
        } else if now.saturating_sub(last_load) >= inner.cfg.load_interval_ms {
            last_load = now;
            flush_load(&inner, now).await;
        }
        if now.saturating_sub(last_house) >= HOUSEKEEPING_MS {
            last_house = now;
            inner.housekeeping().await;
        }
        if pushed {
            // Spaces pushes: changes meanwhile leave one wake, answered after the gap.
            tokio::select! {
                _ = tokio::time::sleep(gap) => {}
                _ = shutdown.changed() => {
                    flush_decisions(&inner).await;
                    break;
                }
            }
        }
    }
}

/// Queues a decision (or, with `retract`, takes one back) for the next flush: the blocks of
/// `hashes` past `known`, as checkpoints with a stride > 1; a retraction always names every
/// block past `known`, since a peer may have materialized the decision's whole prefix.
pub(crate) fn enqueue(
    inner: &Inner,
    instance: InstanceId,
    hashes: &[BlockHash],
    known: usize,
    now: Millis,
    retract: bool,
) {
    let known = known.min(hashes.len());
    if known == hashes.len() {
        return;
    }
    let Some(key) = inner.directory.key_of(instance) else {
        return;
    };
    let max = inner.cfg.max_pending_hashes;
    let stride = inner.cfg.checkpoint_stride;
    let mut selected: Vec<BlockHash> = if stride > 1 && !retract {
        checkpoint_positions(known, hashes.len(), stride)
            .map(|j| hashes[j])
            .collect()
    } else {
        hashes[known..].to_vec()
    };
    selected.truncate(max);
    let n = selected.len();
    let d = PendingDecision {
        key,
        at: now,
        wall: wall_ms(),
        hashes: selected,
        retract,
    };
    let mut p = inner.pending.lock();
    let mut dropped = 0u64;
    while p.hashes + n > max {
        match p.items.pop_front() {
            Some(old) => {
                p.hashes -= old.hashes.len();
                dropped += 1;
            }
            None => break,
        }
    }
    p.hashes += n;
    p.items.push_back(d);
    p.dropped += dropped;
    drop(p);
    if dropped > 0 {
        metrics::counter!(crate::metrics::DROPPED_DECISIONS_TOTAL).increment(dropped);
    }
}

/// Sends every pending decision as delta batches.
pub(crate) async fn flush_decisions(inner: &Inner) {
    let items = {
        let mut p = inner.pending.lock();
        p.hashes = 0;
        std::mem::take(&mut p.items)
    };
    if items.is_empty() {
        return;
    }
    let dests = inner.live_dests();
    let now = inner.now();
    let budget = inner.cfg.max_message_bytes - OVERHEAD - 10;
    let mut b = EntriesBuilder::new(wall_ms(), budget);
    for d in &items {
        let age = now.saturating_sub(d.at);
        let ttl = inner.cfg.prediction_ttl_ms.saturating_sub(age);
        let ttl = match (d.retract, ttl) {
            // A retraction travels as TTL 0, whatever its age.
            (true, _) => 0,
            // Expired before it could be sent.
            (false, 0) => continue,
            (false, ttl) => ttl,
        };
        let mut rest = &d.hashes[..];
        while !rest.is_empty() {
            let n = b.push(d.key, d.wall, ttl, rest);
            if n > 0 {
                rest = &rest[n..];
            } else if b.is_empty() {
                break; // cannot happen with a validated config; never spin
            } else {
                let full = std::mem::replace(&mut b, EntriesBuilder::new(wall_ms(), budget));
                emit(inner, full, &dests).await;
            }
        }
    }
    if !b.is_empty() {
        emit(inner, b, &dests).await;
    }
}

async fn emit(inner: &Inner, b: EntriesBuilder, dests: &[(u64, std::net::SocketAddr)]) {
    let mut buf = Vec::new();
    let seq = {
        let mut log = inner.log.lock();
        let seq = log.next_seq;
        log.next_seq += 1;
        payload::encode_delta(seq, inner.cfg.checkpoint_stride as u64, b, &mut buf);
        log.push(seq, Arc::from(buf.as_slice()), inner.cfg.log_max_bytes);
        seq
    };
    tracing::trace!(seq, bytes = buf.len(), peers = dests.len(), "gossip: delta");
    inner.send_sealed(Kind::Delta, &buf, dests).await;
}

/// Writes a load datagram's payload.
type EncodeLoad = fn(&[LoadShare], &mut Vec<u8>);

/// Sends this replica's load and health shares when changed or due for a heartbeat.
async fn flush_load(inner: &Inner, now: u64) {
    let shares: Vec<LoadShare> = {
        let mut l = inner.local.lock();
        if !l.dirty && now.saturating_sub(l.last_sent) < LOAD_HEARTBEAT_MS {
            return;
        }
        l.dirty = false;
        l.last_sent = now;
        let mut ids: Vec<_> = l.loads.keys().chain(l.health.keys()).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .filter_map(|id| {
                let key = inner.directory.key_of(id)?;
                let load = l.loads.get(&id).copied().unwrap_or_default();
                Some(LoadShare {
                    instance_key: key,
                    in_flight: load.in_flight,
                    pending_prefill_tokens: load.pending_prefill_tokens,
                    decoding: load.decoding,
                    healthy: l.health.get(&id).copied(),
                    sizes: Some(DecodeSizes {
                        context_tokens: load.decoding_context_tokens,
                        output_tokens: load.decoding_output_tokens,
                    }),
                })
            })
            .collect()
    };
    let dests = inner.live_dests();
    if !inner.cfg.share_load_sizes {
        send_load(inner, Kind::Load, payload::encode_load, &shares, &dests).await;
        return;
    }
    // Peers heard sending sizes read them. The others may predate them (and drop `load_sized` as
    // an unknown kind), so they get the counts-only kind too, first: one that reads both keeps
    // the sized state, and stops reading our `load` once it has seen a `load_sized` from us.
    let counts_too: Vec<_> = {
        let peers = inner.peers.lock();
        let ttl = inner.cfg.peer_ttl_ms;
        dests
            .iter()
            .filter(|(node, _)| !peers.get(node).is_some_and(|p| p.sends_sizes(now, ttl)))
            .copied()
            .collect()
    };
    send_load(
        inner,
        Kind::Load,
        payload::encode_load,
        &shares,
        &counts_too,
    )
    .await;
    send_load(
        inner,
        Kind::LoadSized,
        payload::encode_load_sized,
        &shares,
        &dests,
    )
    .await;
}

/// Sends `shares` as `kind` datagrams to `dests`: several when a fleet is too large for one
/// (each a full state of its part), one empty one when there are none.
async fn send_load(
    inner: &Inner,
    kind: Kind,
    encode: EncodeLoad,
    shares: &[LoadShare],
    dests: &[(u64, std::net::SocketAddr)],
) {
    if dests.is_empty() {
        return;
    }
    let per = (inner.cfg.max_message_bytes - OVERHEAD - 10) / MAX_LOAD_SHARE_BYTES;
    let mut buf = Vec::new();
    for part in shares.chunks(per.max(1)) {
        encode(part, &mut buf);
        inner.send_sealed(kind, &buf, dests).await;
    }
    if shares.is_empty() {
        encode(&[], &mut buf);
        inner.send_sealed(kind, &buf, dests).await;
    }
}

#[cfg(test)]
mod tests {
    //! The flush task driven on tokio's paused clock, its datagrams captured and handed to a
    //! peer by hand.

    use super::*;
    use crate::testkit::{config, Replica};
    use crate::wire::envelope::ReplayGuard;
    use kvgate_core::load::RouterLoad;

    /// Ticks that never come within a test: only pushes on change send anything.
    fn quiet(push_on_change: bool) -> crate::GossipConfig {
        crate::GossipConfig {
            flush_interval_ms: 3_600_000,
            load_interval_ms: 3_600_000,
            push_on_change,
            push_gap_ms: 1,
            share_load_sizes: true,
            ..config(1)
        }
    }

    fn pair(push_on_change: bool) -> (Replica, Replica) {
        let a = Replica::new(0xA1, 7101, quiet(push_on_change));
        let b = Replica::new(0xB1, 7102, quiet(push_on_change));
        a.knows(&b);
        b.knows(&a);
        // Membership would mark A up at B; no membership task runs here.
        b.inner.peers.lock().entry(a.inner.node_id).or_default().up = true;
        (a, b)
    }

    /// What `Gossip::publish_load_change` does, on the harness's state.
    fn dispatch(r: &Replica, in_flight: u32) {
        let id = InstanceId(1);
        enqueue(&r.inner, id, &[u64::from(in_flight) + 10], 0, 0, false);
        let mut l = r.inner.local.lock();
        l.loads.insert(
            id,
            RouterLoad {
                in_flight,
                decoding: in_flight / 2,
                decoding_context_tokens: u64::from(in_flight / 2) * 1_000,
                decoding_output_tokens: u64::from(in_flight / 2) * 100,
                ..RouterLoad::default()
            },
        );
        l.dirty = true;
        drop(l);
        if r.inner.cfg.push_on_change {
            r.inner.changed.notify_one();
        }
    }

    async fn deliver(to: &Replica, from: &Replica, datagrams: &[Vec<u8>]) {
        let mut guard = ReplayGuard::new(to.inner.cfg.max_clock_skew_ms);
        let mut plain = Vec::new();
        for d in datagrams {
            crate::recv::handle(&to.inner, d, from.inner.addr, &mut guard, &mut plain).await;
        }
    }

    /// `from` sends `at` an empty `load_sized` datagram: `at` learns that `from` reads sizes.
    async fn sizes_heard(at: &Replica, from: &Replica) {
        let mut buf = Vec::new();
        payload::encode_load_sized(&[], &mut buf);
        let to = [(at.inner.node_id, at.inner.addr)];
        from.inner.send_sealed(Kind::LoadSized, &buf, &to).await;
        deliver(at, from, &from.take_sent()).await;
    }

    /// The kinds of `datagrams`, in order.
    fn kinds(datagrams: &[Vec<u8>]) -> Vec<u8> {
        datagrams.iter().map(|d| d[1]).collect()
    }

    /// Lets the spawned flush task run until it waits again, moving the paused clock by `us`.
    async fn settle(us: u64) {
        tokio::time::advance(Duration::from_micros(us)).await;
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    /// Runs `r`'s flush task until the returned sender says stop; it has run its first tick.
    async fn flushing(r: &Replica) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(run(r.inner.clone(), rx));
        settle(0).await;
        (stop, task)
    }

    #[tokio::test(start_paused = true)]
    async fn a_dispatch_is_pushed_at_once_and_pushes_are_spaced() {
        let (a, b) = pair(true);
        a.inner.peers.lock().entry(b.inner.node_id).or_default().up = true;
        sizes_heard(&a, &b).await;
        let (stop, task) = flushing(&a).await;
        assert!(a.take_sent().is_empty(), "nothing to say before a dispatch");

        // One dispatch: its decision and the load go out without waiting for a tick.
        dispatch(&a, 1);
        settle(0).await;
        let sent = a.take_sent();
        assert_eq!(sent.len(), 2, "one decision batch and one load share");
        deliver(&b, &a, &sent).await;
        assert_eq!(b.inner.agg.read().instances[1].load.in_flight, 1);
        assert_eq!(b.holds(1, &[11]), 1);

        // Fifty dispatches 100 µs apart (5 ms): pushed at most once per millisecond, the last
        // state included.
        settle(1_000).await;
        for k in 2..52 {
            dispatch(&a, k);
            settle(100).await;
        }
        settle(2_000).await;
        let sent = a.take_sent();
        let pushes = sent.len() / 2;
        assert!(
            (4..=7).contains(&pushes),
            "{pushes} pushes for 50 dispatches in 5 ms"
        );
        deliver(&b, &a, &sent).await;
        let seen = b.inner.agg.read().instances[1].load;
        assert_eq!(seen.in_flight, 51);
        assert_eq!(
            (
                seen.decoding,
                seen.decoding_context_tokens,
                seen.decoding_output_tokens
            ),
            (25, 25_000, 2_500),
            "the decoding requests' sizes came with their count"
        );
        assert_eq!(b.holds(1, &[61]), 1, "the last decision arrived");

        let _ = stop.send(true);
        let _ = task.await;
    }

    #[tokio::test(start_paused = true)]
    async fn without_sizes_the_load_goes_as_replicas_that_predate_them_read_it() {
        let (_, b) = pair(true);
        let a = Replica::new(
            0xA2,
            7103,
            crate::GossipConfig {
                share_load_sizes: false,
                ..quiet(true)
            },
        );
        a.knows(&b);
        b.inner.peers.lock().entry(a.inner.node_id).or_default().up = true;
        let (stop, task) = flushing(&a).await;
        dispatch(&a, 8);
        settle(0).await;
        let sent = a.take_sent();
        let load: Vec<_> = sent.iter().filter(|d| d[1] == Kind::Load as u8).collect();
        assert_eq!(load.len(), 1, "one datagram of the counts-only kind");
        deliver(&b, &a, &sent).await;
        let seen = b.inner.agg.read().instances[1].load;
        assert_eq!(
            (seen.in_flight, seen.decoding, seen.decoding_context_tokens),
            (8, 4, 0)
        );
        let _ = stop.send(true);
        let _ = task.await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_not_heard_sending_sizes_gets_the_counts_first_until_it_is() {
        let (a, b) = pair(true);
        a.inner.peers.lock().entry(b.inner.node_id).or_default().up = true;
        let (stop, task) = flushing(&a).await;
        dispatch(&a, 6);
        settle(0).await;
        let sent = a.take_sent();
        assert_eq!(
            kinds(&sent),
            [Kind::Delta as u8, Kind::Load as u8, Kind::LoadSized as u8],
            "what a replica that predates sizes reads, then the sized state"
        );
        // A replica that reads both ends with the sized state, and a late counts-only copy
        // does not undo it.
        let (counts, rest): (Vec<_>, Vec<_>) =
            sent.into_iter().partition(|d| d[1] == Kind::Load as u8);
        deliver(&b, &a, &rest).await;
        deliver(&b, &a, &counts).await;
        let seen = b.inner.agg.read().instances[1].peer_load();
        assert!(seen.sizes_known);
        assert_eq!(
            (seen.load.in_flight, seen.load.decoding_context_tokens),
            (6, 3_000)
        );
        // Once B is heard sending sizes, it gets the sized kind only.
        sizes_heard(&a, &b).await;
        settle(1_000).await;
        dispatch(&a, 7);
        settle(0).await;
        assert_eq!(
            kinds(&a.take_sent()),
            [Kind::Delta as u8, Kind::LoadSized as u8]
        );
        let _ = stop.send(true);
        let _ = task.await;
    }

    #[tokio::test(start_paused = true)]
    async fn without_push_on_change_a_dispatch_waits_for_the_ticks() {
        let (a, _b) = pair(false);
        let (stop, task) = flushing(&a).await;
        a.take_sent();
        dispatch(&a, 1);
        settle(10_000).await;
        assert!(a.take_sent().is_empty(), "sent before the flush tick");
        // Shutdown flushes the decision.
        let _ = stop.send(true);
        let _ = task.await;
        assert_eq!(a.take_sent().len(), 1);
    }
}
