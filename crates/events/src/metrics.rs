//! Metric names and per-stream metric handles.
//!
//! Invariants: every metric this crate emits is named here; labels are bounded (the instance name
//! comes from configuration, the event type from a fixed set).

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};

/// Events applied, by instance and type.
pub const EVENTS_TOTAL: &str = "kvgate_kv_events_total";
/// Payloads that failed to decode (malformed, oversized), by instance.
pub const DECODE_ERRORS_TOTAL: &str = "kvgate_kv_event_decode_errors_total";
/// Sequence gaps detected (including messages dropped by a full channel), by instance.
pub const GAPS_TOTAL: &str = "kvgate_kv_event_gaps_total";
/// Replay requests, by instance and outcome (`covered`, `partial`, `failed`).
pub const REPLAYS_TOTAL: &str = "kvgate_kv_event_replays_total";
/// Engine restarts detected (sequence went backwards), by instance.
pub const RESTARTS_TOTAL: &str = "kvgate_kv_event_restarts_total";
/// Seconds between an event batch's timestamp and its application.
pub const LAG_SECONDS: &str = "kvgate_kv_event_lag_seconds";
/// 1 while an instance's stream is silent although the instance serves requests.
pub const SILENT: &str = "kvgate_kv_event_silent";
/// 1 while an instance announces blocks of another size than the gateway's.
pub const BLOCK_SIZE_MISMATCH: &str = "kvgate_kv_event_block_size_mismatch";
/// Messages dropped before ingestion because the stream's channel was full, by instance.
pub const DROPPED_TOTAL: &str = "kvgate_kv_event_dropped_total";
/// Times an instance's event-sourced entries were dropped, by instance and reason.
pub const WIPES_TOTAL: &str = "kvgate_kv_event_wipes_total";

/// Histogram buckets for [`LAG_SECONDS`] (exporters that support per-metric buckets use these).
pub const LAG_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Handles for one instance, resolved once so the hot path does no label lookups.
#[derive(Clone)]
pub struct StreamMetrics {
    pub(crate) stored: Counter,
    pub(crate) removed: Counter,
    pub(crate) cleared: Counter,
    pub(crate) decode_errors: Counter,
    pub(crate) gaps: Counter,
    pub(crate) replay_covered: Counter,
    pub(crate) replay_partial: Counter,
    pub(crate) replay_failed: Counter,
    pub(crate) restarts: Counter,
    pub(crate) dropped: Counter,
    pub(crate) lag: Histogram,
    pub(crate) silent: Gauge,
    pub(crate) mismatch: Gauge,
    name: String,
}

impl StreamMetrics {
    /// Handles labelled with `instance`.
    pub fn new(instance: &str) -> Self {
        let i = instance.to_owned();
        Self {
            stored: counter!(EVENTS_TOTAL, "instance" => i.clone(), "type" => "block_stored"),
            removed: counter!(EVENTS_TOTAL, "instance" => i.clone(), "type" => "block_removed"),
            cleared: counter!(EVENTS_TOTAL, "instance" => i.clone(), "type" => "all_blocks_cleared"),
            decode_errors: counter!(DECODE_ERRORS_TOTAL, "instance" => i.clone()),
            gaps: counter!(GAPS_TOTAL, "instance" => i.clone()),
            replay_covered: counter!(REPLAYS_TOTAL, "instance" => i.clone(), "outcome" => "covered"),
            replay_partial: counter!(REPLAYS_TOTAL, "instance" => i.clone(), "outcome" => "partial"),
            replay_failed: counter!(REPLAYS_TOTAL, "instance" => i.clone(), "outcome" => "failed"),
            restarts: counter!(RESTARTS_TOTAL, "instance" => i.clone()),
            dropped: counter!(DROPPED_TOTAL, "instance" => i.clone()),
            lag: histogram!(LAG_SECONDS),
            silent: gauge!(SILENT, "instance" => i.clone()),
            mismatch: gauge!(BLOCK_SIZE_MISMATCH, "instance" => i.clone()),
            name: i,
        }
    }

    /// Counts one wipe of the instance's event-sourced entries.
    pub(crate) fn wipe(&self, reason: &'static str) {
        counter!(WIPES_TOTAL, "instance" => self.name.clone(), "reason" => reason).increment(1);
    }
}
