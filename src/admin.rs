//! Gateway-local endpoints: liveness, readiness, metrics, the models union and the admin views.
//!
//! Invariant: nothing here touches an instance; answers come from state the background tasks keep.

use crate::app::AppState;
use crate::error::GatewayError;
use crate::metrics;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{header, HeaderValue, StatusCode, Uri};
use serde::Serialize;

/// `GET /health`: the process is alive.
pub async fn health() -> &'static str {
    "ok"
}

/// `GET /ready`: at least one instance is usable and the gateway is not shutting down.
pub async fn ready(State(s): State<AppState>) -> Response {
    if s.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response()
    } else if s.fleet.any_usable(s.clock.now_ms()) {
        (StatusCode::OK, "ready").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no healthy instance").into_response()
    }
}

/// `GET /admin/cluster`: gossip members, their state, last heard, lag and bytes exchanged.
pub async fn cluster(State(s): State<AppState>) -> Response {
    match s.routing.gossip() {
        Some(g) => Json(g.cluster_status()).into_response(),
        None => Json(serde_json::json!({ "enabled": false })).into_response(),
    }
}

/// `GET /metrics`: Prometheus text exposition.
pub async fn metrics(State(s): State<AppState>) -> Response {
    let load = s.routing.load();
    for inst in s.fleet.view().instances() {
        inst.metrics.set_in_flight(load.snapshot(inst.id).in_flight);
    }
    metrics::set_limits_usage(s.limits.open_connections(), s.limits.budget.in_flight());
    metrics::set_index_stats(&s.routing.index().stats());
    for p in s.fleet.pools() {
        if let Some(stats) = s.routing.tokenizer_cache_stats(p.index) {
            metrics::set_token_cache_stats(&p.model, &stats);
        }
    }
    let mut text = s.metrics.render();
    if !s.fleet.retired().is_empty() {
        text = s
            .fleet
            .retired()
            .with(|gone| metrics::without_instances(&text, gone));
    }
    let mut r = text.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// `GET /v1/models`: union of the instances' lists (cached).
/// `GET /v1/models`: the instances' models; with keys on, a valid key is needed and only the
/// models it may use are listed.
pub async fn models(State(s): State<AppState>, headers: http::HeaderMap) -> Response {
    let who = match s.auth.check(&crate::client::OutHeaders::Map(&headers)) {
        Ok(w) => w,
        Err(e) => return e.into_response(),
    };
    let all = s.fleet.models_json();
    let body = match who.as_ref().filter(|p| p.models.is_some()) {
        Some(p) => filter_models(&all, p).unwrap_or(all),
        None => all,
    };
    let mut r = body.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The `/v1/models` list with only the models `who` may use (`None`: not a list).
fn filter_models(all: &[u8], who: &crate::auth::Principal) -> Option<bytes::Bytes> {
    let mut v: serde_json::Value = serde_json::from_slice(all).ok()?;
    let data = v.get_mut("data")?.as_array_mut()?;
    data.retain(|m| {
        m.get("id")
            .and_then(|id| id.as_str())
            .is_some_and(|id| who.allows(id))
    });
    serde_json::to_vec(&v).ok().map(Into::into)
}

#[derive(Serialize)]
struct InstanceView<'a> {
    id: u32,
    name: &'a str,
    url: &'a str,
    model: &'a str,
    healthy: bool,
    ejected: bool,
    usable: bool,
    /// `serving`, or `draining` (removed by discovery: no new requests).
    state: &'static str,
    /// `prefill`, `decode` or `both` when its pod is labelled (discovery), else null.
    role: Option<&'a str>,
    /// Data-parallel size when its pod is labelled (KV event streams per rank), else null.
    dp_size: Option<u32>,
    in_flight: u32,
    router_load: kvgate_core::load::RouterLoad,
    header_latency_ms: Option<f64>,
    ttft_ms: Option<f64>,
    engine: Option<kvgate_core::load::EngineLoad>,
    capacity_blocks: Option<u64>,
    rates: kvgate_core::load::InstanceRates,
    /// Learned decode step model (time per output token by batch).
    decode_rates: kvgate_core::load::DecodeRates,
    /// Learned fixed overhead before a first token, ms.
    overhead_ms: f64,
}

/// `GET /admin/instances`: health, load and latency of every instance, serving or draining.
pub async fn instances(State(s): State<AppState>) -> Response {
    let now = s.clock.now_ms();
    let stale_after = s.config.load.stale_after_ms;
    let view = s.fleet.snapshot();
    let views: Vec<InstanceView<'_>> = view
        .instances()
        .map(|i| {
            let load = s.routing.load().snapshot(i.id);
            InstanceView {
                id: i.id.0,
                name: &i.name,
                url: &i.config.url,
                model: &s.fleet.pools()[i.pool].model,
                healthy: i.health.active_ok(),
                ejected: i.health.ejected(now),
                usable: i.health.usable(now),
                state: if i.is_removed() {
                    "draining"
                } else {
                    "serving"
                },
                role: i.role.as_deref(),
                dp_size: i.dp_size,
                in_flight: load.in_flight,
                router_load: load,
                header_latency_ms: i.header_latency.get(),
                ttft_ms: i.ttft.get(),
                engine: i.engine.get(now, stale_after),
                capacity_blocks: i.capacity(),
                rates: s.routing.rates(i.id),
                decode_rates: s.routing.decode_rates(i.id),
                overhead_ms: s.routing.overhead_ms(i.id),
            }
        })
        .collect();
    Json(serde_json::json!({ "instances": views })).into_response()
}

/// `GET /admin/decisions`: recent routing decisions with every candidate's score.
pub async fn decisions(State(s): State<AppState>) -> Response {
    Json(serde_json::json!({ "decisions": s.routing.decisions(&s.fleet) })).into_response()
}

/// `GET /admin/index`: placement index statistics, per instance by name.
pub async fn index(State(s): State<AppState>) -> Response {
    let stats = s.routing.index().stats();
    let view = s.fleet.snapshot();
    let per_instance: Vec<_> = view
        .instances()
        .map(|i| {
            serde_json::json!({
                "name": i.name,
                "entries": stats.entries_by_instance.get(i.id.index()).copied().unwrap_or(0),
                "capacity_blocks": i.capacity(),
            })
        })
        .collect();
    let pools: Vec<_> = s
        .fleet
        .pools()
        .iter()
        .map(|p| {
            serde_json::json!({
                "model": p.model,
                "policy": s.routing.policy_name(p.index),
                "hash_mode": s.routing.hash_mode(p.index),
            })
        })
        .collect();
    Json(serde_json::json!({
        "stats": stats,
        "instances": per_instance,
        "pools": pools,
        "events": s.events.status(),
    }))
    .into_response()
}

/// `GET /admin/admission`: admission settings and each pool's queue by priority class.
pub async fn admission(State(s): State<AppState>) -> Response {
    Json(s.admission.status()).into_response()
}

/// Anything else: OpenAI-style 404.
pub async fn not_found(uri: Uri) -> Response {
    GatewayError::NotFound(uri.path().to_string()).into_response()
}

/// Lets a request to `/admin/*` or `/metrics` through only with the admin token, when one is set.
pub async fn require_admin_token(
    State(s): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    if s.admin_token.allows(auth) {
        next.run(req).await
    } else {
        GatewayError::InvalidAdminToken.into_response()
    }
}
