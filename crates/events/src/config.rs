//! Configuration of KV event ingestion: [`EventsConfig`] (gateway-wide, `[events]` in TOML) and
//! [`EventSource`] (one per instance with `kv_events` set).
//!
//! Invariants: every default lives in `EventsConfig::default()` and nowhere else; unknown keys
//! are rejected; [`EventsConfig::validate`] rejects zero sizes and inverted backoff bounds.

use serde::{Deserialize, Serialize};

use crate::decode::{DecodeLimits, Dialect};
use kvgate_core::InstanceId;

/// Gateway-wide settings for KV event ingestion.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventsConfig {
    /// Largest accepted event payload in bytes; larger messages are counted and skipped.
    pub max_message_bytes: usize,
    /// Most events accepted in one batch.
    pub max_events_per_batch: usize,
    /// Most token ids accepted in one event.
    pub max_tokens_per_event: usize,
    /// Engine-hash → kvgate-hash entries tracked per stream (bounds memory; should exceed the
    /// engine's cache size in blocks, all tiers included).
    pub max_tracked_blocks: usize,
    /// Messages buffered between a stream's socket and its ingestion; when full, messages are
    /// dropped (and counted), which shows up as a sequence gap and triggers replay or a rebuild.
    pub channel_capacity: usize,
    /// How long a replay request may take before it counts as failed.
    pub replay_timeout_ms: u64,
    /// A stream with no event for this long ...
    pub silence_threshold_ms: u64,
    /// ... while at least this many requests were dispatched to its instance is flagged silent,
    /// and its event-sourced entries are dropped so routing falls back to predictions.
    pub silence_min_requests: u64,
    /// First reconnect delay after a socket error.
    pub reconnect_initial_ms: u64,
    /// Largest reconnect delay (exponential backoff between the two).
    pub reconnect_max_ms: u64,
    /// Data-parallel ranks per engine when the instance does not say (rank r uses port + r).
    pub dp_ranks: u32,
}

impl Default for EventsConfig {
    fn default() -> Self {
        Self {
            max_message_bytes: 8 << 20,
            max_events_per_batch: 1 << 16,
            max_tokens_per_event: 1 << 22,
            max_tracked_blocks: 1 << 20,
            channel_capacity: 1024,
            replay_timeout_ms: 2_000,
            silence_threshold_ms: 30_000,
            silence_min_requests: 8,
            reconnect_initial_ms: 100,
            reconnect_max_ms: 10_000,
            dp_ranks: 1,
        }
    }
}

/// An invalid events setting, naming the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid events config `{key}`: {message}")]
pub struct EventsConfigError {
    /// The key, e.g. `events.channel_capacity`.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

impl EventsConfig {
    /// Checks values that would make ingestion unable to work.
    pub fn validate(&self) -> Result<(), EventsConfigError> {
        let err = |key: &str, message: &str| EventsConfigError {
            key: format!("events.{key}"),
            message: message.to_owned(),
        };
        let positive = [
            ("max_message_bytes", self.max_message_bytes as u64),
            ("max_events_per_batch", self.max_events_per_batch as u64),
            ("max_tokens_per_event", self.max_tokens_per_event as u64),
            ("max_tracked_blocks", self.max_tracked_blocks as u64),
            ("channel_capacity", self.channel_capacity as u64),
            ("replay_timeout_ms", self.replay_timeout_ms),
            ("reconnect_initial_ms", self.reconnect_initial_ms),
            ("dp_ranks", u64::from(self.dp_ranks)),
        ];
        for (key, v) in positive {
            if v == 0 {
                return Err(err(key, "must be greater than 0"));
            }
        }
        if self.reconnect_max_ms < self.reconnect_initial_ms {
            return Err(err(
                "reconnect_max_ms",
                "must be at least reconnect_initial_ms",
            ));
        }
        Ok(())
    }

    /// The decoder limits these settings imply.
    pub fn decode_limits(&self) -> DecodeLimits {
        DecodeLimits {
            max_payload_bytes: self.max_message_bytes,
            max_events: self.max_events_per_batch,
            max_hashes: self.max_tokens_per_event,
            max_tokens: self.max_tokens_per_event,
            ..DecodeLimits::default()
        }
    }
}

/// Whether the gateway connects its SUB socket or binds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Connect to an engine that binds its PUB socket (engine endpoint `tcp://*:5557`).
    Connect,
    /// Bind, for engines that connect (engine endpoint naming a concrete address).
    Bind,
}

/// One instance's event stream(s): where to listen and how to interpret what arrives.
#[derive(Clone, Debug, PartialEq)]
pub struct EventSource {
    /// The instance the blocks are credited to.
    pub instance: InstanceId,
    /// The instance's configured name (metrics label, logs, admin).
    pub name: String,
    /// ZMQ endpoint, optionally prefixed `bind:` or `connect:` (see [`EventSource::direction`]).
    pub endpoint: String,
    /// The engine's replay (ROUTER) endpoint, if it has one; the gateway always connects to it.
    pub replay_endpoint: Option<String>,
    /// Topic prefix to subscribe to (`""` = everything).
    pub topic: String,
    /// Data-parallel ranks: rank r listens on port + r.
    pub dp_ranks: u32,
    /// The model name requests for this instance are hashed under (the pool's model).
    pub model: String,
    /// The gateway's block size in tokens for this instance; events in another size are flagged.
    pub block_size: u32,
    /// Which engine family publishes.
    pub dialect: Dialect,
}

impl EventSource {
    /// A source for `instance` with one rank, empty topic, no replay and vLLM dialect.
    pub fn new(
        instance: InstanceId,
        name: impl Into<String>,
        endpoint: impl Into<String>,
        model: impl Into<String>,
        block_size: u32,
    ) -> Self {
        Self {
            instance,
            name: name.into(),
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            dp_ranks: 1,
            model: model.into(),
            block_size,
            dialect: Dialect::Vllm,
        }
    }

    /// Whether the gateway binds or connects, and the bare endpoint. An explicit `bind:` or
    /// `connect:` prefix decides; otherwise a wildcard host (`*`, `0.0.0.0`, `[::]`) binds and
    /// anything else connects (the engine then binds: its endpoint has `*`, `::` or `ipc://`).
    pub fn direction(&self) -> (Direction, &str) {
        direction_of(&self.endpoint)
    }

    /// The PUB/SUB endpoint of data-parallel rank `rank`.
    pub fn rank_endpoint(&self, rank: u32) -> String {
        offset_endpoint(self.direction().1, rank)
    }

    /// The replay endpoint of data-parallel rank `rank`.
    pub fn rank_replay_endpoint(&self, rank: u32) -> Option<String> {
        self.replay_endpoint
            .as_deref()
            .map(|e| offset_endpoint(direction_of(e).1, rank))
    }
}

fn direction_of(endpoint: &str) -> (Direction, &str) {
    if let Some(rest) = endpoint.strip_prefix("bind:") {
        return (Direction::Bind, rest);
    }
    if let Some(rest) = endpoint.strip_prefix("connect:") {
        return (Direction::Connect, rest);
    }
    let host = endpoint
        .strip_prefix("tcp://")
        .and_then(|rest| rest.rsplit_once(':'))
        .map(|(host, _)| host);
    match host {
        Some("*" | "0.0.0.0" | "[::]" | "::") => (Direction::Bind, endpoint),
        _ => (Direction::Connect, endpoint),
    }
}

/// vLLM's rule for data-parallel endpoints: TCP port + rank; `inproc` gets a `_dp{rank}` suffix;
/// other transports are shared.
pub fn offset_endpoint(endpoint: &str, rank: u32) -> String {
    if rank == 0 {
        return endpoint.to_owned();
    }
    if endpoint.starts_with("inproc://") {
        return format!("{endpoint}_dp{rank}");
    }
    if endpoint.starts_with("tcp://") {
        if let Some((base, port)) = endpoint.rsplit_once(':') {
            if let Ok(port) = port.parse::<u32>() {
                return format!("{base}:{}", port + rank);
            }
        }
    }
    endpoint.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_parse_from_empty_toml() {
        let cfg = EventsConfig::default();
        cfg.validate().unwrap();
        let parsed: EventsConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(parsed, cfg);
        assert!(serde_json::from_str::<EventsConfig>(r#"{"bogus": 1}"#).is_err());
        let bad = EventsConfig {
            channel_capacity: 0,
            ..EventsConfig::default()
        };
        assert_eq!(bad.validate().unwrap_err().key, "events.channel_capacity");
        let bad = EventsConfig {
            reconnect_max_ms: 1,
            ..EventsConfig::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn direction_follows_vllm_rule_and_prefixes() {
        let mut s = EventSource::new(InstanceId(0), "a", "tcp://10.0.0.5:5557", "m", 16);
        assert_eq!(s.direction(), (Direction::Connect, "tcp://10.0.0.5:5557"));
        s.endpoint = "tcp://*:5557".into();
        assert_eq!(s.direction().0, Direction::Bind);
        s.endpoint = "tcp://0.0.0.0:5557".into();
        assert_eq!(s.direction().0, Direction::Bind);
        s.endpoint = "bind:tcp://127.0.0.1:5557".into();
        assert_eq!(s.direction(), (Direction::Bind, "tcp://127.0.0.1:5557"));
        s.endpoint = "connect:tcp://*:1".into();
        assert_eq!(s.direction().0, Direction::Connect);
        s.endpoint = "ipc:///tmp/x".into();
        assert_eq!(s.direction().0, Direction::Connect);
    }

    #[test]
    fn dp_ranks_offset_ports() {
        let mut s = EventSource::new(InstanceId(0), "a", "tcp://h:5557", "m", 16);
        s.replay_endpoint = Some("tcp://h:6557".into());
        assert_eq!(s.rank_endpoint(0), "tcp://h:5557");
        assert_eq!(s.rank_endpoint(2), "tcp://h:5559");
        assert_eq!(s.rank_replay_endpoint(1).unwrap(), "tcp://h:6558");
        assert_eq!(offset_endpoint("inproc://x", 1), "inproc://x_dp1");
        assert_eq!(offset_endpoint("ipc:///tmp/x", 1), "ipc:///tmp/x");
    }
}
