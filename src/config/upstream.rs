//! `[upstream]`: how the gateway talks to instances; `[health]`: how it decides they are usable;
//! `[load]`: how it reads their own load reports.

use serde::{Deserialize, Serialize};

/// `[upstream]` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamConfig {
    /// TCP connect timeout per attempt.
    pub connect_timeout_ms: u64,
    /// Time allowed from sending the request until the response headers arrive.
    pub first_byte_timeout_ms: u64,
    /// Longest silence allowed between two chunks of a response body.
    pub idle_timeout_ms: u64,
    /// Idle keep-alive connections kept per instance.
    pub pool_max_idle_per_host: usize,
    /// How long an idle keep-alive connection is kept. Below the engines' own keep-alive
    /// (uvicorn's 5 s in vLLM and SGLang), so that the engine is not the side that closes it.
    pub pool_idle_timeout_ms: u64,
    /// Whether proxied requests may be sent twice (the engine may have started on them). On: a
    /// request whose connection closed before any answer byte (reused keep-alive connection:
    /// sent again on a fresh one; otherwise the instance died or dropped it: retried on another
    /// instance), or that was answered 500 or 504, is retried on another instance. Off: those
    /// are answered 502 (closed) or passed through (500, 504). A request the connection closed
    /// on before it was fully written is always sent again.
    pub idempotent_requests: bool,
    /// Attempts per request, on distinct instances (1 disables retries). Retries happen only on
    /// connect failures and 502/503 answers (and, with `idempotent_requests`, connections closed
    /// before an answer and 500/504 answers), and only before anything reached the client.
    pub max_attempts: u32,
    /// `[upstream.tls]`: how `https://` instances are reached; required when any is.
    pub tls: Option<UpstreamTlsConfig>,
}

/// `[upstream.tls]`: TLS to `https://` instances (health checks and scrapes included).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamTlsConfig {
    /// PEM CA certificates that instances' certificates may chain to (engines usually carry
    /// certificates of a private CA). Required unless `system_roots` is on.
    pub ca_file: String,
    /// Trust the system's CA certificates too (`SSL_CERT_FILE`, `SSL_CERT_DIR`, else the
    /// distribution's bundle), for instances with publicly issued certificates (a hosted
    /// OpenAI-compatible API). Read at start-up and when the other files change.
    pub system_roots: bool,
    /// PEM client certificate chain presented to instances that ask for one (mTLS); with
    /// `key_file`.
    pub cert_file: Option<String>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<String>,
    /// The name instances' certificates are verified for, instead of each URL's host (for
    /// instances reached by IP whose certificates name a DNS name, e.g. a Service's).
    pub server_name: Option<String>,
    /// How often the files are checked; changed files are read again and apply to new
    /// connections (a bad new set keeps the old one).
    pub reload_interval_ms: u64,
}

impl Default for UpstreamTlsConfig {
    fn default() -> Self {
        Self {
            ca_file: String::new(),
            system_roots: false,
            cert_file: None,
            key_file: None,
            server_name: None,
            reload_interval_ms: 10_000,
        }
    }
}

impl UpstreamTlsConfig {
    /// Checks that the files are named consistently (their content is checked when the client
    /// is built at start-up); the error names the key.
    pub(super) fn validate(&self) -> Result<(), super::ConfigError> {
        if self.ca_file.is_empty() && !self.system_roots {
            return Err(super::invalid(
                "upstream.tls.ca_file",
                "required with [upstream.tls] unless system_roots = true",
            ));
        }
        if self.reload_interval_ms == 0 || self.reload_interval_ms > 3_600_000 {
            return Err(super::invalid(
                "upstream.tls.reload_interval_ms",
                "must be between 1 and 3600000",
            ));
        }
        if let Some(n) = &self.server_name {
            if rustls::pki_types::ServerName::try_from(n.as_str()).is_err() {
                return Err(super::invalid(
                    "upstream.tls.server_name",
                    "a DNS name or an IP address",
                ));
            }
        }
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => Err(super::invalid(
                "upstream.tls.key_file",
                "required with upstream.tls.cert_file",
            )),
            (None, Some(_)) => Err(super::invalid(
                "upstream.tls.cert_file",
                "required with upstream.tls.key_file",
            )),
            _ => Ok(()),
        }
    }
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            connect_timeout_ms: 1_000,
            first_byte_timeout_ms: 300_000,
            idle_timeout_ms: 120_000,
            pool_max_idle_per_host: 256,
            pool_idle_timeout_ms: 4_000,
            idempotent_requests: false,
            max_attempts: 3,
            tls: None,
        }
    }
}

/// `[health]` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// Interval between active checks (`GET <instance>/health`) of every instance.
    pub interval_ms: u64,
    /// Timeout of one active check.
    pub timeout_ms: u64,
    /// Consecutive failed checks that mark a healthy instance unhealthy.
    pub unhealthy_threshold: u32,
    /// Consecutive successful checks that mark an unhealthy instance healthy again.
    pub healthy_threshold: u32,
    /// Consecutive connect failures on the request path that eject an instance.
    pub passive_failure_threshold: u32,
    /// Consecutive 5xx answers (500, 502, 504; not 503, an engine's full queue) on the request path that eject an instance
    /// as an outlier, for `eject_ms` (a passing active check does not end it: such an instance
    /// usually still answers `/health`).
    pub passive_5xx_threshold: u32,
    /// How long an ejected instance is skipped (for a connect-failure ejection, an active success
    /// ends it sooner).
    pub eject_ms: u64,
    /// How often `/v1/models` of every instance is re-read for the union the gateway serves.
    pub models_refresh_ms: u64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            interval_ms: 2_000,
            timeout_ms: 1_000,
            unhealthy_threshold: 2,
            healthy_threshold: 2,
            passive_failure_threshold: 3,
            passive_5xx_threshold: 5,
            eject_ms: 10_000,
            models_refresh_ms: 30_000,
        }
    }
}

/// `[load]` section: scraping of engine-reported load (`/metrics`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoadConfig {
    /// Scrape engine metrics at all.
    pub enabled: bool,
    /// Interval between scrapes of each instance.
    pub poll_interval_ms: u64,
    /// A scrape older than this is marked stale and ignored by scoring.
    pub stale_after_ms: u64,
    /// Timeout of one scrape.
    pub timeout_ms: u64,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            poll_interval_ms: 1_000,
            stale_after_ms: 5_000,
            timeout_ms: 500,
        }
    }
}
