//! OpenAI-style error responses in the engine's flavour.
//!
//! vLLM (≥ 0.10.1): `{"error": {"message", "type", "param", "code"}}`; SGLang and older vLLM: a
//! flat `{"object": "error", "message", "type", "param", "code"}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::Flavour;

/// An error answer.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// Flavour of the body.
    pub flavour: Flavour,
}

impl ApiError {
    /// A 400 for bad input.
    pub fn bad_request(flavour: Flavour, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            flavour,
        }
    }

    /// Any status.
    pub fn new(flavour: Flavour, status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            flavour,
        }
    }

    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 422 => "BadRequestError",
            404 => "NotFoundError",
            503 => "ServiceUnavailableError",
            _ => "InternalServerError",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        match self.flavour {
            Flavour::Vllm => {
                json!({"error": {"message": self.message, "type": self.kind(), "param": null, "code": self.status.as_u16()}})
            }
            Flavour::Sglang => {
                json!({"object": "error", "message": self.message, "type": self.kind(), "param": null, "code": self.status.as_u16()})
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
