//! One kvgate replica in this process: the real gateway (`kvgate::app::run`) on an ephemeral
//! 127.0.0.1 port, gossiping on another.
//!
//! Invariant: `stop` signals shutdown and waits for the serve loop (which leaves the gossip
//! cluster gracefully) with a bound, so a benchmark never hangs on a replica.

use kvgate::app::AppState;
use kvgate::config::{Config, HashMode, InstanceConfig, PoolConfig};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::oneshot;

/// Cluster secret of the benchmark (loopback only).
const SECRET: &str = "cluster-bench-secret-0123456789";

/// How replicas are configured.
#[derive(Clone, Debug)]
pub struct ReplicaSpec {
    /// Engine URLs (one pool, model `model`).
    pub urls: Vec<String>,
    /// Served model name.
    pub model: String,
    /// Gossip on (several replicas) or off (independent replicas / one gateway).
    pub gossip: bool,
    /// `gossip.checkpoint_stride`.
    pub stride: usize,
    /// `gossip.forget_dead_peer_placements`.
    pub forget_dead: bool,
    /// `gossip.push_on_change`.
    pub push_on_change: bool,
    /// `gossip.share_load_sizes`.
    pub share_load_sizes: bool,
    /// `routing.policy.kvgate.concurrency_weight`.
    pub concurrency_weight: f64,
    /// Poll the engines' `/metrics` (the lightweight engines have none).
    pub scrape_engines: bool,
}

/// A running replica.
pub struct Replica {
    /// HTTP address.
    pub addr: SocketAddr,
    /// Its state (index, load, gossip handle).
    pub state: AppState,
    stop: Option<oneshot::Sender<()>>,
    join: tokio::task::JoinHandle<std::io::Result<()>>,
}

fn config(spec: &ReplicaSpec, seeds: &[SocketAddr]) -> Config {
    let mut c = Config::default();
    c.server.shutdown_grace_ms = 1_000;
    // Several replicas in one process: no admin listener on the default fixed port.
    c.server.admin_listen = kvgate::config::ADMIN_ON_MAIN.into();
    c.routing.hash_mode = HashMode::Token;
    c.load.enabled = spec.scrape_engines;
    c.pools = vec![PoolConfig {
        model: spec.model.clone(),
        block_size: Some(16),
        tokenizer: None,
        chat_template: None,
        flavour: Default::default(),
        instances: spec
            .urls
            .iter()
            .enumerate()
            .map(|(i, u)| InstanceConfig::at(format!("sim-{i}"), u.clone()))
            .collect(),
        max_instances: None,
        discovery: Default::default(),
    }];
    if spec.gossip {
        c.gossip.enabled = true;
        c.gossip.bind = "127.0.0.1:0".into();
        c.gossip.seeds = seeds.iter().map(|a| a.to_string()).collect();
        c.gossip.secret = SECRET.into();
        c.gossip.checkpoint_stride = spec.stride;
        c.gossip.forget_dead_peer_placements = spec.forget_dead;
        c.gossip.push_on_change = spec.push_on_change;
        c.gossip.share_load_sizes = spec.share_load_sizes;
        c.routing.policy.kvgate.concurrency_weight = spec.concurrency_weight;
        c.gossip.prediction_ttl_ms = c.routing.predicted_ttl_ms;
    }
    c
}

impl Replica {
    /// Starts a replica seeded with `seeds` (gossip addresses of running replicas).
    pub async fn start(spec: &ReplicaSpec, seeds: &[SocketAddr]) -> anyhow::Result<Replica> {
        let state = AppState::new(config(spec, seeds))?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        let join = tokio::spawn(kvgate::app::run(listener, state.clone(), async move {
            let _ = rx.await;
        }));
        let r = Replica {
            addr,
            state,
            stop: Some(tx),
            join,
        };
        if spec.gossip {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while r.state.routing.gossip().is_none() {
                if tokio::time::Instant::now() > deadline {
                    anyhow::bail!("gossip did not start");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        Ok(r)
    }

    /// Gossip address, when gossiping.
    pub fn gossip_addr(&self) -> Option<SocketAddr> {
        self.state.routing.gossip().map(|g| g.local_addr())
    }

    /// Live gossip peers.
    pub fn live_peers(&self) -> usize {
        self.state.routing.gossip().map_or(0, |g| g.live_peers())
    }

    /// Gossip bytes (out, in) so far.
    pub fn gossip_bytes(&self) -> (u64, u64) {
        self.state.routing.gossip().map_or((0, 0), |g| {
            let s = g.cluster_status();
            (s.bytes_out, s.bytes_in)
        })
    }

    /// Base URL of its completions endpoint.
    pub fn completions_url(&self) -> String {
        format!("http://{}/v1/completions", self.addr)
    }

    /// Shuts down (drains for at most the configured grace, then a bound).
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let abort = self.join.abort_handle();
        if tokio::time::timeout(Duration::from_secs(8), &mut self.join)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
}
