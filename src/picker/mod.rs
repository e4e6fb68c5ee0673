//! The endpoint picker: kvgate as a Gateway API Inference Extension (GIE) endpoint picker,
//! serving Envoy's `envoy.service.ext_proc.v3.ExternalProcessor` on its own port
//! (`[picker]`), beside the HTTP proxy and over the same state — one routing core, two doors.
//!
//! A conformant gateway (Envoy, Istio, kgateway, agentgateway, NGINX Gateway Fabric, GKE)
//! opens one ext_proc stream per HTTP request of an `InferencePool` and, in FULL_DUPLEX_STREAMED
//! mode, sends the request headers and body chunks; the picker gathers the body
//! ([`stream`]), routes it exactly as the proxy does — the same parse, auth, rate limit,
//! admission gate and decision ([`crate::proxy::admit`], [`crate::proxy::decide`]) — and
//! answers with the endpoint in the `x-gateway-destination-endpoint` header and the `envoy.lb`
//! dynamic metadata, chosen first and fallbacks after ([`protocol`]), then passes the body back.
//! The response's headers and body are observed by the proxy's own
//! [`crate::proxy::body::Tracker`] (time to first token, output tokens, the end of the request)
//! and passed back unchanged.
//!
//! Invariants:
//! - A decision made here is a decision like the proxy's: recorded in the index as a
//!   prediction, shared by gossip, shown in `/admin/decisions`, holding the chosen instance's
//!   load until the response ends or the stream does.
//! - The stream ending before the response does (the client went away, the gateway reset
//!   it) finishes the request as the proxy finishes one whose client left: load and the
//!   admission place released exactly once.
//! - The body held per stream never exceeds `server.body_limit_bytes` (413 beyond it) and is
//!   reserved in the server's in-flight body budget; at most `picker.max_streams` streams are
//!   served at once; a stream silent for `picker.idle_timeout_ms` before its decision is ended.
//! - Refusals of the request (400, 401, 403, 413, 415, 429) are the gateway's immediate answer,
//!   with the proxy's status, headers and body. Failures of the picker's own, and no usable
//!   instance, follow `picker.failure_mode`: an immediate 503 (FailClose), or the stream ended
//!   with gRPC `UNAVAILABLE` for a fail-open gateway to route the request itself (FailOpen).
//! - When the gateway reports that a fallback served the request
//!   (`x-gateway-destination-endpoint-served`), the load moves to it and the chosen instance's
//!   prediction is taken back.

pub mod protocol;
pub mod server;
pub mod stream;

pub use server::{serve, Picker};
