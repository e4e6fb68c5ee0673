//! The `kubernetes` source: a Service's EndpointSlices, pods by label selector, or an
//! `InferencePool`'s pods, followed with list + watch against the API server.
//!
//! Layout (one concept per file): [`auth`] where the API server is and its credentials;
//! [`kubeconfig`] reading them from a kubeconfig file; [`client`]
//! the HTTP list/watch requests; [`lines`] and [`reflector`] the sans-I/O stream splitting and
//! watch state machine; [`backoff`] retry delays; [`watch`] the list-then-watch loop of one
//! collection; [`endpoints`], [`pods`], [`pool`] and [`metadata`] objects to [`Endpoint`]s;
//! [`limits`] every bound.
//!
//! Invariants:
//! - Nothing is published until every watch the mode needs has completed its first LIST; after
//!   that the whole set is recomputed and published after each applied change (a burst read in
//!   one chunk, or arriving while the set is computed, is published once).
//! - While any of the mode's watches is failing, the last published set is kept and the
//!   failures are reported in [`crate::EndpointSet::error`].
//! - Only `list` and `watch` are used (the shipped RBAC grants nothing more).
//! - In `inference_pool` mode a changed pool selector replaces the pod watch; the set is kept
//!   until the new watch has listed.

pub mod auth;
pub mod backoff;
pub mod client;
pub mod endpoints;
pub mod kubeconfig;
pub mod limits;
pub mod lines;
pub mod metadata;
pub mod objects;
pub mod pods;
pub mod pool;
pub mod reflector;
pub mod watch;

use crate::config::DiscoveryConfig;
use crate::endpoint::{Endpoint, EndpointSet};
use crate::publish::Publisher;
use crate::source::{DiscoveryError, Source};
use auth::ApiTarget;
use client::Client;
use endpoints::SliceSettings;
use limits::Limits;
use metadata::{Ports, Warned};
use objects::{EndpointSlice, InferencePool, Pod, Resource};
use std::future::Future;
use std::sync::Arc;
use tokio::sync::watch as chan;
use watch::{Api, WatchSpec, Watched};

/// The label EndpointSlices carry naming their Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What is watched.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    Service(String),
    Selector(String),
    Pool(String),
}

/// Follows one pool's engines in Kubernetes.
#[derive(Debug)]
pub struct KubernetesSource {
    client: Arc<Client>,
    mode: Mode,
    slices: SliceSettings,
    port: Option<u16>,
}

/// A spawned watch, aborted when dropped (the source's tasks end with it).
struct Task(tokio::task::JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn spawn_watch<T: Resource>(
    client: &Arc<Client>,
    spec: WatchSpec,
) -> (chan::Receiver<Watched<T>>, Task) {
    let (tx, rx) = chan::channel(Watched::default());
    (
        rx,
        Task(tokio::spawn(watch::run(Arc::clone(client), spec, tx))),
    )
}

impl KubernetesSource {
    /// A source for `cfg` (validated) with the default [`Limits`]: in-cluster config unless
    /// `api_server` is set.
    pub fn new(cfg: &DiscoveryConfig) -> Result<Self, DiscoveryError> {
        Self::with_limits(cfg, Limits::default())
    }

    /// [`KubernetesSource::new`] with other bounds (tests shorten the backoff).
    pub fn with_limits(cfg: &DiscoveryConfig, limits: Limits) -> Result<Self, DiscoveryError> {
        let target = ApiTarget::resolve(
            cfg,
            |k| std::env::var(k).ok(),
            std::path::Path::new(auth::SERVICE_ACCOUNT_DIR),
        )?;
        let mode = match (&cfg.service, &cfg.selector, &cfg.inference_pool) {
            (Some(s), None, None) => Mode::Service(s.clone()),
            (None, Some(s), None) => Mode::Selector(s.clone()),
            (None, None, Some(p)) => Mode::Pool(p.clone()),
            _ => {
                return Err(DiscoveryError::Config {
                    key: "service",
                    message: "exactly one of service, selector and inference_pool".into(),
                })
            }
        };
        if matches!(mode, Mode::Selector(_)) && cfg.port.is_none() {
            return Err(DiscoveryError::Config {
                key: "port",
                message: "selector mode needs the engines' HTTP port".into(),
            });
        }
        let client = Client::new(target, limits).map_err(DiscoveryError::Unavailable)?;
        Ok(Self {
            client: Arc::new(client),
            mode,
            slices: SliceSettings {
                port_name: cfg.port_name.clone(),
                port: cfg.port,
                ports: Ports {
                    kv_events: cfg.kv_events_port,
                    kv_replay: cfg.kv_replay_port,
                },
            },
            port: cfg.port,
        })
    }

    fn ns(&self) -> &str {
        self.client.namespace()
    }

    fn pods_spec(&self, selector: Option<&str>) -> WatchSpec {
        WatchSpec {
            apis: vec![Api {
                path: format!("/api/v1/namespaces/{}/pods", self.ns()),
                resource: "pods",
                group: "",
            }],
            query: selector
                .map(|s| vec![("labelSelector".to_string(), s.to_string())])
                .unwrap_or_default(),
        }
    }

    fn slices_spec(&self, service: &str) -> WatchSpec {
        WatchSpec {
            apis: vec![Api {
                path: format!(
                    "/apis/discovery.k8s.io/v1/namespaces/{}/endpointslices",
                    self.ns()
                ),
                resource: "endpointslices",
                group: "discovery.k8s.io",
            }],
            query: vec![(
                "labelSelector".to_string(),
                format!("{SERVICE_NAME_LABEL}={service}"),
            )],
        }
    }

    fn pool_spec(&self, name: &str) -> WatchSpec {
        let ns = self.ns();
        WatchSpec {
            apis: vec![
                Api {
                    path: format!("/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools"),
                    resource: "inferencepools",
                    group: "inference.networking.k8s.io",
                },
                Api {
                    path: format!(
                        "/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/{ns}/inferencepools"
                    ),
                    resource: "inferencepools",
                    group: "inference.networking.x-k8s.io",
                },
            ],
            query: vec![("fieldSelector".to_string(), format!("metadata.name={name}"))],
        }
    }
}

/// Publishes the set, or the failures keeping the last one; nothing before everything listed.
fn emit(
    publisher: &Publisher,
    errors: Vec<String>,
    synced: bool,
    endpoints: impl FnOnce() -> Vec<Endpoint>,
) {
    if !errors.is_empty() {
        publisher.fail(errors.join("; "));
    } else if synced {
        publisher.publish(endpoints());
    }
}

/// Resolves when `rx` changes; never when there is none or its sender is gone.
async fn changed<T>(rx: Option<&mut chan::Receiver<Watched<T>>>) {
    match rx {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

impl KubernetesSource {
    async fn run_service(
        &self,
        service: &str,
        publisher: &Publisher,
        shutdown: impl Future<Output = ()>,
    ) {
        let (mut slices_rx, _slices) =
            spawn_watch::<EndpointSlice>(&self.client, self.slices_spec(service));
        let (mut pods_rx, _pods) = spawn_watch::<Pod>(&self.client, self.pods_spec(None));
        let mut warned = Warned::default();
        tokio::pin!(shutdown);
        loop {
            let s = slices_rx.borrow_and_update().clone();
            let p = pods_rx.borrow_and_update().clone();
            let errors = [s.error, p.error].into_iter().flatten().collect();
            emit(publisher, errors, s.synced && p.synced, || {
                endpoints::from_slices(&s.objects, &p.objects, &self.slices, &mut warned)
            });
            tokio::select! {
                _ = &mut shutdown => return,
                _ = changed(Some(&mut slices_rx)) => {}
                _ = changed(Some(&mut pods_rx)) => {}
            }
        }
    }

    async fn run_selector(
        &self,
        selector: &str,
        publisher: &Publisher,
        shutdown: impl Future<Output = ()>,
    ) {
        let (mut pods_rx, _pods) = spawn_watch::<Pod>(&self.client, self.pods_spec(Some(selector)));
        let Some(port) = self.port else { return };
        let mut warned = Warned::default();
        tokio::pin!(shutdown);
        loop {
            let p = pods_rx.borrow_and_update().clone();
            emit(publisher, p.error.into_iter().collect(), p.synced, || {
                pods::from_pods(&p.objects, port, self.slices.ports, &mut warned)
            });
            tokio::select! {
                _ = &mut shutdown => return,
                _ = changed(Some(&mut pods_rx)) => {}
            }
        }
    }

    async fn run_pool(
        &self,
        name: &str,
        publisher: &Publisher,
        shutdown: impl Future<Output = ()>,
    ) {
        let (mut pool_rx, _pool) = spawn_watch::<InferencePool>(&self.client, self.pool_spec(name));
        // The pool's current target and the pod watch following its selector.
        let mut current: Option<(pool::PoolTarget, chan::Receiver<Watched<Pod>>, Task)> = None;
        let mut warned = Warned::default();
        tokio::pin!(shutdown);
        loop {
            let w = pool_rx.borrow_and_update().clone();
            let mut errors: Vec<String> = w.error.into_iter().collect();
            if w.synced {
                match w.objects.get(name).map(pool::target) {
                    None => errors.push(format!(
                        "kubernetes: InferencePool {name} not found in namespace {}",
                        self.ns()
                    )),
                    Some(Err(e)) => errors.push(e),
                    Some(Ok(t)) => match &mut current {
                        Some((cur, _, _)) if cur.selector == t.selector => *cur = t,
                        _ => {
                            tracing::info!(pool = name, selector = %t.selector, port = t.port, "kubernetes discovery: watching the InferencePool's pods");
                            let (rx, task) =
                                spawn_watch::<Pod>(&self.client, self.pods_spec(Some(&t.selector)));
                            current = Some((t, rx, task));
                        }
                    },
                }
            }
            match &mut current {
                Some((t, rx, _)) => {
                    let p = rx.borrow_and_update().clone();
                    errors.extend(p.error);
                    let (port, ports) = (t.port, self.slices.ports);
                    let warned = &mut warned;
                    emit(publisher, errors, w.synced && p.synced, move || {
                        pods::from_pods(&p.objects, port, ports, warned)
                    });
                }
                None => emit(publisher, errors, false, Vec::new),
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = changed(Some(&mut pool_rx)) => {}
                _ = changed(current.as_mut().map(|c| &mut c.1)) => {}
            }
        }
    }
}

impl Source for KubernetesSource {
    async fn run(
        self,
        tx: chan::Sender<EndpointSet>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) {
        let publisher = Publisher::new(tx);
        match self.mode.clone() {
            Mode::Service(s) => self.run_service(&s, &publisher, shutdown).await,
            Mode::Selector(s) => self.run_selector(&s, &publisher, shutdown).await,
            Mode::Pool(p) => self.run_pool(&p, &publisher, shutdown).await,
        }
    }
}
