//! Shared state of one gossip replica and the actions every task performs on it.
//!
//! Invariants:
//! - Locks are `parking_lot` and never held across an `.await`; each guards bounded state.
//! - A peer's load and health count only while it is a live member and was heard within
//!   `peer_ttl_ms`; the aggregate read on the request path is recomputed on every change and on
//!   the housekeeping tick, so reads are one short read lock.
//! - The peer table holds at most `MAX_PEERS` entries (authenticated senders only).

use crate::checkpoints::Checkpoints;
use crate::directory::InstanceDirectory;
use crate::membership::{MemberView, MembershipInput, NodeIdentity};
use crate::retracted::Retracted;
use crate::store::PlacementStore;
use crate::transport::Transport;
use crate::wire::envelope::{Header, Keys, Reject};
use crate::wire::payload::{self, Entry, LoadShare};
use crate::wire::Kind;
use crate::{metrics as m, GossipConfig};
use ahash::AHashMap;
use kvgate_core::load::{extend_at_mean, RouterLoad};
use kvgate_core::router::PeerLoad;
use kvgate_core::{BlockHash, InstanceId, Millis};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, Semaphore};

/// The caller's monotonic clock (the same origin as the index's `now`).
pub type Clock = Arc<dyn Fn() -> Millis + Send + Sync>;

/// Where peers' usage reports go: `(sender node id, cumulative usage)`.
pub type UsageSink = Arc<dyn Fn(u64, &[payload::Usage]) + Send + Sync>;

/// Bound on the peer table.
const MAX_PEERS: usize = 1024;
/// Weight of one convergence lag sample in the smoothed lags ([`Inner::transit_ms`] and each
/// peer's `lag_ewma_ms`; each received decision batch gives one).
const LAG_ALPHA: f64 = 0.1;

/// Folds `sample` into a smoothed lag; the first sample is taken as it is.
fn smooth_lag(old: Option<f64>, sample: f64) -> f64 {
    old.map_or(sample, |old| old + LAG_ALPHA * (sample - old))
}

/// A snapshot request with no progress for this long is asked again.
const SNAPSHOT_RETRY_MS: Millis = 2_000;
/// Attempts per snapshot before giving up (TTLs and deltas still converge the index).
const SNAPSHOT_ATTEMPTS: u32 = 3;
/// Resend requests per peer are at most this frequent.
const RESEND_EVERY_MS: Millis = 100;
/// Longest gap repaired by resends; larger gaps ask for a snapshot.
pub(crate) const MAX_RESEND_SPAN: u64 = 256;

/// Wall clock, ms since the UNIX epoch (for timestamps and convergence lag, which cross
/// processes; the monotonic [`Clock`] never leaves the process).
pub(crate) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// One routing decision waiting for the next flush.
pub(crate) struct PendingDecision {
    pub key: u64,
    pub at: Millis,
    pub wall: u64,
    pub hashes: Vec<BlockHash>,
    /// A decision taken back (sent with a TTL of 0), not made.
    pub retract: bool,
}

/// Decisions waiting for the next flush, bounded by total hashes.
#[derive(Default)]
pub(crate) struct Pending {
    pub items: VecDeque<PendingDecision>,
    pub hashes: usize,
    pub dropped: u64,
}

/// Recently sent delta batches, for resends; bounded by bytes.
#[derive(Default)]
pub(crate) struct SentLog {
    pub batches: VecDeque<(u64, Arc<[u8]>)>,
    pub bytes: usize,
    pub next_seq: u64,
}

impl SentLog {
    pub fn push(&mut self, seq: u64, payload: Arc<[u8]>, max_bytes: usize) {
        self.bytes += payload.len();
        self.batches.push_back((seq, payload));
        while self.bytes > max_bytes {
            match self.batches.pop_front() {
                Some((_, p)) => self.bytes -= p.len(),
                None => break,
            }
        }
    }
    /// The batches `from..=to`, if all are still held.
    pub fn range(&self, from: u64, to: u64) -> Option<Vec<Arc<[u8]>>> {
        let first = self.batches.front()?.0;
        if from < first || to >= self.next_seq {
            return None;
        }
        let start = (from - first) as usize;
        let end = (to - first) as usize;
        Some(
            self.batches
                .range(start..=end)
                .map(|(_, p)| p.clone())
                .collect(),
        )
    }
}

/// This replica's latest published load and health.
#[derive(Default)]
pub(crate) struct LocalShares {
    pub loads: AHashMap<InstanceId, RouterLoad>,
    pub health: AHashMap<InstanceId, bool>,
    pub dirty: bool,
    pub last_sent: Millis,
}

/// What this replica knows about one peer.
#[derive(Default)]
pub(crate) struct PeerState {
    pub addr: Option<SocketAddr>,
    pub up: bool,
    pub last_heard: Option<Millis>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub next_seq: Option<u64>,
    pub last_resend_ask: Millis,
    pub repairs: u64,
    /// Latest share per instance, with when it arrived (merged: a large fleet spans datagrams).
    pub shares: AHashMap<InstanceId, (LoadShare, Millis)>,
    /// When its last `load_sized` datagram arrived: it reads sizes, and its `load` datagrams
    /// (sent in case this replica predates sizes) say less than those.
    pub sized_load_at: Option<Millis>,
    pub lag_ms: Option<u64>,
    pub lag_ewma_ms: Option<f64>,
    /// Outstanding snapshot request: (request id, last progress, attempts).
    pub snapshot: Option<(u64, Millis, u32)>,
    pub last_snapshot_served: Option<Millis>,
    /// A snapshot for this peer is queued or being sent.
    pub serving_snapshot: bool,
}

impl PeerState {
    /// Whether it sent a `load_sized` datagram within `ttl` ms of `now`.
    pub fn sends_sizes(&self, now: Millis, ttl: Millis) -> bool {
        self.sized_load_at
            .is_some_and(|at| now.saturating_sub(at) <= ttl)
    }
}

/// Sum of live peers' shares, indexed by `InstanceId::index()`.
#[derive(Default)]
pub(crate) struct Aggregate {
    pub instances: Vec<InstanceAggregate>,
}

/// Live peers' shares of one instance, summed.
#[derive(Clone, Copy, Default)]
pub(crate) struct InstanceAggregate {
    pub load: RouterLoad,
    pub health: Option<bool>,
    /// Decoding requests counted with their sizes, and without (from peers that predate sizes or
    /// do not send them).
    sized: u32,
    blind: u32,
}

impl InstanceAggregate {
    /// What the router reads: the sum, with sizes known when any peer sent them (counts-only
    /// peers' requests are filled in at the sized ones' mean).
    pub fn peer_load(&self) -> PeerLoad {
        PeerLoad {
            load: self.load,
            sizes_known: self.blind == 0 || self.sized > 0,
        }
    }
}

/// Counters for status and tests.
#[derive(Default)]
pub(crate) struct Stats {
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub messages_in: AtomicU64,
    pub messages_out: AtomicU64,
    pub rejected: Mutex<BTreeMap<&'static str, u64>>,
}

/// Everything one replica shares between its tasks.
pub(crate) struct Inner {
    pub cfg: GossipConfig,
    pub node_id: u64,
    pub addr: SocketAddr,
    pub keys: Keys,
    pub transport: Arc<dyn Transport>,
    pub store: Arc<dyn PlacementStore>,
    pub directory: InstanceDirectory,
    pub clock: Clock,
    pub counter: AtomicU64,
    pub pending: Mutex<Pending>,
    pub log: Mutex<SentLog>,
    pub local: Mutex<LocalShares>,
    pub peers: Mutex<AHashMap<u64, PeerState>>,
    pub members: RwLock<Vec<MemberView>>,
    /// Live (alive or suspect) members other than us, as of the last membership update: read on
    /// every routing decision, so kept apart from `members`.
    pub live_peers: AtomicU32,
    pub agg: RwLock<Aggregate>,
    pub stats: Stats,
    pub membership_tx: mpsc::Sender<MembershipInput>,
    pub checkpoints: Checkpoints,
    /// Set once any checkpoint arrived; lets `materialize` return at once in full-hash clusters.
    pub has_checkpoints: AtomicBool,
    /// Set by shutdown; background snapshot transfers stop at their next chunk.
    pub stopping: AtomicBool,
    pub snapshot_slots: Arc<Semaphore>,
    /// Receives peers' usage reports, once the caller set it.
    pub usage_sink: std::sync::OnceLock<UsageSink>,
    /// Retractions applied recently, so a late (resent) decision they took back stays out.
    pub retracted: Mutex<Retracted>,
    /// Woken by a load change with `push_on_change`: the flush task pushes at once. A wake while
    /// it is busy or spacing its pushes is kept (one permit), so changes coalesce.
    pub changed: tokio::sync::Notify,
    /// Smoothed convergence lag of peers' decisions into this replica, ms, as `f64` bits (NaN
    /// before any sample): how long a peer's decision stays unseen here with `push_on_change`.
    /// Samples are capped at two load intervals (a resent batch is not the usual transit).
    pub transit_ms: AtomicU64,
}

impl Inner {
    /// The state of a replica `node_id` advertising `addr`, before any task runs.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: GossipConfig,
        node_id: u64,
        addr: SocketAddr,
        transport: Arc<dyn Transport>,
        store: Arc<dyn PlacementStore>,
        directory: InstanceDirectory,
        clock: Clock,
        membership_tx: mpsc::Sender<MembershipInput>,
    ) -> Self {
        let previous: Vec<&[u8]> = cfg.previous_secrets.iter().map(|s| s.as_bytes()).collect();
        Inner {
            keys: Keys::with_previous(&cfg.cluster_id, cfg.secret.as_bytes(), &previous),
            checkpoints: Checkpoints::new(cfg.checkpoint_stride, cfg.max_checkpoints),
            retracted: Mutex::new(Retracted::new(cfg.prediction_ttl_ms)),
            cfg,
            node_id,
            addr,
            transport,
            store,
            directory,
            clock,
            counter: AtomicU64::new(1),
            pending: Mutex::default(),
            log: Mutex::default(),
            local: Mutex::default(),
            peers: Mutex::default(),
            members: Default::default(),
            live_peers: AtomicU32::new(0),
            agg: Default::default(),
            stats: Stats::default(),
            membership_tx,
            has_checkpoints: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            snapshot_slots: Arc::new(Semaphore::new(crate::snapshot::SNAPSHOT_SLOTS)),
            usage_sink: std::sync::OnceLock::new(),
            changed: tokio::sync::Notify::new(),
            transit_ms: AtomicU64::new(f64::NAN.to_bits()),
        }
    }

    pub fn now(&self) -> Millis {
        (self.clock)()
    }

    pub fn count_reject(&self, reason: &'static str) {
        m::rejected(reason);
        *self.stats.rejected.lock().entry(reason).or_insert(0) += 1;
    }

    pub fn reject(&self, r: Reject) {
        self.count_reject(r.label());
    }

    /// Seals `payload` once and sends it to every destination `(node, addr)`.
    pub async fn send_sealed(&self, kind: Kind, payload: &[u8], dests: &[(u64, SocketAddr)]) {
        if dests.is_empty() {
            return;
        }
        let h = Header {
            kind,
            sender: self.node_id,
            counter: self.counter.fetch_add(1, Ordering::Relaxed),
            wall_ms: wall_ms(),
        };
        let mut buf = Vec::new();
        self.keys.seal(&h, payload, &mut buf);
        for &(node, addr) in dests {
            match self.transport.send_to(&buf, addr).await {
                Ok(()) => {
                    m::datagram(kind.label(), "out", buf.len());
                    self.stats
                        .bytes_out
                        .fetch_add(buf.len() as u64, Ordering::Relaxed);
                    self.stats.messages_out.fetch_add(1, Ordering::Relaxed);
                    if let Some(p) = self.peers.lock().get_mut(&node) {
                        p.bytes_out += buf.len() as u64;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, %addr, "gossip: send failed");
                    self.count_reject("send_error");
                }
            }
        }
    }

    /// Live (alive or suspect) members other than us, as send destinations.
    pub fn live_dests(&self) -> Vec<(u64, SocketAddr)> {
        self.members
            .read()
            .iter()
            .filter(|v| v.state != foca::State::Down && v.id.node != self.node_id)
            .map(|v| (v.id.node, v.id.addr))
            .collect()
    }

    pub fn set_members(&self, v: Vec<MemberView>) {
        let live = v.iter().filter(|m| m.state != foca::State::Down).count();
        metrics::gauge!(m::PEERS).set(live as f64);
        let peers = v
            .iter()
            .filter(|m| m.state != foca::State::Down && m.id.node != self.node_id)
            .count();
        self.live_peers
            .store(u32::try_from(peers).unwrap_or(u32::MAX), Ordering::Relaxed);
        *self.members.write() = v;
    }

    /// Records that an authenticated datagram arrived from `node`.
    pub fn heard(&self, node: u64, src: SocketAddr, bytes: usize) {
        let now = self.now();
        let mut peers = self.peers.lock();
        if !peers.contains_key(&node) && peers.len() >= MAX_PEERS {
            // Evict the longest-silent peer that is not a live member.
            if let Some(k) = peers
                .iter()
                .filter(|(_, p)| !p.up)
                .min_by_key(|(_, p)| p.last_heard)
                .map(|(k, _)| *k)
            {
                peers.remove(&k);
            } else {
                return;
            }
        }
        let p = peers.entry(node).or_default();
        p.addr = Some(src);
        p.last_heard = Some(now);
        p.bytes_in += bytes as u64;
    }

    /// Applies predictions received from `from`: full hash lists (`stride` 1) go to the index,
    /// checkpoints to the checkpoint store. Entries without a decision time (snapshots) give no
    /// lag sample.
    /// `seq`: the delta batch's sequence number, or `None` for a snapshot chunk. In a delta an
    /// entry with a TTL of 0 takes a decision back (in a snapshot it is merely expired), and a
    /// decision a later batch already took back (this batch was resent late) is not applied.
    pub fn apply_entries(&self, from: u64, entries: &[Entry], stride: u64, seq: Option<u64>) {
        if stride > 1 && stride != self.cfg.checkpoint_stride as u64 {
            // Still usable (each decision's last block is a checkpoint), but misconfigured.
            self.count_reject("stride_mismatch");
        }
        let now = self.now();
        let wall = wall_ms();
        let mut lag: Option<u64> = None;
        let mut kept: Vec<BlockHash> = Vec::new();
        for e in entries {
            let Some(id) = self.directory.id_of_key(e.instance_key) else {
                self.count_reject("unknown_instance");
                continue;
            };
            if let (0, Some(seq)) = (e.ttl_ms, seq) {
                // A retraction carries every block past what its origin already knew, so it
                // also removes what was materialized here from the decision's checkpoints.
                self.checkpoints.retract(id, &e.hashes);
                self.store.retract_peer(id, &e.hashes);
                self.retracted.lock().note(from, id, &e.hashes, seq, now);
                continue;
            }
            let ttl = e.ttl_ms.min(self.cfg.prediction_ttl_ms);
            if ttl == 0 || e.hashes.is_empty() {
                continue;
            }
            let mut hashes = &e.hashes[..];
            if let Some(seq) = seq {
                let r = self.retracted.lock();
                if r.len() > 0 {
                    kept.clear();
                    kept.extend_from_slice(hashes);
                    if r.filter(from, id, seq, &mut kept, now) > 0 {
                        hashes = &kept;
                    }
                }
            }
            if hashes.is_empty() {
                continue;
            }
            if stride > 1 {
                self.checkpoints.insert(id, hashes, ttl, now);
                self.has_checkpoints.store(true, Ordering::Relaxed);
            } else {
                self.store.predict_peer(id, hashes, ttl, now);
            }
            if e.decided_wall_ms != 0 {
                let l = wall.saturating_sub(e.decided_wall_ms);
                metrics::histogram!(m::CONVERGENCE_LAG_SECONDS).record(l as f64 / 1000.0);
                lag = Some(lag.map_or(l, |x| x.max(l)));
            }
        }
        if let Some(l) = lag {
            self.note_transit(l);
            if let Some(p) = self.peers.lock().get_mut(&from) {
                p.lag_ms = Some(l);
                p.lag_ewma_ms = Some(smooth_lag(p.lag_ewma_ms, l as f64));
            }
        }
    }

    /// Folds a convergence lag sample (ms) into [`Inner::transit_ms`]. Only the receive path
    /// writes it; a sample lost to a racing write changes nothing that matters, so a plain
    /// load-then-store suffices.
    fn note_transit(&self, lag_ms: u64) {
        let cap = self.cfg.load_interval_ms.saturating_mul(2);
        let sample = lag_ms.min(cap) as f64;
        let old = f64::from_bits(self.transit_ms.load(Ordering::Relaxed));
        let new = smooth_lag(Some(old).filter(|o| !o.is_nan()), sample);
        self.transit_ms.store(new.to_bits(), Ordering::Relaxed);
    }

    /// The smoothed convergence lag of peers' decisions, ms (0 before any sample).
    pub fn transit_ms(&self) -> f64 {
        let t = f64::from_bits(self.transit_ms.load(Ordering::Relaxed));
        if t.is_nan() {
            0.0
        } else {
            t
        }
    }

    /// See [`crate::Gossip::unseen_window_ms`].
    pub fn unseen_window_ms(&self) -> Millis {
        let c = &self.cfg;
        let ticks = c.load_interval_ms.saturating_mul(2);
        if c.push_on_change {
            let transit = self.transit_ms().ceil() as Millis;
            transit.clamp(c.push_gap_ms.min(ticks), ticks)
        } else {
            ticks
        }
    }

    /// Stores `from`'s latest load shares and refreshes the aggregate.
    pub fn set_shares(&self, from: u64, shares: Vec<LoadShare>, sized: bool) {
        let now = self.now();
        if let Some(p) = self.peers.lock().get_mut(&from) {
            if sized {
                p.sized_load_at = Some(now);
            } else if p.sends_sizes(now, self.cfg.peer_ttl_ms) {
                // Its `load_sized` datagrams carry the same shares with their sizes.
                return;
            }
            for s in shares {
                if let Some(id) = self.directory.id_of_key(s.instance_key) {
                    p.shares.insert(id, (s, now));
                }
            }
        }
        self.recompute_aggregate();
    }

    /// Rebuilds the live-peer sums.
    pub fn recompute_aggregate(&self) {
        let now = self.now();
        let ttl = self.cfg.peer_ttl_ms;
        let mut a = Aggregate::default();
        {
            let peers = self.peers.lock();
            for p in peers.values() {
                if !p.up {
                    continue;
                }
                for (id, (s, at)) in &p.shares {
                    if now.saturating_sub(*at) > ttl {
                        continue;
                    }
                    let i = id.index();
                    if a.instances.len() <= i {
                        a.instances.resize(i + 1, InstanceAggregate::default());
                    }
                    let e = &mut a.instances[i];
                    let l = &mut e.load;
                    l.in_flight = l.in_flight.saturating_add(s.in_flight);
                    l.pending_prefill_tokens = l
                        .pending_prefill_tokens
                        .saturating_add(s.pending_prefill_tokens);
                    l.decoding = l.decoding.saturating_add(s.decoding);
                    match s.sizes {
                        Some(z) => {
                            l.decoding_context_tokens =
                                l.decoding_context_tokens.saturating_add(z.context_tokens);
                            l.decoding_output_tokens =
                                l.decoding_output_tokens.saturating_add(z.output_tokens);
                            e.sized = e.sized.saturating_add(s.decoding);
                        }
                        None => e.blind = e.blind.saturating_add(s.decoding),
                    }
                    e.health = match (e.health, s.healthy) {
                        (Some(false), _) | (_, Some(false)) => Some(false),
                        (Some(true), _) | (_, Some(true)) => Some(true),
                        (None, None) => None,
                    };
                }
            }
        }
        for e in &mut a.instances {
            let (known, count) = (u64::from(e.sized), u64::from(e.sized) + u64::from(e.blind));
            let l = &mut e.load;
            l.decoding_context_tokens = extend_at_mean(l.decoding_context_tokens, known, count);
            l.decoding_output_tokens = extend_at_mean(l.decoding_output_tokens, known, count);
        }
        *self.agg.write() = a;
    }

    /// Asks `node` at `addr` for a snapshot of its own predictions.
    pub async fn request_snapshot(&self, node: u64, addr: SocketAddr) {
        let id: u64 = rand::random();
        let now = self.now();
        {
            let mut peers = self.peers.lock();
            let p = peers.entry(node).or_default();
            let attempts = match p.snapshot {
                Some((_, _, a)) => a + 1,
                None => 1,
            };
            p.snapshot = Some((id, now, attempts));
        }
        let mut buf = Vec::new();
        payload::encode_snapshot_request(id, &mut buf);
        self.send_sealed(Kind::SnapshotRequest, &buf, &[(node, addr)])
            .await;
    }

    pub async fn on_member_up(&self, id: &NodeIdentity) {
        let was_up = {
            let mut peers = self.peers.lock();
            let p = peers.entry(id.node).or_default();
            let was = p.up;
            p.up = true;
            p.addr = Some(id.addr);
            if !was {
                // Whatever came before is covered by the snapshot asked for below.
                p.next_seq = None;
                p.snapshot = None;
            }
            was
        };
        if was_up {
            return;
        }
        tracing::info!(addr = %id.addr, node = format_args!("{:016x}", id.node), "gossip: member up");
        self.local.lock().dirty = true;
        self.recompute_aggregate();
        self.request_snapshot(id.node, id.addr).await;
    }

    pub async fn on_member_down(&self, id: &NodeIdentity) {
        let was_up = self.peers.lock().remove(&id.node).is_some_and(|p| p.up);
        if !was_up {
            return;
        }
        tracing::info!(addr = %id.addr, node = format_args!("{:016x}", id.node), "gossip: member down");
        self.recompute_aggregate();
        if self.cfg.forget_dead_peer_placements {
            // Neither the index nor the checkpoint store attributes peer entries to a peer: drop
            // them all and re-fetch the live peers' own predictions (snapshots carry full hashes).
            self.checkpoints.clear();
            for inst in self.directory.ids() {
                self.store.clear_peer(inst);
            }
            for (node, addr) in self.live_dests() {
                if node != id.node {
                    self.request_snapshot(node, addr).await;
                }
            }
        }
    }

    pub async fn on_rename(&self, old: &NodeIdentity, new: &NodeIdentity) {
        if old.node != new.node {
            // A restart at the same address: the predecessor is gone.
            self.on_member_down(old).await;
            if self
                .members
                .read()
                .iter()
                .any(|v| v.id == *new && v.state != foca::State::Down)
            {
                self.on_member_up(new).await;
            }
        }
    }

    /// Periodic: expire silent peers' shares, retry stalled snapshots.
    pub async fn housekeeping(&self) {
        self.recompute_aggregate();
        let now = self.now();
        let retry: Vec<(u64, SocketAddr)> = {
            let mut peers = self.peers.lock();
            let mut v = Vec::new();
            for (node, p) in peers.iter_mut() {
                if let (true, Some(addr), Some((_, progress, attempts))) =
                    (p.up, p.addr, p.snapshot)
                {
                    if now.saturating_sub(progress) >= SNAPSHOT_RETRY_MS {
                        if attempts >= SNAPSHOT_ATTEMPTS {
                            p.snapshot = None;
                        } else {
                            v.push((*node, addr));
                        }
                    }
                }
            }
            v
        };
        for (node, addr) in retry {
            self.request_snapshot(node, addr).await;
        }
    }

    /// Sequence bookkeeping of a delta batch from `from`; returns a range to ask again, if any.
    pub fn track_seq(&self, from: u64, seq: u64) -> Option<(u64, u64)> {
        let now = self.now();
        let mut peers = self.peers.lock();
        let p = peers.get_mut(&from)?;
        let ask = match p.next_seq {
            Some(exp) if seq > exp && now.saturating_sub(p.last_resend_ask) >= RESEND_EVERY_MS => {
                p.last_resend_ask = now;
                p.repairs += 1;
                Some((exp, seq - 1))
            }
            _ => None,
        };
        p.next_seq = Some(p.next_seq.map_or(seq + 1, |n| n.max(seq + 1)));
        ask
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sent_log_is_bounded_and_serves_ranges() {
        let mut l = SentLog::default();
        for seq in 0..10u64 {
            l.next_seq = seq + 1;
            l.push(seq, Arc::from(vec![seq as u8; 100]), 550);
        }
        assert!(l.bytes <= 550);
        assert_eq!(l.batches.len(), 5);
        assert!(l.range(2, 6).is_none(), "2 was evicted");
        let r = l.range(6, 9).unwrap();
        assert_eq!(r.len(), 4);
        assert_eq!(r[0][0], 6);
        assert!(l.range(9, 10).is_none(), "10 not produced yet");
    }

    #[test]
    fn peers_decoding_sizes_are_summed_and_filled_in_for_peers_without_them() {
        let r = crate::testkit::Replica::new(1, 7003, crate::testkit::config(1));
        let key = r.inner.directory.key_of(InstanceId(1)).unwrap();
        for node in [100, 200, 300] {
            r.inner.peers.lock().entry(node).or_default().up = true;
        }
        let share = |decoding: u32, sized: bool| LoadShare {
            instance_key: key,
            decoding,
            sizes: sized.then_some(payload::DecodeSizes {
                context_tokens: u64::from(decoding) * 10_000,
                output_tokens: u64::from(decoding) * 200,
            }),
            ..LoadShare::default()
        };
        let seen = |r: &crate::testkit::Replica| {
            let p = r.inner.agg.read().instances[1].peer_load();
            let l = p.load;
            (
                l.decoding,
                l.decoding_context_tokens,
                l.decoding_output_tokens,
                p.sizes_known,
            )
        };
        r.inner.set_shares(100, vec![share(2, true)], true);
        r.inner.set_shares(200, vec![share(1, true)], true);
        assert_eq!(seen(&r), (3, 30_000, 600, true));
        // A peer that predates sizes: its 3 requests are taken at the others' mean.
        r.inner.set_shares(300, vec![share(3, false)], false);
        assert_eq!(seen(&r), (6, 60_000, 1_200, true));
        // Only peers without sizes: none are guessed here, and the router is told so (it
        // scales its own).
        for node in [100, 200] {
            r.inner.peers.lock().get_mut(&node).unwrap().up = false;
        }
        r.inner.recompute_aggregate();
        assert_eq!(seen(&r), (3, 0, 0, false));
    }

    #[test]
    fn a_peer_that_sends_sizes_is_read_from_its_sized_datagrams_only() {
        let cfg = GossipConfig {
            peer_ttl_ms: 500,
            ..crate::testkit::config(1)
        };
        let r = crate::testkit::Replica::new(1, 7004, cfg);
        let key = r.inner.directory.key_of(InstanceId(1)).unwrap();
        r.inner.peers.lock().entry(100).or_default().up = true;
        let share = |in_flight: u32, sized: bool| LoadShare {
            instance_key: key,
            in_flight,
            decoding: 1,
            sizes: sized.then_some(payload::DecodeSizes {
                context_tokens: 5_000,
                output_tokens: 100,
            }),
            ..LoadShare::default()
        };
        let seen = |r: &crate::testkit::Replica| {
            let p = r.inner.agg.read().instances[1].peer_load();
            (
                p.load.in_flight,
                p.load.decoding_context_tokens,
                p.sizes_known,
            )
        };
        // Until it sends sizes, its counts-only datagrams are what there is.
        r.inner.set_shares(100, vec![share(2, false)], false);
        assert_eq!(seen(&r), (2, 0, false));
        r.inner.set_shares(100, vec![share(3, true)], true);
        assert_eq!(seen(&r), (3, 5_000, true));
        // The counts-only copy it also sends (to replicas that may predate sizes) changes
        // nothing, even arriving after the sized one.
        r.inner.set_shares(100, vec![share(4, false)], false);
        assert_eq!(seen(&r), (3, 5_000, true));
        // A peer silent in sizes for longer than the TTL is read from its counts again.
        let stale = r.inner.now() - 501;
        r.inner.peers.lock().get_mut(&100).unwrap().sized_load_at = Some(stale);
        r.inner.set_shares(100, vec![share(4, false)], false);
        assert_eq!(seen(&r), (4, 0, false));
    }

    #[test]
    fn transit_is_a_smoothed_lag_with_resends_capped() {
        let cfg = GossipConfig {
            load_interval_ms: 50,
            ..crate::testkit::config(1)
        };
        let r = crate::testkit::Replica::new(1, 7001, cfg);
        assert_eq!(r.inner.transit_ms(), 0.0, "no sample yet");
        // The first sample is taken as it is, even 0 (a same-millisecond arrival).
        r.inner.note_transit(0);
        assert_eq!(r.inner.transit_ms(), 0.0);
        r.inner.note_transit(10);
        assert!((r.inner.transit_ms() - 1.0).abs() < 1e-9);
        // A batch resent a minute late counts as two load intervals, not a minute.
        r.inner.note_transit(60_000);
        assert!((r.inner.transit_ms() - 10.9).abs() < 1e-9);
    }

    #[test]
    fn the_unseen_window_is_the_transit_between_the_push_gap_and_two_load_intervals() {
        let replica = |push_on_change: bool, push_gap_ms: u64| {
            let cfg = GossipConfig {
                load_interval_ms: 50,
                push_on_change,
                push_gap_ms,
                ..crate::testkit::config(1)
            };
            crate::testkit::Replica::new(1, 7002, cfg)
        };
        let on = replica(true, 2);
        assert_eq!(on.inner.unseen_window_ms(), 2, "no sample: the push gap");
        on.inner.note_transit(1);
        assert_eq!(on.inner.unseen_window_ms(), 2, "at least the push gap");
        on.inner.note_transit(43);
        assert_eq!(on.inner.unseen_window_ms(), 6, "5.2 ms rounded up");
        for _ in 0..100 {
            on.inner.note_transit(400);
        }
        assert_eq!(
            on.inner.unseen_window_ms(),
            100,
            "at most two load intervals"
        );
        // Without the push, two load intervals whatever was measured.
        let ticks = replica(false, 2);
        ticks.inner.note_transit(3);
        assert_eq!(ticks.inner.unseen_window_ms(), 100);
        // A push gap beyond the ticks is held to them.
        assert_eq!(replica(true, 500).inner.unseen_window_ms(), 100);
    }
}
