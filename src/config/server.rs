//! `[server]`: the listening side of the gateway.

use serde::{Deserialize, Serialize};

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable, one line per event.
    Human,
    /// One JSON object per line, for log pipelines.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "human" => Ok(LogFormat::Human),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("expected `human` or `json`, got `{other}`")),
        }
    }
}

/// `[server]` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Socket address the gateway listens on.
    pub listen: String,
    /// Largest accepted request body; bigger bodies get 413 without being read.
    pub body_limit_bytes: usize,
    /// After SIGTERM/SIGINT: how long in-flight requests and streams may still finish.
    pub shutdown_grace_ms: u64,
    /// Log line format.
    pub log_format: LogFormat,
    /// `tracing` filter directive (e.g. `info`, `kvgate=debug,info`).
    pub log_filter: String,
    /// Header carrying the request id, propagated upstream and returned to the client.
    pub request_id_header: String,
    /// Threads serving client connections, each with its own single-threaded runtime and
    /// upstream connection pools; 0 = one per available core.
    pub threads: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".to_string(),
            body_limit_bytes: 32 * 1024 * 1024,
            shutdown_grace_ms: 30_000,
            log_format: LogFormat::Human,
            log_filter: "info".to_string(),
            request_id_header: "x-request-id".to_string(),
            threads: 0,
        }
    }
}
