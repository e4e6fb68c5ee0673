//! The gateway's one error type and its single mapping to an HTTP response.
//!
//! Invariants:
//! - Every error a client can see is a [`GatewayError`]; it becomes a response only in
//!   [`GatewayError::into_response`], with an OpenAI-style body
//!   `{"error": {"message", "type", "code"}}`.
//! - Each variant records who is at fault ([`Fault`]) and whether retrying elsewhere is safe.
//! - Messages may quote client input in the body, but never reach metric labels: labels use
//!   [`GatewayError::code`], a bounded set.

use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};

/// Who caused a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The request was wrong.
    Client,
    /// An instance failed or was unreachable.
    Upstream,
    /// The gateway itself could not serve (no capacity, internal failure).
    Gateway,
}

/// Everything that can go wrong serving a request.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The body is not JSON.
    #[error("request body is not valid JSON: {0}")]
    MalformedJson(String),
    /// The body is JSON but not an object.
    #[error("request body must be a JSON object")]
    NotAnObject,
    /// `Content-Type` is not `application/json`.
    #[error("unsupported content type `{0}`: send application/json")]
    UnsupportedMediaType(String),
    /// A required field is absent.
    #[error("missing required field `{0}`")]
    MissingField(&'static str),
    /// A field has the wrong shape.
    #[error("invalid field `{field}`: {message}")]
    InvalidField {
        /// The field.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The body exceeds `server.body_limit_bytes`.
    #[error("request body exceeds the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The limit.
        limit: usize,
    },
    /// The client's body could not be read (it hung up, bad framing).
    #[error("could not read the request body: {0}")]
    BodyRead(String),
    /// The declared body did not arrive within `server.limits.body_read_timeout_ms`.
    #[error("the request body did not arrive within {timeout_ms} ms")]
    BodyTimeout {
        /// The body read timeout.
        timeout_ms: u64,
    },
    /// The in-flight body budget had no room for this body within the wait.
    #[error("the gateway holds too many request bodies; retry shortly (waited {waited_ms} ms)")]
    BodyBudgetExhausted {
        /// How long the request waited for room.
        waited_ms: u64,
    },
    /// `server.limits.max_connections` connections are open.
    #[error("the gateway serves its maximum of {max} connections; retry shortly")]
    TooManyConnections {
        /// The cap.
        max: usize,
    },
    /// No pool serves this model.
    #[error("the model `{0}` does not exist")]
    UnknownModel(String),
    /// No `model` while several pools exist.
    #[error("missing required field `model`: this gateway serves several models")]
    ModelRequired,
    /// Every instance of the pool is unhealthy, ejected or already tried.
    #[error("no healthy instance is available for model `{model}`")]
    NoHealthyInstance {
        /// The model.
        model: String,
    },
    /// TCP connect to the chosen instance(s) failed.
    #[error("could not connect to instance `{instance}`")]
    UpstreamConnect {
        /// The last instance tried.
        instance: String,
    },
    /// The instance sent no response headers in time.
    #[error("instance `{instance}` did not respond within {timeout_ms} ms")]
    UpstreamTimeout {
        /// The instance.
        instance: String,
        /// The first-byte timeout.
        timeout_ms: u64,
    },
    /// The instance broke the connection or HTTP framing.
    #[error("instance `{instance}` failed: {message}")]
    UpstreamProtocol {
        /// The instance.
        instance: String,
        /// What happened.
        message: String,
    },
    /// A path the gateway does not serve.
    #[error("not found: {0}")]
    NotFound(String),
    /// The gateway is shutting down or failed internally.
    #[error("internal gateway error: {0}")]
    Internal(String),
    /// Admission control turned the request away: its pool is saturated and the request could
    /// not wait (queue full), waited too long, or was shed for a more urgent one.
    #[error("model `{model}` is overloaded ({reason}); retry after {retry_after_s} s")]
    Overloaded {
        /// The pool's model.
        model: String,
        /// `queue_full`, `wait_timeout` or `shed` (also the `x-kvgate-reject-reason` header).
        reason: &'static str,
        /// The predicted drain time, seconds (the `Retry-After` header).
        retry_after_s: u64,
    },
    /// `auth.enabled` and the request carried no key, or a key the gateway does not know.
    #[error("invalid or missing API key")]
    InvalidApiKey,
    /// An admin token is configured and the request to `/admin/*` or `/metrics` did not carry it.
    #[error("invalid or missing admin token")]
    InvalidAdminToken,
    /// The key's tenant may not use this model.
    #[error("model `{0}` is not allowed for this API key")]
    ModelNotAllowed(String),
    /// The tenant is over its rate limit (requests per second or tokens per minute).
    #[error("rate limit exceeded ({} per {}); retry after {} s", .0.limit, if .0.limit == "requests" { "second" } else { "minute" }, .0.retry_after_s())]
    RateLimited(Box<crate::ratelimit::Refused>),
    /// Every tokenizing thread is busy and the queue for them is full or was waited on too long.
    #[error("the gateway's tokenizers are busy ({queued} prompts waiting); retry shortly")]
    TokenizerBusy {
        /// Prompts waiting when this one was turned away.
        queued: usize,
    },
}

impl GatewayError {
    /// HTTP status.
    pub fn status(&self) -> StatusCode {
        use GatewayError::*;
        match self {
            MalformedJson(_)
            | NotAnObject
            | MissingField(_)
            | InvalidField { .. }
            | ModelRequired
            | BodyRead(_) => StatusCode::BAD_REQUEST,
            UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            BodyBudgetExhausted { .. } | TooManyConnections { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            UnknownModel(_) | NotFound(_) => StatusCode::NOT_FOUND,
            InvalidApiKey | InvalidAdminToken => StatusCode::UNAUTHORIZED,
            ModelNotAllowed(_) => StatusCode::FORBIDDEN,
            NoHealthyInstance { .. } => StatusCode::SERVICE_UNAVAILABLE,
            UpstreamConnect { .. } | UpstreamProtocol { .. } => StatusCode::BAD_GATEWAY,
            UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Overloaded { .. } | RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            TokenizerBusy { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// Who is at fault.
    pub fn fault(&self) -> Fault {
        use GatewayError::*;
        match self {
            MalformedJson(_)
            | NotAnObject
            | UnsupportedMediaType(_)
            | MissingField(_)
            | InvalidField { .. }
            | PayloadTooLarge { .. }
            | BodyRead(_)
            | BodyTimeout { .. }
            | UnknownModel(_)
            | ModelRequired
            | InvalidApiKey
            | InvalidAdminToken
            | ModelNotAllowed(_)
            | RateLimited(_)
            | NotFound(_) => Fault::Client,
            UpstreamConnect { .. } | UpstreamTimeout { .. } | UpstreamProtocol { .. } => {
                Fault::Upstream
            }
            NoHealthyInstance { .. }
            | BodyBudgetExhausted { .. }
            | TooManyConnections { .. }
            | Internal(_)
            | Overloaded { .. }
            | TokenizerBusy { .. } => Fault::Gateway,
        }
    }

    /// Whether the client may safely send the same request again (nothing was generated).
    pub fn retry_safe(&self) -> bool {
        matches!(
            self,
            GatewayError::NoHealthyInstance { .. }
                | GatewayError::UpstreamConnect { .. }
                | GatewayError::Overloaded { .. }
                | GatewayError::RateLimited(_)
                | GatewayError::TokenizerBusy { .. }
                | GatewayError::BodyBudgetExhausted { .. }
                | GatewayError::TooManyConnections { .. }
        )
    }

    /// Whether the connection closes after this answer: the request's body was not (fully)
    /// read, so the next bytes on it are not a request head.
    pub fn closes_connection(&self) -> bool {
        matches!(
            self,
            GatewayError::BodyTimeout { .. }
                | GatewayError::BodyBudgetExhausted { .. }
                | GatewayError::TooManyConnections { .. }
        )
    }

    /// OpenAI error `type`.
    pub fn error_type(&self) -> &'static str {
        if let GatewayError::RateLimited(_) = self {
            // What OpenAI's clients look for to back off.
            return "rate_limit_exceeded";
        }
        match self.fault() {
            Fault::Client => "invalid_request_error",
            Fault::Upstream => "upstream_error",
            Fault::Gateway => "service_unavailable",
        }
    }

    /// Why the gateway refused the request, as the audit log and tenant metrics name it.
    pub fn audit_reason(&self) -> &'static str {
        use GatewayError::*;
        match self {
            InvalidApiKey | InvalidAdminToken => "auth",
            ModelNotAllowed(_) | UnknownModel(_) | ModelRequired => "model",
            RateLimited(_) => "rate_limit",
            Overloaded { .. } => "admission",
            PayloadTooLarge { .. }
            | BodyTimeout { .. }
            | BodyBudgetExhausted { .. }
            | TooManyConnections { .. } => "limits",
            MalformedJson(_)
            | NotAnObject
            | MissingField(_)
            | InvalidField { .. }
            | UnsupportedMediaType(_)
            | BodyRead(_)
            | NotFound(_) => "invalid_request",
            UpstreamConnect { .. } | UpstreamTimeout { .. } | UpstreamProtocol { .. } => "upstream",
            NoHealthyInstance { .. } | TokenizerBusy { .. } | Internal(_) => "unavailable",
        }
    }

    /// Stable machine-readable `code`; also the bounded metric label for this error.
    pub fn code(&self) -> &'static str {
        use GatewayError::*;
        match self {
            MalformedJson(_) => "malformed_json",
            NotAnObject => "body_not_object",
            UnsupportedMediaType(_) => "unsupported_media_type",
            MissingField(_) => "missing_field",
            InvalidField { .. } => "invalid_field",
            PayloadTooLarge { .. } => "payload_too_large",
            BodyRead(_) => "body_read_failed",
            BodyTimeout { .. } => "body_read_timeout",
            BodyBudgetExhausted { .. } => "body_budget_exhausted",
            TooManyConnections { .. } => "too_many_connections",
            UnknownModel(_) => "model_not_found",
            ModelRequired => "model_required",
            NoHealthyInstance { .. } => "no_healthy_instance",
            UpstreamConnect { .. } => "upstream_connect_failed",
            UpstreamTimeout { .. } => "upstream_timeout",
            UpstreamProtocol { .. } => "upstream_protocol_error",
            NotFound(_) => "not_found",
            Internal(_) => "internal_error",
            Overloaded { .. } => "overloaded",
            TokenizerBusy { .. } => "tokenizer_busy",
            InvalidApiKey => "invalid_api_key",
            InvalidAdminToken => "invalid_admin_token",
            ModelNotAllowed(_) => "model_not_allowed",
            RateLimited(_) => "rate_limit_exceeded",
        }
    }

    /// The OpenAI-style JSON body.
    pub fn body(&self) -> String {
        serde_json::json!({
            "error": {
                "message": self.to_string(),
                "type": self.error_type(),
                "code": self.code(),
            }
        })
        .to_string()
    }
}

/// Seconds a client should wait before retrying after a 503.
const RETRY_AFTER_SECS: &str = "1";

impl From<crate::proxy::json::SyntaxError> for GatewayError {
    fn from(e: crate::proxy::json::SyntaxError) -> Self {
        GatewayError::MalformedJson(e.to_string())
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let mut resp = (self.status(), self.body()).into_response();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.status() == StatusCode::SERVICE_UNAVAILABLE {
            h.insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        if let GatewayError::Overloaded {
            reason,
            retry_after_s,
            ..
        } = &self
        {
            h.insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_s));
            h.insert(X_REJECT_REASON, HeaderValue::from_static(reason));
        }
        if let GatewayError::RateLimited(r) = &self {
            h.insert(header::RETRY_AFTER, HeaderValue::from(r.retry_after_s()));
            crate::ratelimit::headers(&r.status, |n, v| {
                h.insert(n, v);
            });
        }
        if matches!(
            self,
            GatewayError::InvalidApiKey | GatewayError::InvalidAdminToken
        ) {
            h.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.closes_connection() {
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

/// Response header of a 429 from admission control: why (`queue_full`, `wait_timeout`, `shed`).
pub const X_REJECT_REASON: http::HeaderName =
    http::HeaderName::from_static("x-kvgate-reject-reason");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_healthy_instance_is_503_with_retry_after() {
        let e = GatewayError::NoHealthyInstance { model: "m".into() };
        assert_eq!(e.fault(), Fault::Gateway);
        assert!(e.retry_safe());
        let r = e.into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn overloaded_is_429_with_retry_after_and_reason() {
        let e = GatewayError::Overloaded {
            model: "m".into(),
            reason: "queue_full",
            retry_after_s: 7,
        };
        assert!(e.retry_safe());
        assert_eq!(e.code(), "overloaded");
        let r = e.into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "7");
        assert_eq!(r.headers()[X_REJECT_REASON], "queue_full");
    }

    #[test]
    fn limit_errors_map_to_their_statuses_and_close() {
        let cases = [
            (
                GatewayError::BodyTimeout { timeout_ms: 1 },
                408,
                Fault::Client,
            ),
            (
                GatewayError::BodyBudgetExhausted { waited_ms: 1 },
                503,
                Fault::Gateway,
            ),
            (
                GatewayError::TooManyConnections { max: 1 },
                503,
                Fault::Gateway,
            ),
        ];
        for (e, status, fault) in cases {
            assert_eq!(e.fault(), fault, "{e}");
            assert!(e.closes_connection());
            let r = e.into_response();
            assert_eq!(r.status().as_u16(), status);
            assert_eq!(r.headers()[header::CONNECTION], "close");
            assert_eq!(r.headers().contains_key(header::RETRY_AFTER), status == 503);
        }
    }

    #[test]
    fn body_is_openai_shaped() {
        let e = GatewayError::UnknownModel("x".into());
        let v: serde_json::Value = serde_json::from_str(&e.body()).unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("`x`"));
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
    }
}
