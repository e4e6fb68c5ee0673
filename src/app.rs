//! Application wiring: shared state, the HTTP router and the serve loop with graceful shutdown.
//!
//! Invariants:
//! - [`run`] takes an already bound listener, so tests bind `127.0.0.1:0` and read the port
//!   ([`run_with_admin`] the admin listener too, when `server.admin_listen` is set). With
//!   `server.listen` empty (the endpoint picker as the only door) the binary serves the admin
//!   listener alone through [`crate::proxy::server::run_with_admin`].
//! - With an admin listener (`server.admin_listen` an address, by default `127.0.0.1:9091` in
//!   front of real instances without an admin token) the admin surface (`/admin/*`, `/metrics`)
//!   is served only by [`admin_router`] on that listener; [`router`] answers it 404. `/health` and
//!   `/ready` are on both. [`AppState::new`] settles an empty `server.admin_listen` first.
//! - After the shutdown future resolves the listener stops accepting; in-flight requests and streams
//!   get `server.shutdown_grace_ms` to finish, then [`run`] returns and drops what is left.
//! - Background tasks (health checks, scrapes, model refresh, index expiry, metrics upkeep) live
//!   exactly as long as [`run`].

use crate::admin;
use crate::client::HttpClient;
use crate::clock::Clock;
use crate::config::Config;
use crate::error::GatewayError;
use crate::fleet::{tasks, Fleet};
use crate::metrics;
use crate::proxy;
use crate::routing::Routing;
use axum::routing::{get, post};
use http::HeaderName;
use metrics_exporter_prometheus::PrometheusHandle;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Everything a request handler needs. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// The shared state behind [`AppState`].
pub struct Shared {
    /// Validated configuration.
    pub config: Arc<Config>,
    /// Pools and instances.
    pub fleet: Arc<Fleet>,
    /// Routing glue (index, load, policies, decision log).
    pub routing: Arc<Routing>,
    /// Upstream client.
    pub client: HttpClient,
    /// Monotonic clock shared with the core.
    pub clock: Clock,
    /// Prometheus exposition.
    pub metrics: PrometheusHandle,
    /// `server.request_id_header`, parsed once.
    pub request_id_header: HeaderName,
    /// Engine KV event ingestion (running once the background tasks start).
    pub events: crate::events::Events,
    /// Admission control: the pools' wait queues.
    pub admission: crate::admission::Admission,
    /// The bounded pool that tokenizes large prompts off the serving threads.
    pub offload: crate::proxy::offload::Offload,
    /// `[server.limits]` in force: deadlines, the connection cap, the body budget.
    pub limits: proxy::limits::Limits,
    /// The admin listener's own limits (the same `[server.limits]`, a connection cap of its
    /// own, so that a flood on the main listener cannot take the admin listener's places);
    /// `None` without `server.admin_listen`.
    pub admin_limits: Option<proxy::limits::Limits>,
    /// Client API keys (`[auth]`), reloaded in place.
    pub auth: Arc<crate::auth::Keys>,
    /// The token `/admin/*` and `/metrics` need, if any.
    pub admin_token: crate::auth::AdminToken,
    /// Set once shutdown starts: `/ready` fails from then on.
    draining: std::sync::atomic::AtomicBool,
    /// Per-tenant rate limits (`[rate_limits]` and the keys file's tenants).
    pub rate_limits: Arc<crate::ratelimit::RateLimits>,
    /// Endpoint-set channels given for discovered pools before the background tasks start,
    /// used instead of starting the pools' configured sources (see [`AppState::set_source`]).
    given_sources: parking_lot::Mutex<
        Vec<(
            usize,
            tokio::sync::watch::Receiver<kvgate_discovery::EndpointSet>,
        )>,
    >,
}

impl Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    /// Builds the state from a valid config with at least one pool. An empty
    /// `server.admin_listen` is settled here ([`Config::settle_admin_listen`]) as in front of
    /// real instances; the binary settles it before the embedded fleet fills `pools`.
    pub fn new(mut config: Config) -> Result<AppState, GatewayError> {
        let admin_token = crate::auth::AdminToken::load(
            &config.auth,
            std::env::var(crate::auth::ENV_ADMIN_TOKEN).ok().as_deref(),
        )
        .map_err(|e| GatewayError::Internal(e.to_string()))?;
        config.settle_admin_listen(admin_token.is_set());
        config
            .validate()
            .map_err(|e| GatewayError::Internal(e.to_string()))?;
        if config.pools.is_empty() {
            return Err(GatewayError::Internal(
                "no pools configured: configure [[pools]] or start the embedded fleet first".into(),
            ));
        }
        // Before the fleet: instances pre-register metric handles with the recorder.
        let metrics = metrics::install().map_err(GatewayError::Internal)?;
        let clock = Clock::new();
        let fleet = Arc::new(Fleet::new(&config)?);
        let routing = Arc::new(Routing::new(&config, &fleet, clock)?);
        let admission = crate::admission::Admission::new(
            &config.admission,
            &fleet,
            routing.load().clone(),
            clock,
        );
        // `https://` instances: the CA bundle and client certificate are read now, so that a bad
        // file stops the start instead of failing every request.
        let upstream_tls = match &config.upstream.tls {
            Some(t) => Some(Arc::new(
                crate::tls::upstream::UpstreamTls::load(t)
                    .map_err(|e| GatewayError::Internal(format!("upstream.tls: {e}")))?,
            )),
            None => None,
        };
        let client = HttpClient::with_tls(&config.upstream, upstream_tls);
        let offload = crate::proxy::offload::Offload::new(&config.routing.tokenize);
        let request_id_header = HeaderName::from_bytes(config.server.request_id_header.as_bytes())
            .map_err(|e| GatewayError::Internal(e.to_string()))?;
        let limits = proxy::limits::Limits::new(&config.server);
        let admin_limits = config
            .server
            .has_admin_listener()
            .then(|| proxy::limits::Limits::new(&config.server));
        let env_keys = std::env::var(crate::auth::ENV_KEYS).ok();
        let auth = crate::auth::Keys::load(&config.auth, env_keys.as_deref())
            .map_err(|e| GatewayError::Internal(e.to_string()))?;
        let auth = Arc::new(auth);
        let rate_limits = Arc::new(crate::ratelimit::RateLimits::new(
            &config.rate_limits,
            auth.clone(),
            clock,
        ));
        Ok(AppState(Arc::new(Shared {
            limits,
            admin_limits,
            auth,
            admin_token,
            rate_limits,
            config: Arc::new(config),
            fleet,
            routing,
            client,
            clock,
            metrics,
            request_id_header,
            events: Default::default(),
            admission,
            offload,
            given_sources: Default::default(),
            draining: Default::default(),
        })))
    }

    /// Makes discovered pool `pool` follow the endpoint sets on `rx` instead of starting its
    /// configured source: for a program embedding the gateway with its own discovery, and for
    /// tests. Call before the gateway runs.
    pub fn set_source(
        &self,
        pool: usize,
        rx: tokio::sync::watch::Receiver<kvgate_discovery::EndpointSet>,
    ) {
        self.given_sources.lock().push((pool, rx));
    }

    /// Shutdown has started: `/ready` fails from now on.
    pub fn start_draining(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// True once shutdown has started.
    pub fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The channel given for `pool`, once.
    pub(crate) fn take_source(
        &self,
        pool: usize,
    ) -> Option<tokio::sync::watch::Receiver<kvgate_discovery::EndpointSet>> {
        let mut g = self.given_sources.lock();
        let at = g.iter().position(|(p, _)| *p == pool)?;
        Some(g.swap_remove(at).1)
    }
}

/// The admin surface: what reveals the fleet, the decisions and the load, behind the admin
/// token when one is set.
fn guarded_routes(state: &AppState) -> axum::Router<AppState> {
    axum::Router::new()
        .route("/metrics", get(admin::metrics))
        .route("/admin/instances", get(admin::instances))
        .route("/admin/decisions", get(admin::decisions))
        .route("/admin/index", get(admin::index))
        .route("/admin/cluster", get(admin::cluster))
        .route("/admin/admission", get(admin::admission))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            admin::require_admin_token,
        ))
}

/// The main listener's routes: the proxied endpoints, `/v1/models`, the probes and, unless
/// `server.admin_listen` is set (then they answer 404 here), the admin surface.
pub fn router(state: AppState) -> axum::Router {
    let mut r = axum::Router::new();
    if !state.config.server.has_admin_listener() {
        r = r.merge(guarded_routes(&state));
    }
    r.route("/v1/chat/completions", post(proxy::chat))
        .route("/v1/completions", post(proxy::completions))
        .route("/v1/embeddings", post(proxy::embeddings))
        .route("/v1/responses", post(proxy::responses))
        .route("/v1/models", get(admin::models))
        .route("/health", get(admin::health))
        .route("/ready", get(admin::ready))
        .fallback(admin::not_found)
        .with_state(state)
}

/// The admin listener's routes (`server.admin_listen`): the admin surface and the probes;
/// everything else, the inference endpoints included, answers 404.
pub fn admin_router(state: AppState) -> axum::Router {
    guarded_routes(&state)
        .route("/health", get(admin::health))
        .route("/ready", get(admin::ready))
        .fallback(admin::not_found)
        .with_state(state)
}

/// Logs the loud start-up warnings about what the configuration leaves open in front of real
/// instances (`fleet`; the embedded simulated fleet has nothing to protect): the inference
/// endpoints without API keys, and `/admin/*` and `/metrics` without an admin token
/// (`admin_token`) on a main listener that is not loopback. `config` is settled (see
/// [`Config::settle_admin_listen`]).
pub fn warn_open_surfaces(config: &Config, fleet: crate::config::FleetKind, admin_token: bool) {
    if fleet == crate::config::FleetKind::Embedded {
        return;
    }
    let s = &config.server;
    if !config.auth.enabled {
        // Real instances with no keys: anyone who reaches the port spends their capacity.
        tracing::warn!(
            listen = %if s.has_proxy_listener() { &s.listen } else { &config.picker.listen },
            "[auth] is OFF in front of real instances: the gateway is OPEN, any client that can reach it may use every model; set auth.enabled = true (docs/security.md)"
        );
    }
    if !s.has_admin_listener() && !admin_token && !s.listens_on_loopback() {
        // Every instance URL, every decision with its scores, the metrics: to anyone.
        tracing::warn!(
            listen = %s.listen,
            "/admin/* and /metrics are OPEN on the main listener with no admin token: any client that can reach it reads every instance URL, the routing decisions and the metrics; set KVGATE_ADMIN_TOKEN or server.admin_listen to an address (docs/security.md#admin-listener)"
        );
    }
}

/// Starts the background tasks tied to `state`; they stop when `token` is cancelled.
pub fn spawn_background(
    state: &AppState,
    token: CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut handles = tasks::spawn(
        tasks::Probe {
            fleet: state.fleet.clone(),
            client: state.client.clone(),
            config: state.config.clone(),
            clock: state.clock,
            index: state.routing.index().clone(),
            tracked_in_flight: {
                let routing = state.routing.clone();
                Arc::new(move |id| routing.fleet_in_flight(id))
            },
        },
        token.clone(),
    );
    handles.extend(crate::events::spawn(state, token.clone()));
    handles.extend(crate::live::spawn(state, token.clone()));
    if let Some(tls) = state.client.tls() {
        handles.push(tokio::spawn(crate::tls::upstream::watch(
            tls.clone(),
            token.clone(),
        )));
    }
    handles.push(tokio::spawn(crate::auth::reload_loop(
        state.auth.clone(),
        state.config.auth.clone(),
        token.clone(),
    )));
    if let Some(g) = state.routing.gossip().cloned() {
        handles.push(tokio::spawn(crate::ratelimit::share_usage(
            state.rate_limits.clone(),
            g.clone(),
            token.clone(),
        )));
        handles.push(tokio::spawn(publish_to_gossip(
            state.clone(),
            g,
            token.clone(),
        )));
    }
    handles.push(tokio::spawn(state.routing.clone().expire_loop(
        state.config.routing.index.expire_interval_ms,
        token.clone(),
    )));
    let handle = state.metrics.clone();
    let t = token;
    handles.push(tokio::spawn(async move {
        // Drains histogram samples even when nobody scrapes, bounding their memory.
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = t.cancelled() => return,
                _ = tick.tick() => handle.run_upkeep(),
            }
        }
    }));
    handles
}

/// Starts replica gossip when `gossip.enabled` and attaches it to routing (decisions shared,
/// peers' load scored). A configured but failing gossip is a start-up error, not a silent
/// single-replica mode.
pub async fn start_gossip(state: &AppState) -> std::io::Result<Option<kvgate_gossip::Gossip>> {
    let cfg = &state.config.gossip;
    if !cfg.enabled {
        return Ok(None);
    }
    let directory = kvgate_gossip::InstanceDirectory::new();
    for i in state.fleet.view().serving() {
        directory.insert(i.id, &gossip_name(&state.fleet, i));
    }
    let clock = state.clock;
    let gossip = kvgate_gossip::Gossip::start(
        cfg.clone(),
        state.routing.index().clone(),
        directory,
        Arc::new(move || clock.now_ms()),
    )
    .await
    .map_err(|e| std::io::Error::other(e.to_string()))?;
    state.routing.set_gossip(gossip.clone());
    Ok(Some(gossip))
}

/// The name an instance goes by between replicas: its configured name in a static pool (every
/// replica configures the same), `name@url` in a discovered pool, so that a pod re-created under
/// its old name with a new address is a new instance to the peers too.
pub fn gossip_name(fleet: &crate::fleet::Fleet, inst: &crate::fleet::Instance) -> String {
    if fleet.pools()[inst.pool].config.is_discovered() {
        format!("{}@{}", inst.name, inst.config.url)
    } else {
        inst.name.clone()
    }
}

/// Publishes this replica's router-tracked load and own health verdicts to its gossip peers every
/// `gossip.load_interval_ms` (gossip sends only what changed, plus a heartbeat), and applies the
/// peers' merged health verdicts to routing on the same tick.
async fn publish_to_gossip(
    state: AppState,
    gossip: kvgate_gossip::Gossip,
    token: CancellationToken,
) {
    let mut tick =
        tokio::time::interval(Duration::from_millis(state.config.gossip.load_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut loads = Vec::new();
    let mut health = Vec::new();
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = state.clock.now_ms();
        loads.clear();
        health.clear();
        for i in state.fleet.view().serving() {
            loads.push((i.id, state.routing.load().snapshot(i.id)));
            // Only this replica's own observation: re-publishing peers' verdicts would let a dead
            // verdict circulate after the replica that made it sees the instance recover.
            health.push((i.id, i.health.own_usable(now)));
            // A live peer that observes the instance dead keeps it out of routing here too.
            i.health
                .set_peer_down(gossip.peer_health(i.id) == Some(false));
        }
        gossip.publish_load(&loads);
        gossip.publish_health(&health);
    }
}

/// Serves `state` on `listener` until `shutdown` resolves, then drains for the grace period:
/// the binary's serving path ([`crate::proxy::server::run`]) with one serving thread, for
/// embedding the gateway in another program or a test. It binds the admin listener itself when
/// there is one: in front of real instances that is `127.0.0.1:9091` unless the config says
/// otherwise, so a program starting several gateways sets `server.admin_listen` (to `main`, or
/// see [`run_with_admin`]).
pub async fn run(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::proxy::server::run(listener, state, 1, shutdown).await
}

/// [`run`] with the admin listener (`server.admin_listen`) already bound, so that tests bind
/// `127.0.0.1:0` for it too and read its port.
pub async fn run_with_admin(
    listener: TcpListener,
    admin: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::proxy::server::run_with_admin(Some(listener), Some(admin), state, 1, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{FleetKind, InstanceConfig, PoolConfig};
    use std::sync::Mutex;

    /// The log lines `f` writes, as the binary's human format.
    fn logged(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap_or_else(|e| e.into_inner()).extend(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = buf.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    fn real(listen: &str, admin_listen: &str) -> Config {
        let mut c = Config {
            pools: vec![PoolConfig::serving(
                "m",
                vec![InstanceConfig::at("i0", "http://10.0.0.1:8000")],
            )],
            ..Config::default()
        };
        c.auth.enabled = true;
        c.server.listen = listen.into();
        c.server.admin_listen = admin_listen.into();
        c
    }

    const OPEN: &str = "/admin/* and /metrics are OPEN on the main listener";

    #[test]
    fn an_open_admin_surface_on_a_reachable_main_listener_is_a_warning() {
        let open = real("0.0.0.0:8080", "main");
        let out = logged(|| warn_open_surfaces(&open, FleetKind::Real, false));
        assert!(out.contains("WARN") && out.contains(OPEN), "{out}");
        assert!(!out.contains("[auth] is OFF"), "{out}");

        // Closed by a token, on a listener of its own, or on loopback: nothing to say.
        let quiet = [
            (real("0.0.0.0:8080", "main"), FleetKind::Real, true),
            (
                real("0.0.0.0:8080", "127.0.0.1:9091"),
                FleetKind::Real,
                false,
            ),
            (real("127.0.0.1:8080", "main"), FleetKind::Real, false),
            (real("[::1]:8080", "main"), FleetKind::Real, false),
            (real("0.0.0.0:8080", "main"), FleetKind::Embedded, false),
        ];
        for (c, fleet, token) in quiet {
            let out = logged(|| warn_open_surfaces(&c, fleet, token));
            assert!(out.is_empty(), "{:?} {fleet:?} {token}: {out}", c.server);
        }

        // Auth off in front of real instances has its own warning.
        let mut c = real("127.0.0.1:8080", "main");
        c.auth.enabled = false;
        let out = logged(|| warn_open_surfaces(&c, FleetKind::Real, false));
        assert!(
            out.contains("[auth] is OFF") && !out.contains(OPEN),
            "{out}"
        );
    }
}
