//! The hyper service of a connection [`super::h1`] handed off: the four proxied endpoints go
//! straight to [`super::handle`]; everything else (admin, health, metrics, models, 404/405) goes
//! through the axum router.
//!
//! Invariants:
//! - The proxied paths answer exactly as through the router: the same handler, the same errors;
//!   only `POST` takes the direct path, so other methods still get the router's 405.
//! - Relayed bodies are never boxed (see [`super::body::GatewayBody`]).

use super::body::GatewayBody;
use super::parse::Endpoint;
use crate::app::{self, AppState};
use http::{Method, Request, Response};
use hyper::body::Incoming;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use tower::ServiceExt;

/// Per-connection service: cheap to clone (shared state and a router handle).
#[derive(Clone)]
pub struct GatewayService {
    state: AppState,
    router: axum::Router,
}

impl GatewayService {
    /// The service for `state`.
    pub fn new(state: AppState) -> Self {
        let router = app::router(state.clone());
        Self { state, router }
    }

    /// The shared state.
    pub fn state(&self) -> &AppState {
        &self.state
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<GatewayBody>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for GatewayService {
    type Response = Response<GatewayBody>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, req: Request<Incoming>) -> Answer {
        if req.method() == Method::POST {
            if let Some(endpoint) = Endpoint::for_path(req.uri().path()) {
                let state = self.state.clone();
                return Box::pin(async move {
                    Ok(super::handle(state, endpoint, req).await.into_http())
                });
            }
        }
        let router = self.router.clone();
        Box::pin(async move {
            let resp = match router.oneshot(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            Ok(resp.map(GatewayBody::plain))
        })
    }
}
