//! Sans-I/O harness for unit tests: replicas whose datagrams are captured instead of sent, so a
//! test moves them between replicas by hand, in any order, and nothing depends on timing.
//! No task runs: the test calls the flush and receive steps itself; the clock stands still.

use crate::membership::{MemberView, NodeIdentity};
use crate::node::Inner;
use crate::transport::{BoxFuture, Transport};
use crate::{GossipConfig, InstanceDirectory};
use kvgate_core::index::{IndexConfig, PlacementIndex, PrefixMatches};
use kvgate_core::{BlockHash, InstanceId};
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::Arc;

/// Instances every test replica knows, by the same names.
pub const INSTANCES: u32 = 3;
/// The standing clock's reading.
pub const NOW: u64 = 1_000;

/// A transport that records what is sent and never receives.
#[derive(Default)]
pub struct Captured {
    pub addr: Option<SocketAddr>,
    pub sent: Mutex<Vec<Vec<u8>>>,
}

impl Transport for Captured {
    fn send_to<'a>(&'a self, data: &'a [u8], _: SocketAddr) -> BoxFuture<'a, std::io::Result<()>> {
        self.sent.lock().push(data.to_vec());
        Box::pin(async { Ok(()) })
    }
    fn recv_from<'a>(
        &'a self,
        _: &'a mut [u8],
    ) -> BoxFuture<'a, std::io::Result<(usize, SocketAddr)>> {
        Box::pin(std::future::pending())
    }
    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.addr.ok_or_else(|| std::io::Error::other("no address"))
    }
}

/// One replica: its state, index and captured datagrams.
pub struct Replica {
    pub inner: Arc<Inner>,
    pub index: Arc<PlacementIndex>,
    pub out: Arc<Captured>,
}

pub fn config(stride: usize) -> GossipConfig {
    GossipConfig {
        enabled: true,
        bind: "127.0.0.1:0".into(),
        secret: "testkit-secret-0123456789".into(),
        checkpoint_stride: stride,
        ..GossipConfig::default()
    }
}

impl Replica {
    pub fn new(node: u64, port: u16, cfg: GossipConfig) -> Replica {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let index = Arc::new(PlacementIndex::new(IndexConfig {
            shards: 4,
            max_entries: 1 << 16,
            default_instance_capacity: 1 << 14,
        }));
        let directory =
            InstanceDirectory::from_pairs((0..INSTANCES).map(|i| (InstanceId(i), format!("e{i}"))));
        let out = Arc::new(Captured {
            addr: Some(addr),
            ..Default::default()
        });
        let (tx, _rx) = tokio::sync::mpsc::channel(16);
        let inner = Arc::new(Inner::new(
            cfg,
            node,
            addr,
            out.clone(),
            index.clone(),
            directory,
            Arc::new(|| NOW),
            tx,
        ));
        Replica { inner, index, out }
    }

    /// Makes `peer` a live member here, so flushes go to it.
    pub fn knows(&self, peer: &Replica) {
        self.inner.set_members(vec![MemberView {
            id: NodeIdentity {
                addr: peer.inner.addr,
                node: peer.inner.node_id,
                epoch: 1,
                bump: 0,
            },
            state: foca::State::Alive,
        }]);
    }

    /// The datagrams sent since the last call.
    pub fn take_sent(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *self.out.sent.lock())
    }

    /// Leading blocks of `hashes` held on `instance` here, checkpoints materialized first (as
    /// routing does).
    pub fn holds(&self, instance: u32, hashes: &[BlockHash]) -> u32 {
        self.inner
            .checkpoints
            .materialize(hashes, NOW, self.index.as_ref());
        let mut m = PrefixMatches::default();
        self.index.match_prefix(hashes, NOW, &mut m);
        m.get(InstanceId(instance)).total()
    }
}
