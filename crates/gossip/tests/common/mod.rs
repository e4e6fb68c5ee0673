//! Test harness: gossip replicas on 127.0.0.1 ephemeral ports, each with its own real placement
//! index and a partition switch on its socket.
#![allow(dead_code)]

use kvgate_core::index::{IndexConfig, PlacementIndex, PrefixMatches};
use kvgate_core::{BlockHash, InstanceId, Millis, Source};
use kvgate_gossip::transport::{PartitionableTransport, UdpTransport};
use kvgate_gossip::wire::envelope::{Header, Keys};
use kvgate_gossip::wire::payload::{encode_delta, EntriesBuilder};
use kvgate_gossip::wire::Kind;
use kvgate_gossip::{Clock, Gossip, GossipConfig, InstanceDirectory};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const SECRET: &str = "test-secret-0123456789";
pub const INSTANCES: usize = 4;
pub const PREDICTION_TTL_MS: u64 = 60_000;

pub fn now_ms() -> Millis {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as Millis
}

pub fn clock() -> Clock {
    Arc::new(now_ms)
}

/// Fast protocol timings so failure detection takes about a second.
pub fn fast_config(seeds: &[SocketAddr]) -> GossipConfig {
    GossipConfig {
        enabled: true,
        bind: "127.0.0.1:0".into(),
        seeds: seeds.iter().map(|a| a.to_string()).collect(),
        cluster_id: "test".into(),
        secret: SECRET.into(),
        flush_interval_ms: 10,
        load_interval_ms: 20,
        probe_period_ms: 200,
        probe_rtt_ms: 80,
        suspect_to_down_ms: 600,
        seed_interval_ms: 300,
        peer_ttl_ms: 2_000,
        prediction_ttl_ms: PREDICTION_TTL_MS,
        // Every hash: these tests exercise the full-hash path; checkpoint tests set 16.
        checkpoint_stride: 1,
        ..GossipConfig::default()
    }
}

pub fn instance_name(i: usize) -> String {
    format!("http://engine-{i}:8000")
}

pub struct Node {
    pub gossip: Gossip,
    pub index: Arc<PlacementIndex>,
    pub directory: InstanceDirectory,
    pub cut: Arc<AtomicBool>,
    pub addr: SocketAddr,
    /// Reverse numbering: replicas number instances differently; only names are shared.
    pub reversed: bool,
}

impl Node {
    pub async fn start(bind: SocketAddr, cfg: GossipConfig, reversed: bool) -> Node {
        let index = Arc::new(PlacementIndex::new(IndexConfig {
            shards: 16,
            max_entries: 1 << 20,
            default_instance_capacity: 1 << 18,
        }));
        let directory = InstanceDirectory::from_pairs((0..INSTANCES).map(|i| {
            let id = if reversed { INSTANCES - 1 - i } else { i };
            (InstanceId(id as u32), instance_name(i))
        }));
        let udp = UdpTransport::bind(bind).await.expect("bind");
        let (t, cut) = PartitionableTransport::new(udp);
        let addr = kvgate_gossip::transport::Transport::local_addr(&t).expect("addr");
        let gossip = Gossip::start_with_transport(
            cfg,
            Arc::new(t),
            index.clone(),
            directory.clone(),
            clock(),
        )
        .await
        .expect("start");
        Node {
            gossip,
            index,
            directory,
            cut,
            addr,
            reversed,
        }
    }

    /// This node's id for the instance named `instance_name(i)`.
    pub fn id(&self, i: usize) -> InstanceId {
        InstanceId(if self.reversed { INSTANCES - 1 - i } else { i } as u32)
    }

    /// A routing decision as the gateway makes it: match, predict locally, share what is new.
    pub fn decide(&self, i: usize, hashes: &[BlockHash]) {
        let now = now_ms();
        self.gossip.materialize(hashes, now);
        let mut out = PrefixMatches::default();
        self.index.match_prefix(hashes, now, &mut out);
        let known = out.get(self.id(i)).total() as usize;
        self.index
            .predict(self.id(i), hashes, Source::Local, PREDICTION_TTL_MS, now);
        self.gossip.record_decision(self.id(i), hashes, known, now);
    }

    /// Leading blocks of `hashes` this node's index holds on instance `i`, as the gateway sees
    /// them when routing (checkpoints materialized first).
    pub fn holds(&self, i: usize, hashes: &[BlockHash]) -> u32 {
        let now = now_ms();
        self.gossip.materialize(hashes, now);
        let mut out = PrefixMatches::default();
        self.index.match_prefix(hashes, now, &mut out);
        out.get(self.id(i)).total()
    }

    /// Whether this node has every delta batch `from` sent so far (and `from` sent some),
    /// without materializing anything.
    pub fn has_all_batches_of(&self, from: &Node) -> bool {
        let sent = from.gossip.cluster_status().batches_sent;
        let addr = from.addr.to_string();
        sent > 0
            && self
                .gossip
                .cluster_status()
                .members
                .iter()
                .any(|m| m.addr == addr && m.next_seq.is_some_and(|n| n >= sent))
    }

    pub fn partition(&self, on: bool) {
        self.cut.store(on, Ordering::SeqCst);
    }

    pub fn rejected(&self, reason: &str) -> u64 {
        self.gossip
            .cluster_status()
            .rejected
            .get(reason)
            .copied()
            .unwrap_or(0)
    }
}

/// Starts `n` replicas: the first is everyone's seed; odd ones number instances in reverse.
pub async fn cluster(n: usize) -> Vec<Node> {
    cluster_with(n, 1).await
}

/// Starts `n` replicas sharing placements at `checkpoint_stride`.
pub async fn cluster_with(n: usize, stride: usize) -> Vec<Node> {
    cluster_of(n, |c| GossipConfig {
        checkpoint_stride: stride,
        ..c
    })
    .await
}

/// Starts `n` replicas, each with `fast_config` changed by `f`.
pub async fn cluster_of(n: usize, f: impl Fn(GossipConfig) -> GossipConfig) -> Vec<Node> {
    let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let cfg = |seeds: &[SocketAddr]| f(fast_config(seeds));
    let first = Node::start(any, cfg(&[]), false).await;
    let seed = first.addr;
    let mut v = vec![first];
    for i in 1..n {
        v.push(Node::start(any, cfg(&[seed]), i % 2 == 1).await);
    }
    let ok = wait_until(Duration::from_secs(15), || {
        v.iter().all(|x| x.gossip.live_peers() == n - 1)
    })
    .await;
    assert!(ok, "cluster of {n} did not form");
    v
}

/// Polls `f` every 20 ms until true or `timeout`.
pub async fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A chain of `n` distinct pseudo-random block hashes derived from `seed`.
pub fn chain(seed: u64, n: usize) -> Vec<BlockHash> {
    let mut h = seed;
    (0..n)
        .map(|i| {
            h = xxhash_rust::xxh3::xxh3_64_with_seed(&(i as u64).to_le_bytes(), h);
            h
        })
        .collect()
}

pub const CONVERGE: Duration = Duration::from_secs(10);

/// Wall-clock milliseconds, as envelopes carry them.
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A delta datagram sealed with `keys`: `hashes` placed on instance `instance`, as `sender`'s
/// `counter`-th datagram.
pub fn sealed_delta(
    keys: &Keys,
    sender: u64,
    counter: u64,
    instance: usize,
    hashes: &[u64],
) -> Vec<u8> {
    let now = wall_ms();
    let mut b = EntriesBuilder::new(now, 60_000);
    b.push(
        kvgate_gossip::instance_key(&instance_name(instance)),
        now,
        60_000,
        hashes,
    );
    let mut payload = Vec::new();
    encode_delta(0, 1, b, &mut payload);
    let mut d = Vec::new();
    keys.seal(
        &Header {
            kind: Kind::Delta,
            sender,
            counter,
            wall_ms: now,
        },
        &payload,
        &mut d,
    );
    d
}

/// Sends raw bytes to `to` from a fresh socket.
pub async fn send_raw(to: SocketAddr, d: &[u8]) {
    let s = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind");
    s.send_to(d, to).await.expect("send");
}
