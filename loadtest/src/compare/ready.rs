//! Readiness of a router under test: its worker list (or health) and a warm-up request.
//!
//! SGLang-style routers report ready before their workers are registered, so when `GET /workers`
//! exists it must list every worker; otherwise `GET /health` must answer 200. Then one small
//! streamed request must succeed end to end. Every wait is bounded by the given timeout.

use std::time::Duration;

use crate::prompt::ApiKind;
use crate::replay::request::{send, Attempt};
use crate::replay::Outcome;

/// Why a router never became ready.
#[derive(Debug, thiserror::Error)]
#[error("router at {url} not ready after {secs} s: {last}")]
pub struct NotReady {
    /// Router URL.
    pub url: String,
    /// Time waited.
    pub secs: u64,
    /// Last observation.
    pub last: String,
}

/// Waits until the router lists every worker (or is healthy), then warms it up with one request.
pub async fn wait_ready(
    client: &reqwest::Client,
    url: &str,
    workers: &[String],
    model: &str,
    api: ApiKind,
    timeout: Duration,
) -> Result<(), NotReady> {
    let start = tokio::time::Instant::now();
    let mut last = String::from("no answer");
    let fail = |last: String| NotReady {
        url: url.to_string(),
        secs: timeout.as_secs(),
        last,
    };
    loop {
        if start.elapsed() > timeout {
            return Err(fail(last));
        }
        match probe(client, url, workers).await {
            Ok(()) => break,
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    loop {
        if start.elapsed() > timeout {
            return Err(fail(last));
        }
        let body = warm_up_body(model, api);
        let (outcome, _) = send(Attempt {
            client,
            url: &format!("{url}{}", api.path()),
            body,
            timeout: Duration::from_secs(30),
        })
        .await;
        match outcome {
            Outcome::Ok => return Ok(()),
            other => last = format!("warm-up request: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn probe(client: &reqwest::Client, url: &str, workers: &[String]) -> Result<(), String> {
    let get = |path: &str| {
        client
            .get(format!("{url}{path}"))
            .timeout(Duration::from_secs(5))
            .send()
    };
    match get("/workers").await {
        Ok(r) if r.status().is_success() => {
            let text = r.text().await.map_err(|e| e.to_string())?;
            let missing: Vec<&String> = workers
                .iter()
                .filter(|w| !text.contains(w.trim_start_matches("http://")))
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            return Err(format!("/workers does not list {missing:?} yet"));
        }
        Ok(_) => {}
        Err(e) => return Err(e.to_string()),
    }
    match get("/health").await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("/health answered {}", r.status())),
        Err(e) => Err(e.to_string()),
    }
}

fn warm_up_body(model: &str, api: ApiKind) -> Vec<u8> {
    let v = match api {
        ApiKind::Chat => serde_json::json!({
            "model": model, "messages": [{"role": "user", "content": "warm-up"}],
            "max_tokens": 1, "stream": true,
        }),
        ApiKind::Completions => serde_json::json!({
            "model": model, "prompt": "warm-up", "max_tokens": 1, "stream": true,
        }),
    };
    v.to_string().into_bytes()
}
