//! Gossip configuration: the one place of its defaults.
//!
//! Invariants:
//! - Every default lives in `impl Default for GossipConfig` and nowhere else.
//! - Unknown keys are rejected (`deny_unknown_fields`); [`GossipConfig::validate`] rejects values
//!   that would make the protocol unsafe or unbounded (empty secret, zero intervals, datagrams larger
//!   than UDP allows) before anything binds a socket.
//! - The secret never appears in serialized output (`/admin/config` shows the section without it).

use serde::{Deserialize, Serialize};

/// Environment variable that supplies the cluster secret (preferred over a secret in a file).
pub const ENV_SECRET: &str = "KVGATE_GOSSIP_SECRET";

/// Largest UDP payload over IPv4.
pub const MAX_UDP_PAYLOAD: usize = 65_507;

/// Configuration of replica gossip. Maps to the `[gossip]` table of the gateway's config.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GossipConfig {
    /// Off by default: a single gateway needs no gossip.
    pub enabled: bool,
    /// UDP address to bind (membership and data share one socket). Port 0 picks a free port.
    pub bind: String,
    /// Address peers use to reach this replica; empty = the bound address (fine unless NAT or a
    /// wildcard bind is involved; in Kubernetes set it to the pod IP and port).
    pub advertise: String,
    /// Static seeds, `host:port`; re-resolved every `seed_interval_ms`.
    pub seeds: Vec<String>,
    /// A DNS name (`host:port`) resolving to every replica, e.g. a Kubernetes headless Service;
    /// re-resolved every `seed_interval_ms`.
    pub dns_seed: Option<String>,
    /// Cluster name; replicas with a different name never exchange state, even with one secret.
    pub cluster_id: String,
    /// Shared cluster secret (at least 16 bytes); the ChaCha20-Poly1305 key that seals every
    /// datagram is derived from it. Prefer the `KVGATE_GOSSIP_SECRET` environment variable;
    /// never serialized.
    #[serde(skip_serializing)]
    pub secret: String,
    /// Further secrets accepted when opening datagrams (never used to seal), for key rotation:
    /// add the new secret here everywhere, then make it `secret` (old one here), then drop the
    /// old one. At most 4, each at least 16 bytes; never serialized.
    #[serde(skip_serializing)]
    pub previous_secrets: Vec<String>,
    /// How often pending routing decisions are batched and pushed to every live peer.
    pub flush_interval_ms: u64,
    /// How often this replica's in-flight load and health observations are pushed.
    pub load_interval_ms: u64,
    /// Push this replica's load (and its pending decisions) to every live peer as soon as it
    /// changes (a request dispatched, its first token, its end), instead of on the next load
    /// tick: a peer deciding a moment later sees it. Pushes are spaced at least `push_gap_ms`
    /// apart; changes in between go out together at the end of the gap. Off: a change reaches
    /// peers on the next flush and load ticks (up to `flush_interval_ms` and twice
    /// `load_interval_ms` later).
    pub push_on_change: bool,
    /// Least spacing of pushes on change, in wall ms: bounds them to `1000 / push_gap_ms` per
    /// second, each one load datagram (and a decision batch) to every live peer.
    pub push_gap_ms: u64,
    /// Send load shares with the sizes of the requests decoding on each instance (`load_sized`
    /// datagrams), so that peers price the decode batch a request joins with what is there
    /// rather than with their own mean (docs/gossip.md: eight replicas level with one gateway on
    /// the conversation trace at ~93 %, where counts alone left them 1.4–1.5× its TTFT). Peers
    /// not yet heard sending sizes also get the counts-only `load` kind, first, so replicas of
    /// earlier releases (which drop `load_sized` as an unknown kind) still see this one's load.
    /// Off: counts only, to every peer.
    pub share_load_sizes: bool,
    /// SWIM probe period.
    pub probe_period_ms: u64,
    /// SWIM probe round-trip timeout (must be below `probe_period_ms`).
    pub probe_rtt_ms: u64,
    /// How long a suspected member has to refute before it is declared down.
    pub suspect_to_down_ms: u64,
    /// How often seeds are re-resolved and announced to (when not already members).
    pub seed_interval_ms: u64,
    /// Largest datagram sent or accepted, envelope included.
    pub max_message_bytes: usize,
    /// A peer's load and health shares expire when nothing was heard from it for this long.
    pub peer_ttl_ms: u64,
    /// Time-to-live given to a prediction received from a peer (should equal the gateway's own
    /// prediction TTL); the age of the decision at sending is subtracted.
    pub prediction_ttl_ms: u64,
    /// Bound on the log of recently sent delta batches kept for resends to peers that missed one.
    pub log_max_bytes: usize,
    /// Share a decision as every `checkpoint_stride`-th block hash (plus its last) instead of every
    /// block hash: `checkpoint_stride`× less placement traffic, at the price of matching peers'
    /// placements at that granularity (a prompt sharing only part of a peer's decision matches up
    /// to the last checkpoint inside the shared part). 1 = every hash, applied to the index on
    /// arrival; above 1 the gateway calls `Gossip::materialize` before matching a prompt. Must be
    /// the same on every replica.
    pub checkpoint_stride: usize,
    /// Bound on checkpoint hashes received from peers and not yet materialized.
    pub max_checkpoints: usize,
    /// Bound on block hashes waiting for the next flush; beyond it the oldest decisions are dropped
    /// (and counted).
    pub max_pending_hashes: usize,
    /// Pace of snapshot transfer to a joining peer, in bytes per second.
    pub snapshot_bytes_per_s: u64,
    /// Accepted difference between a message's timestamp and this replica's wall clock; older or
    /// newer messages are rejected as replays.
    pub max_clock_skew_ms: u64,
    /// When a peer is declared dead (or replaced by a restart), drop every peer-sourced
    /// prediction and unmaterialized checkpoint and re-fetch snapshots from the live peers, so the
    /// dead replica's placements disappear at once instead of by TTL. On by default: a replica's
    /// contributions should not outlive it, whatever its last decisions were. `false` keeps them until their TTL, which
    /// is safe too, since the requests the dead replica routed did reach the engines, whose caches
    /// still hold those blocks, and avoids the cost: every survivor fetches a full snapshot from
    /// every other, and live peers' placements are missing here until those arrive. Its load and
    /// health shares are always dropped at once.
    pub forget_dead_peer_placements: bool,
}

impl Default for GossipConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            bind: "0.0.0.0:7946".to_string(),
            advertise: String::new(),
            seeds: Vec::new(),
            dns_seed: None,
            cluster_id: "kvgate".to_string(),
            secret: String::new(),
            previous_secrets: Vec::new(),
            flush_interval_ms: 25,
            load_interval_ms: 50,
            push_on_change: true,
            push_gap_ms: 1,
            share_load_sizes: true,
            probe_period_ms: 1_000,
            probe_rtt_ms: 400,
            suspect_to_down_ms: 3_000,
            seed_interval_ms: 5_000,
            max_message_bytes: 60 * 1024,
            peer_ttl_ms: 5_000,
            prediction_ttl_ms: 120_000,
            log_max_bytes: 16 * 1024 * 1024,
            checkpoint_stride: 16,
            max_checkpoints: 1 << 20,
            max_pending_hashes: 1 << 20,
            snapshot_bytes_per_s: 8 * 1024 * 1024,
            max_clock_skew_ms: 30_000,
            forget_dead_peer_placements: true,
        }
    }
}

/// Shows every setting but the secrets (a log line or panic message must not leak them).
impl std::fmt::Debug for GossipConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Serialization already skips the secrets: reuse it so no field is forgotten.
        match serde_json::to_string(self) {
            Ok(j) => write!(f, "GossipConfig {j} (secrets redacted)"),
            Err(_) => f.write_str("GossipConfig (secrets redacted)"),
        }
    }
}

/// An invalid gossip setting, naming the key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("gossip.{key}: {message}")]
pub struct ConfigError {
    /// The offending key.
    pub key: &'static str,
    /// What is wrong with it.
    pub message: String,
}

fn err(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        key,
        message: message.into(),
    }
}

impl GossipConfig {
    /// Fills `secret` from `KVGATE_GOSSIP_SECRET` when that variable is set and non-empty.
    pub fn apply_env(&mut self) {
        if let Ok(s) = std::env::var(ENV_SECRET) {
            if !s.is_empty() {
                self.secret = s;
            }
        }
    }

    /// Checks the settings (only meaningful when `enabled`; a disabled section always passes).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        if self.secret.len() < 16 {
            return Err(err(
                "secret",
                format!("must be at least 16 bytes (set {ENV_SECRET})"),
            ));
        }
        if self.previous_secrets.len() > 4 || self.previous_secrets.iter().any(|s| s.len() < 16) {
            return Err(err("previous_secrets", "at most 4, each at least 16 bytes"));
        }
        if self.cluster_id.is_empty() || self.cluster_id.len() > 255 {
            return Err(err("cluster_id", "must be 1..=255 bytes"));
        }
        if self.bind.is_empty() {
            return Err(err("bind", "must be host:port"));
        }
        if !(1024..=MAX_UDP_PAYLOAD).contains(&self.max_message_bytes) {
            return Err(err(
                "max_message_bytes",
                format!("must be within 1024..={MAX_UDP_PAYLOAD}"),
            ));
        }
        let positive: [(&'static str, u64); 9] = [
            ("flush_interval_ms", self.flush_interval_ms),
            ("load_interval_ms", self.load_interval_ms),
            ("push_gap_ms", self.push_gap_ms),
            ("probe_period_ms", self.probe_period_ms),
            ("probe_rtt_ms", self.probe_rtt_ms),
            ("suspect_to_down_ms", self.suspect_to_down_ms),
            ("seed_interval_ms", self.seed_interval_ms),
            ("peer_ttl_ms", self.peer_ttl_ms),
            ("snapshot_bytes_per_s", self.snapshot_bytes_per_s),
        ];
        for (key, v) in positive {
            if v == 0 {
                return Err(err(key, "must be positive"));
            }
        }
        if self.probe_rtt_ms >= self.probe_period_ms {
            return Err(err("probe_rtt_ms", "must be below probe_period_ms"));
        }
        if self.log_max_bytes < self.max_message_bytes {
            return Err(err("log_max_bytes", "must hold at least one message"));
        }
        if !(1..=1024).contains(&self.checkpoint_stride) {
            return Err(err("checkpoint_stride", "must be within 1..=1024"));
        }
        if self.max_checkpoints == 0 {
            return Err(err("max_checkpoints", "must be positive"));
        }
        if self.max_pending_hashes == 0 {
            return Err(err("max_pending_hashes", "must be positive"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enabled() -> GossipConfig {
        GossipConfig {
            enabled: true,
            secret: "0123456789abcdef".into(),
            ..GossipConfig::default()
        }
    }

    #[test]
    fn disabled_default_is_valid_and_enabled_needs_secret() {
        assert_eq!(GossipConfig::default().validate(), Ok(()));
        let mut c = enabled();
        assert_eq!(c.validate(), Ok(()));
        c.secret = "short".into();
        assert_eq!(c.validate().map_err(|e| e.key), Err("secret"));
    }

    #[test]
    fn rejects_bad_values() {
        let mut c = enabled();
        c.max_message_bytes = 70_000;
        assert_eq!(c.validate().map_err(|e| e.key), Err("max_message_bytes"));
        let mut c = enabled();
        c.flush_interval_ms = 0;
        assert_eq!(c.validate().map_err(|e| e.key), Err("flush_interval_ms"));
        let mut c = enabled();
        c.push_gap_ms = 0;
        assert_eq!(c.validate().map_err(|e| e.key), Err("push_gap_ms"));
        let mut c = enabled();
        c.probe_rtt_ms = c.probe_period_ms;
        assert_eq!(c.validate().map_err(|e| e.key), Err("probe_rtt_ms"));
    }

    #[test]
    fn secret_is_not_serialized() {
        let json = serde_json::to_string(&enabled()).unwrap();
        assert!(!json.contains("0123456789abcdef"));
        assert!(json.contains("cluster_id"));
    }

    #[test]
    fn debug_redacts_secrets_and_previous_are_checked() {
        let mut c = enabled();
        c.previous_secrets = vec!["previous-secret-0123".into()];
        assert_eq!(c.validate(), Ok(()));
        let d = format!("{c:?}");
        assert!(
            !d.contains("0123456789abcdef") && !d.contains("previous-secret"),
            "{d}"
        );
        c.previous_secrets.push("short".into());
        assert_eq!(c.validate().map_err(|e| e.key), Err("previous_secrets"));
    }

    #[test]
    fn unknown_keys_rejected() {
        let r: Result<GossipConfig, _> = serde_json::from_str(r#"{"enabled":true,"nope":1}"#);
        assert!(r.is_err());
    }
}
