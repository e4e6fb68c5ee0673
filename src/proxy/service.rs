//! The hyper service of a connection [`super::h1`] handed off: the four proxied endpoints go
//! straight to [`super::handle`]; everything else (admin, health, metrics, models, 404/405) goes
//! through the axum router. On the admin listener (`server.admin_listen`) every request goes
//! through the admin router ([`app::admin_router`]), which serves no inference endpoint.
//!
//! Invariants:
//! - The proxied paths answer exactly as through the router: the same handler, the same errors;
//!   only `POST` takes the direct path, so other methods still get the router's 405.
//! - An admin service never calls the proxy handler, and its connections are held to the admin
//!   listener's own limits ([`GatewayService::limits`]).
//! - Relayed bodies are never boxed (see [`super::body::GatewayBody`]).

use super::body::GatewayBody;
use super::limits::Limits;
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
    /// Serves the admin listener: no proxied endpoint, the admin listener's limits.
    admin: bool,
}

impl GatewayService {
    /// The main listener's service for `state`.
    pub fn new(state: AppState) -> Self {
        let router = app::router(state.clone());
        Self {
            state,
            router,
            admin: false,
        }
    }

    /// The admin listener's service for `state`.
    pub fn admin(state: AppState) -> Self {
        let router = app::admin_router(state.clone());
        Self {
            state,
            router,
            admin: true,
        }
    }

    /// The shared state.
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// True when this service answers the proxied endpoints (the main listener's).
    pub fn proxies(&self) -> bool {
        !self.admin
    }

    /// The limits this service's connections are held to.
    pub fn limits(&self) -> &Limits {
        match &self.state.admin_limits {
            Some(l) if self.admin => l,
            _ => &self.state.limits,
        }
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<GatewayBody>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for GatewayService {
    type Response = Response<GatewayBody>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, req: Request<Incoming>) -> Answer {
        if req.method() == Method::POST && !self.admin {
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
