//! Per-tenant rate limits end to end, over both serving paths (kvgate's HTTP/1.1 loop for a body
//! with a length, hyper for a chunked body): OpenAI's `x-ratelimit-*` headers on answers, 429
//! `rate_limit_exceeded` with `Retry-After` over a limit, output tokens charged as they stream
//! (a request admitted within budget drives it negative and holds the next one), nothing
//! refused reaching the instance; prompt tokens given back to requests every engine refused
//! (503), but not the request, nor to a request abandoned after dispatch.

mod common;

use common::*;
use kvgate::config::Config;
use std::time::Duration;

#[derive(Clone, Copy, Debug)]
enum Via {
    H1,
    Hyper,
}

const BODY: &str = r#"{"model":"m","prompt":"hello","max_tokens":1}"#;
const STREAM: &str = r#"{"model":"m","prompt":"hello","stream":true}"#;

async fn post(gw: &Gateway, via: Via, key: &str, body: &'static str) -> reqwest::Response {
    let req = client()
        .post(gw.url("/v1/completions"))
        .header("content-type", "application/json")
        .header("x-api-key", key);
    let req = match via {
        Via::H1 => req.body(body),
        Via::Hyper => {
            let chunks: Vec<Result<&'static str, std::io::Error>> = vec![Ok(body)];
            req.body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        }
    };
    req.send().await.expect("answered")
}

const KEYS: &str = r#"
[[tenants]]
name = "req-h1"
requests_per_second = 1
burst_requests = 2

[[tenants]]
name = "req-hyper"
requests_per_second = 1
burst_requests = 2

[[keys]]
key = "sk-req-h1"
tenant = "req-h1"

[[keys]]
key = "sk-req-hyper"
tenant = "req-hyper"

[[keys]]
key = "sk-tok-h1"
tenant = "tok-h1"
tokens_per_minute = 30

[[keys]]
key = "sk-tok-hyper"
tenant = "tok-hyper"
tokens_per_minute = 30

[[keys]]
key = "sk-free"
tenant = "free"
"#;

async fn gateway(keys: &str, f: impl FnOnce(&mut Config)) -> (Mock, Gateway) {
    let a = Mock::start("a").await;
    let mut c = config_for(&[a.url()]);
    let path = fresh_dir("ratelimit").join("keys.toml");
    std::fs::write(&path, keys).unwrap();
    c.auth.enabled = true;
    c.auth.keys_file = path.to_string_lossy().into_owned();
    f(&mut c);
    let gw = Gateway::start(c).await;
    assert!(eventually(10, || gw.state.fleet.any_usable(gw.state.clock.now_ms())).await);
    (a, gw)
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn request_limit_answers_429_with_openai_headers_on_both_paths() {
    let (a, gw) = gateway(KEYS, |_| {}).await;
    for (via, key) in [(Via::H1, "sk-req-h1"), (Via::Hyper, "sk-req-hyper")] {
        let r = post(&gw, via, key, BODY).await;
        assert_eq!(r.status(), 200, "{via:?}");
        assert_eq!(header(&r, "x-ratelimit-limit-requests"), "2");
        assert_eq!(header(&r, "x-ratelimit-remaining-requests"), "1");
        assert!(header(&r, "x-ratelimit-reset-requests").ends_with('s'));
        // No token limit, no token headers.
        assert!(r.headers().get("x-ratelimit-limit-tokens").is_none());
        let r = post(&gw, via, key, BODY).await;
        assert_eq!(r.status(), 200, "{via:?}");
        // The bucket refills one request a second: the third, sent at once, is refused.
        let r = post(&gw, via, key, BODY).await;
        assert_eq!(r.status(), 429, "{via:?}");
        assert_eq!(header(&r, "retry-after"), "1");
        assert_eq!(header(&r, "x-ratelimit-remaining-requests"), "0");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"]["type"], "rate_limit_exceeded");
        assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    }
    // Tenants' metrics: bounded labels, the refusal counted by reason.
    let m = gw.get_text("/metrics").await;
    let has = |parts: &[&str]| m.lines().any(|l| parts.iter().all(|p| l.contains(p)));
    assert!(
        has(&[
            "kvgate_tenant_rejections_total",
            "tenant=\"req-h1\"",
            "reason=\"rate_limit\""
        ]),
        "{m}"
    );
    // Every answer counts, refusals included: 3 requests per tenant, whichever serving thread
    // (and its cached counter handle) took each.
    for tenant in ["req-h1", "req-hyper"] {
        let label = format!("tenant=\"{tenant}\"");
        let line = m
            .lines()
            .find(|l| l.starts_with("kvgate_tenant_requests_total") && l.contains(&label))
            .unwrap_or_else(|| panic!("no request count for {tenant}: {m}"));
        assert!(line.ends_with(" 3"), "{line}");
    }
    // Refused requests never reached the instance; an unlimited tenant is not held back.
    assert_eq!(a.count(), 4);
    for _ in 0..5 {
        let r = post(&gw, Via::H1, "sk-free", BODY).await;
        assert_eq!(r.status(), 200);
        assert!(r.headers().get("x-ratelimit-limit-requests").is_none());
    }
}

#[tokio::test]
async fn streamed_output_tokens_drive_the_budget_negative_and_hold_the_next_request() {
    let (a, gw) = gateway(KEYS, |_| {}).await;
    a.set_mode(Mode::Stream {
        chunks: 50,
        delay: Duration::from_millis(1),
    });
    for (via, key) in [(Via::H1, "sk-tok-h1"), (Via::Hyper, "sk-tok-hyper")] {
        // 30 tokens a minute: within budget, so admitted; its ~50 streamed tokens put the
        // tenant ~25 tokens in debt.
        let r = post(&gw, via, key, STREAM).await;
        assert_eq!(r.status(), 200, "{via:?}");
        assert_eq!(header(&r, "x-ratelimit-limit-tokens"), "30");
        let body = r.text().await.unwrap();
        assert!(body.contains("[DONE]") || body.contains("data:"), "{body}");
        let r = post(&gw, via, key, STREAM).await;
        assert_eq!(r.status(), 429, "{via:?}");
        // At half a token a second, a debt of > 20 tokens takes > 40 s to repay.
        let wait: u64 = header(&r, "retry-after").parse().unwrap();
        assert!(wait > 40, "{via:?}: retry after {wait}");
        assert_eq!(header(&r, "x-ratelimit-remaining-tokens"), "0");
        let reset = header(&r, "x-ratelimit-reset-tokens");
        assert!(reset.contains('m'), "{reset}");
    }
    let m = gw.get_text("/metrics").await;
    let output = m.lines().find(|l| {
        l.starts_with("kvgate_tenant_tokens_charged_total")
            && l.contains("tenant=\"tok-h1\"")
            && l.contains("kind=\"output\"")
    });
    let n: f64 = output
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(n >= 50.0, "output tokens charged: {n}\n{m}");
}

#[tokio::test]
async fn defaults_apply_to_every_tenant_and_anonymous_without_keys() {
    let a = Mock::start("a").await;
    let mut c = config_for(&[a.url()]);
    c.rate_limits.requests_per_second = Some(1);
    c.rate_limits.burst_requests = Some(1);
    let gw = Gateway::start(c).await;
    assert!(eventually(10, || gw.state.fleet.any_usable(gw.state.clock.now_ms())).await);
    let r = post(&gw, Via::H1, "ignored", BODY).await;
    assert_eq!(r.status(), 200);
    // A client-chosen tenant header is no way around the limit without keys.
    let r = client()
        .post(gw.url("/v1/completions"))
        .header("content-type", "application/json")
        .header("x-kvgate-tenant", "someone-else")
        .body(BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
}

fn replica(urls: &[String], seeds: Vec<String>) -> Config {
    let mut c = config_for(urls);
    c.gossip = kvgate_gossip::GossipConfig {
        enabled: true,
        bind: "127.0.0.1:0".into(),
        seeds,
        secret: "ratelimit-test-secret-0123".into(),
        probe_period_ms: 200,
        probe_rtt_ms: 80,
        suspect_to_down_ms: 600,
        seed_interval_ms: 200,
        ..Default::default()
    };
    c.rate_limits.requests_per_second = Some(RATE);
    c.rate_limits.burst_requests = Some(BURST);
    c.rate_limits.gossip_interval_ms = INTERVAL_MS;
    c
}

const RATE: u64 = 20;
const BURST: u64 = 5;
const INTERVAL_MS: u64 = 50;

/// Two replicas gossiping on 127.0.0.1 share one budget: over a window of `t` the pair admits
/// at most `burst + rate × t` plus the convergence bound `(N − 1) × (rate × d + burst)`, with
/// `d` the usage interval plus delivery (taken as 50 ms on loopback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_gossiping_enforce_one_budget() {
    let e = Mock::start("e").await;
    let urls = vec![e.url()];
    let a = Gateway::start(replica(&urls, vec![])).await;
    assert!(eventually(10, || a.state.routing.gossip().is_some()).await);
    let ga = a.state.routing.gossip().cloned().unwrap();
    let b = Gateway::start(replica(&urls, vec![ga.local_addr().to_string()])).await;
    assert!(eventually(10, || b.state.routing.gossip().is_some()).await);
    let gb = b.state.routing.gossip().cloned().unwrap();
    assert!(eventually(10, || ga.live_peers() == 1 && gb.live_peers() == 1).await);
    for g in [&a, &b] {
        assert!(eventually(10, || g.state.fleet.any_usable(g.state.clock.now_ms())).await);
    }
    let started = std::time::Instant::now();
    let window = Duration::from_secs(3);
    let (mut admitted, mut refused, mut i) = (0u64, 0u64, 0u64);
    while started.elapsed() < window && i < 100_000 {
        let gw = if i % 2 == 0 { &a } else { &b };
        i += 1;
        match post(gw, Via::H1, "unused", BODY).await.status().as_u16() {
            200 => admitted += 1,
            429 => refused += 1,
            s => panic!("status {s}"),
        }
    }
    let t = started.elapsed().as_secs_f64();
    let budget = BURST as f64 + RATE as f64 * t;
    let d = (INTERVAL_MS + 50) as f64 / 1000.0;
    let bound = RATE as f64 * d + BURST as f64;
    println!(
        "two replicas, {RATE}/s burst {BURST}, usage every {INTERVAL_MS} ms: {admitted} admitted \
         ({refused} refused) in {t:.2} s; budget {budget:.1}, over-admission {:.1} (bound {bound:.1})",
        admitted as f64 - budget
    );
    assert!(refused > 0, "the limit never bit");
    assert!(
        admitted as f64 <= budget + bound,
        "{admitted} admitted > budget {budget:.1} + bound {bound:.1}"
    );
    // Each replica alone would have admitted the whole budget.
    assert!(
        (admitted as f64) < 2.0 * budget - BURST as f64,
        "{admitted}: usage not shared"
    );
}

const REFUND_KEYS: &str = r#"
[[keys]]
key = "sk-refund"
tenant = "refund"
tokens_per_minute = 60
burst_tokens = 1000

[[keys]]
key = "sk-gone"
tenant = "gone"
tokens_per_minute = 60
burst_tokens = 1000

[[keys]]
key = "sk-count"
tenant = "count"
requests_per_second = 1
burst_requests = 3
"#;

/// About 100 prompt tokens (text mode counts 4 bytes a token).
const LONG: &str = r#"{"model":"m","prompt":"0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789","max_tokens":1}"#;

fn remaining_tokens(r: &reqwest::Response) -> i64 {
    header(r, "x-ratelimit-remaining-tokens")
        .parse()
        .expect("x-ratelimit-remaining-tokens")
}

fn metric(m: &str, tenant: &str, kind: &str) -> f64 {
    m.lines()
        .find(|l| {
            l.starts_with("kvgate_tenant_tokens_charged_total")
                && l.contains(&format!("tenant=\"{tenant}\""))
                && l.contains(&format!("kind=\"{kind}\""))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// A request every engine refuses (503) gets its prompt tokens back, on both serving paths;
/// the request itself stays counted; one that was served is charged as usual.
#[tokio::test]
async fn a_refused_request_gets_its_prompt_tokens_back_but_not_its_request() {
    let (a, gw) = gateway(REFUND_KEYS, |_| {}).await;
    a.set_mode(Mode::Status(503));
    // The headers of an answer show the buckets right after its admission, before any refund.
    let first = post(&gw, Via::H1, "sk-refund", LONG).await;
    assert_eq!(first.status(), 503);
    let after_one = remaining_tokens(&first);
    let prompt = 1000 - after_one;
    assert!(prompt >= 90, "prompt tokens charged: {prompt}");
    for via in [Via::H1, Via::Hyper, Via::H1, Via::Hyper] {
        let r = post(&gw, via, "sk-refund", LONG).await;
        assert_eq!(r.status(), 503, "{via:?}");
        // Charged afresh each time from a refunded bucket, not ever deeper (which would be
        // `after_one - k × prompt` without refunds). A refund may lose a token to rounding.
        assert!(
            remaining_tokens(&r) + 2 >= after_one,
            "{via:?}: {} left, {after_one} after the first",
            remaining_tokens(&r)
        );
    }
    assert_eq!(
        a.count(),
        5,
        "every request reached the engine and was refused"
    );
    let m = gw.get_text("/metrics").await;
    let refunded = metric(&m, "refund", "refunded");
    assert!(
        refunded >= 5.0 * (prompt as f64 - 1.0),
        "refunded {refunded} of 5 × {prompt}\n{m}"
    );

    // Served requests are charged and stay charged.
    a.set_mode(Mode::Json);
    let r = post(&gw, Via::H1, "sk-refund", LONG).await;
    assert_eq!(r.status(), 200);
    let served = remaining_tokens(&r);
    assert!(served + 5 >= after_one, "{served}");
    let r = post(&gw, Via::H1, "sk-refund", LONG).await;
    assert_eq!(r.status(), 200);
    assert!(
        remaining_tokens(&r) <= served - prompt + 2,
        "the first served one was refunded"
    );

    // The request count is not given back: 3 burst, 1 a second, every one refused by the
    // engine: the fourth at once is over the request limit.
    a.set_mode(Mode::Status(503));
    for _ in 0..3 {
        assert_eq!(post(&gw, Via::H1, "sk-count", BODY).await.status(), 503);
    }
    let r = post(&gw, Via::H1, "sk-count", BODY).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "x-ratelimit-remaining-requests"), "0");
}

/// A client that leaves once its request was dispatched does not get its tokens back: the
/// engine holds the request and may be computing it.
#[tokio::test]
async fn a_client_gone_after_dispatch_stays_charged() {
    let (a, gw) = gateway(REFUND_KEYS, |_| {}).await;
    a.set_mode(Mode::Held);
    let url = gw.url("/v1/completions");
    let gone = tokio::spawn(async move {
        client()
            .post(url)
            .header("content-type", "application/json")
            .header("x-api-key", "sk-gone")
            .body(LONG)
            .send()
            .await
            .map(|r| r.status())
    });
    assert!(eventually(10, || a.held() == 1).await, "never dispatched");
    gone.abort();
    let _ = gone.await;
    a.set_mode(Mode::Json);
    a.release(1);
    let r = post(&gw, Via::H1, "sk-gone", LONG).await;
    assert_eq!(r.status(), 200);
    let second = remaining_tokens(&r);
    let r = post(&gw, Via::H1, "sk-gone", LONG).await;
    let third = remaining_tokens(&r);
    let prompt = second - third;
    assert!(prompt >= 90, "{prompt}");
    // Two prompts charged before the third's admission: the abandoned one and the second.
    assert!(
        second <= 1000 - 2 * prompt + 2,
        "the abandoned request was refunded: {second} left"
    );
    let m = gw.get_text("/metrics").await;
    assert_eq!(metric(&m, "gone", "refunded"), 0.0, "{m}");
}

/// The queue of the first pool as `/admin/admission` shows it.
async fn queued(gw: &Gateway) -> u64 {
    let v: serde_json::Value =
        serde_json::from_str(&gw.get_text("/admin/admission").await).unwrap();
    v["pools"][0]["entries"].as_u64().unwrap_or(0)
}

/// A client that leaves while its request waits in the admission queue (no engine holds it
/// yet) gets its prompt tokens back.
#[tokio::test]
async fn a_client_gone_while_queued_gets_its_tokens_back() {
    let (a, gw) = gateway(REFUND_KEYS, |c| {
        c.admission.enabled = true;
        c.admission.max_inflight_per_instance = 1;
        c.admission.max_wait_ms = 10_000;
    })
    .await;
    a.set_mode(Mode::Held);
    for (round, via) in [Via::H1, Via::Hyper].into_iter().enumerate() {
        let url = gw.url("/v1/completions");
        let send = |key: &'static str| {
            let req = client()
                .post(url.clone())
                .header("content-type", "application/json")
                .header("x-api-key", key);
            let req = match via {
                Via::H1 => req.body(LONG),
                Via::Hyper => {
                    let chunks: Vec<Result<&'static str, std::io::Error>> = vec![Ok(LONG)];
                    req.body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
                }
            };
            tokio::spawn(async move { req.send().await.map(|r| r.status()) })
        };
        // One request holds the only place; the refund tenant's waits behind it.
        let holder = send("sk-gone");
        assert!(eventually(10, || a.held() == 1).await);
        let waiting = send("sk-refund");
        let ok = eventually_async(10, || async { queued(&gw).await == 1 }).await;
        assert!(ok, "{via:?}: never queued");
        waiting.abort();
        let _ = waiting.await;
        let ok = eventually_async(10, || async {
            let m = gw.get_text("/metrics").await;
            metric(&m, "refund", "refunded") >= 90.0 * (round as f64 + 1.0)
        })
        .await;
        assert!(
            ok,
            "{via:?}: the queued request's tokens were not given back"
        );
        a.release(1);
        assert!(holder.await.unwrap().is_ok());
    }
}
