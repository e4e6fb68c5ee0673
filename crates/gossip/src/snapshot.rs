//! Serving a snapshot of this replica's own live predictions to a peer that joined, returned or
//! fell too far behind for the resend log.
//!
//! Invariants:
//! - At most `SNAPSHOT_SLOTS` snapshots are produced at once (others wait for a slot), at most one
//!   per requester at a time and none within `SERVE_EVERY_MS` of the last one it got (so the
//!   waiting tasks are bounded by the peer table); collection runs on the blocking pool, never on
//!   the receive loop.
//! - Transfer is paced at `snapshot_bytes_per_s`, so a large snapshot cannot overrun the
//!   requester's socket buffer or the network.
//! - Chunks are self-contained: losing one loses only its entries (the requester re-asks when the
//!   last chunk does not arrive).

use crate::node::{wall_ms, Inner};
use crate::wire::envelope::OVERHEAD;
use crate::wire::payload::{self, ChunkHeader, EntriesBuilder};
use crate::wire::Kind;
use ahash::AHashMap;
use kvgate_core::{BlockHash, InstanceId};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Concurrent snapshots this replica serves.
pub(crate) const SNAPSHOT_SLOTS: usize = 2;
/// Minimum spacing of snapshots served to one requester.
const SERVE_EVERY_MS: u64 = 500;
/// Expiry times are grouped to this granularity (TTLs are rounded down by less than this).
const TTL_BUCKET_MS: u64 = 1_000;

/// Starts serving a snapshot to `node` at `to`. A requester already being served (or queued)
/// is not served twice; requests beyond the concurrent slots wait for one.
pub(crate) fn serve(inner: &Arc<Inner>, node: u64, to: SocketAddr, request_id: u64) {
    let now = inner.now();
    {
        let mut peers = inner.peers.lock();
        let Some(p) = peers.get_mut(&node) else {
            return;
        };
        if p.serving_snapshot
            || p.last_snapshot_served
                .is_some_and(|t| now.saturating_sub(t) < SERVE_EVERY_MS)
        {
            return;
        }
        p.serving_snapshot = true;
    }
    let inner = inner.clone();
    tokio::spawn(async move {
        if let Ok(_permit) = inner.snapshot_slots.clone().acquire_owned().await {
            let collector = inner.clone();
            match tokio::task::spawn_blocking(move || collect(&collector)).await {
                Ok(groups) => send(&inner, node, to, request_id, groups).await,
                Err(e) => tracing::warn!(error = %e, "gossip: snapshot collection failed"),
            }
        }
        let now = inner.now();
        if let Some(p) = inner.peers.lock().get_mut(&node) {
            p.serving_snapshot = false;
            p.last_snapshot_served = Some(now);
        }
    });
}

type Groups = Vec<(u64, u64, Vec<BlockHash>)>;

/// This replica's own live predictions as (instance key, ttl, hashes) groups.
fn collect(inner: &Inner) -> Groups {
    let now = inner.now();
    let mut by: AHashMap<(InstanceId, u64), Vec<BlockHash>> = AHashMap::new();
    inner
        .store
        .for_each_local(now, &mut |inst, hash, expires_at| {
            by.entry((inst, expires_at / TTL_BUCKET_MS))
                .or_default()
                .push(hash);
        });
    by.into_iter()
        .filter_map(|((inst, bucket), hashes)| {
            let key = inner.directory.key_of(inst)?;
            let ttl = (bucket * TTL_BUCKET_MS).saturating_sub(now);
            (ttl > 0).then_some((key, ttl, hashes))
        })
        .collect()
}

async fn send(inner: &Inner, node: u64, to: SocketAddr, request_id: u64, groups: Groups) {
    let budget = inner.cfg.max_message_bytes - OVERHEAD - payload::CHUNK_HEADER_MAX;
    let rate = inner.cfg.snapshot_bytes_per_s.max(1);
    let mut chunk = 0u64;
    let mut debt = 0u64;
    let mut b = EntriesBuilder::new(0, budget);
    let mut buf = Vec::new();
    for (key, ttl, hashes) in &groups {
        let mut rest = &hashes[..];
        while !rest.is_empty() {
            if inner.stopping.load(Ordering::Relaxed) {
                return;
            }
            let n = b.push(*key, 0, *ttl, rest);
            if n > 0 {
                rest = &rest[n..];
                continue;
            }
            if b.is_empty() {
                return; // budget too small to make progress; validated config prevents this
            }
            let full = std::mem::replace(&mut b, EntriesBuilder::new(0, budget));
            let h = ChunkHeader {
                request_id,
                chunk,
                last: false,
            };
            chunk += 1;
            payload::encode_chunk(h, full, &mut buf);
            inner
                .send_sealed(Kind::SnapshotChunk, &buf, &[(node, to)])
                .await;
            debt += buf.len() as u64;
            let wait_us = debt * 1_000_000 / rate;
            if wait_us >= 2_000 {
                tokio::time::sleep(Duration::from_micros(wait_us)).await;
                debt = 0;
            }
        }
    }
    // The open builder is the last chunk; possibly empty, meaning "that was all".
    let h = ChunkHeader {
        request_id,
        chunk,
        last: true,
    };
    payload::encode_chunk(h, b, &mut buf);
    inner
        .send_sealed(Kind::SnapshotChunk, &buf, &[(node, to)])
        .await;
    tracing::debug!(%to, chunks = chunk + 1, at = wall_ms(), "gossip: snapshot served");
}
