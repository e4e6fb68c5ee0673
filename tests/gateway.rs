//! The proxy end to end: forwarding, streaming, cancellation, retries, errors, shutdown.

mod common;

use common::*;
use futures::StreamExt;
use std::sync::atomic::Ordering;
use std::time::Duration;

async fn post(gw: &Gateway, path: &str, body: &'static str) -> reqwest::Response {
    client()
        .post(gw.url(path))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
}

async fn error_code(resp: reqwest::Response) -> (u16, String) {
    let status = resp.status().as_u16();
    let v: serde_json::Value = resp.json().await.unwrap();
    let code = v["error"]["code"].as_str().unwrap_or_default().to_string();
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    (status, code)
}

#[tokio::test]
async fn forwards_body_and_headers_byte_for_byte() {
    let a = Mock::start("a").await;
    let gw = Gateway::start(config_for(&[a.url()])).await;
    let body = "{ \"model\" :\"m\",\n  \"messages\":[{\"role\":\"user\",\"content\":\"h\\u00e9llo\"}],\"x_unknown\":{\"deep\":[1,2.50,null]} ,\"temperature\":1e-3 }\n";
    let resp = client()
        .post(gw.url("/v1/chat/completions?api-version=7"))
        .header("content-type", "application/json")
        .header("x-custom", "kept")
        .header("authorization", "Bearer secret")
        .header("x-request-id", "req-123")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-request-id"], "req-123");
    assert_eq!(resp.headers()["x-kvgate-instance"], "i0");
    assert!(resp.headers().contains_key("x-kvgate-matched-blocks"));
    assert!(resp.headers().contains_key("x-kvgate-predicted-ttft-ms"));
    let text = resp.text().await.unwrap();
    assert!(text.contains("\"served_by\":\"a\""), "{text}");
    let got = a.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body.as_ref(), body.as_bytes());
    assert_eq!(got[0].path, "/v1/chat/completions?api-version=7");
    assert_eq!(got[0].headers["x-custom"], "kept");
    assert_eq!(got[0].headers["authorization"], "Bearer secret");
    assert_eq!(got[0].headers["x-request-id"], "req-123");
}

#[tokio::test]
async fn request_id_is_generated_when_absent() {
    let a = Mock::start("a").await;
    let gw = Gateway::start(config_for(&[a.url()])).await;
    let r1 = post(&gw, "/v1/completions", r#"{"model":"m","prompt":"x"}"#).await;
    let r2 = post(&gw, "/v1/completions", r#"{"model":"m","prompt":"x"}"#).await;
    let id1 = r1.headers()["x-request-id"].to_str().unwrap().to_string();
    let id2 = r2.headers()["x-request-id"].to_str().unwrap().to_string();
    assert!(!id1.is_empty() && id1 != id2);
    assert_eq!(
        a.received()[0].headers["x-request-id"].to_str().unwrap(),
        id1
    );
}

#[tokio::test]
async fn all_four_endpoints_are_proxied() {
    let a = Mock::start("a").await;
    let gw = Gateway::start(config_for(&[a.url()])).await;
    for (path, body) in [
        ("/v1/chat/completions", CHAT),
        ("/v1/completions", r#"{"model":"m","prompt":[1,2,3]}"#),
        ("/v1/embeddings", r#"{"model":"m","input":["a","b"]}"#),
        (
            "/v1/responses",
            r#"{"model":"m","input":"hi","instructions":"x"}"#,
        ),
    ] {
        let r = post(&gw, path, body).await;
        assert_eq!(r.status(), 200, "{path}");
    }
    let paths: Vec<String> = a.received().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/responses"
        ]
    );
}

#[tokio::test]
async fn streams_chunks_as_they_arrive() {
    let a = Mock::start("a").await;
    a.set_mode(Mode::Stream {
        chunks: 5,
        delay: Duration::from_millis(150),
    });
    let gw = Gateway::start(config_for(&[a.url()])).await;
    let resp = post(
        &gw,
        "/v1/chat/completions",
        r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}"#,
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: {"), "{first:?}");
    // The first chunk reached the client while the upstream was still generating.
    assert_eq!(a.state.streams_completed.load(Ordering::SeqCst), 0);
    let mut all = first.to_vec();
    while let Some(c) = stream.next().await {
        all.extend_from_slice(&c.unwrap());
    }
    let text = String::from_utf8(all).unwrap();
    assert_eq!(text.matches("data: {").count(), 5);
    assert!(text.ends_with("data: [DONE]\n\n"));
    assert!(eventually(5, || a.state.streams_completed.load(Ordering::SeqCst) == 1).await);
}

#[tokio::test]
async fn client_disconnect_cancels_upstream_stream() {
    let a = Mock::start("a").await;
    a.set_mode(Mode::Stream {
        chunks: 200,
        delay: Duration::from_millis(50),
    });
    let mut cfg = config_for(&[a.url()]);
    // A name of its own: the metrics recorder is shared by every gateway in this process.
    cfg.pools[0].instances[0].name = Some("gone-client".into());
    let gw = Gateway::start(cfg).await;
    let in_flight = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("kvgate_in_flight_requests{instance=\"gone-client\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_string)
    };
    let resp = post(
        &gw,
        "/v1/chat/completions",
        r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}"#,
    )
    .await;
    let mut stream = resp.bytes_stream();
    stream.next().await.unwrap().unwrap();
    let metrics = gw.get_text("/metrics").await;
    assert_eq!(in_flight(&metrics).as_deref(), Some("1"));
    drop(stream);
    assert!(
        eventually(10, || a.state.streams_dropped.load(Ordering::SeqCst) == 1).await,
        "upstream stream was not dropped after the client went away"
    );
    assert_eq!(a.state.streams_completed.load(Ordering::SeqCst), 0);
    // The load guard was released with the body.
    let gw_state = gw.state.clone();
    assert!(
        eventually(5, || gw_state
            .routing
            .load()
            .snapshot(kvgate_core::InstanceId(0))
            .in_flight
            == 0)
        .await
    );
    let metrics = gw.get_text("/metrics").await;
    assert_eq!(in_flight(&metrics).as_deref(), Some("0"));
}

#[tokio::test]
async fn connect_failure_is_retried_on_another_instance() {
    let dead = dead_addr().await;
    let b = Mock::start("b").await;
    let mut cfg = config_for(&[format!("http://{dead}"), b.url()]);
    cfg.health.interval_ms = 60_000; // passive path only
    let gw = Gateway::start(cfg).await;
    for _ in 0..4 {
        let r = post(&gw, "/v1/chat/completions", CHAT).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-kvgate-instance"], "i1");
    }
    assert_eq!(b.count(), 4);
}

#[tokio::test]
async fn connect_failures_eject_passively() {
    let dead = dead_addr().await;
    let b = Mock::start("b").await;
    let mut cfg = config_for(&[format!("http://{dead}"), b.url()]);
    cfg.health.interval_ms = 60_000;
    cfg.health.passive_failure_threshold = 1;
    cfg.health.eject_ms = 60_000;
    let gw = Gateway::start(cfg).await;
    for _ in 0..3 {
        assert_eq!(post(&gw, "/v1/chat/completions", CHAT).await.status(), 200);
    }
    let v: serde_json::Value = client()
        .get(gw.url("/admin/instances"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["instances"][0]["ejected"], true, "{v}");
    assert_eq!(v["instances"][1]["usable"], true, "{v}");
}

#[tokio::test]
async fn all_instances_refusing_gives_502() {
    let d1 = dead_addr().await;
    let d2 = dead_addr().await;
    let mut cfg = config_for(&[format!("http://{d1}"), format!("http://{d2}")]);
    cfg.health.interval_ms = 60_000;
    let gw = Gateway::start(cfg).await;
    let (status, code) = error_code(post(&gw, "/v1/chat/completions", CHAT).await).await;
    assert_eq!((status, code.as_str()), (502, "upstream_connect_failed"));
}

#[tokio::test]
async fn status_503_is_retried_and_passed_through_when_out_of_attempts() {
    let a = Mock::start("a").await;
    let b = Mock::start("b").await;
    a.set_mode(Mode::Status(503));
    let gw = Gateway::start(config_for(&[a.url(), b.url()])).await;
    for _ in 0..4 {
        let r = post(&gw, "/v1/chat/completions", CHAT).await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(b.count(), 4);

    let mut cfg = config_for(&[a.url()]);
    cfg.upstream.max_attempts = 1;
    let gw1 = Gateway::start(cfg).await;
    // More 503s than the outlier threshold: a busy engine is not ejected, so each one is the
    // engine's own answer, never "no healthy instance".
    for _ in 0..=kvgate::config::HealthConfig::default().passive_5xx_threshold {
        let r = post(&gw1, "/v1/chat/completions", CHAT).await;
        assert_eq!(r.status(), 503);
        assert!(r.text().await.unwrap().contains("mock a failing"));
    }
}

#[tokio::test]
async fn other_upstream_errors_pass_through_unretried() {
    let a = Mock::start("a").await;
    let b = Mock::start("b").await;
    a.set_mode(Mode::Status(500));
    b.set_mode(Mode::Status(500));
    let gw = Gateway::start(config_for(&[a.url(), b.url()])).await;
    let r = post(&gw, "/v1/chat/completions", CHAT).await;
    assert_eq!(r.status(), 500);
    assert!(r.text().await.unwrap().contains("failing"));
    assert_eq!(a.count() + b.count(), 1);
}

#[tokio::test]
async fn no_retry_once_streaming_began_and_the_break_is_an_sse_error_event() {
    let a = Mock::start("a").await;
    let b = Mock::start("b").await;
    a.set_mode(Mode::DropMidStream { chunks: 2 });
    b.set_mode(Mode::DropMidStream { chunks: 2 });
    let gw = Gateway::start(config_for(&[a.url(), b.url()])).await;
    let r = post(
        &gw,
        "/v1/chat/completions",
        r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}"#,
    )
    .await;
    assert_eq!(r.status(), 200);
    // The broken stream ends, cleanly, with an SSE error event after the events that came.
    let text = r.text().await.expect("the response ends cleanly");
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| e.starts_with("data:"))
        .collect();
    assert_eq!(events.len(), 3, "{text:?}");
    let last: serde_json::Value =
        serde_json::from_str(events[2].trim_start_matches("data:").trim()).expect("json event");
    assert_eq!(last["error"]["code"], "upstream_stream_broken", "{text:?}");
    assert!(!text.contains("[DONE]"));
    assert_eq!(a.count() + b.count(), 1, "retried after streaming began");
}

#[tokio::test]
async fn first_byte_timeout_is_504() {
    let a = Mock::start("a").await;
    a.set_mode(Mode::Slow(Duration::from_secs(5)));
    let mut cfg = config_for(&[a.url()]);
    cfg.upstream.first_byte_timeout_ms = 200;
    let gw = Gateway::start(cfg).await;
    let (status, code) = error_code(post(&gw, "/v1/chat/completions", CHAT).await).await;
    assert_eq!((status, code.as_str()), (504, "upstream_timeout"));
}

#[tokio::test]
async fn bad_inputs_get_clear_4xx() {
    let a = Mock::start("a").await;
    let mut cfg = config_for(&[a.url()]);
    cfg.server.body_limit_bytes = 1024;
    let gw = Gateway::start(cfg).await;
    let cases: [(&str, &str, String, u16, &str); 8] = [
        (
            "/v1/chat/completions",
            "application/json",
            "{\"model\":".into(),
            400,
            "malformed_json",
        ),
        (
            "/v1/chat/completions",
            "text/plain",
            CHAT.into(),
            415,
            "unsupported_media_type",
        ),
        (
            "/v1/chat/completions",
            "application/json",
            r#"{"model":"m"}"#.into(),
            400,
            "missing_field",
        ),
        (
            "/v1/completions",
            "application/json",
            r#"{"model":"m"}"#.into(),
            400,
            "missing_field",
        ),
        (
            "/v1/embeddings",
            "application/json",
            r#"{"model":"m"}"#.into(),
            400,
            "missing_field",
        ),
        (
            "/v1/chat/completions",
            "application/json",
            r#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#.into(),
            404,
            "model_not_found",
        ),
        (
            "/v1/chat/completions",
            "application/json",
            format!(
                r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
                "x".repeat(2000)
            ),
            413,
            "payload_too_large",
        ),
        (
            "/v1/chat/completions",
            "application/json",
            "[1,2]".into(),
            400,
            "body_not_object",
        ),
    ];
    for (path, ct, body, want_status, want_code) in cases {
        let r = client()
            .post(gw.url(path))
            .header("content-type", ct)
            .body(body)
            .send()
            .await
            .unwrap();
        assert!(r.headers().contains_key("x-request-id"));
        let (status, code) = error_code(r).await;
        assert_eq!(
            (status, code.as_str()),
            (want_status, want_code),
            "{path} {ct}"
        );
    }
    // Chunked body over the limit (no Content-Length): still 413.
    let chunks = futures::stream::iter((0..4).map(|_| Ok::<_, std::io::Error>(vec![b' '; 512])));
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(r).await.0, 413);
    let r = client().get(gw.url("/v2/nothing")).send().await.unwrap();
    assert_eq!(error_code(r).await, (404, "not_found".to_string()));
    assert_eq!(a.count(), 0, "no bad request may reach an instance");
}

#[tokio::test]
async fn model_is_optional_with_one_pool_and_required_with_several() {
    let a = Mock::start("a").await;
    let b = Mock::start("b").await;
    let gw = Gateway::start(config_for(&[a.url()])).await;
    let r = post(
        &gw,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"x"}]}"#,
    )
    .await;
    assert_eq!(r.status(), 200);

    let mut cfg = config_for(&[a.url()]);
    let mut second = cfg.pools[0].clone();
    second.model = "other".into();
    second.instances[0].url = b.url();
    second.instances[0].name = Some("j0".into());
    cfg.pools.push(second);
    let gw2 = Gateway::start(cfg).await;
    let r = post(
        &gw2,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"x"}]}"#,
    )
    .await;
    assert_eq!(error_code(r).await, (400, "model_required".to_string()));
    let r = post(
        &gw2,
        "/v1/chat/completions",
        r#"{"model":"other","messages":[{"role":"user","content":"x"}]}"#,
    )
    .await;
    assert_eq!(r.headers()["x-kvgate-instance"], "j0");
}

#[tokio::test]
async fn graceful_shutdown_lets_an_inflight_stream_finish() {
    let a = Mock::start("a").await;
    a.set_mode(Mode::Stream {
        chunks: 8,
        delay: Duration::from_millis(60),
    });
    let mut gw = Gateway::start(config_for(&[a.url()])).await;
    let resp = post(
        &gw,
        "/v1/chat/completions",
        r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}"#,
    )
    .await;
    let mut stream = resp.bytes_stream();
    let mut all = stream.next().await.unwrap().unwrap().to_vec();
    gw.shutdown();
    while let Some(c) = stream.next().await {
        all.extend_from_slice(&c.expect("stream cut during graceful shutdown"));
    }
    assert!(String::from_utf8_lossy(&all).ends_with("data: [DONE]\n\n"));
    let join = gw.join.take().unwrap();
    tokio::time::timeout(Duration::from_secs(10), join)
        .await
        .expect("server did not stop after draining")
        .unwrap()
        .unwrap();
    assert!(
        client().get(gw.url("/health")).send().await.is_err(),
        "still accepting after shutdown"
    );
}

#[tokio::test]
async fn shutdown_grace_period_bounds_the_drain() {
    let a = Mock::start("a").await;
    a.set_mode(Mode::Stream {
        chunks: 1000,
        delay: Duration::from_millis(50),
    });
    let mut cfg = config_for(&[a.url()]);
    cfg.server.shutdown_grace_ms = 300;
    let mut gw = Gateway::start(cfg).await;
    let resp = post(
        &gw,
        "/v1/chat/completions",
        r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}"#,
    )
    .await;
    let mut stream = resp.bytes_stream();
    stream.next().await.unwrap().unwrap();
    gw.shutdown();
    let join = gw.join.take().unwrap();
    tokio::time::timeout(Duration::from_secs(10), join)
        .await
        .expect("grace period not enforced")
        .unwrap()
        .unwrap();
}
