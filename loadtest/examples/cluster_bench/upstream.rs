//! Lightweight engines for the rate part of the benchmark: each is one FIFO server that holds
//! every completion for a fixed service time, then answers with a one-token completion.
//!
//! Invariants: the prompt is read but not parsed (so an engine costs almost no CPU and the
//! gateway replicas are what is exercised); requests are served one at a time in arrival order:
//! each is given the absolute finish time `max(now, previous finish) + service` and sleeps until
//! it, so timer slack does not accumulate into lost capacity. The in-flight count of an instance
//! is therefore its queue, and load balancing across instances shows in it; `/health` and
//! `/v1/models` answer as an engine does.

use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

const COMPLETION: &str = r#"{"id":"cmpl-bench","object":"text_completion","model":"m","choices":[{"index":0,"text":"a","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
const MODELS: &str = r#"{"object":"list","data":[{"id":"m","object":"model","owned_by":"bench"}]}"#;

/// A running set of lightweight engines.
pub struct Upstreams {
    /// Base URLs.
    pub urls: Vec<String>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Upstreams {
    /// Starts `n` engines on 127.0.0.1 ephemeral ports, each serving in `service`.
    pub async fn start(n: usize, service: Duration) -> anyhow::Result<Upstreams> {
        let mut urls = Vec::new();
        let mut tasks = Vec::new();
        for _ in 0..n {
            let free_at = Arc::new(Mutex::new(Instant::now()));
            let app = Router::new()
                .route(
                    "/v1/completions",
                    post(move |_body: axum::body::Bytes| {
                        let free_at = free_at.clone();
                        async move {
                            let finish = {
                                let mut f = free_at.lock().unwrap_or_else(|e| e.into_inner());
                                *f = (*f).max(Instant::now()) + service;
                                *f
                            };
                            tokio::time::sleep_until(finish).await;
                            ([("content-type", "application/json")], COMPLETION)
                        }
                    }),
                )
                .route("/health", get(|| async { "ok" }))
                .route(
                    "/v1/models",
                    get(|| async { ([("content-type", "application/json")], MODELS) }),
                );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            urls.push(format!("http://{}", listener.local_addr()?));
            tasks.push(tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            }));
        }
        Ok(Upstreams { urls, tasks })
    }

    /// Stops every engine.
    pub fn shutdown(self) {
        for t in self.tasks {
            t.abort();
        }
    }
}
