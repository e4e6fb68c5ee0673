//! Sends one streaming request and measures it.
//!
//! The response body is consumed chunk by chunk; per generated chunk only two timestamps and a
//! few counters are updated (no per-token allocation beyond the transport's own buffers).

use std::time::{Duration, Instant};

use futures_util::StreamExt;

use super::record::{ErrorClass, Outcome, RequestRecord};
use super::sse::{Chunk, SseParser};

/// Response header naming the instance that served the request.
pub const INSTANCE_HEADER: &str = "x-kvgate-instance";
/// Response header with the router's predicted time to first token, ms.
pub const PREDICTED_TTFT_HEADER: &str = "x-kvgate-predicted-ttft-ms";
/// Response header giving the reason of a gateway's rejection.
pub const REJECT_REASON_HEADER: &str = "x-kvgate-reject-reason";
/// Most bytes read from an error response body (only drained so the connection can be reused).
const MAX_ERROR_BODY: usize = 64 << 10;

/// Everything needed to send one request.
pub struct Attempt<'a> {
    /// Shared HTTP client.
    pub client: &'a reqwest::Client,
    /// Full URL (base + API path).
    pub url: &'a str,
    /// JSON body.
    pub body: Vec<u8>,
    /// Whole-request timeout.
    pub timeout: Duration,
    /// A header sent with the request (the tenant's), as name and value.
    pub header: Option<(&'a str, &'a str)>,
}

/// What one attempt measured; the caller adds scheduling fields.
#[derive(Debug, Default)]
pub struct Measured {
    pub(crate) ttft: Option<Duration>,
    pub(crate) e2e: Option<Duration>,
    pub(crate) itl_sum: Duration,
    pub(crate) itl_max: Duration,
    pub(crate) chunks: u32,
    pub(crate) prompt_tokens: Option<u32>,
    pub(crate) completion_tokens: Option<u32>,
    pub(crate) cached_tokens: Option<u32>,
    pub(crate) instance: Option<String>,
    pub(crate) reject_reason: Option<String>,
    pub(crate) predicted_ttft_ms: Option<f64>,
}

impl Measured {
    /// Turns the measurement into a record.
    pub fn into_record(
        self,
        outcome: Outcome,
        index: usize,
        scheduled_at_s: f64,
        sent_at_s: f64,
        input_length: u32,
        output_length: u32,
    ) -> RequestRecord {
        let gaps = self.chunks.saturating_sub(1);
        RequestRecord {
            index,
            scheduled_at_s,
            sent_at_s,
            input_length,
            output_length,
            ttft_s: self.ttft.map(|d| d.as_secs_f64()),
            e2e_s: self.e2e.map(|d| d.as_secs_f64()),
            itl_mean_s: (gaps > 0).then(|| self.itl_sum.as_secs_f64() / f64::from(gaps)),
            itl_max_s: (gaps > 0).then_some(self.itl_max.as_secs_f64()),
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens.unwrap_or(self.chunks),
            cached_tokens: self.cached_tokens,
            instance: self.instance,
            replica: None,
            tenant: None,
            reject_reason: self.reject_reason,
            predicted_ttft_s: self
                .predicted_ttft_ms
                .filter(|ms| ms.is_finite() && *ms >= 0.0)
                .map(|ms| ms / 1e3),
            outcome,
        }
    }
}

fn classify(e: &reqwest::Error) -> ErrorClass {
    if e.is_timeout() {
        ErrorClass::Timeout
    } else if e.is_connect() {
        ErrorClass::Connect
    } else if e.is_body() || e.is_decode() {
        ErrorClass::StreamBroken
    } else {
        ErrorClass::Other
    }
}

/// Sends the request and reads the stream to the end.
pub async fn send(a: Attempt<'_>) -> (Outcome, Measured) {
    let mut m = Measured::default();
    let t0 = Instant::now();
    let mut post = a
        .client
        .post(a.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(reqwest::header::ACCEPT, "text/event-stream");
    if let Some((name, value)) = a.header {
        post = post.header(name, value);
    }
    let resp = match post.timeout(a.timeout).body(a.body).send().await {
        Ok(r) => r,
        Err(e) => {
            return (
                Outcome::Error {
                    class: classify(&e),
                },
                m,
            )
        }
    };
    m.instance = resp
        .headers()
        .get(INSTANCE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.chars().take(128).collect());
    m.predicted_ttft_ms = resp
        .headers()
        .get(PREDICTED_TTFT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse().ok());
    let status = resp.status().as_u16();
    if status != 200 {
        if matches!(status, 429 | 503) {
            m.reject_reason = resp
                .headers()
                .get(REJECT_REASON_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(|s| s.chars().take(64).collect());
        }
        drain(resp).await;
        let outcome = match status {
            429 | 503 => Outcome::Rejected { status },
            400..=499 => Outcome::Error {
                class: ErrorClass::Http4xx,
            },
            500..=599 => Outcome::Error {
                class: ErrorClass::Http5xx,
            },
            _ => Outcome::Error {
                class: ErrorClass::Other,
            },
        };
        return (outcome, m);
    }
    let mut parser = SseParser::default();
    let mut stream = resp.bytes_stream();
    let mut last = t0;
    let mut done = false;
    let mut broken = false;
    while let Some(item) = stream.next().await {
        let bytes = match item {
            Ok(b) => b,
            Err(e) => {
                let class = match classify(&e) {
                    ErrorClass::Timeout => ErrorClass::Timeout,
                    _ => ErrorClass::StreamBroken,
                };
                return (Outcome::Error { class }, m);
            }
        };
        let now = Instant::now();
        let fed = parser.feed(&bytes, |data| {
            if data == b"[DONE]" {
                done = true;
                return;
            }
            let Ok(chunk) = serde_json::from_slice::<Chunk>(data) else {
                broken = true;
                return;
            };
            if chunk.error.is_some() {
                broken = true;
            }
            if chunk.has_token() {
                if m.ttft.is_none() {
                    m.ttft = Some(now - t0);
                } else {
                    let gap = now - last;
                    m.itl_sum += gap;
                    m.itl_max = m.itl_max.max(gap);
                }
                last = now;
                m.chunks += 1;
            }
            if let Some(u) = chunk.usage {
                m.prompt_tokens = u.prompt_tokens.or(m.prompt_tokens);
                m.completion_tokens = u.completion_tokens.or(m.completion_tokens);
                m.cached_tokens = u
                    .prompt_tokens_details
                    .and_then(|d| d.cached_tokens)
                    .or(m.cached_tokens);
            }
        });
        if fed.is_err() || broken {
            return (
                Outcome::Error {
                    class: ErrorClass::StreamBroken,
                },
                m,
            );
        }
        if done {
            break;
        }
    }
    m.e2e = Some(t0.elapsed());
    if !done {
        return (
            Outcome::Error {
                class: ErrorClass::StreamBroken,
            },
            m,
        );
    }
    (Outcome::Ok, m)
}

async fn drain(resp: reqwest::Response) {
    let mut stream = resp.bytes_stream();
    let mut n = 0usize;
    while let Some(Ok(b)) = stream.next().await {
        n += b.len();
        if n > MAX_ERROR_BODY {
            break;
        }
    }
}
