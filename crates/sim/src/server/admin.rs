//! Everything besides completions: models, health, metrics, tokenize, prefix-cache reset,
//! SGLang's info and load endpoints, and the fault/admin surface.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::engine_loop::Cmd;
use super::error::ApiError;
use super::faults::{Faults, METRICS_HANG_MAX};
use super::metrics::{render_sglang, render_vllm, MetricsInfo};
use super::request::{prompt_tokens, Kind};
use super::{AppState, Flavour};

/// `GET /v1/models`.
pub async fn models(State(st): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": st.model, "object": "model", "created": 0, "owned_by": "kvgate-sim",
        "root": st.model, "parent": null, "max_model_len": st.params.max_model_len,
    }]}))
}

/// `GET /health`.
pub async fn health() -> StatusCode {
    StatusCode::OK
}

/// `GET /metrics`. Under the `metrics_hang` fault, waits until it is cleared (at most
/// [`METRICS_HANG_MAX`]) before answering.
pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    wait_while_hanging(&st, METRICS_HANG_MAX).await;
    let snap = st.core.snapshot.lock().clone();
    let info = MetricsInfo {
        model: &st.model,
        block_size: st.params.block_size,
        num_gpu_blocks: st.params.num_gpu_blocks,
        num_cpu_blocks: st.params.num_cpu_blocks,
    };
    let text = match st.flavour {
        Flavour::Vllm => render_vllm(&snap, &info),
        Flavour::Sglang => render_sglang(&snap, &info),
    };
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// Returns once the `metrics_hang` fault is off, or after `max` at the latest.
async fn wait_while_hanging(st: &AppState, max: std::time::Duration) {
    let until = tokio::time::Instant::now() + max;
    loop {
        // Registered before the check, so a change in between is not missed.
        let changed = st.core.faults_changed.notified();
        if !st.core.faults.lock().metrics_hang {
            return;
        }
        if tokio::time::timeout_at(until, changed).await.is_err() {
            return;
        }
    }
}

/// `POST /tokenize` (vLLM shape: `prompt` or `messages`).
pub async fn tokenize(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return ApiError::bad_request(st.flavour, format!("invalid JSON body: {e}"))
                .into_response()
        }
    };
    let kind = if v.get("messages").is_some() {
        Kind::Chat
    } else {
        Kind::Completion
    };
    let tokens = if kind == Kind::Completion
        && v.get("add_special_tokens").and_then(Value::as_bool) == Some(false)
    {
        match v.get("prompt").and_then(Value::as_str) {
            Some(p) => st
                .tokens
                .tokenizer
                .encode(p, false)
                .map_err(|e| e.to_string()),
            None => Err("`prompt` is required".to_string()),
        }
    } else {
        prompt_tokens(kind, &v, &st.tokens)
    };
    match tokens {
        Ok(t) => {
            Json(json!({"count": t.len(), "max_model_len": st.params.max_model_len, "tokens": t}))
                .into_response()
        }
        Err(m) => ApiError::bad_request(st.flavour, m).into_response(),
    }
}

/// `POST /reset_prefix_cache`.
pub async fn reset_prefix_cache(State(st): State<Arc<AppState>>) -> Response {
    let (tx, rx) = oneshot::channel();
    if st.core.cmd_tx.send(Cmd::Reset(tx)).await.is_err() {
        return ApiError::new(
            st.flavour,
            StatusCode::SERVICE_UNAVAILABLE,
            "engine stopped",
        )
        .into_response();
    }
    match rx.await {
        Ok(true) => StatusCode::OK.into_response(),
        Ok(false) => ApiError::new(
            st.flavour,
            StatusCode::CONFLICT,
            "cannot reset the prefix cache while requests are running",
        )
        .into_response(),
        Err(_) => ApiError::new(
            st.flavour,
            StatusCode::SERVICE_UNAVAILABLE,
            "engine stopped",
        )
        .into_response(),
    }
}

/// `GET /get_server_info`, `/server_info` (SGLang).
pub async fn server_info(State(st): State<Arc<AppState>>) -> Json<Value> {
    let p = &st.params;
    Json(json!({
        "model_path": st.model, "served_model_name": st.model, "tokenizer_path": st.model,
        "page_size": p.block_size, "max_total_num_tokens": u64::from(p.num_gpu_blocks) * u64::from(p.block_size),
        "max_running_requests": p.max_num_seqs, "context_length": p.max_model_len,
        "chunked_prefill_size": p.max_num_batched_tokens, "tp_size": 1, "dp_size": 1,
        "disaggregation_mode": "null", "version": concat!("kvgate-sim ", env!("CARGO_PKG_VERSION")),
        "internal_states": [{"last_gen_throughput": 0.0}],
    }))
}

/// `GET /get_model_info`, `/model_info` (SGLang).
pub async fn model_info(State(st): State<Arc<AppState>>) -> Json<Value> {
    Json(
        json!({"model_path": st.model, "tokenizer_path": st.model, "is_generation": true,
                "model_type": "llama", "architectures": ["LlamaForCausalLM"]}),
    )
}

/// `GET /get_load` (SGLang, deprecated shape).
pub async fn get_load(State(st): State<Arc<AppState>>) -> Json<Value> {
    let s = st.core.snapshot.lock().clone();
    Json(
        json!([{"dp_rank": 0, "num_reqs": s.load.running + s.load.waiting,
                 "num_waiting_reqs": s.load.waiting, "num_tokens": s.used_tokens}]),
    )
}

/// `GET /v1/loads` (SGLang).
pub async fn loads(State(st): State<Arc<AppState>>) -> Json<Value> {
    let s = st.core.snapshot.lock().clone();
    let p = &st.params;
    Json(json!({
        "timestamp": crate::kv_events::publisher::now_ts(), "version": env!("CARGO_PKG_VERSION"), "dp_rank_count": 1,
        "loads": [{
            "dp_rank": 0, "num_running_reqs": s.load.running, "num_waiting_reqs": s.load.waiting,
            "num_total_reqs": s.load.running + s.load.waiting, "num_used_tokens": s.used_tokens,
            "max_total_num_tokens": u64::from(p.num_gpu_blocks) * u64::from(p.block_size),
            "token_usage": s.load.kv_usage, "gen_throughput": 0.0, "cache_hit_rate": s.hit_rate(),
            "utilization": s.load.kv_usage, "max_running_requests": p.max_num_seqs,
        }],
    }))
}

/// `GET /admin/faults`.
pub async fn get_faults(State(st): State<Arc<AppState>>) -> Json<Faults> {
    Json(st.core.faults.lock().clone())
}

/// `POST /admin/faults`: replaces the fault settings; `restart: true` restarts the engine now.
pub async fn set_faults(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let f: Faults = match serde_json::from_slice(&body) {
        Ok(f) => f,
        Err(e) => {
            return ApiError::bad_request(st.flavour, format!("invalid faults: {e}"))
                .into_response()
        }
    };
    let mut f = f.sanitised();
    if f.restart {
        let (tx, rx) = oneshot::channel();
        if st.core.cmd_tx.send(Cmd::Restart(tx)).await.is_ok() {
            let _ = rx.await;
        }
        f.restart = false;
    }
    *st.core.faults.lock() = f.clone();
    st.core.faults_changed.notify_waiters();
    Json(f).into_response()
}

/// `GET /admin/stats`: the engine's own counters and load (ground truth for benchmarks).
pub async fn stats(State(st): State<Arc<AppState>>) -> Json<Value> {
    let s = st.core.snapshot.lock().clone();
    Json(
        json!({"name": st.name, "load": s.load, "stats": s.stats, "request_success": s.request_success,
                "ttft_count": s.ttft.count, "ttft_sum_s": s.ttft.sum}),
    )
}

/// `GET /admin/cache`: engine hashes cached on the GPU, sorted.
pub async fn cache(State(st): State<Arc<AppState>>) -> Response {
    let (tx, rx) = oneshot::channel();
    if st.core.cmd_tx.send(Cmd::CachedHashes(tx)).await.is_err() {
        return ApiError::new(
            st.flavour,
            StatusCode::SERVICE_UNAVAILABLE,
            "engine stopped",
        )
        .into_response();
    }
    match rx.await {
        Ok(mut h) => {
            h.sort_unstable();
            Json(json!({"gpu": h})).into_response()
        }
        Err(_) => ApiError::new(
            st.flavour,
            StatusCode::SERVICE_UNAVAILABLE,
            "engine stopped",
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{Fleet, FleetConfig};
    use std::time::Duration;

    async fn one_engine() -> Fleet {
        Fleet::start(FleetConfig {
            engines: 1,
            kv_events: false,
            ..FleetConfig::default()
        })
        .await
        .unwrap()
    }

    fn faults(v: Value) -> Bytes {
        Bytes::from(v.to_string())
    }

    #[tokio::test]
    async fn a_hanging_metrics_endpoint_answers_once_the_fault_is_cleared() {
        let fleet = one_engine().await;
        let st = fleet.engines()[0].state.clone();
        set_faults(State(st.clone()), faults(json!({"metrics_hang": true}))).await;
        let mut pending = tokio::spawn(metrics(State(st.clone())));
        assert!(
            tokio::time::timeout(Duration::from_millis(200), &mut pending)
                .await
                .is_err(),
            "/metrics answered while hanging"
        );
        set_faults(State(st.clone()), faults(json!({}))).await;
        let resp = tokio::time::timeout(Duration::from_secs(5), pending)
            .await
            .expect("still hanging after the fault was cleared")
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        // Without the fault, at once.
        let resp = tokio::time::timeout(Duration::from_secs(5), metrics(State(st)))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        fleet.shutdown().await;
    }

    #[tokio::test]
    async fn a_hanging_metrics_endpoint_answers_after_its_bound() {
        let fleet = one_engine().await;
        let st = fleet.engines()[0].state.clone();
        set_faults(State(st.clone()), faults(json!({"metrics_hang": true}))).await;
        let max = Duration::from_millis(100);
        let started = tokio::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(5), wait_while_hanging(&st, max))
            .await
            .expect("the bound did not end the hang");
        assert!(started.elapsed() >= max);
        fleet.shutdown().await;
    }
}
