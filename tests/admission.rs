//! Admission control end to end: a saturated pool queues and admits as requests finish; 429s with
//! `Retry-After` and a reason when the queue is full, the wait bound passes or a request is shed;
//! priority order, a key's `max_priority` ceiling and tenant fair share as observed by the
//! instance; the gateway's own endpoints unaffected. Every scenario runs over both serving paths: kvgate's HTTP/1.1 loop (a body with
//! a length) and hyper (a chunked body).
//!
//! The pool is one mock instance that holds every answer until the test releases it, with an
//! in-flight capacity of one: the pool is saturated exactly while one request is held.

mod common;

use common::*;
use kvgate::config::Config;

#[derive(Clone, Copy, Debug)]
enum Via {
    /// A body with a `content-length`: served by kvgate's own loop.
    H1,
    /// A chunked body: handed to hyper.
    Hyper,
}

fn admission_config(url: String) -> Config {
    let mut c = config_for(&[url]);
    c.admission.enabled = true;
    c.admission.max_inflight_per_instance = 1;
    c.admission.max_wait_ms = 10_000;
    c
}

/// A completion whose prompt is `tag` padded to `len` bytes.
fn body(tag: &str, len: usize, priority: Option<i64>) -> String {
    let prompt = format!("{tag}{}", "x".repeat(len.saturating_sub(tag.len())));
    match priority {
        Some(p) => format!(r#"{{"model":"m","prompt":"{prompt}","max_tokens":1,"priority":{p}}}"#),
        None => format!(r#"{{"model":"m","prompt":"{prompt}","max_tokens":1}}"#),
    }
}

/// Sends `body` with extra `headers` over `via`, in the background.
fn send(
    gw: &Gateway,
    via: Via,
    body: String,
    headers: &[(&'static str, &'static str)],
) -> tokio::task::JoinHandle<reqwest::Response> {
    let mut req = client()
        .post(gw.url("/v1/completions"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req = match via {
        Via::H1 => req.body(body),
        Via::Hyper => {
            let chunks: Vec<Result<String, std::io::Error>> = vec![Ok(body)];
            req.body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        }
    };
    tokio::spawn(async move { req.send().await.expect("answered") })
}

/// The pool's queue as `/admin/admission` shows it.
async fn queued(gw: &Gateway) -> u64 {
    let v: serde_json::Value =
        serde_json::from_str(&gw.get_text("/admin/admission").await).unwrap();
    v["pools"][0]["entries"].as_u64().unwrap()
}

async fn wait_queued(gw: &Gateway, n: u64) {
    let reached = eventually_async(10, || async { queued(gw).await == n }).await;
    assert!(reached, "queue never reached {n}");
}

/// A gateway in front of a holding mock, with one request held (the pool saturated).
async fn saturated(
    cfg: impl FnOnce(&mut Config),
    via: Via,
) -> (Mock, Gateway, tokio::task::JoinHandle<reqwest::Response>) {
    let a = Mock::start("a").await;
    a.set_mode(Mode::Held);
    let mut c = admission_config(a.url());
    cfg(&mut c);
    let gw = Gateway::start(c).await;
    let first = send(&gw, via, body("first", 10, None), &[]);
    assert!(eventually(10, || a.held() == 1).await);
    (a, gw, first)
}

/// The tag of the `i`-th prompt the mock received.
fn tag_of(a: &Mock, i: usize) -> String {
    let b = &a.received()[i].body;
    let v: serde_json::Value = serde_json::from_slice(b).unwrap();
    v["prompt"]
        .as_str()
        .unwrap()
        .trim_end_matches('x')
        .to_string()
}

/// Releases one held request and waits until the mock has received `n` requests in all.
async fn next(a: &Mock, n: usize) {
    a.release(1);
    assert!(
        eventually(10, || a.count() >= n).await,
        "request {n} never arrived"
    );
}

/// The value of the series `series` (name and labels) in a Prometheus exposition, 0 if absent.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

async fn rejected(resp: reqwest::Response) -> (String, u64, String) {
    assert_eq!(resp.status(), 429);
    let reason = resp.headers()["x-kvgate-reject-reason"]
        .to_str()
        .unwrap()
        .to_string();
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let v: serde_json::Value = resp.json().await.unwrap();
    (
        reason,
        retry,
        v["error"]["code"].as_str().unwrap().to_string(),
    )
}

macro_rules! over_both_paths {
    ($($name:ident),* $(,)?) => {
        mod h1 {
            $(#[tokio::test] async fn $name() { super::$name(super::Via::H1).await })*
        }
        mod hyper {
            $(#[tokio::test] async fn $name() { super::$name(super::Via::Hyper).await })*
        }
    };
}

over_both_paths!(
    a_saturated_pool_queues_then_admits_when_a_request_finishes,
    a_full_queue_answers_429_with_retry_after_and_reason,
    the_wait_bound_answers_429,
    sheddable_requests_are_rejected_first,
    critical_is_served_before_standard,
    tenants_share_by_tokens,
    gateway_endpoints_are_served_while_the_queue_is_full,
    an_engine_reporting_a_queue_saturates_its_instance,
    a_tenant_weight_multiplies_its_share,
    queued_time_counts_in_time_to_first_token,
);

async fn a_saturated_pool_queues_then_admits_when_a_request_finishes(via: Via) {
    let (a, gw, first) = saturated(|_| {}, via).await;
    let second = send(&gw, via, body("second", 10, None), &[]);
    wait_queued(&gw, 1).await;
    assert_eq!(
        a.count(),
        1,
        "the queued request must not reach the instance"
    );
    next(&a, 2).await;
    assert_eq!(first.await.unwrap().status(), 200);
    assert_eq!(queued(&gw).await, 0);
    a.release(1);
    let resp = second.await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(tag_of(&a, 1), "second");
    // The recorder is shared by every gateway in this process: at least this one's wait.
    let metrics = gw.get_text("/metrics").await;
    assert!(
        metric(
            &metrics,
            "kvgate_admission_queue_wait_seconds_count{pool=\"m\"}"
        ) >= 1.0,
        "{metrics}"
    );
}

/// The sum and count of `name`'s series (a histogram's `_sum` and `_count`) for instance
/// `instance`, as Prometheus text exposes them; 0 if absent.
fn histogram(text: &str, name: &str, instance: &str) -> (f64, f64) {
    let label = format!("instance=\"{instance}\"");
    let value = |suffix: &str| {
        let prefix = format!("{name}_{suffix}{{");
        text.lines()
            .filter(|l| l.starts_with(&prefix) && l.contains(&label))
            .find_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            .unwrap_or(0.0)
    };
    (value("sum"), value("count"))
}

/// A streamed request that waits in the queue: the time-to-first-token histogram, which runs
/// from arrival, records at least the wait the queue itself reported before the test let the
/// request go. (Counted from its dispatch instead, it would record the mock's few ms.)
async fn queued_time_counts_in_time_to_first_token(via: Via) {
    // The least wait to observe before releasing: far above what the mock takes to answer.
    const WAIT_MS: u64 = 300;
    // An instance name of its own: the recorder is shared by every test in this process, and
    // only this test's requests are recorded under it.
    let instance = match via {
        Via::H1 => "ttft-h1",
        Via::Hyper => "ttft-hyper",
    };
    let (a, gw, first) = saturated(
        |c| c.pools[0].instances[0].name = Some(instance.to_string()),
        via,
    )
    .await;
    let streamed = send(
        &gw,
        via,
        r#"{"model":"m","prompt":"queued","max_tokens":2,"stream":true}"#.to_string(),
        &[],
    );
    wait_queued(&gw, 1).await;
    // Polled, not slept: the queue's own account of how long its one entry has waited.
    let waited = std::sync::atomic::AtomicU64::new(0);
    let long_enough = eventually_async(10, || async {
        let v: serde_json::Value =
            serde_json::from_str(&gw.get_text("/admin/admission").await).unwrap();
        let ms = v["pools"][0]["classes"][1]["oldest_wait_ms"]
            .as_u64()
            .unwrap_or(0);
        waited.store(ms, std::sync::atomic::Ordering::SeqCst);
        ms >= WAIT_MS
    })
    .await;
    let waited_ms = waited.load(std::sync::atomic::Ordering::SeqCst);
    assert!(long_enough, "the queued request never waited {WAIT_MS} ms");
    assert_eq!(a.count(), 1, "the streamed request must still be queued");
    let before = histogram(
        &gw.get_text("/metrics").await,
        kvgate::metrics::TTFT,
        instance,
    );
    assert_eq!(before, (0.0, 0.0), "nothing streamed yet");
    a.set_mode(Mode::Stream {
        chunks: 2,
        delay: std::time::Duration::from_millis(1),
    });
    a.release(1);
    assert_eq!(first.await.unwrap().status(), 200);
    let resp = streamed.await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    let (sum, count) = histogram(
        &gw.get_text("/metrics").await,
        kvgate::metrics::TTFT,
        instance,
    );
    // The first request was not streamed: the one observation is the queued request's.
    assert_eq!(count, 1.0, "{via:?}");
    assert!(
        sum >= waited_ms as f64 / 1e3,
        "{via:?}: time to first token {sum} s, but it waited {waited_ms} ms in the queue"
    );
}

/// The mock's `/metrics` reports 2 requests waiting: with `max_engine_waiting = 2` and no count
/// bound, its instance is saturated by the engine's own queue alone. An idle pool still admits (a
/// waiter finding nothing in flight admits itself); the next request queues until one finishes.
async fn an_engine_reporting_a_queue_saturates_its_instance(via: Via) {
    let a = Mock::start("a").await;
    a.set_mode(Mode::Held);
    let mut c = admission_config(a.url());
    c.admission.max_inflight_per_instance = 0;
    c.admission.max_engine_waiting = 2;
    let gw = Gateway::start(c).await;
    let scraped = eventually_async(10, || async {
        let v: serde_json::Value =
            serde_json::from_str(&gw.get_text("/admin/instances").await).unwrap();
        v.to_string().contains("\"waiting\":2")
    })
    .await;
    assert!(scraped, "the engine's load was never scraped");
    let first = send(&gw, via, body("first", 10, None), &[]);
    assert!(eventually(10, || a.held() == 1).await);
    let second = send(&gw, via, body("second", 10, None), &[]);
    wait_queued(&gw, 1).await;
    assert_eq!(
        a.count(),
        1,
        "the queued request must not reach the instance"
    );
    next(&a, 2).await;
    assert_eq!(first.await.unwrap().status(), 200);
    a.release(1);
    assert_eq!(second.await.unwrap().status(), 200);
    assert_eq!(tag_of(&a, 1), "second");
}

async fn a_full_queue_answers_429_with_retry_after_and_reason(via: Via) {
    let (a, gw, first) = saturated(|c| c.admission.max_queue_entries = 1, via).await;
    let second = send(&gw, via, body("second", 10, None), &[]);
    wait_queued(&gw, 1).await;
    let third = send(&gw, via, body("third", 10, None), &[]).await.unwrap();
    let (reason, retry, code) = rejected(third).await;
    assert_eq!(
        (reason.as_str(), code.as_str()),
        ("queue_full", "overloaded")
    );
    assert!(retry >= 1);
    let metrics = gw.get_text("/metrics").await;
    assert!(
        metric(
            &metrics,
            "kvgate_admission_rejections_total{pool=\"m\",reason=\"queue_full\"}"
        ) >= 1.0,
        "{metrics}"
    );
    a.release(2);
    assert_eq!(first.await.unwrap().status(), 200);
    assert_eq!(second.await.unwrap().status(), 200);
}

async fn the_wait_bound_answers_429(via: Via) {
    let (a, gw, first) = saturated(|c| c.admission.max_wait_ms = 200, via).await;
    let second = send(&gw, via, body("second", 10, None), &[]).await.unwrap();
    let (reason, retry, _) = rejected(second).await;
    assert_eq!(reason, "wait_timeout");
    assert!(retry >= 1);
    assert_eq!(queued(&gw).await, 0);
    a.release(1);
    assert_eq!(first.await.unwrap().status(), 200);
    assert_eq!(a.count(), 1);
}

async fn sheddable_requests_are_rejected_first(via: Via) {
    let (a, gw, first) = saturated(|c| c.admission.max_queue_entries = 2, via).await;
    let shed = send(
        &gw,
        via,
        body("shed", 10, None),
        &[("x-kvgate-priority", "sheddable")],
    );
    wait_queued(&gw, 1).await;
    let standard = send(&gw, via, body("standard", 10, None), &[]);
    wait_queued(&gw, 2).await;
    // Full: a critical arrival evicts the sheddable one, which is answered 429 at once.
    let critical = send(
        &gw,
        via,
        body("critical", 10, None),
        &[("x-kvgate-priority", "critical")],
    );
    let (reason, _, _) = rejected(shed.await.unwrap()).await;
    assert_eq!(reason, "shed");
    // A sheddable arrival now finds no room and nothing below it to evict.
    let late = send(
        &gw,
        via,
        body("late", 10, None),
        &[("x-kvgate-priority", "sheddable")],
    );
    assert_eq!(rejected(late.await.unwrap()).await.0, "queue_full");
    next(&a, 2).await;
    next(&a, 3).await;
    a.release(1);
    for h in [first, standard, critical] {
        assert_eq!(h.await.unwrap().status(), 200);
    }
    assert_eq!(tag_of(&a, 1), "critical");
    assert_eq!(tag_of(&a, 2), "standard");
}

async fn critical_is_served_before_standard(via: Via) {
    let (a, gw, first) = saturated(|_| {}, via).await;
    let standard = send(&gw, via, body("standard", 10, None), &[]);
    wait_queued(&gw, 1).await;
    let sheddable = send(&gw, via, body("sheddable", 10, Some(5)), &[]);
    wait_queued(&gw, 2).await;
    // The body's vLLM priority: negative is critical.
    let critical = send(&gw, via, body("critical", 10, Some(-1)), &[]);
    wait_queued(&gw, 3).await;
    for n in 2..=4 {
        next(&a, n).await;
    }
    a.release(1);
    for h in [first, standard, sheddable, critical] {
        assert_eq!(h.await.unwrap().status(), 200);
    }
    let order: Vec<String> = (1..4).map(|i| tag_of(&a, i)).collect();
    assert_eq!(order, ["critical", "standard", "sheddable"]);
}

async fn tenants_share_by_tokens(via: Via) {
    let (a, gw, first) = saturated(|_| {}, via).await;
    // Tenant "big" queues first, four prompts of ~1000 tokens; then "small", eight of ~100.
    // Served in arrival order, "small" would wait for all of "big"; served by tokens, "small"
    // gets about ten of its requests per one of "big"'s.
    let mut handles = vec![first];
    let mut n = 0;
    for _ in 0..4 {
        handles.push(send(
            &gw,
            via,
            body("big", 4000, None),
            &[("x-kvgate-tenant", "big")],
        ));
        n += 1;
        wait_queued(&gw, n).await;
    }
    for _ in 0..8 {
        handles.push(send(
            &gw,
            via,
            body("small", 400, None),
            &[("x-kvgate-tenant", "small")],
        ));
        n += 1;
        wait_queued(&gw, n).await;
    }
    for k in 2..=13 {
        next(&a, k).await;
    }
    a.release(1);
    for h in handles {
        assert_eq!(h.await.unwrap().status(), 200);
    }
    let order: Vec<String> = (1..13).map(|i| tag_of(&a, i)).collect();
    // The first to wait is served first (equal counters, older head); then "small" until its
    // tokens pass "big"'s, and so on.
    assert_eq!(order[0], "big", "{order:?}");
    assert!(
        order[1..9].iter().all(|t| t == "small"),
        "small was not given its share: {order:?}"
    );
    // The tenant is the configured header's value, forwarded unchanged.
    assert_eq!(a.received()[1].headers["x-kvgate-tenant"], "big");
}

/// As `tenants_share_by_tokens`, with "big" weighing 10: its ~1000-token requests are charged
/// like "small"'s ~100-token ones, so the two alternate instead of "small" going eight times first.
async fn a_tenant_weight_multiplies_its_share(via: Via) {
    let (a, gw, first) = saturated(
        |c| {
            c.admission.tenant_weights = [("big".to_string(), 10)].into();
        },
        via,
    )
    .await;
    let mut handles = vec![first];
    let mut n = 0;
    for (tag, len, count) in [("big", 4000, 4), ("small", 400, 8)] {
        for _ in 0..count {
            handles.push(send(
                &gw,
                via,
                body(tag, len, None),
                &[("x-kvgate-tenant", tag)],
            ));
            n += 1;
            wait_queued(&gw, n).await;
        }
    }
    for k in 2..=13 {
        next(&a, k).await;
    }
    a.release(1);
    for h in handles {
        assert_eq!(h.await.unwrap().status(), 200);
    }
    let order: Vec<String> = (1..13).map(|i| tag_of(&a, i)).collect();
    let big_early = order[..7].iter().filter(|t| *t == "big").count();
    assert!(
        big_early >= 3,
        "big was not given its weighted share: {order:?}"
    );
}

async fn gateway_endpoints_are_served_while_the_queue_is_full(via: Via) {
    let (a, gw, first) = saturated(|c| c.admission.max_queue_entries = 1, via).await;
    let second = send(&gw, via, body("second", 10, None), &[]);
    wait_queued(&gw, 1).await;
    let full = send(&gw, via, body("third", 10, None), &[]).await.unwrap();
    assert_eq!(full.status(), 429, "the queue is full");
    for path in [
        "/health",
        "/ready",
        "/metrics",
        "/v1/models",
        "/admin/admission",
        "/admin/instances",
        "/admin/decisions",
    ] {
        let resp = client().get(gw.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
    }
    let v: serde_json::Value =
        serde_json::from_str(&gw.get_text("/admin/admission").await).unwrap();
    assert_eq!(v["enabled"], true);
    assert_eq!(v["pools"][0]["classes"][1]["priority"], "standard");
    assert_eq!(v["pools"][0]["classes"][1]["entries"], 1);
    a.release(2);
    assert_eq!(first.await.unwrap().status(), 200);
    assert_eq!(second.await.unwrap().status(), 200);
}

/// Off (the default), a saturated pool is forwarded to anyway.
#[tokio::test]
async fn disabled_admission_forwards_everything() {
    let a = Mock::start("a").await;
    a.set_mode(Mode::Held);
    let mut c = admission_config(a.url());
    c.admission.enabled = false;
    let gw = Gateway::start(c).await;
    let first = send(&gw, Via::H1, body("first", 10, None), &[]);
    let second = send(&gw, Via::H1, body("second", 10, None), &[]);
    assert!(eventually(10, || a.held() == 2).await);
    a.release(2);
    assert_eq!(first.await.unwrap().status(), 200);
    assert_eq!(second.await.unwrap().status(), 200);
}

/// A key's `max_priority` lowers what its requests ask for: a `critical` ask from a key capped at
/// `standard` queues as standard, behind a critical request that came later from a key without a
/// ceiling, while the uncapped key's `critical` is honoured.
#[tokio::test]
async fn a_keys_max_priority_lowers_the_asked_priority() {
    let a = Mock::start("a").await;
    a.set_mode(Mode::Held);
    let mut c = admission_config(a.url());
    let keys = fresh_dir("admission-ceiling").join("keys.toml");
    std::fs::write(
        &keys,
        r#"
[[keys]]
key = "sk-capped"
tenant = "capped"
max_priority = "standard"

[[keys]]
key = "sk-free"
tenant = "free"
"#,
    )
    .unwrap();
    c.auth.enabled = true;
    c.auth.keys_file = keys.to_string_lossy().into_owned();
    let gw = Gateway::start(c).await;
    let first = send(
        &gw,
        Via::H1,
        body("first", 10, None),
        &[("authorization", "Bearer sk-free")],
    );
    assert!(eventually(10, || a.held() == 1).await);

    /// Entries queued per class, most urgent first, as `/admin/admission` shows them.
    async fn classes(gw: &Gateway) -> Vec<(String, u64)> {
        let v: serde_json::Value =
            serde_json::from_str(&gw.get_text("/admin/admission").await).unwrap();
        v["pools"][0]["classes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["priority"].as_str().unwrap().to_string(),
                    c["entries"].as_u64().unwrap(),
                )
            })
            .collect()
    }
    let class = |name: &str, n: u64| (name.to_string(), n);

    // Asked critical by header and by the body's vLLM priority: both queue as standard.
    let by_header = send(
        &gw,
        Via::H1,
        body("capped-header", 10, None),
        &[
            ("authorization", "Bearer sk-capped"),
            ("x-kvgate-priority", "critical"),
        ],
    );
    wait_queued(&gw, 1).await;
    let by_body = send(
        &gw,
        Via::H1,
        body("capped-body", 10, Some(-1)),
        &[("authorization", "Bearer sk-capped")],
    );
    wait_queued(&gw, 2).await;
    assert_eq!(
        classes(&gw).await,
        [
            class("critical", 0),
            class("standard", 2),
            class("sheddable", 0)
        ]
    );
    // A less urgent ask than the ceiling is kept as asked.
    let shed = send(
        &gw,
        Via::H1,
        body("capped-sheddable", 10, None),
        &[
            ("authorization", "Bearer sk-capped"),
            ("x-kvgate-priority", "sheddable"),
        ],
    );
    wait_queued(&gw, 3).await;
    // The key without a ceiling gets the critical it asks for.
    let critical = send(
        &gw,
        Via::H1,
        body("free-critical", 10, None),
        &[
            ("authorization", "Bearer sk-free"),
            ("x-kvgate-priority", "critical"),
        ],
    );
    wait_queued(&gw, 4).await;
    assert_eq!(
        classes(&gw).await,
        [
            class("critical", 1),
            class("standard", 2),
            class("sheddable", 1)
        ]
    );

    // Served in class order: the later uncapped critical first, the capped asks after it.
    for n in 2..=5 {
        next(&a, n).await;
    }
    a.release(1);
    for h in [first, by_header, by_body, shed, critical] {
        assert_eq!(h.await.unwrap().status(), 200);
    }
    assert_eq!(tag_of(&a, 1), "free-critical");
    let mut standard = [tag_of(&a, 2), tag_of(&a, 3)];
    standard.sort();
    assert_eq!(standard, ["capped-body", "capped-header"]);
    assert_eq!(tag_of(&a, 4), "capped-sheddable");
}
