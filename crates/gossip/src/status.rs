//! What `/admin/cluster` shows.
//!
//! Invariant: plain data, serializable, holding no secret.

use serde::Serialize;
use std::collections::BTreeMap;

/// The cluster as this replica sees it.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterStatus {
    /// The cluster id (not the secret).
    pub cluster_id: String,
    /// This replica's node id (random per process start), hex.
    pub node_id: String,
    /// This replica's advertised address.
    pub addr: String,
    /// Other members known to the membership protocol, with data-plane statistics.
    pub members: Vec<MemberStatus>,
    /// Datagram bytes received (all kinds, envelopes included).
    pub bytes_in: u64,
    /// Datagram bytes sent.
    pub bytes_out: u64,
    /// Datagrams received and accepted.
    pub messages_in: u64,
    /// Datagrams sent.
    pub messages_out: u64,
    /// Datagrams dropped, by reason.
    pub rejected: BTreeMap<&'static str, u64>,
    /// Delta batches this replica has produced (next sequence number).
    pub batches_sent: u64,
    /// Bytes held by the resend log.
    pub log_bytes: usize,
    /// Block hashes waiting for the next flush.
    pub pending_hashes: usize,
    /// Decisions dropped because the pending queue was full.
    pub dropped_decisions: u64,
    /// How long a peer's dispatch stays unseen here, ms: the window of the policy's estimate of
    /// peers' concurrent decisions (`Gossip::unseen_window_ms`).
    pub unseen_window_ms: u64,
}

/// One peer.
#[derive(Clone, Debug, Serialize)]
pub struct MemberStatus {
    /// Advertised address.
    pub addr: String,
    /// Node id, hex.
    pub node_id: String,
    /// `alive`, `suspect` or `down` (SWIM state).
    pub state: &'static str,
    /// Milliseconds since anything authenticated was heard from it (None = never).
    pub last_heard_ms_ago: Option<u64>,
    /// Latest convergence lag of its decisions into this replica's index, ms.
    pub lag_ms: Option<u64>,
    /// Smoothed convergence lag, ms.
    pub lag_ewma_ms: Option<f64>,
    /// Bytes received from it.
    pub bytes_in: u64,
    /// Bytes sent to it.
    pub bytes_out: u64,
    /// Its next expected delta batch sequence number.
    pub next_seq: Option<u64>,
    /// Delta batches it had to resend or snapshots it sent us.
    pub repairs: u64,
    /// Instances it reports load for.
    pub load_instances: usize,
    /// It sent load with decoding sizes within `peer_ttl_ms` (a release that reads them; until
    /// then it also gets the counts-only kind): in a rolling upgrade, false for the old replicas.
    pub sends_load_sizes: bool,
}
