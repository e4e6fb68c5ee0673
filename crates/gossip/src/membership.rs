//! SWIM membership and failure detection with `foca`, driven by one task.
//!
//! foca does no I/O: this task feeds it authenticated membership datagrams, fires its timers in
//! deadline order, seals and sends what it asks to send, and turns its notifications into
//! data-plane actions (snapshot requests on join, dropping a dead peer's contributions).
//!
//! Invariants:
//! - Only this task touches the `Foca` value; everything else talks to it through a bounded
//!   channel, and sees membership through the view published after every step.
//! - A node's identity carries a random per-process `node` id (also the envelope's sender id) and
//!   its start time, so a restarted replica at the same address wins the address conflict and its
//!   predecessor's contributions are dropped; `bump` lets a replica wrongly declared down rejoin at
//!   once (foca's `renew`).

use crate::node::Inner;
use crate::wire::Kind;
use foca::{AccumulatingRuntime, Foca, OwnedNotification, PostcardCodec, Timer};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Who a member is, as the membership protocol knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIdentity {
    /// Where it receives datagrams.
    pub addr: SocketAddr,
    /// Random per process start; the envelope's sender id. 0 = a seed not yet known.
    pub node: u64,
    /// Process start, µs since the UNIX epoch: a restart wins over its predecessor.
    pub epoch: u64,
    /// Bumped when it rejoins after being declared down.
    pub bump: u16,
}

impl NodeIdentity {
    /// The placeholder identity used to announce to a seed address.
    pub fn seed(addr: SocketAddr) -> Self {
        Self {
            addr,
            node: 0,
            epoch: 0,
            bump: 0,
        }
    }
}

impl foca::Identity for NodeIdentity {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(Self {
            bump: self.bump.wrapping_add(1),
            ..self.clone()
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, other: &Self) -> bool {
        (self.epoch, self.bump, self.node) > (other.epoch, other.bump, other.node)
    }
}

/// A member and its SWIM state.
#[derive(Clone, Debug)]
pub struct MemberView {
    /// Identity.
    pub id: NodeIdentity,
    /// Alive, suspect or down.
    pub state: foca::State,
}

/// Inputs to the membership task.
pub(crate) enum MembershipInput {
    /// An authenticated membership payload.
    Data(Vec<u8>),
    /// Announce ourselves to this address (a seed).
    Announce(SocketAddr),
}

/// foca's configuration from ours.
fn foca_config(cfg: &crate::GossipConfig) -> foca::Config {
    let mut c = foca::Config::new_lan(NonZeroU32::MIN.saturating_add(7));
    c.probe_period = Duration::from_millis(cfg.probe_period_ms);
    c.probe_rtt = Duration::from_millis(cfg.probe_rtt_ms);
    c.suspect_to_down_after = Duration::from_millis(cfg.suspect_to_down_ms);
    let three = NonZeroUsize::MIN.saturating_add(2);
    c.periodic_gossip = Some(foca::PeriodicParams {
        frequency: Duration::from_millis((cfg.probe_period_ms / 5).max(20)),
        num_members: three,
    });
    c.periodic_announce = Some(foca::PeriodicParams {
        frequency: Duration::from_millis(cfg.seed_interval_ms.saturating_mul(2)),
        num_members: NonZeroUsize::MIN,
    });
    c.periodic_announce_to_down_members = Some(foca::PeriodicParams {
        frequency: Duration::from_millis(cfg.seed_interval_ms),
        num_members: three,
    });
    c
}

type Timers = BinaryHeap<Reverse<(Instant, Timer<NodeIdentity>)>>;

/// Runs membership until shutdown; on shutdown leaves the cluster gracefully.
pub(crate) async fn run(
    inner: Arc<Inner>,
    identity: NodeIdentity,
    mut rx: mpsc::Receiver<MembershipInput>,
    mut shutdown: watch::Receiver<bool>,
) {
    let rng: rand::rngs::StdRng = rand::make_rng();
    let mut foca = Foca::new(identity, foca_config(&inner.cfg), rng, PostcardCodec);
    let mut rt = AccumulatingRuntime::new();
    let mut timers: Timers = BinaryHeap::new();
    loop {
        let next = timers.peek().map(|Reverse((t, _))| *t);
        let sleep = async move {
            match next {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = sleep => {
                let now = Instant::now();
                while timers.peek().is_some_and(|Reverse((t, _))| *t <= now) {
                    if let Some(Reverse((_, timer))) = timers.pop() {
                        if let Err(e) = foca.handle_timer(timer, &mut rt) {
                            tracing::debug!(error = %e, "gossip: membership timer");
                        }
                    }
                }
            }
            msg = rx.recv() => match msg {
                None => break,
                Some(MembershipInput::Data(d)) => {
                    if let Err(e) = foca.handle_data(&d, &mut rt) {
                        tracing::debug!(error = %e, "gossip: membership packet refused");
                        inner.count_reject("membership");
                    }
                }
                Some(MembershipInput::Announce(addr)) => {
                    if let Err(e) = foca.announce(NodeIdentity::seed(addr), &mut rt) {
                        tracing::debug!(error = %e, %addr, "gossip: announce");
                    }
                }
            },
            _ = shutdown.changed() => {
                if let Err(e) = foca.leave_cluster(&mut rt) {
                    tracing::debug!(error = %e, "gossip: leave");
                }
                drain(&inner, &foca, &mut rt, &mut timers).await;
                break;
            }
        }
        drain(&inner, &foca, &mut rt, &mut timers).await;
    }
}

async fn drain(
    inner: &Arc<Inner>,
    foca: &Foca<NodeIdentity, PostcardCodec, rand::rngs::StdRng, foca::NoCustomBroadcast>,
    rt: &mut AccumulatingRuntime<NodeIdentity>,
    timers: &mut Timers,
) {
    while let Some((to, data)) = rt.to_send() {
        inner
            .send_sealed(Kind::Membership, &data, &[(to.node, to.addr)])
            .await;
    }
    let now = Instant::now();
    while let Some((after, timer)) = rt.to_schedule() {
        timers.push(Reverse((now + after, timer)));
    }
    inner.set_members(
        foca.iter_membership_state()
            .map(|m| MemberView {
                id: m.id().clone(),
                state: m.state(),
            })
            .collect(),
    );
    while let Some(n) = rt.to_notify() {
        match n {
            OwnedNotification::MemberUp(id) => inner.on_member_up(&id).await,
            OwnedNotification::MemberDown(id) => inner.on_member_down(&id).await,
            OwnedNotification::Rename(old, new) => inner.on_rename(&old, &new).await,
            OwnedNotification::Rejoin(id) => {
                tracing::info!(bump = id.bump, "gossip: rejoined after being declared down")
            }
            OwnedNotification::Defunct => tracing::warn!("gossip: declared down; not rejoining"),
            OwnedNotification::Idle => tracing::info!("gossip: no live peers"),
            OwnedNotification::Active => tracing::info!("gossip: joined the cluster"),
        }
    }
}
