//! What was measured for one request.
//!
//! Times are seconds relative to the replay start (`*_at_s`) or durations (`*_s`). A record exists
//! for every request that was sent; its `outcome` says how it ended.

use serde::Serialize;

/// Why a request failed, by class (a bounded set: safe as a metric label or table column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// The TCP connection could not be established.
    Connect,
    /// The request timed out.
    Timeout,
    /// The server answered 4xx (other than 429).
    Http4xx,
    /// The server answered 5xx (other than 503).
    Http5xx,
    /// The stream ended or failed before `[DONE]`, or carried an error object.
    StreamBroken,
    /// Any other transport failure.
    Other,
}

impl ErrorClass {
    /// Every class, in table order.
    pub const ALL: [ErrorClass; 6] = [
        ErrorClass::Connect,
        ErrorClass::Timeout,
        ErrorClass::Http4xx,
        ErrorClass::Http5xx,
        ErrorClass::StreamBroken,
        ErrorClass::Other,
    ];

    /// Short name.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Connect => "connect",
            ErrorClass::Timeout => "timeout",
            ErrorClass::Http4xx => "http_4xx",
            ErrorClass::Http5xx => "http_5xx",
            ErrorClass::StreamBroken => "stream_broken",
            ErrorClass::Other => "other",
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// The stream completed.
    Ok,
    /// The server shed the request (HTTP 429 or 503).
    Rejected {
        /// HTTP status.
        status: u16,
    },
    /// The request failed.
    Error {
        /// Failure class.
        class: ErrorClass,
    },
}

/// Measurements of one request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestRecord {
    /// Index of the request in the (sliced) trace.
    pub index: usize,
    /// When the schedule said to send it.
    pub scheduled_at_s: f64,
    /// When it was actually sent (later than scheduled if the concurrency cap was reached).
    pub sent_at_s: f64,
    /// Prompt length the trace asked for, tokens.
    pub input_length: u32,
    /// Output length the trace asked for, tokens.
    pub output_length: u32,
    /// Time to first generated token.
    pub ttft_s: Option<f64>,
    /// End-to-end latency (send to end of stream).
    pub e2e_s: Option<f64>,
    /// Mean gap between generated chunks after the first.
    pub itl_mean_s: Option<f64>,
    /// Largest gap between generated chunks.
    pub itl_max_s: Option<f64>,
    /// Prompt tokens reported by the server.
    pub prompt_tokens: Option<u32>,
    /// Generated tokens (server's usage, else the number of content chunks).
    pub completion_tokens: u32,
    /// Cached prompt tokens reported by the server, if it reports them.
    pub cached_tokens: Option<u32>,
    /// Instance that served it, from the `x-kvgate-instance` response header.
    pub instance: Option<String>,
    /// The router's predicted time to first token (kvgate's `x-kvgate-predicted-ttft-ms`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_ttft_s: Option<f64>,
    /// Which of the router's replicas it was sent to (replays over several base URLs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<u32>,
    /// The tenant it was sent as (replays with a tenant mix).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Why the router refused it, from a rejection's `x-kvgate-reject-reason` header.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reject_reason: Option<String>,
    /// How it ended.
    pub outcome: Outcome,
}
