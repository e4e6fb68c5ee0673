//! Test harness: in-process mock OpenAI instances and a gateway on an ephemeral port.
//!
//! Mocks record every request they receive (path, headers, raw body), answer JSON (at once, or when
//! the test releases them), SSE streams (paced, or as fast as the client reads) with
//! controllable delays or chosen error statuses on demand, toggle their `/health`, and notice when a
//! stream they were sending is dropped (the client — the gateway — went away).
#![allow(dead_code)]

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, StatusCode};
use kvgate::config::{Config, InstanceConfig, PoolConfig};
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// What a mock answers to the next proxied requests.
#[derive(Clone, Debug)]
pub enum Mode {
    /// 200 with a small JSON body naming the mock.
    Json,
    /// SSE: `chunks` data events `delay` apart, then `[DONE]`.
    Stream { chunks: usize, delay: Duration },
    /// This status with an OpenAI-style error body.
    Status(u16),
    /// Sends `chunks` SSE events then breaks the connection.
    DropMidStream { chunks: usize },
    /// Waits this long before answering with JSON.
    Slow(Duration),
    /// Holds each request until [`Mock::release`] lets it go, then answers with JSON.
    Held,
    /// SSE: the first of `chunks` data events at once, then holds (counted in [`Mock::held`])
    /// until [`Mock::release`], then the rest and `[DONE]`.
    HeldStream { chunks: usize },
    /// SSE: up to `chunks` data events of `bytes` bytes each, sent as fast as the client reads.
    Flood { chunks: usize, bytes: usize },
}

/// One request a mock received.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

pub struct MockState {
    pub name: String,
    pub mode: Mutex<Mode>,
    pub healthy: AtomicBool,
    pub received: Mutex<Vec<Received>>,
    pub streams_dropped: AtomicUsize,
    pub streams_completed: AtomicUsize,
    pub models: Mutex<Vec<String>>,
    pub health_checks: AtomicUsize,
    /// Permits for held requests ([`Mode::Held`]).
    pub hold: tokio::sync::Semaphore,
    /// Requests being held now.
    pub held: AtomicUsize,
}

pub struct Mock {
    pub addr: SocketAddr,
    pub state: Arc<MockState>,
    stop: Option<oneshot::Sender<()>>,
}

impl Mock {
    pub async fn start(name: &str) -> Mock {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::start_on(name, listener)
    }

    /// A mock serving on `listener` (e.g. another loopback address on a port chosen for the
    /// first, as the pods of one Kubernetes pool share a port).
    pub fn start_on(name: &str, listener: tokio::net::TcpListener) -> Mock {
        let state = Arc::new(MockState {
            name: name.to_string(),
            mode: Mutex::new(Mode::Json),
            healthy: AtomicBool::new(true),
            received: Mutex::new(Vec::new()),
            streams_dropped: AtomicUsize::new(0),
            streams_completed: AtomicUsize::new(0),
            models: Mutex::new(vec!["m".to_string()]),
            health_checks: AtomicUsize::new(0),
            hold: tokio::sync::Semaphore::new(0),
            held: AtomicUsize::new(0),
        });
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(proxied))
            .route("/v1/completions", post(proxied))
            .route("/v1/embeddings", post(proxied))
            .route("/v1/responses", post(proxied))
            .route("/health", get(health))
            .route("/v1/models", get(models))
            .route("/metrics", get(metrics))
            .with_state(state.clone());
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
        });
        Mock {
            addr,
            state,
            stop: Some(tx),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn set_mode(&self, m: Mode) {
        *self.state.mode.lock() = m;
    }
    pub fn set_healthy(&self, h: bool) {
        self.state.healthy.store(h, Ordering::SeqCst);
    }
    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().clone()
    }
    pub fn count(&self) -> usize {
        self.state.received.lock().len()
    }
    /// Lets `n` held requests ([`Mode::Held`]) answer.
    pub fn release(&self, n: usize) {
        self.state.hold.add_permits(n);
    }
    /// Requests being held now.
    pub fn held(&self) -> usize {
        self.state.held.load(Ordering::SeqCst)
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// An address nothing listens on (bound, then released).
pub async fn dead_addr() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a
}

async fn health(State(s): State<Arc<MockState>>) -> StatusCode {
    s.health_checks.fetch_add(1, Ordering::SeqCst);
    if s.healthy.load(Ordering::SeqCst) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn models(State(s): State<Arc<MockState>>) -> Response {
    let data: Vec<_> = s
        .models
        .lock()
        .iter()
        .map(|m| serde_json::json!({"id": m, "object": "model", "owned_by": s.name}))
        .collect();
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

async fn metrics() -> &'static str {
    "vllm:num_requests_running{model_name=\"m\"} 1\nvllm:num_requests_waiting{model_name=\"m\"} 2\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1\n"
}

/// Marks a stream dropped unless it completed.
struct StreamGuard {
    state: Arc<MockState>,
    done: bool,
}

impl StreamGuard {
    fn finish(mut self) {
        self.done = true;
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self.done {
            self.state.streams_completed.fetch_add(1, Ordering::SeqCst);
        } else {
            self.state.streams_dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn proxied(State(s): State<Arc<MockState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    s.received.lock().push(Received {
        path: parts.uri.to_string(),
        headers: parts.headers,
        body,
    });
    let mode = s.mode.lock().clone();
    match mode {
        Mode::Json => (
            [("content-type", "application/json")],
            format!(r#"{{"id":"x","object":"chat.completion","served_by":"{}"}}"#, s.name),
        )
            .into_response(),
        Mode::Status(code) => (
            StatusCode::from_u16(code).unwrap(),
            [("content-type", "application/json")],
            format!(r#"{{"error":{{"message":"mock {} failing","type":"server_error","code":{code}}}}}"#, s.name),
        )
            .into_response(),
        Mode::Stream { chunks, delay } => sse(s.clone(), chunks, delay, false),
        Mode::DropMidStream { chunks } => sse(s.clone(), chunks, Duration::from_millis(5), true),
        Mode::Slow(d) => {
            tokio::time::sleep(d).await;
            (StatusCode::OK, [("content-type", "application/json")], "{}").into_response()
        }
        Mode::Held => {
            s.held.fetch_add(1, Ordering::SeqCst);
            if let Ok(p) = s.hold.acquire().await {
                p.forget();
            }
            s.held.fetch_sub(1, Ordering::SeqCst);
            (
                [("content-type", "application/json")],
                format!(r#"{{"id":"x","object":"chat.completion","served_by":"{}"}}"#, s.name),
            )
                .into_response()
        }
        Mode::Flood { chunks, bytes } => flood(s.clone(), chunks, bytes),
        Mode::HeldStream { chunks } => held_sse(s.clone(), chunks),
    }
}

fn held_sse(s: Arc<MockState>, chunks: usize) -> Response {
    let guard = StreamGuard {
        state: s.clone(),
        done: false,
    };
    let stream = futures::stream::unfold((0usize, guard, s), move |(i, guard, s)| async move {
        if i > chunks {
            guard.finish();
            return None;
        }
        if i == 1 {
            s.held.fetch_add(1, Ordering::SeqCst);
            if let Ok(p) = s.hold.acquire().await {
                p.forget();
            }
            s.held.fetch_sub(1, Ordering::SeqCst);
        }
        if i == chunks {
            return Some((
                Ok::<_, std::io::Error>(Bytes::from_static(b"data: [DONE]\n\n")),
                (i + 1, guard, s),
            ));
        }
        let line = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n"
        );
        Some((Ok(Bytes::from(line)), (i + 1, guard, s)))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

fn flood(s: Arc<MockState>, chunks: usize, bytes: usize) -> Response {
    let guard = StreamGuard {
        state: s,
        done: false,
    };
    let event = Bytes::from(format!("data: {}\n\n", "x".repeat(bytes)));
    let stream = futures::stream::unfold((0usize, guard), move |(i, guard)| {
        let event = event.clone();
        async move {
            if i == chunks {
                guard.finish();
                return None;
            }
            Some((Ok::<_, std::io::Error>(event), (i + 1, guard)))
        }
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

fn sse(s: Arc<MockState>, chunks: usize, delay: Duration, fail: bool) -> Response {
    let stream = async_stream(s, chunks, delay, fail);
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

fn async_stream(
    s: Arc<MockState>,
    chunks: usize,
    delay: Duration,
    fail: bool,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    let guard = StreamGuard {
        state: s,
        done: false,
    };
    futures::stream::unfold((0usize, guard), move |(i, guard)| async move {
        if i > chunks {
            guard.finish();
            return None;
        }
        if i > 0 {
            tokio::time::sleep(delay).await;
        }
        if i == chunks {
            if fail {
                return Some((
                    Err(std::io::Error::other("mock drops the stream")),
                    (i + 1, guard),
                ));
            }
            return Some((Ok(Bytes::from_static(b"data: [DONE]\n\n")), (i + 1, guard)));
        }
        let line = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n"
        );
        Some((Ok(Bytes::from(line)), (i + 1, guard)))
    })
}

/// A config fronting `urls` as one pool of model `m`, with fast health checks and the admin
/// surface on the main listener: the tests read `/metrics` and `/admin/*` there, which in front
/// of real instances has to be asked for (the default is an admin listener on a fixed loopback
/// port, which no test may bind; tests wanting one set `127.0.0.1:0`, bound by [`Gateway`]).
pub fn config_for(urls: &[String]) -> Config {
    let mut c = Config::default();
    c.server.admin_listen = kvgate::config::ADMIN_ON_MAIN.into();
    c.health.interval_ms = 50;
    c.health.timeout_ms = 500;
    c.health.models_refresh_ms = 100;
    c.load.poll_interval_ms = 100;
    c.server.shutdown_grace_ms = 5_000;
    c.pools = vec![PoolConfig::serving(
        "m",
        urls.iter()
            .enumerate()
            .map(|(i, u)| InstanceConfig::at(format!("i{i}"), u.clone()))
            .collect(),
    )];
    c
}

/// A running gateway.
pub struct Gateway {
    pub addr: SocketAddr,
    /// The admin listener's address, when `server.admin_listen` names one (bound on 127.0.0.1
    /// port 0 whatever the address, so the default 127.0.0.1:9091 is never bound by a test).
    pub admin_addr: Option<SocketAddr>,
    pub state: kvgate::app::AppState,
    stop: Option<oneshot::Sender<()>>,
    pub join: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Gateway {
    pub async fn start(cfg: Config) -> Gateway {
        Self::start_with(cfg, |_| {}).await
    }

    /// [`Gateway::start`], with `prepare` run on the state before it serves.
    pub async fn start_with(cfg: Config, prepare: impl FnOnce(&kvgate::app::AppState)) -> Gateway {
        let state = kvgate::app::AppState::new(cfg).expect("gateway state");
        prepare(&state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let stop = async move {
            let _ = rx.await;
        };
        let (join, admin_addr) = if state.config.server.has_admin_listener() {
            let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let admin_addr = admin.local_addr().unwrap();
            let run = kvgate::app::run_with_admin(listener, admin, state.clone(), stop);
            (tokio::spawn(run), Some(admin_addr))
        } else {
            (
                tokio::spawn(kvgate::app::run(listener, state.clone(), stop)),
                None,
            )
        };
        Gateway {
            addr,
            admin_addr,
            state,
            stop: Some(tx),
            join: Some(join),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// `path` on the admin listener (panics without one).
    pub fn admin_url(&self, path: &str) -> String {
        let addr = self.admin_addr.expect("server.admin_listen set");
        format!("http://{addr}{path}")
    }

    /// The body of `GET path`, as text.
    pub async fn get_text(&self, path: &str) -> String {
        let resp = client().get(self.url(path)).send().await.unwrap();
        resp.text().await.unwrap()
    }

    /// Signals shutdown (the serve loop then drains).
    pub fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A fresh directory for one test's files: unique per process *and* per call, since the tests of
/// one file run on threads of one process and must not share (or overwrite) each other's files.
pub fn fresh_dir(tag: &str) -> std::path::PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "kvgate-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One chat request for the first pool's model through `gw`; its status and the instance that
/// answered (`x-kvgate-instance`, empty when none did).
pub async fn ask(gw: &Gateway, prompt: &str) -> (u16, String) {
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .json(&serde_json::json!({"model": gw.state.fleet.pools()[0].model, "messages": [{"role": "user", "content": prompt}]}))
        .send()
        .await
        .expect("request");
    let who = r
        .headers()
        .get("x-kvgate-instance")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (r.status().as_u16(), who)
}

/// A completion (model `m`, 4 tokens) through the gateway at `addr`, which must succeed: the
/// instance that answered (`x-kvgate-instance`) and the leading blocks it held
/// (`x-kvgate-matched-blocks`).
pub async fn complete_at(addr: SocketAddr, prompt: &str) -> (String, u32) {
    let r = client()
        .post(format!("http://{addr}/v1/completions"))
        .json(&serde_json::json!({ "model": "m", "prompt": prompt, "max_tokens": 4 }))
        .send()
        .await
        .expect("request");
    assert!(r.status().is_success(), "status {}", r.status());
    let h = |n: &str| {
        r.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    (
        h("x-kvgate-instance"),
        h("x-kvgate-matched-blocks").parse().unwrap_or(0),
    )
}

/// Whether `g` has received every delta batch its first gossip peer had produced when that peer
/// reported `sent` of them.
pub fn received_batches(g: &kvgate_gossip::Gossip, sent: u64) -> bool {
    g.cluster_status()
        .members
        .first()
        .and_then(|m| m.next_seq)
        .is_some_and(|n| n >= sent)
}

/// `GET url`, as JSON.
pub async fn get_json(url: impl reqwest::IntoUrl) -> serde_json::Value {
    client()
        .get(url)
        .send()
        .await
        .expect("GET")
        .json()
        .await
        .expect("a JSON answer")
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap()
}

/// Polls `f` every 20 ms until it is true or `secs` elapse; returns the last value.
pub async fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if f() {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One HTTP answer read off a raw client connection.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    /// The first field named `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// The OpenAI-style error body's `code`.
    pub fn code(&self) -> String {
        let v: serde_json::Value = serde_json::from_slice(&self.body).expect("JSON error body");
        v["error"]["code"].as_str().unwrap_or_default().to_string()
    }
}

/// [`eventually`] for a check that must await (an HTTP call, a connection).
pub async fn eventually_async<F: std::future::Future<Output = bool>>(
    secs: u64,
    mut f: impl FnMut() -> F,
) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if f().await {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;
