//! [`Client`]: the HTTP half of list and watch against the API server (the I/O seam); parsing
//! and state live in [`super::reflector`] and [`super::lines`].
//!
//! Invariants: only LIST and WATCH requests on collections are made (the shipped RBAC grants
//! nothing else; a single object is listed with `fieldSelector=metadata.name=...`); every
//! request carries the token read just before it; connect, list and idle-read times and list and
//! event sizes are bounded by [`Limits`].

use super::auth::ApiTarget;
use super::limits::Limits;
use super::lines::LineBuffer;
use super::objects::{List, Status};
use serde::de::DeserializeOwned;

/// A failed list or watch request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// The API server answered with a non-200 status.
    #[error("HTTP {code}: {message}")]
    Status {
        /// The status.
        code: u16,
        /// The `Status` body's message, or the body's start.
        message: String,
    },
    /// Connecting, sending or reading failed (includes timeouts).
    #[error("{0}")]
    Transport(String),
    /// A body or line over its limit.
    #[error("{0}")]
    TooLarge(String),
    /// A body that does not parse.
    #[error("undecodable answer: {0}")]
    Decode(String),
}

/// Lists and watches collections under one [`ApiTarget`].
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    target: ApiTarget,
    limits: Limits,
}

/// Longest part of an error body quoted in a message.
const MAX_QUOTED: usize = 300;

impl Client {
    /// A client for `target` (its CA the only trusted root, its client certificate presented
    /// when it has one) bounded by `limits`.
    pub fn new(target: ApiTarget, limits: Limits) -> Result<Self, String> {
        let mut b = reqwest::Client::builder()
            .connect_timeout(limits.connect_timeout)
            .tls_built_in_root_certs(false)
            .use_rustls_tls();
        if let Some(pem) = &target.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| format!("kubernetes: the CA file is not PEM: {e}"))?;
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        if let Some(pem) = &target.identity_pem {
            let id = reqwest::Identity::from_pem(&pem.0).map_err(|e| {
                format!("kubernetes: the client certificate and key are not usable PEM: {e}")
            })?;
            b = b.identity(id);
        }
        let http = b
            .build()
            .map_err(|e| format!("kubernetes: building the HTTP client: {e}"))?;
        Ok(Self {
            http,
            target,
            limits,
        })
    }

    /// The namespace watched.
    pub fn namespace(&self) -> &str {
        &self.target.namespace
    }

    /// The bounds.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    async fn send(
        &self,
        path: &str,
        query: &[(String, String)],
        timeout: Option<std::time::Duration>,
    ) -> Result<reqwest::Response, ApiError> {
        let token = self
            .target
            .token(self.limits.max_token_bytes)
            .await
            .map_err(ApiError::Transport)?;
        let mut req = self
            .http
            .get(format!("{}{path}", self.target.base))
            .query(query)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        // A server that accepts and never answers must not hold a watch forever.
        let resp = tokio::time::timeout(self.limits.response_timeout, req.send())
            .await
            .map_err(|_| {
                ApiError::Transport(format!(
                    "no response within {} s",
                    self.limits.response_timeout.as_secs_f64()
                ))
            })?
            .map_err(|e| ApiError::Transport(error_chain(&e)))?;
        if resp.status().as_u16() == 200 {
            return Ok(resp);
        }
        let code = resp.status().as_u16();
        let body = read_bounded(resp, 64 << 10).await.unwrap_or_default();
        let message = serde_json::from_slice::<Status>(&body)
            .ok()
            .and_then(|s| s.message)
            .unwrap_or_else(|| {
                String::from_utf8_lossy(&body[..body.len().min(MAX_QUOTED)]).into_owned()
            });
        Err(ApiError::Status { code, message })
    }

    /// Every object of the collection at `path` matching `query`, paged by `limit` and
    /// `continue`; and the list's resource version.
    pub async fn list<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(String, String)],
    ) -> Result<(Vec<T>, String), ApiError> {
        let mut items = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut q = query.to_vec();
            q.push(("limit".into(), self.limits.list_page.to_string()));
            if let Some(t) = token.take() {
                q.push(("continue".into(), t));
            }
            let resp = self.send(path, &q, Some(self.limits.list_timeout)).await?;
            let body = read_bounded(resp, self.limits.max_list_bytes).await?;
            let page: List<T> =
                serde_json::from_slice(&body).map_err(|e| ApiError::Decode(e.to_string()))?;
            items.extend(page.items);
            if items.len() > self.limits.max_objects {
                return Err(ApiError::TooLarge(format!(
                    "more than {} objects; narrow the selector or namespace",
                    self.limits.max_objects
                )));
            }
            match page.metadata.continue_token.filter(|t| !t.is_empty()) {
                Some(t) => token = Some(t),
                None => {
                    let rv = page.metadata.resource_version.unwrap_or_default();
                    return Ok((items, rv));
                }
            }
        }
    }

    /// Opens a watch of the collection at `path` from `resource_version`.
    pub async fn watch(
        &self,
        path: &str,
        query: &[(String, String)],
        resource_version: &str,
    ) -> Result<WatchStream, ApiError> {
        let mut q = query.to_vec();
        q.push(("watch".into(), "1".into()));
        q.push(("allowWatchBookmarks".into(), "true".into()));
        q.push(("resourceVersion".into(), resource_version.into()));
        q.push((
            "timeoutSeconds".into(),
            self.limits.watch_timeout.as_secs().max(1).to_string(),
        ));
        let resp = self.send(path, &q, None).await?;
        Ok(WatchStream {
            resp,
            lines: LineBuffer::new(self.limits.max_event_bytes),
            idle: self.limits.idle_timeout,
        })
    }
}

/// An open watch: event lines as they arrive.
#[derive(Debug)]
pub struct WatchStream {
    resp: reqwest::Response,
    lines: LineBuffer,
    idle: std::time::Duration,
}

impl WatchStream {
    /// The next complete lines (one chunk's worth); `Ok(None)` when the server ended the watch.
    pub async fn next_lines(&mut self) -> Result<Option<Vec<Vec<u8>>>, ApiError> {
        loop {
            let chunk = tokio::time::timeout(self.idle, self.resp.chunk())
                .await
                .map_err(|_| {
                    ApiError::Transport(format!("watch silent for {} s", self.idle.as_secs_f64()))
                })?
                .map_err(|e| ApiError::Transport(error_chain(&e)))?;
            let Some(chunk) = chunk else {
                if self.lines.has_partial() {
                    return Err(ApiError::Transport("watch ended mid-event".into()));
                }
                return Ok(None);
            };
            let lines = self
                .lines
                .push(&chunk)
                .map_err(|e| ApiError::TooLarge(e.to_string()))?;
            if !lines.is_empty() {
                return Ok(Some(lines));
            }
        }
    }
}

async fn read_bounded(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, ApiError> {
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| ApiError::Transport(error_chain(&e)))?
    {
        if body.len() + chunk.len() > max {
            return Err(ApiError::TooLarge(format!(
                "a list answer exceeds {max} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// An error with its sources, which is where reqwest keeps the useful part.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
