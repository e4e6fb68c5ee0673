//! A fake Kubernetes API server: scripted LIST answers and WATCH streams per collection path,
//! on 127.0.0.1:0; it records every request's query and `Authorization` header.
//!
//! Built only with the `fake-api` feature. Used by this crate's tests, the gateway's
//! `tests/kubernetes_fleet.rs` and the load tester's `scale_bench` example, so none of them
//! keeps a copy of it.
//!
//! Invariants: a request pops the next reply scripted for its path and kind (list or watch);
//! with nothing scripted a LIST answers 500 and a WATCH stays open silently, like a quiet
//! watch. While [`FakeApi::fail_all`] is set, every request is answered with that status and
//! nothing scripted is consumed (an outage). A poisoned lock is taken over (a panicking test
//! thread must not wedge the server).

pub mod objects;

pub use objects::*;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::mpsc;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One item of a scripted watch stream.
enum Item {
    Bytes(Vec<u8>),
    Abort,
}

enum Reply {
    Json(u16, Value),
    Stream(mpsc::UnboundedReceiver<Item>),
}

/// A recorded request.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub watch: bool,
    pub query: HashMap<String, String>,
    /// The `Authorization` header.
    pub auth: Option<String>,
}

#[derive(Default)]
struct Inner {
    replies: Mutex<HashMap<(String, bool), VecDeque<Reply>>>,
    seen: Mutex<Vec<Seen>>,
    /// Senders of unscripted watches, held so those streams stay open.
    quiet: Mutex<Vec<mpsc::UnboundedSender<Item>>>,
    /// The status every request gets during an outage ([`FakeApi::fail_all`]).
    failing: Mutex<Option<u16>>,
}

/// The running fake server.
#[derive(Clone)]
pub struct FakeApi {
    pub addr: SocketAddr,
    inner: Arc<Inner>,
}

/// The sending end of one scripted watch stream; dropping it ends the stream cleanly.
pub struct WatchTx(mpsc::UnboundedSender<Item>);

impl WatchTx {
    /// Sends one event line.
    pub fn event(&self, kind: &str, object: Value) {
        self.line(&json!({"type": kind, "object": object}).to_string());
    }
    /// Sends a BOOKMARK at `rv`.
    pub fn bookmark(&self, rv: &str) {
        self.event(
            "BOOKMARK",
            json!({"kind": "Pod", "metadata": {"resourceVersion": rv}}),
        );
    }
    /// Sends an ERROR event with `code`.
    pub fn error(&self, code: u16) {
        self.event(
            "ERROR",
            json!({"kind": "Status", "code": code, "reason": "Expired", "message": "too old resource version"}),
        );
    }
    /// Sends `text` and a newline.
    pub fn line(&self, text: &str) {
        let mut b = text.as_bytes().to_vec();
        b.push(b'\n');
        let _ = self.0.send(Item::Bytes(b));
    }
    /// Sends raw bytes (part of a line).
    pub fn raw(&self, b: Vec<u8>) {
        let _ = self.0.send(Item::Bytes(b));
    }
    /// Breaks the connection without ending the response.
    pub fn abort(&self) {
        let _ = self.0.send(Item::Abort);
    }
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    uri: Uri,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let path = uri.path().to_string();
    let watch = query.get("watch").is_some_and(|w| w == "1" || w == "true");
    lock(&inner.seen).push(Seen {
        path: path.clone(),
        watch,
        query,
        auth: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
    });
    if let Some(code) = *lock(&inner.failing) {
        return (
            StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            [("content-type", "application/json")],
            json!({"kind": "Status", "status": "Failure", "code": code, "message": "fake outage"})
                .to_string(),
        )
            .into_response();
    }
    let reply = lock(&inner.replies)
        .get_mut(&(path.clone(), watch))
        .and_then(VecDeque::pop_front);
    match reply {
        Some(Reply::Json(code, body)) => (
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            [("content-type", "application/json")],
            body.to_string(),
        )
            .into_response(),
        Some(Reply::Stream(rx)) => stream(rx),
        None if watch => {
            let (tx, rx) = mpsc::unbounded_channel();
            lock(&inner.quiet).push(tx);
            stream(rx)
        }
        None => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("nothing scripted for {path}"),
        )
            .into_response(),
    }
}

fn stream(rx: mpsc::UnboundedReceiver<Item>) -> Response {
    let s = futures_util::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            None => None,
            Some(Item::Bytes(b)) => Some((Ok::<_, std::io::Error>(Bytes::from(b)), rx)),
            Some(Item::Abort) => Some((Err(std::io::Error::other("abort")), rx)),
        }
    });
    ([("content-type", "application/json")], Body::from_stream(s)).into_response()
}

impl FakeApi {
    /// Binds 127.0.0.1:0 and serves plain HTTP until the runtime ends.
    pub async fn start() -> std::io::Result<FakeApi> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let (api, app) = FakeApi::unserved(listener.local_addr()?);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(api)
    }

    /// The server's state and its router, for a test that serves it itself (over TLS) at
    /// `addr`.
    pub fn unserved(addr: SocketAddr) -> (FakeApi, axum::Router) {
        let inner = Arc::new(Inner::default());
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&inner));
        (FakeApi { addr, inner }, app)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn push(&self, path: &str, watch: bool, r: Reply) {
        lock(&self.inner.replies)
            .entry((path.to_string(), watch))
            .or_default()
            .push_back(r);
    }

    /// Scripts one LIST answer: `items` at resource version `rv`.
    pub fn list(&self, path: &str, rv: &str, items: Vec<Value>) {
        self.push(
            path,
            false,
            Reply::Json(
                200,
                json!({"kind": "List", "metadata": {"resourceVersion": rv}, "items": items}),
            ),
        );
    }

    /// Scripts one LIST page that continues with `token`.
    pub fn page(&self, path: &str, rv: &str, items: Vec<Value>, token: &str) {
        self.push(
            path,
            false,
            Reply::Json(
                200,
                json!({"kind": "List", "metadata": {"resourceVersion": rv, "continue": token}, "items": items}),
            ),
        );
    }

    /// Scripts one error status for the next LIST (`watch = false`) or WATCH of `path`.
    pub fn status(&self, path: &str, watch: bool, code: u16, message: &str) {
        self.push(
            path,
            watch,
            Reply::Json(
                code,
                json!({"kind": "Status", "status": "Failure", "code": code, "message": message}),
            ),
        );
    }

    /// Scripts the next WATCH of `path` as a stream the test writes to.
    pub fn watch(&self, path: &str) -> WatchTx {
        let (tx, rx) = mpsc::unbounded_channel();
        self.push(path, true, Reply::Stream(rx));
        WatchTx(tx)
    }

    /// An outage: with `Some(code)` every request from now on is answered `code` (scripted
    /// replies wait); `None` ends it. Open watch streams are not touched: break them with
    /// [`WatchTx::abort`].
    pub fn fail_all(&self, code: Option<u16>) {
        *lock(&self.inner.failing) = code;
    }

    /// The requests seen for `path`, LISTs (`watch = false`) or WATCHes.
    pub fn seen(&self, path: &str, watch: bool) -> Vec<Seen> {
        lock(&self.inner.seen)
            .iter()
            .filter(|s| s.path == path && s.watch == watch)
            .cloned()
            .collect()
    }
}
