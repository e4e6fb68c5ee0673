//! Every gossip metric name, with its labels, in one place.
//!
//! Invariant: label values come from fixed sets ([`crate::wire::Kind::label`],
//! [`crate::wire::envelope::Reject::label`], `"in"`/`"out"`), never from input, so cardinality is
//! bounded.

/// Counter, label `direction` (`in`/`out`): datagram bytes, envelopes included.
pub const BYTES_TOTAL: &str = "kvgate_gossip_bytes_total";
/// Counter, labels `kind`, `direction`: datagrams.
pub const MESSAGES_TOTAL: &str = "kvgate_gossip_messages_total";
/// Counter, label `reason`: datagrams dropped (unauthenticated, malformed, replayed, ...).
pub const REJECTED_TOTAL: &str = "kvgate_gossip_rejected_total";
/// Gauge: live peers (this replica excluded).
pub const PEERS: &str = "kvgate_gossip_peers";
/// Histogram: origin's decision time to applied in this replica's index, seconds.
pub const CONVERGENCE_LAG_SECONDS: &str = "kvgate_gossip_convergence_lag_seconds";
/// Counter: routing decisions not shared because the pending queue was full.
pub const DROPPED_DECISIONS_TOTAL: &str = "kvgate_gossip_dropped_decisions_total";
/// Suggested histogram buckets for [`CONVERGENCE_LAG_SECONDS`].
pub const LAG_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Counts `bytes` of one datagram of `kind` in `direction`.
pub(crate) fn datagram(kind: &'static str, direction: &'static str, bytes: usize) {
    metrics::counter!(BYTES_TOTAL, "direction" => direction).increment(bytes as u64);
    metrics::counter!(MESSAGES_TOTAL, "kind" => kind, "direction" => direction).increment(1);
}

/// Counts a rejected datagram.
pub(crate) fn rejected(reason: &'static str) {
    metrics::counter!(REJECTED_TOTAL, "reason" => reason).increment(1);
}
