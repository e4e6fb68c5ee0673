//! `/v1/chat/completions` and `/v1/completions`: streaming (SSE) and not.
//!
//! Invariants: the response never buffers more than one chunk per produced token; the stream
//! holds the request's [`ReqState`], so a client that disconnects drops it and the engine loop
//! aborts the request; streams end with `data: [DONE]` (errors included), except when a fault
//! asks to drop the connection.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use rand::Rng;
use serde_json::{json, Value};

use super::engine_loop::{status, Cmd, ReqState};
use super::error::ApiError;
use super::request::{parse, Kind, Parsed};
use super::AppState;
use crate::hashing::engine_block_hashes;
use crate::model::SimRequest;

/// `POST /v1/chat/completions`.
pub async fn chat(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    complete(st, Kind::Chat, body).await
}

/// `POST /v1/completions`.
pub async fn completions(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    complete(st, Kind::Completion, body).await
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What a response needs to render itself.
struct Ctx {
    vocab: Arc<super::output::OutputVocab>,
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    seed: u64,
    prompt_key: u64,
    prompt_tokens: u32,
    output_tokens: u32,
    include_usage: bool,
    drop_after_first: bool,
}

impl Ctx {
    fn text(&self, from: u32, to: u32) -> String {
        (from..to)
            .map(|i| self.vocab.text(self.seed, self.prompt_key, i))
            .collect()
    }

    fn usage(&self, cached: u32) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.output_tokens,
            "total_tokens": self.prompt_tokens + self.output_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    fn chunk(&self, text: &str, first: bool, finish: bool) -> Value {
        let finish_reason = if finish { json!("length") } else { Value::Null };
        match self.kind {
            Kind::Chat => {
                let delta = if first {
                    json!({"role": "assistant", "content": text})
                } else {
                    json!({"content": text})
                };
                json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                       "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}]})
            }
            Kind::Completion => {
                json!({"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                       "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason}]})
            }
        }
    }

    fn usage_chunk(&self, cached: u32) -> Value {
        let object = match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model, "choices": [], "usage": self.usage(cached)})
    }

    fn full(&self, cached: u32) -> Value {
        let text = self.text(0, self.output_tokens);
        match self.kind {
            Kind::Chat => {
                json!({"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": "length"}],
                "usage": self.usage(cached)})
            }
            Kind::Completion => {
                json!({"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": "length"}],
                "usage": self.usage(cached)})
            }
        }
    }
}

async fn complete(st: Arc<AppState>, kind: Kind, body: Bytes) -> Response {
    let fl = st.flavour;
    let (fail, drop_after_first) = {
        let f = st.core.faults.lock().clone();
        let mut rng = st.rng.lock();
        let fail = f.always_5xx || (f.error_rate > 0.0 && rng.gen::<f64>() < f.error_rate);
        (fail, f.drop_rate > 0.0 && rng.gen::<f64>() < f.drop_rate)
    };
    if fail {
        return ApiError::new(
            fl,
            StatusCode::INTERNAL_SERVER_ERROR,
            "injected fault: internal server error",
        )
        .into_response();
    }
    let value: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return ApiError::bad_request(fl, format!("invalid JSON body: {e}")).into_response()
        }
    };
    let p: Parsed = match parse(
        kind,
        &value,
        &st.tokens,
        st.default_max_tokens,
        st.params.max_model_len,
    ) {
        Ok(p) => p,
        Err(m) => return ApiError::bad_request(fl, m).into_response(),
    };
    let bs = st.params.block_size;
    let blocks = engine_block_hashes(&p.tokens, bs, p.cache_salt.as_deref());
    if (p.tokens.len() as u64 + u64::from(p.output_tokens)).div_ceil(u64::from(bs))
        > u64::from(st.params.num_gpu_blocks.saturating_sub(1).max(1))
    {
        return ApiError::bad_request(fl, "the request needs more KV blocks than the engine has")
            .into_response();
    }
    let prompt_key = blocks.last().copied().unwrap_or_else(|| {
        xxhash_rust::xxh3::xxh3_64_with_seed(
            &p.tokens
                .iter()
                .flat_map(|t| t.to_le_bytes())
                .collect::<Vec<u8>>(),
            st.seed,
        )
    });
    let num = st.next_id.fetch_add(1, Ordering::Relaxed);
    let prompt_len = p.tokens.len() as u32;
    let req = SimRequest {
        id: num,
        blocks,
        // Every prompt token: KV events carry the full blocks' ids, and blocks of generated
        // tokens (which start inside the last partial prompt block) need the rest.
        block_tokens: p.tokens.clone(),
        prompt_tokens: prompt_len,
        output_tokens: p.output_tokens,
    };
    let output_ids = st
        .vocab
        .ids(st.seed, prompt_key, p.output_tokens)
        .unwrap_or_default();
    let state = Arc::new(ReqState::default());
    if st
        .core
        .cmd_tx
        .try_send(Cmd::Submit(
            req,
            output_ids,
            state.clone(),
            std::time::Instant::now(),
        ))
        .is_err()
    {
        return ApiError::new(fl, StatusCode::SERVICE_UNAVAILABLE, "engine queue is full")
            .into_response();
    }
    let prefix = match kind {
        Kind::Chat => "chatcmpl",
        Kind::Completion => "cmpl",
    };
    let ctx = Ctx {
        vocab: st.vocab.clone(),
        kind,
        id: format!("{prefix}-{}-{num}", st.name),
        created: unix_now(),
        model: p.model.clone().unwrap_or_else(|| st.model.clone()),
        seed: st.seed,
        prompt_key,
        prompt_tokens: prompt_len,
        output_tokens: p.output_tokens,
        include_usage: p.include_usage,
        drop_after_first,
    };
    if p.stream {
        stream_response(ctx, state, fl)
    } else {
        full_response(ctx, state, fl).await
    }
}

async fn full_response(ctx: Ctx, state: Arc<ReqState>, fl: super::Flavour) -> Response {
    loop {
        let notified = state.notify.notified();
        match state.status.load(Ordering::Acquire) {
            status::DONE => break,
            status::REJECTED => {
                return ApiError::new(
                    fl,
                    StatusCode::SERVICE_UNAVAILABLE,
                    "request rejected: engine queue full or request too long",
                )
                .into_response()
            }
            status::ABORTED => {
                return ApiError::new(
                    fl,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "engine restarted or stopped",
                )
                .into_response()
            }
            _ => notified.await,
        }
    }
    let cached = state.cached.load(Ordering::Relaxed);
    let body = ctx.full(cached).to_string();
    if ctx.drop_after_first {
        // Half a body, then a broken connection.
        let half = body.as_bytes()[..body.len() / 2].to_vec();
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from(half)),
            Err(std::io::Error::other("injected fault: connection dropped")),
        ];
        return Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from_stream(futures_util::stream::iter(chunks)))
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    }
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn sse(v: &Value, out: &mut String) {
    out.push_str("data: ");
    out.push_str(&v.to_string());
    out.push_str("\n\n");
}

enum Phase {
    Running,
    Ended,
}

fn stream_response(ctx: Ctx, state: Arc<ReqState>, fl: super::Flavour) -> Response {
    let init = (ctx, state, 0u32, Phase::Running);
    let stream =
        futures_util::stream::unfold(init, move |(ctx, state, emitted, phase)| async move {
            if let Phase::Ended = phase {
                return None;
            }
            loop {
                let notified = state.notify.notified();
                let mut produced = state
                    .produced
                    .load(Ordering::Relaxed)
                    .min(ctx.output_tokens);
                if ctx.drop_after_first && emitted == 0 {
                    // The fault cuts the connection right after the first token's chunk.
                    produced = produced.min(1);
                }
                let st = state.status.load(Ordering::Acquire);
                if st == status::ABORTED {
                    drop(notified);
                    let e: Result<Bytes, std::io::Error> =
                        Err(std::io::Error::other("engine restarted or stopped"));
                    return Some((e, (ctx, state, emitted, Phase::Ended)));
                }
                if st == status::REJECTED {
                    drop(notified);
                    let mut out = String::new();
                    sse(
                        &ApiError::new(
                            fl,
                            StatusCode::SERVICE_UNAVAILABLE,
                            "request rejected: engine queue full or request too long",
                        )
                        .body(),
                        &mut out,
                    );
                    out.push_str("data: [DONE]\n\n");
                    return Some((Ok(Bytes::from(out)), (ctx, state, emitted, Phase::Ended)));
                }
                if produced > emitted {
                    drop(notified);
                    if ctx.drop_after_first && emitted > 0 {
                        let e: Result<Bytes, std::io::Error> =
                            Err(std::io::Error::other("injected fault: connection dropped"));
                        return Some((e, (ctx, state, emitted, Phase::Ended)));
                    }
                    let mut out = String::new();
                    for i in emitted..produced {
                        let last = i + 1 == ctx.output_tokens;
                        sse(&ctx.chunk(&ctx.text(i, i + 1), i == 0, last), &mut out);
                    }
                    let done = produced >= ctx.output_tokens;
                    if done {
                        if ctx.include_usage {
                            sse(
                                &ctx.usage_chunk(state.cached.load(Ordering::Relaxed)),
                                &mut out,
                            );
                        }
                        out.push_str("data: [DONE]\n\n");
                    }
                    let next = if done { Phase::Ended } else { Phase::Running };
                    return Some((Ok(Bytes::from(out)), (ctx, state, produced, next)));
                }
                notified.await;
            }
        });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
