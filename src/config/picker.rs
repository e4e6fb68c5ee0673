//! `[picker]`: kvgate as a Gateway API Inference Extension endpoint picker — Envoy's
//! `ext_proc` gRPC service on its own port, beside the HTTP listener (see `docs/picker.md`).

use super::{invalid, ConfigError};
use serde::{Deserialize, Serialize};

/// What the picker answers when it cannot name an endpoint for a reason of its own (no usable
/// instance, too many streams, an idle stream): the InferencePool's `endpointPickerRef.failureMode`,
/// mirrored so that the gateway's and the picker's behaviour agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureMode {
    /// The request fails: an immediate 503 answer from the gateway.
    FailClose,
    /// The ext_proc stream ends with a gRPC `UNAVAILABLE` status, so that a gateway configured
    /// to fail open (Envoy's `failure_mode_allow`) sends the request on with its own load
    /// balancing. Admission and rate-limit refusals (429) are answered in either mode.
    FailOpen,
}

/// `[picker]` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PickerConfig {
    /// Serve the ext_proc endpoint picker (off by default).
    pub enabled: bool,
    /// Socket address of the gRPC listener (GIE's conventional EPP port is 9002).
    pub listen: String,
    /// See [`FailureMode`].
    pub failure_mode: FailureMode,
    /// ext_proc streams (one per HTTP request in flight through the gateway) open at once;
    /// beyond it a new stream is refused at once (gRPC `RESOURCE_EXHAUSTED`, or the failure mode).
    pub max_streams: usize,
    /// Longest wait for the gateway's next message on a stream, from the request headers until
    /// the decision (the request body streaming in); past it the stream is ended with the
    /// failure mode. The response phase is bounded by `upstream.idle_timeout_ms` between
    /// messages instead, as the proxy bounds a silent upstream.
    pub idle_timeout_ms: u64,
    /// Fallback endpoints named after the chosen one, best first (0–16); the gateway tries them
    /// in order when it retries.
    pub fallbacks: usize,
}

impl Default for PickerConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            listen: "0.0.0.0:9002".to_string(),
            failure_mode: FailureMode::FailClose,
            max_streams: 4096,
            idle_timeout_ms: 30_000,
            fallbacks: 2,
        }
    }
}

impl PickerConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(invalid(
                "picker.listen",
                format!(
                    "`{}` is not a socket address like 0.0.0.0:9002",
                    self.listen
                ),
            ));
        }
        if self.max_streams == 0 {
            return Err(invalid("picker.max_streams", "must be > 0"));
        }
        if self.idle_timeout_ms == 0 {
            return Err(invalid("picker.idle_timeout_ms", "must be > 0"));
        }
        if self.fallbacks > 16 {
            return Err(invalid("picker.fallbacks", "must be between 0 and 16"));
        }
        Ok(())
    }
}
