//! The upstream HTTP client: pooled keep-alive HTTP/1.1 connections to instances, with connect
//! and first-byte timeouts.
//!
//! Invariants:
//! - Connect failures are reported as [`SendError::Connect`] and nothing else is: only they (and
//!   502/503 answers) make a request safe to retry elsewhere, since the instance never saw it.
//! - Every wait is bounded by a configured timeout; bodies read into memory have a size cap.
//! - Each thread has its own connection pool per client: a pooled connection's driving task runs
//!   on the runtime of the thread that opened it, so a request and its upstream connection never
//!   wake each other across threads. Idle connections are bounded per thread.

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::cell::RefCell;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::config::UpstreamConfig;

/// Why a request to an instance failed before a response arrived.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// TCP connect failed or timed out: the instance never saw the request.
    #[error("connect failed: {0}")]
    Connect(String),
    /// No response headers within the timeout.
    #[error("timed out")]
    Timeout,
    /// The connection broke or the answer was not valid HTTP.
    #[error("{0}")]
    Protocol(String),
    /// A body read into memory exceeded its cap.
    #[error("response body too large")]
    TooLarge,
}

impl SendError {
    /// Bounded metric label for the cause.
    pub fn cause(&self) -> &'static str {
        match self {
            SendError::Connect(_) => "connect",
            SendError::Timeout => "timeout",
            SendError::Protocol(_) => "protocol",
            SendError::TooLarge => "body",
        }
    }
}

/// Pooled client shared by the proxy and the background checkers. Cheap to clone.
#[derive(Clone)]
pub struct HttpClient {
    settings: Arc<Settings>,
}

/// What every per-thread pool of one client is built from.
struct Settings {
    connect_timeout: Duration,
    max_idle_per_host: usize,
    idle_timeout: Duration,
}

type Pool = Client<HttpConnector, Full<Bytes>>;

thread_local! {
    /// This thread's pools, one per live [`HttpClient`] (entries of dropped clients are pruned
    /// whenever a new one is added, so the list stays as long as the live clients).
    static POOLS: RefCell<Vec<(Weak<Settings>, Pool)>> = const { RefCell::new(Vec::new()) };
}

impl HttpClient {
    /// A client with `cfg`'s connect timeout and pool settings.
    pub fn new(cfg: &UpstreamConfig) -> Self {
        Self {
            settings: Arc::new(Settings {
                connect_timeout: Duration::from_millis(cfg.connect_timeout_ms),
                max_idle_per_host: cfg.pool_max_idle_per_host,
                idle_timeout: Duration::from_millis(cfg.pool_idle_timeout_ms),
            }),
        }
    }

    fn build(s: &Settings) -> Pool {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(s.connect_timeout));
        connector.set_keepalive(Some(Duration::from_secs(60)));
        Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(s.max_idle_per_host)
            .pool_idle_timeout(s.idle_timeout)
            .build(connector)
    }

    /// Starts `req` on this thread's pool.
    fn start(&self, req: Request<Full<Bytes>>) -> hyper_util::client::legacy::ResponseFuture {
        POOLS.with(|pools| {
            let mut pools = pools.borrow_mut();
            let me = Arc::as_ptr(&self.settings);
            if let Some((_, pool)) = pools.iter().find(|(w, _)| std::ptr::eq(w.as_ptr(), me)) {
                return pool.request(req);
            }
            pools.retain(|(w, _)| w.strong_count() > 0);
            let pool = Self::build(&self.settings);
            let fut = pool.request(req);
            pools.push((Arc::downgrade(&self.settings), pool));
            fut
        })
    }

    /// Sends `req`, waiting at most `first_byte` for the response headers.
    pub async fn send(
        &self,
        req: Request<Full<Bytes>>,
        first_byte: Duration,
    ) -> Result<Response<Incoming>, SendError> {
        match tokio::time::timeout(first_byte, self.start(req)).await {
            Err(_) => Err(SendError::Timeout),
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) if e.is_connect() => Err(SendError::Connect(error_chain(&e))),
            Ok(Err(e)) => Err(SendError::Protocol(error_chain(&e))),
        }
    }

    /// `GET uri`, reading at most `limit` body bytes, the whole exchange bounded by `timeout`.
    pub async fn get_bytes(
        &self,
        uri: Uri,
        timeout: Duration,
        limit: usize,
    ) -> Result<(StatusCode, Bytes), SendError> {
        let req = Request::get(uri)
            .body(Full::new(Bytes::new()))
            .map_err(|e| SendError::Protocol(e.to_string()))?;
        let fut = async {
            let resp = self.send(req, timeout).await?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), limit)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        SendError::TooLarge
                    } else {
                        SendError::Protocol(e.to_string())
                    }
                })?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(timeout, fut)
            .await
            .unwrap_or(Err(SendError::Timeout))
    }
}

/// The error and its sources, joined: hyper's top-level messages alone are vague.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
