//! The proxied OpenAI endpoints: read the body once, route, forward the original bytes, relay the
//! answer.
//!
//! Invariants:
//! - The client's body is read once, under `server.body_limit_bytes`, and forwarded byte for byte;
//!   only routing fields are parsed (see [`parse`]).
//! - A request is retried on another instance only after a connect failure or a 502/503 answer,
//!   or — with `upstream.idempotent_requests` — a connection closed before any answer byte or a
//!   500/504 answer; all before anything was sent to the client, and at most
//!   `upstream.max_attempts` times in all. Once response headers are relayed there is no retry.
//! - Connect failures and connections closed before an answer count toward passive ejection
//!   (`health.passive_failure_threshold`); 500/502/503/504 answers toward outlier ejection
//!   (`health.passive_5xx_threshold`), whether or not they are retried; 503 (an engine's full
//!   queue) never ejects, so overload does not cascade through ejections.
//! - An attempt that failed that way takes its routing prediction back (locally and through
//!   gossip), since the instance never computed the prompt; a timeout or a broken answer does not
//!   (the instance may have).
//! - Errors become responses only through [`GatewayError`]'s single mapping.
//! - With admission control on, a request to a saturated pool waits in the pool's queue before
//!   its decision is used (see [`crate::admission`]); its time there counts in its time to first
//!   token, which runs from arrival.

pub mod body;
pub mod date;
pub mod h1;
pub mod headers;
pub mod isolation;
pub mod json;
pub mod limits;
pub mod offload;
pub mod parse;
pub mod reply;
pub mod server;
pub mod service;
pub mod usage;

use crate::admission::{Gate, PRIORITY_HEADER};
use crate::app::AppState;
use crate::client::wire::Fields;
use crate::client::{OutHeaders, Outgoing, SendError, UpstreamResponse};
use crate::error::{Fault, GatewayError};
use crate::fleet::Pool;
use crate::metrics;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use body::{BoxError, GatewayBody, ProxyBody, Tracker};
use bytes::Bytes;
use http::{header, HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, Limited};
use kvgate_core::InstanceId;
use parse::Endpoint;
use reply::Reply;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `POST /v1/chat/completions`
pub async fn chat(State(s): State<AppState>, req: Request) -> Response {
    handle(s, Endpoint::Chat, req)
        .await
        .into_http()
        .into_response()
}
/// `POST /v1/completions`
pub async fn completions(State(s): State<AppState>, req: Request) -> Response {
    handle(s, Endpoint::Completions, req)
        .await
        .into_http()
        .into_response()
}
/// `POST /v1/embeddings`
pub async fn embeddings(State(s): State<AppState>, req: Request) -> Response {
    handle(s, Endpoint::Embeddings, req)
        .await
        .into_http()
        .into_response()
}
/// `POST /v1/responses`
pub async fn responses(State(s): State<AppState>, req: Request) -> Response {
    handle(s, Endpoint::Responses, req)
        .await
        .into_http()
        .into_response()
}

/// Proxies one request to `endpoint`: the whole request path, errors included.
pub async fn handle<B>(state: AppState, endpoint: Endpoint, req: http::Request<B>) -> Reply
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let started = Instant::now();
    let rid = headers::request_id(req.headers().get(&state.request_id_header));
    let mut tenant = None;
    let result = async {
        let (parts, body) = req.into_parts();
        headers::is_json(parts.headers.get(header::CONTENT_TYPE))
            .map_err(GatewayError::UnsupportedMediaType)?;
        let limit = state.limits.body_limit;
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(GatewayError::PayloadTooLarge { limit });
        }
        let (bytes, reserved) = read_body(body, declared, &state.limits).await?;
        let mut up = parts.headers;
        headers::strip_hop_by_hop(&mut up);
        up.remove(&state.request_id_header);
        let who = state.auth.check(&OutHeaders::Map(&up))?;
        tenant = who.as_ref().map(|p| p.tenant.clone());
        let (tenant_header, strip_key) = client_filter(&state);
        let dropped: Vec<http::HeaderName> = up
            .keys()
            .filter(|n| !headers::from_client(n.as_str().as_bytes(), tenant_header, strip_key))
            .cloned()
            .collect();
        for n in dropped {
            up.remove(n);
        }
        let out = Upstream {
            headers: OutHeaders::Map(&up),
            query: parts.uri.query(),
            body: bytes,
        };
        let forwarded = forward(&state, endpoint, out, who, &rid, started).await;
        // The body was forwarded (or refused) and is dropped with the request.
        drop(reserved);
        forwarded
    }
    .await;
    answer(&state, endpoint, result, rid, tenant)
}

/// A request as [`h1`] read it, its body complete.
pub struct RawRequest {
    /// End-to-end fields, free of connection-level ones, `host`, `content-length` and the
    /// request id field.
    pub fields: Fields,
    /// The request target, when it has a query.
    pub target: Option<http::uri::PathAndQuery>,
    /// The `content-type` value.
    pub content_type: Option<HeaderValue>,
    /// The request id field's value.
    pub request_id: Option<HeaderValue>,
    /// The body, within the limit.
    pub body: Bytes,
}

/// [`handle`] for a request [`h1`] read: the same checks, errors and forwarding, without a
/// header map.
pub async fn handle_raw(state: &AppState, endpoint: Endpoint, req: RawRequest) -> Reply {
    let started = Instant::now();
    let rid = headers::request_id(req.request_id.as_ref());
    // Checked without an async block around `forward`: its future is large, and each enclosing
    // future copies it once more.
    let checked =
        headers::is_json(req.content_type.as_ref()).map_err(GatewayError::UnsupportedMediaType);
    let mut fields = req.fields;
    let who = checked.and_then(|()| state.auth.check(&OutHeaders::Fields(&fields)));
    let tenant = who
        .as_ref()
        .ok()
        .and_then(|w| w.as_ref())
        .map(|p| p.tenant.clone());
    let result = match who {
        Ok(who) => {
            let (tenant_header, strip_key) = client_filter(state);
            fields.retain(|n| headers::from_client(n, tenant_header, strip_key));
            let out = Upstream {
                headers: OutHeaders::Fields(&fields),
                query: req.target.as_ref().and_then(|t| t.query()),
                body: req.body,
            };
            forward(state, endpoint, out, who, &rid, started).await
        }
        Err(e) => Err(e),
    };
    answer(state, endpoint, result, rid, tenant)
}

/// What [`headers::from_client`] filters by: the tenant header and whether to strip the key.
pub fn client_filter(state: &AppState) -> (&str, bool) {
    let auth = &state.config.auth;
    (
        state.admission.tenant_header().as_str(),
        auth.enabled && !auth.forward_client_key,
    )
}

/// The answer to a request [`h1`] refuses before reading all of its body (a limit): the error's,
/// counted and logged as every other.
pub fn refusal(state: &AppState, endpoint: Endpoint, e: GatewayError) -> Reply {
    answer(state, endpoint, Err(e), headers::request_id(None), None)
}

/// A tenant's bounded label: the key's tenant, [`crate::ratelimit::ANONYMOUS`] without keys,
/// `unauthenticated` when keys are on and the request had no valid one.
pub fn tenant_label(state: &AppState, tenant: Option<&std::sync::Arc<str>>) -> std::sync::Arc<str> {
    match tenant {
        Some(t) => t.clone(),
        None if state.auth.enabled() => "unauthenticated".into(),
        None => crate::ratelimit::ANONYMOUS.into(),
    }
}

/// The reply to a request with id `rid` of `tenant` (once known): the forwarded answer, or the
/// error's, counted and logged; a refusal also gets one audit line.
fn answer(
    state: &AppState,
    endpoint: Endpoint,
    result: Result<Reply, GatewayError>,
    rid: HeaderValue,
    tenant: Option<std::sync::Arc<str>>,
) -> Reply {
    let label = tenant_label(state, tenant.as_ref());
    metrics::record_tenant_request(&label);
    let mut reply = match result {
        Ok(r) => r,
        Err(e) => {
            record_refusal(endpoint, &e, &rid, &label);
            Reply::Made(e.into_response().map(GatewayBody::plain))
        }
    };
    reply.set(state.request_id_header.clone(), rid);
    reply
}

/// Counts and logs a refused request of `label`'s tenant: one audit line, the rejection
/// metrics, a log line by fault. Both doors call it for every refusal.
pub fn record_refusal(endpoint: Endpoint, e: &GatewayError, rid: &HeaderValue, label: &str) {
    let status = e.status();
    let reason = e.audit_reason();
    metrics::record_tenant_rejection(label, reason);
    // Tenant, reason, status and id only: never the prompt or the key.
    tracing::info!(
        target: "kvgate::audit",
        tenant = %label,
        reason,
        status = status.as_u16(),
        code = e.code(),
        request_id = ?rid,
        "request refused"
    );
    metrics::record_rejected(
        endpoint.label(),
        e.code(),
        metrics::status_class(status.as_u16()),
    );
    match e.fault() {
        Fault::Client => {
            tracing::debug!(request_id = ?rid, code = e.code(), "rejected: {e}")
        }
        _ => tracing::warn!(request_id = ?rid, code = e.code(), "failed: {e}"),
    }
}

/// What [`forward`] sends upstream besides the routing.
struct Upstream<'a> {
    /// End-to-end fields, without the request id field.
    headers: OutHeaders<'a>,
    query: Option<&'a str>,
    body: Bytes,
}

/// Reads a body under the limits: at most `limits.body_limit` bytes, within the body read
/// timeout, reserved in the body budget before they are kept (the declared length up front,
/// otherwise as frames arrive). The reservation is returned with the bytes.
async fn read_body<'a, B>(
    body: B,
    declared: Option<u64>,
    limits: &'a limits::Limits,
) -> Result<(Bytes, limits::budget::Reserved<'a>), GatewayError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let limit = limits.body_limit;
    // Within the limit: checked by the caller.
    let mut reserved = limits
        .budget
        .reserve(declared.unwrap_or(0) as usize)
        .await?;
    let read = async {
        let mut body = std::pin::pin!(Limited::new(body, limit));
        let mut parts: Vec<Bytes> = Vec::new();
        let mut len = 0usize;
        while let Some(frame) = body.frame().await {
            let data = match frame {
                Ok(f) => match f.into_data() {
                    Ok(d) => d,
                    // Trailers carry nothing forwarded.
                    Err(_) => continue,
                },
                Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                    return Err(GatewayError::PayloadTooLarge { limit })
                }
                Err(e) => return Err(GatewayError::BodyRead(e.to_string())),
            };
            len += data.len();
            if len > reserved.num_permits() {
                let more = len - reserved.num_permits();
                limits.budget.grow(&mut reserved, more).await?;
            }
            parts.push(data);
        }
        Ok(match parts.len() {
            0 => Bytes::new(),
            1 => parts.swap_remove(0),
            _ => {
                let mut all = bytes::BytesMut::with_capacity(len);
                for p in parts {
                    all.extend_from_slice(&p);
                }
                all.freeze()
            }
        })
    };
    match tokio::time::timeout(limits.body, read).await {
        Ok(Ok(bytes)) => Ok((bytes, reserved)),
        Ok(Err(e)) => Err(e),
        Err(_) => {
            metrics::record_connection_closed(metrics::CloseReason::BodyTimeout);
            Err(GatewayError::BodyTimeout {
                timeout_ms: limits.body.as_millis() as u64,
            })
        }
    }
}

fn has_candidate(state: &AppState, pool: &Pool, tried: &[InstanceId]) -> bool {
    let now = state.clock.now_ms();
    let view = state.fleet.view();
    view.members(pool.index)
        .iter()
        .any(|id| !tried.contains(id) && view.instance(*id).is_some_and(|i| i.health.usable(now)))
}

/// A request parsed, hashed for its pool, authorized for its model, admitted under its tenant's
/// rate limit and given its admission gate: the first half of "admit + decide", shared by both
/// doors — the proxy's `forward` and the endpoint picker ([`crate::picker`]).
pub struct Admitted<'s> {
    /// Its pool.
    pub pool: &'s Pool,
    /// Its prompt, hashed for that pool.
    pub prep: crate::routing::Prepared,
    /// Whether it asked for a stream.
    pub stream: bool,
    /// The body to send on: the client's bytes, with an isolated tenant's cache salt set.
    pub body: Bytes,
    /// Admission control's gate for the pool (open when admission is off).
    pub gate: Gate<'s>,
    /// The rate limit it was admitted under, if its tenant is limited.
    pub rate: Option<crate::ratelimit::Admitted>,
    /// The prompt's rate-limit charge: given back if dropped while no engine holds the request.
    pub charge: crate::ratelimit::Charge<'s>,
}

/// Parses `bytes` as a request to `endpoint` (on the tokenizing threads when large), finds its
/// pool, checks that `who` may use the model, charges the tenant's rate limit and builds the
/// admission gate from `headers` (priority, tenant) and the body's priority.
pub async fn admit<'s>(
    state: &'s AppState,
    endpoint: Endpoint,
    headers: &OutHeaders<'_>,
    bytes: Bytes,
    who: Option<&crate::auth::Principal>,
) -> Result<Admitted<'s>, GatewayError> {
    // An isolated tenant's requests are hashed and cached under a salt of its own.
    let isolated = who.and_then(|p| {
        (p.cache.unwrap_or(state.config.auth.cache) == crate::config::CacheSharing::Isolated)
            .then(|| p.tenant.clone())
    });
    let ready = if state
        .offload
        .applies(state.routing.strictest_mode(), bytes.len())
    {
        state
            .offload
            .ready(state, endpoint, bytes.clone(), isolated)
            .await?
    } else {
        offload::ready(state, endpoint, &bytes, isolated.as_deref())?
    };
    let bytes = match &ready.cache_salt {
        Some(salt) => isolation::with_cache_salt(&bytes, salt)?,
        None => bytes,
    };
    let pool = &state.fleet.pools()[ready.pool];
    if let Some(p) = who {
        if !p.allows(&pool.model) {
            return Err(if state.config.auth.hide_disallowed_models {
                GatewayError::UnknownModel(pool.model.clone())
            } else {
                GatewayError::ModelNotAllowed(pool.model.clone())
            });
        }
    }
    let (prep, stream, body_priority) = (ready.prep, ready.stream, ready.priority);
    // Within budget now, or refused before anything is queued or routed. The prompt's charge
    // is given back if this returns (or is dropped) while no engine holds the request.
    let (rate, charge) = state.rate_limits.admit(
        &tenant_label(state, who.map(|p| &p.tenant)),
        u64::from(prep.prompt_tokens),
    )?;
    let adm = &state.admission;
    let gate = if adm.enabled() {
        let output = state.routing.expected_output(pool.index, prep.max_tokens);
        adm.gate(
            pool.index,
            headers::find(headers, PRIORITY_HEADER),
            body_priority,
            // With keys, the key names the tenant; the client cannot choose one.
            match who {
                Some(p) => Some(p.tenant.as_bytes()),
                None => headers::find(headers, adm.tenant_header().as_str()),
            },
            u64::from(prep.prompt_tokens) + u64::from(output),
        )
        .with_ceiling(who.and_then(|p| p.max_priority))
    } else {
        Gate::off()
    };
    Ok(Admitted {
        pool,
        prep,
        stream,
        body: bytes,
        gate,
        rate,
        charge,
    })
}

/// The second half of "admit + decide", shared by both doors: waits at the admission gate,
/// decides among the pool's usable instances not in `exclude`, and keeps the decision only if
/// the gate lets it through (a saturated pool's decision is taken back and made again once
/// admitted). `last_tried`: the instance a previous attempt failed on, named in the error when
/// no instance is left.
pub async fn decide(
    state: &AppState,
    adm: &mut Admitted<'_>,
    exclude: &[InstanceId],
    last_tried: Option<&Arc<crate::fleet::Instance>>,
    rid: &HeaderValue,
) -> Result<crate::routing::Routed, GatewayError> {
    loop {
        adm.gate.enter().await?;
        let full_at = adm.gate.capacity();
        let routed =
            match state
                .routing
                .decide(&state.fleet, adm.pool, &adm.prep, exclude, rid, full_at)
            {
                Ok(r) => r,
                // Usable instances exist, but every one is full: wait for one to finish.
                Err(GatewayError::NoHealthyInstance { .. })
                    if full_at.is_some()
                        && has_candidate(state, adm.pool, exclude)
                        && adm.gate.all_full() =>
                {
                    continue
                }
                // Every usable instance was tried and refused connections: report that, not "none healthy".
                Err(e @ GatewayError::NoHealthyInstance { .. }) => match last_tried {
                    Some(last) => {
                        return Err(GatewayError::UpstreamConnect {
                            instance: last.name.clone(),
                        })
                    }
                    None => return Err(e),
                },
                Err(e) => return Err(e),
            };
        if adm.gate.check(&routed) {
            // Saturated: the decision is dropped (its load and its prediction with it) and made
            // again once admitted.
            state.routing.retract(&adm.prep, &routed);
            continue;
        }
        return Ok(routed);
    }
}

async fn forward(
    state: &AppState,
    endpoint: Endpoint,
    req: Upstream<'_>,
    who: Option<crate::auth::Principal>,
    rid: &HeaderValue,
    started: Instant,
) -> Result<Reply, GatewayError> {
    let mut adm = admit(state, endpoint, &req.headers, req.body, who.as_ref()).await?;
    let stream = adm.stream;
    let pool = adm.pool;

    let query_path;
    let path_and_query = match req.query {
        Some(q) => {
            query_path = format!("{}?{}", endpoint.path(), q);
            query_path.as_str()
        }
        None => endpoint.path(),
    };
    let cfg = &state.config;
    let first_byte = Duration::from_millis(cfg.upstream.first_byte_timeout_ms);
    let max_attempts = cfg.upstream.max_attempts as usize;
    let mut tried: Vec<InstanceId> = Vec::new();
    let mut last_tried: Option<Arc<crate::fleet::Instance>> = None;
    loop {
        let routed = decide(state, &mut adm, &tried, last_tried.as_ref(), rid).await?;
        let id = routed.chosen;
        state.events.note_dispatch(id);
        let inst = routed.instance.clone();
        let inst = &*inst;
        let up = Outgoing {
            authority: &inst.authority,
            tls: inst.tls,
            host: &inst.host_header,
            method: &Method::POST,
            path_and_query,
            headers: req.headers,
            extra: Some((&state.request_id_header, rid)),
            body: &adm.body,
        };
        let sent = Instant::now();
        adm.charge.at_engine(true);
        match state.client.send_to(up, first_byte).await {
            Ok(resp) => {
                inst.header_latency
                    .observe(sent.elapsed().as_secs_f64() * 1e3);
                let status = resp.status;
                note_answer(state, inst, status.as_u16());
                let retryable = status == StatusCode::BAD_GATEWAY
                    || status == StatusCode::SERVICE_UNAVAILABLE
                    || (cfg.upstream.idempotent_requests && matches!(status.as_u16(), 500 | 504));
                if retryable {
                    // Refused or failed, not served: the prompt will not be cached there.
                    state.routing.retract(&adm.prep, &routed);
                    adm.charge.at_engine(false);
                    tried.push(id);
                    last_tried = Some(routed.instance.clone());
                    if tried.len() < max_attempts && has_candidate(state, pool, &tried) {
                        metrics::record_retry(&pool.model, "status");
                        tracing::debug!(request_id = ?rid, instance = %inst.name, %status, "retrying on another instance");
                        continue;
                    }
                }
                let times = (started, sent);
                return Ok(relay(
                    state,
                    endpoint,
                    resp,
                    routed,
                    times,
                    stream,
                    (adm.gate.hand_over(), adm.rate.take()),
                ));
            }
            Err(e @ (SendError::Connect(_) | SendError::Closed(_)))
                if matches!(e, SendError::Connect(_)) || cfg.upstream.idempotent_requests =>
            {
                let cause = e.cause();
                metrics::record_upstream_error(&inst.name, cause);
                // Connect failure: the instance never saw the request. Closed: it went away with
                // it; with idempotent requests that is as good as never having sent it.
                state.routing.retract(&adm.prep, &routed);
                adm.charge.at_engine(false);
                let h = &cfg.health;
                if inst.health.record_connect_failure(
                    state.clock.now_ms(),
                    h.passive_failure_threshold,
                    h.eject_ms,
                ) {
                    note_ejection(inst, h.eject_ms, &format!("repeated connect failures: {e}"));
                }
                tried.push(id);
                last_tried = Some(routed.instance.clone());
                if tried.len() < max_attempts && has_candidate(state, pool, &tried) {
                    metrics::record_retry(&pool.model, cause);
                    continue;
                }
                return Err(match e {
                    SendError::Connect(_) => GatewayError::UpstreamConnect {
                        instance: inst.name.clone(),
                    },
                    e => GatewayError::UpstreamProtocol {
                        instance: inst.name.clone(),
                        message: e.to_string(),
                    },
                });
            }
            Err(SendError::Timeout) => {
                metrics::record_upstream_error(&inst.name, "timeout");
                return Err(GatewayError::UpstreamTimeout {
                    instance: inst.name.clone(),
                    timeout_ms: cfg.upstream.first_byte_timeout_ms,
                });
            }
            Err(e) => {
                metrics::record_upstream_error(&inst.name, e.cause());
                return Err(GatewayError::UpstreamProtocol {
                    instance: inst.name.clone(),
                    message: e.to_string(),
                });
            }
        }
    }
}

/// An answer that counts toward outlier ejection: the instance failed the request.
fn is_5xx_failure(status: u16) -> bool {
    matches!(status, 500 | 502 | 504)
}

/// Passive health from an instance's answer `status`, the same for both doors: 500/502/504
/// count toward outlier ejection, 503 (a full queue: busy, not broken) is only counted, any
/// other answer is a success.
pub fn note_answer(state: &AppState, inst: &crate::fleet::Instance, status: u16) {
    if status == 503 {
        // Busy, not broken: engines answer 503 when their queue is full. Ejecting for it would
        // move that load onto the others and overload them in turn.
        metrics::record_upstream_error(&inst.name, "status_5xx");
    } else if is_5xx_failure(status) {
        metrics::record_upstream_error(&inst.name, "status_5xx");
        let h = &state.config.health;
        if inst
            .health
            .record_5xx(state.clock.now_ms(), h.passive_5xx_threshold, h.eject_ms)
        {
            note_ejection(inst, h.eject_ms, "consecutive 5xx answers");
        }
    } else {
        inst.health.record_success();
    }
}

fn note_ejection(inst: &crate::fleet::Instance, eject_ms: u64, why: &str) {
    metrics::record_ejection(&inst.name);
    inst.metrics.set_healthy(false);
    tracing::warn!(instance = %inst.name, "ejected for {eject_ms} ms after {why}");
}

/// `times`: the request's arrival and the chosen attempt's dispatch. `admitted`: the pool whose
/// admission place the response holds until it ends, and the rate limit it was admitted under.
fn relay(
    state: &AppState,
    endpoint: Endpoint,
    resp: UpstreamResponse,
    routed: crate::routing::Routed,
    times: (Instant, Instant),
    stream: bool,
    admitted: (Option<usize>, Option<crate::ratelimit::Admitted>),
) -> Reply {
    let (admitted, rate) = admitted;
    let inst = routed.instance.clone();
    let mut tracker = Tracker::new(
        state.clone(),
        routed.instance.clone(),
        endpoint.index(),
        routed.guard,
        times.0,
        stream,
        routed.learning,
        resp.status.as_u16(),
    );
    tracker.dispatched(times.1, admitted);
    if let Some(r) = &rate {
        tracker.charge_to(r.tenant, r.label.clone());
    }
    let idle = Duration::from_millis(state.config.upstream.idle_timeout_ms);
    let body = GatewayBody::Relay {
        body: ProxyBody::new(resp.body, idle, tracker),
    };
    let mut reply = Reply::relayed(resp.status, resp.fields, body);
    reply.set(headers::X_INSTANCE, inst.name_header.clone());
    reply.set(
        headers::X_MATCHED_BLOCKS,
        HeaderValue::from(routed.matched_blocks),
    );
    if let Some(v) = headers::one_decimal(routed.predicted_cost_ms) {
        reply.set(headers::X_PREDICTED_TTFT, v);
    }
    if let Some(r) = &rate {
        crate::ratelimit::headers(&r.status, |n, v| reply.set(n, v));
    }
    reply
}
