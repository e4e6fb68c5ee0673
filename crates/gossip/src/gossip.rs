//! The public handle: start, feed decisions and load, read peers' load and health, inspect,
//! shut down.
//!
//! Invariants:
//! - The request-path methods (`record_decision`, `peer_load`, `peer_health`) take one short lock
//!   and never wait on I/O.
//! - `shutdown` leaves the cluster gracefully (peers see this replica leave at once instead of
//!   after a failure-detection timeout) and waits for every task.

use crate::directory::InstanceDirectory;
use crate::membership::{self, NodeIdentity};
use crate::node::{Clock, Inner};
use crate::status::{ClusterStatus, MemberStatus};
use crate::store::PlacementStore;
use crate::transport::{Transport, UdpTransport};
use crate::{flush, recv, GossipConfig};
use kvgate_core::load::RouterLoad;
use kvgate_core::router::PeerLoad;
use kvgate_core::{BlockHash, InstanceId, Millis};
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// Why gossip could not start.
#[derive(Debug, thiserror::Error)]
pub enum GossipError {
    /// `enabled = false`: the caller should not start gossip.
    #[error("gossip is disabled in the configuration")]
    Disabled,
    /// An invalid setting.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// An address did not resolve.
    #[error("gossip.{key}: cannot resolve {addr:?}: {message}")]
    Resolve {
        /// The config key.
        key: &'static str,
        /// The address.
        addr: String,
        /// Why.
        message: String,
    },
    /// The socket could not be bound.
    #[error("gossip: cannot bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}

struct Tasks {
    shutdown: watch::Sender<bool>,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

/// A running gossip replica. Cheap to clone; every clone is the same replica.
#[derive(Clone)]
pub struct Gossip {
    inner: Arc<Inner>,
    tasks: Arc<Tasks>,
}

impl std::fmt::Debug for Gossip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gossip")
            .field("addr", &self.inner.addr)
            .field("node", &format_args!("{:016x}", self.inner.node_id))
            .finish()
    }
}

async fn resolve(key: &'static str, addr: &str) -> Result<SocketAddr, GossipError> {
    let err = |message: String| GossipError::Resolve {
        key,
        addr: addr.to_string(),
        message,
    };
    tokio::net::lookup_host(addr)
        .await
        .map_err(|e| err(e.to_string()))?
        .next()
        .ok_or_else(|| err("no address".into()))
}

impl Gossip {
    /// Binds the configured UDP address and starts gossiping.
    ///
    /// `index` receives peers' predictions and provides this replica's own for snapshots;
    /// `directory` names instances across replicas; `clock` is the monotonic clock the gateway
    /// passes to the index.
    pub async fn start(
        cfg: GossipConfig,
        index: Arc<dyn PlacementStore>,
        directory: InstanceDirectory,
        clock: Clock,
    ) -> Result<Gossip, GossipError> {
        if !cfg.enabled {
            return Err(GossipError::Disabled);
        }
        cfg.validate()?;
        let bind = resolve("bind", &cfg.bind).await?;
        let t = UdpTransport::bind(bind)
            .await
            .map_err(|source| GossipError::Bind { addr: bind, source })?;
        Self::start_with_transport(cfg, Arc::new(t), index, directory, clock).await
    }

    /// Starts gossiping over `transport` (tests wrap UDP to inject partitions).
    pub async fn start_with_transport(
        cfg: GossipConfig,
        transport: Arc<dyn Transport>,
        index: Arc<dyn PlacementStore>,
        directory: InstanceDirectory,
        clock: Clock,
    ) -> Result<Gossip, GossipError> {
        if !cfg.enabled {
            return Err(GossipError::Disabled);
        }
        cfg.validate()?;
        let local = transport.local_addr().map_err(|source| GossipError::Bind {
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            source,
        })?;
        let addr = if cfg.advertise.is_empty() {
            if local.ip().is_unspecified() {
                return Err(GossipError::Resolve {
                    key: "advertise",
                    addr: local.to_string(),
                    message: "bound to a wildcard address; set gossip.advertise".into(),
                });
            }
            local
        } else {
            resolve("advertise", &cfg.advertise).await?
        };
        let node_id: u64 = rand::random::<u64>() | 1;
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        let (membership_tx, membership_rx) = mpsc::channel(1024);
        let inner = Arc::new(Inner::new(
            cfg,
            node_id,
            addr,
            transport,
            index,
            directory,
            clock,
            membership_tx,
        ));
        let (shutdown, rx) = watch::channel(false);
        let identity = NodeIdentity {
            addr,
            node: node_id,
            epoch,
            bump: 0,
        };
        let handles = vec![
            tokio::spawn(membership::run(
                inner.clone(),
                identity,
                membership_rx,
                rx.clone(),
            )),
            tokio::spawn(recv::run(inner.clone(), rx.clone())),
            tokio::spawn(flush::run(inner.clone(), rx.clone())),
            tokio::spawn(crate::seeds::run(inner.clone(), rx)),
        ];
        tracing::info!(%addr, node = format_args!("{node_id:016x}"), "gossip: started");
        Ok(Gossip {
            inner,
            tasks: Arc::new(Tasks {
                shutdown,
                handles: Mutex::new(handles),
            }),
        })
    }

    /// Shares a routing decision: `instance` will hold the prompt whose block chain is `hashes`.
    ///
    /// `known` is the leading run of `hashes` the index already held on `instance` before the
    /// decision (from any source; the chosen instance's match): peers already know those blocks,
    /// so only the rest is sent (or, with `checkpoint_stride` > 1, its checkpoints). `now` is the
    /// caller's monotonic clock. Cheap: one short lock and a copy; sending happens on the next
    /// flush.
    pub fn record_decision(
        &self,
        instance: InstanceId,
        hashes: &[BlockHash],
        known: usize,
        now: Millis,
    ) {
        flush::enqueue(&self.inner, instance, hashes, known, now, false);
    }

    /// Takes back a decision shared by [`Gossip::record_decision`] with the same arguments: its
    /// request never reached `instance`. Peers drop their predictions (and checkpoints) of the
    /// blocks past `known` there. Queued behind the decision in the same delta stream, so peers
    /// apply it after the decision whatever the flush boundaries, losses and resends in between;
    /// it names every block past `known` (not only checkpoints), so it also takes back what a
    /// peer already materialized from the decision's checkpoints.
    pub fn retract_decision(
        &self,
        instance: InstanceId,
        hashes: &[BlockHash],
        known: usize,
        now: Millis,
    ) {
        flush::enqueue(&self.inner, instance, hashes, known, now, true);
    }

    /// Turns peers' checkpoints found in `hashes` (a prompt's block chain) into `Source::Peer`
    /// predictions in the index. Call before matching a prompt; a no-op (one atomic load) unless
    /// peers share checkpoints (`checkpoint_stride` > 1). Returns how many instances gained a
    /// prefix.
    pub fn materialize(&self, hashes: &[BlockHash], now: Millis) -> usize {
        if !self.inner.has_checkpoints.load(Ordering::Relaxed) {
            return 0;
        }
        self.inner
            .checkpoints
            .materialize(hashes, now, self.inner.store.as_ref())
    }

    /// The placement index's removal hook
    /// ([`kvgate_core::index::PlacementIndex::set_on_remove`]): an engine's eviction makes this
    /// replica forget peers' pending checkpoints of the evicted blocks. A checkpoint waits
    /// unmaterialized until a prompt containing it arrives, possibly long after the engine let the
    /// prefix go; materialized then, it would predict the prefix back for the rest of its TTL and
    /// send the prompt where nothing is cached. Holds this replica weakly: the index keeps
    /// nothing alive through it.
    pub fn eviction_hook(&self) -> kvgate_core::index::RemoveHook {
        let inner = Arc::downgrade(&self.inner);
        Arc::new(move |instance, hashes| {
            if let Some(inner) = inner.upgrade() {
                if inner.has_checkpoints.load(Ordering::Relaxed) {
                    inner.checkpoints.retract(instance, hashes);
                }
            }
        })
    }

    /// Publishes this replica's router-tracked load per instance (full state; call periodically,
    /// e.g. every `load_interval_ms`). Sent on the next load tick if anything changed.
    pub fn publish_load(&self, loads: &[(InstanceId, RouterLoad)]) {
        let mut l = self.inner.local.lock();
        for &(id, load) in loads {
            if l.loads.insert(id, load) != Some(load) {
                l.dirty = true;
            }
        }
    }

    /// Publishes this replica's load on `instance` right after it changed (a dispatch there, a
    /// first token, a completion); with `push_on_change` the flush task pushes it (and pending
    /// decisions) to every live peer at once, spaced by `push_gap_ms`; otherwise nothing is done
    /// here and the change reaches peers with the next [`Gossip::publish_load`] tick. Cheap: one
    /// short lock and a wake. Increments
    /// and decrements must both come here: pushing only dispatches would show peers load that
    /// has already left until the next tick.
    pub fn publish_load_change(&self, instance: InstanceId, load: RouterLoad) {
        // Without the push the gateway's load tick publishes every instance anyway: no lock on
        // the request path for a change that would wait for it.
        if !self.inner.cfg.push_on_change {
            return;
        }
        self.publish_load(&[(instance, load)]);
        self.inner.changed.notify_one();
    }

    /// Sends this replica's cumulative usage per tenant to every live peer now (chunked into
    /// datagrams of at most [`crate::wire::payload::MAX_USAGE_ENTRIES`] entries; sealed like the rest).
    pub async fn publish_usage(&self, usage: &[crate::wire::payload::Usage]) {
        let dests = self.inner.live_dests();
        let mut buf = Vec::new();
        for part in usage.chunks(crate::wire::payload::MAX_USAGE_ENTRIES) {
            crate::wire::payload::encode_usage(part, &mut buf);
            self.inner
                .send_sealed(crate::wire::Kind::Usage, &buf, &dests)
                .await;
        }
    }

    /// Where peers' usage reports are delivered (set once; later calls are ignored).
    pub fn on_usage(&self, sink: crate::node::UsageSink) {
        let _ = self.inner.usage_sink.set(sink);
    }

    /// Publishes this replica's health observations (true = healthy).
    pub fn publish_health(&self, health: &[(InstanceId, bool)]) {
        let mut l = self.inner.local.lock();
        for &(id, ok) in health {
            if l.health.insert(id, ok) != Some(ok) {
                l.dirty = true;
            }
        }
    }

    /// The sum of live peers' router-tracked load on `instance` (this replica's own excluded):
    /// score on own + this for fleet-wide load.
    pub fn peer_load(&self, instance: InstanceId) -> PeerLoad {
        self.inner
            .agg
            .read()
            .instances
            .get(instance.index())
            .copied()
            .unwrap_or_default()
            .peer_load()
    }

    /// The names this replica's instances go by on the wire; the gateway registers instances
    /// as discovery adds them and forgets them as it removes them.
    pub fn directory(&self) -> &InstanceDirectory {
        &self.inner.directory
    }

    /// Live peers' view of `instance`: `Some(false)` if any peer observes it dead,
    /// `Some(true)` if some observe it healthy and none dead, `None` without reports.
    pub fn peer_health(&self, instance: InstanceId) -> Option<bool> {
        self.inner
            .agg
            .read()
            .instances
            .get(instance.index())
            .and_then(|e| e.health)
    }

    /// The advertised address of this replica.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Number of live peers (one atomic load).
    pub fn live_peers(&self) -> usize {
        self.inner.live_peers.load(Ordering::Relaxed) as usize
    }

    /// This replica's random node id (also what peers know it by).
    pub fn node_id(&self) -> u64 {
        self.inner.node_id
    }

    /// How long a peer's dispatch stays out of [`Gossip::peer_load`] here. With
    /// `push_on_change`: the measured convergence lag of peers' decisions into this replica (the
    /// spacing of pushes, the transit and the receive path: several ms when a burst loads the
    /// machines), at least `push_gap_ms`, at most two load intervals (where the ticks would have
    /// shown it). The lag is read from the peers' wall clocks: a peer whose clock runs ahead adds
    /// no lag, one behind adds at most the cap. Without the push: the peer publishes its load
    /// every `load_interval_ms` and sends it on its next load tick, so two intervals. (Assumes
    /// peers configured alike.)
    pub fn unseen_window_ms(&self) -> Millis {
        self.inner.unseen_window_ms()
    }

    /// Members, their state, last heard, lag and bytes, for `/admin/cluster`.
    pub fn cluster_status(&self) -> ClusterStatus {
        let i = &self.inner;
        let now = i.now();
        let members = {
            let peers = i.peers.lock();
            i.members
                .read()
                .iter()
                .filter(|v| v.id.node != i.node_id)
                .map(|v| {
                    let p = peers.get(&v.id.node);
                    MemberStatus {
                        addr: v.id.addr.to_string(),
                        node_id: format!("{:016x}", v.id.node),
                        state: match v.state {
                            foca::State::Alive => "alive",
                            foca::State::Suspect => "suspect",
                            foca::State::Down => "down",
                        },
                        last_heard_ms_ago: p
                            .and_then(|p| p.last_heard)
                            .map(|t| now.saturating_sub(t)),
                        lag_ms: p.and_then(|p| p.lag_ms),
                        lag_ewma_ms: p.and_then(|p| p.lag_ewma_ms),
                        bytes_in: p.map_or(0, |p| p.bytes_in),
                        bytes_out: p.map_or(0, |p| p.bytes_out),
                        next_seq: p.and_then(|p| p.next_seq),
                        repairs: p.map_or(0, |p| p.repairs),
                        load_instances: p.map_or(0, |p| p.shares.len()),
                        sends_load_sizes: p.is_some_and(|p| p.sends_sizes(now, i.cfg.peer_ttl_ms)),
                    }
                })
                .collect()
        };
        let (log_bytes, batches_sent) = {
            let l = i.log.lock();
            (l.bytes, l.next_seq)
        };
        let (pending_hashes, dropped_decisions) = {
            let p = i.pending.lock();
            (p.hashes, p.dropped)
        };
        ClusterStatus {
            cluster_id: i.cfg.cluster_id.clone(),
            node_id: format!("{:016x}", i.node_id),
            addr: i.addr.to_string(),
            members,
            bytes_in: i.stats.bytes_in.load(Ordering::Relaxed),
            bytes_out: i.stats.bytes_out.load(Ordering::Relaxed),
            messages_in: i.stats.messages_in.load(Ordering::Relaxed),
            messages_out: i.stats.messages_out.load(Ordering::Relaxed),
            rejected: i.stats.rejected.lock().clone(),
            batches_sent,
            log_bytes,
            pending_hashes,
            dropped_decisions,
            unseen_window_ms: self.unseen_window_ms(),
        }
    }

    /// Leaves the cluster and stops every task (waits at most a few seconds). The socket closes
    /// when the last clone of this handle is dropped.
    pub async fn shutdown(self) {
        self.inner.stopping.store(true, Ordering::Relaxed);
        let _ = self.tasks.shutdown.send(true);
        let handles = std::mem::take(&mut *self.tasks.handles.lock());
        for h in handles {
            let abort = h.abort_handle();
            if tokio::time::timeout(Duration::from_secs(3), h)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }
}
