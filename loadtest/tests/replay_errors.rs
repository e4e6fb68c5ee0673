//! Error classification of the replayer against misbehaving servers (all on 127.0.0.1:0).

use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use kvgate_loadtest::prompt::{ApiKind, PromptBuilder};
use kvgate_loadtest::replay::{self, Arrivals, ErrorClass, Outcome, ReplayConfig};
use kvgate_loadtest::trace::{Trace, TraceRequest};

async fn serve(app: axum::Router) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    format!("http://{addr}")
}

fn trace(n: u64) -> Trace {
    let reqs = (0..n)
        .map(|i| TraceRequest {
            timestamp_ms: i * 10,
            input_length: 40,
            output_length: 3,
            hash_ids: vec![0, i + 1],
        })
        .collect();
    Trace::from_requests(reqs, 32).unwrap()
}

async fn outcomes(url: String) -> Vec<Outcome> {
    let b = PromptBuilder::builtin(ApiKind::Chat, 32, 1).unwrap();
    let cfg = ReplayConfig {
        arrivals: Arrivals::Trace { speed_up: 1.0 },
        request_timeout: Duration::from_secs(2),
        drain_timeout: Duration::from_secs(5),
        progress: false,
        concurrency: 2,
        ..ReplayConfig::new(url, "m")
    };
    let out = replay::run(&trace(3), &b, &cfg, "").await.unwrap();
    assert_eq!(out.records.len(), 3);
    out.records.iter().map(|r| r.outcome).collect()
}

fn sse(chunks: &'static str) -> Response {
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("x-kvgate-instance", "e1")
        .body(Body::from(chunks))
        .unwrap()
}

#[tokio::test]
async fn classifies_outcomes() {
    let ok = serve(axum::Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            sse(
                "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
                 data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n\
                 data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n\
                 data: {\"choices\":[{\"delta\":{\"content\":\"c\"}}]}\n\n\
                 data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":3,\
                 \"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\ndata: [DONE]\n\n",
            )
        }),
    ))
    .await;
    assert!(outcomes(ok.clone()).await.iter().all(|o| *o == Outcome::Ok));

    let busy = serve(axum::Router::new().route(
        "/v1/chat/completions",
        post(|| async { StatusCode::TOO_MANY_REQUESTS.into_response() }),
    ))
    .await;
    assert!(outcomes(busy)
        .await
        .iter()
        .all(|o| *o == Outcome::Rejected { status: 429 }));

    let broken = serve(axum::Router::new().route(
        "/v1/chat/completions",
        post(|| async { sse("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n") }),
    ))
    .await;
    assert!(outcomes(broken).await.iter().all(|o| *o
        == Outcome::Error {
            class: ErrorClass::StreamBroken
        }));

    let failing = serve(axum::Router::new().route(
        "/v1/chat/completions",
        post(|| async { StatusCode::BAD_GATEWAY.into_response() }),
    ))
    .await;
    assert!(outcomes(failing).await.iter().all(|o| *o
        == Outcome::Error {
            class: ErrorClass::Http5xx
        }));

    let bad = serve(axum::Router::new().route(
        "/v1/chat/completions",
        post(|| async { StatusCode::BAD_REQUEST.into_response() }),
    ))
    .await;
    assert!(outcomes(bad).await.iter().all(|o| *o
        == Outcome::Error {
            class: ErrorClass::Http4xx
        }));

    let slow = serve(axum::Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            StatusCode::OK
        }),
    ))
    .await;
    assert!(outcomes(slow).await.iter().all(|o| *o
        == Outcome::Error {
            class: ErrorClass::Timeout
        }));

    // A port nobody listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    assert!(outcomes(closed).await.iter().all(|o| *o
        == Outcome::Error {
            class: ErrorClass::Connect
        }));
}

#[tokio::test]
async fn measures_ok_stream() {
    let url = serve(axum::Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            sse("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n\
                 data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n\
                 data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\
                 \"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\ndata: [DONE]\n\n")
        }),
    ))
    .await;
    let b = PromptBuilder::builtin(ApiKind::Chat, 32, 1).unwrap();
    let cfg = ReplayConfig {
        arrivals: Arrivals::Poisson {
            rate: 100.0,
            seed: 1,
        },
        progress: false,
        ..ReplayConfig::new(url, "m")
    };
    let out = replay::run(&trace(5), &b, &cfg, "").await.unwrap();
    for r in &out.records {
        assert_eq!(r.outcome, Outcome::Ok);
        assert!(r.ttft_s.is_some() && r.e2e_s >= r.ttft_s);
        assert_eq!(r.completion_tokens, 2);
        assert_eq!(r.cached_tokens, Some(32));
        assert_eq!(r.prompt_tokens, Some(40));
        assert_eq!(r.instance.as_deref(), Some("e1"));
    }
}

/// Each request carries its tenant's header, a one-tenant run sends exactly that tenant's
/// requests of the full mix, and a rejection's stated reason is kept.
#[tokio::test]
async fn tenants_are_sent_and_reject_reasons_kept() {
    use axum::http::HeaderMap;
    use kvgate_loadtest::replay::TenantMix;
    // Tenant "a" is refused with a reason; "b" is served.
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(|h: HeaderMap| async move {
            match h.get("x-tenant").and_then(|v| v.to_str().ok()) {
                Some("a") => (
                    StatusCode::TOO_MANY_REQUESTS,
                    [("x-kvgate-reject-reason", "queue_full")],
                    "{}",
                )
                    .into_response(),
                Some("b") => {
                    sse("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n")
                }
                _ => StatusCode::BAD_REQUEST.into_response(),
            }
        }),
    );
    let url = serve(app).await;
    let b = PromptBuilder::builtin(ApiKind::Chat, 32, 1).unwrap();
    let run = |only: Option<&str>| {
        let cfg = ReplayConfig {
            arrivals: Arrivals::Trace { speed_up: 10.0 },
            request_timeout: Duration::from_secs(2),
            drain_timeout: Duration::from_secs(5),
            progress: false,
            tenants: Some(
                TenantMix::parse("a:1,b:1", "x-tenant", only.map(String::from), 3).unwrap(),
            ),
            ..ReplayConfig::new(url.clone(), "m")
        };
        let b = b.clone();
        async move { replay::run(&trace(40), &b, &cfg, "").await.unwrap() }
    };
    let all = run(None).await;
    assert_eq!(all.records.len(), 40);
    let mut b_indices = Vec::new();
    for r in &all.records {
        match r.tenant.as_deref() {
            Some("a") => {
                assert_eq!(r.outcome, Outcome::Rejected { status: 429 });
                assert_eq!(r.reject_reason.as_deref(), Some("queue_full"));
            }
            Some("b") => {
                assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
                b_indices.push(r.index);
            }
            t => panic!("tenant {t:?}"),
        }
    }
    assert!(!b_indices.is_empty() && b_indices.len() < 40);
    let alone = run(Some("b")).await;
    let idx: Vec<usize> = alone.records.iter().map(|r| r.index).collect();
    assert_eq!(idx, b_indices);
}
