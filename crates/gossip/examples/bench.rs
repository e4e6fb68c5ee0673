//! Gossip benchmark on loopback: N replicas in one process, each routing decisions at a fixed
//! rate with ~8K-token prompts, measuring convergence lag, bandwidth per replica and the catch-up
//! time of a restarted replica.
//!
//! ```text
//! cargo run -p kvgate-gossip --release --example bench -- [--scenario chat|fresh|both]
//!     [--secs 15] [--rate 250] [--nodes 4] [--instances 8] [--block-tokens 16] [--stride 16]
//! ```
//!
//! Scenarios:
//! - `fresh`: every decision is a brand-new ~8K-token prompt (all blocks new): the worst case.
//! - `chat`: multi-turn conversations over 16 shared system prompts; a Service spreads turns over
//!   replicas at random; each replica routes a prompt to the instance holding its longest prefix
//!   (else a random one) and shares only the blocks that instance did not already hold.
//!
//! Convergence lag is the `kvgate_gossip_convergence_lag_seconds` histogram: origin's decision
//! (wall clock at `record_decision`) to the prediction applied in a receiver's index, every
//! receiver, every batch.

use anyhow::{bail, Context, Result};
use kvgate_core::index::{IndexConfig, PlacementIndex, PrefixMatches};
use kvgate_core::{BlockHash, InstanceId, Source};
use kvgate_gossip::{Clock, Gossip, GossipConfig, InstanceDirectory};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

const TTL_MS: u64 = 120_000;
/// Time spent in `materialize` on the routing path, for the per-call mean.
static MATERIALIZE_NS: AtomicU64 = AtomicU64::new(0);
static MATERIALIZE_CALLS: AtomicU64 = AtomicU64::new(0);
const SECRET: &str = "bench-secret-0123456789";

#[derive(Clone, Copy, PartialEq)]
enum Scenario {
    Fresh,
    Chat,
}

struct Args {
    scenarios: Vec<Scenario>,
    secs: u64,
    rate: u64,
    nodes: usize,
    instances: usize,
    block_tokens: usize,
    stride: usize,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        scenarios: vec![Scenario::Chat, Scenario::Fresh],
        secs: 15,
        rate: 250,
        nodes: 4,
        instances: 8,
        block_tokens: 16,
        stride: GossipConfig::default().checkpoint_stride,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().with_context(|| format!("{k} needs a value"))?;
        match k.as_str() {
            "--scenario" => {
                a.scenarios = match v.as_str() {
                    "chat" => vec![Scenario::Chat],
                    "fresh" => vec![Scenario::Fresh],
                    "both" => vec![Scenario::Chat, Scenario::Fresh],
                    _ => bail!("--scenario chat|fresh|both"),
                }
            }
            "--secs" => a.secs = v.parse()?,
            "--rate" => a.rate = v.parse()?,
            "--nodes" => a.nodes = v.parse()?,
            "--instances" => a.instances = v.parse()?,
            "--block-tokens" => a.block_tokens = v.parse()?,
            "--stride" => a.stride = v.parse()?,
            _ => bail!("unknown flag {k}"),
        }
    }
    if a.nodes < 2 || a.rate == 0 || a.secs == 0 || a.block_tokens == 0 {
        bail!("need --nodes >= 2 and positive --rate, --secs, --block-tokens");
    }
    Ok(a)
}

fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

struct Node {
    gossip: Gossip,
    index: Arc<PlacementIndex>,
    addr: SocketAddr,
}

async fn start_node(bind: SocketAddr, seeds: &[SocketAddr], args: &Args) -> Result<Node> {
    let instances = args.instances;
    let index = Arc::new(PlacementIndex::new(IndexConfig {
        shards: 64,
        max_entries: 8 << 20,
        default_instance_capacity: 2 << 20,
    }));
    let dir = InstanceDirectory::from_pairs(
        (0..instances).map(|i| (InstanceId(i as u32), format!("http://engine-{i}:8000"))),
    );
    let cfg = GossipConfig {
        enabled: true,
        bind: bind.to_string(),
        seeds: seeds.iter().map(|s| s.to_string()).collect(),
        cluster_id: "bench".into(),
        secret: SECRET.into(),
        prediction_ttl_ms: TTL_MS,
        probe_period_ms: 500,
        probe_rtt_ms: 200,
        suspect_to_down_ms: 1_500,
        seed_interval_ms: 500,
        checkpoint_stride: args.stride,
        ..GossipConfig::default()
    };
    let clock: Clock = Arc::new(now_ms);
    let gossip = Gossip::start(cfg, index.clone(), dir, clock).await?;
    let addr = gossip.local_addr();
    Ok(Node {
        gossip,
        index,
        addr,
    })
}

/// Deterministic xorshift, one per generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn extend_chain(chain: &mut Vec<BlockHash>, n: usize, rng: &mut Rng) {
    let mut h = chain.last().copied().unwrap_or(0x5eed);
    for _ in 0..n {
        h = xxhash_rust::xxh3::xxh3_64_with_seed(&rng.next().to_le_bytes(), h);
        chain.push(h);
    }
}

/// Shared workload: the conversations a Service spreads over all replicas.
struct Workload {
    scenario: Scenario,
    blocks_per_prompt: usize,
    system: Vec<Vec<BlockHash>>,
    convs: Mutex<Vec<Vec<BlockHash>>>,
}

impl Workload {
    fn new(scenario: Scenario, block_tokens: usize) -> Self {
        let blocks_per_prompt = 8192 / block_tokens;
        let mut rng = Rng(0x1234_5678_9abc);
        let system = (0..16)
            .map(|_| {
                let mut c = Vec::new();
                extend_chain(&mut c, 1024 / block_tokens, &mut rng);
                c
            })
            .collect();
        Self {
            scenario,
            blocks_per_prompt,
            system,
            convs: Mutex::new(Vec::new()),
        }
    }

    /// The next prompt's block chain.
    fn next(&self, rng: &mut Rng) -> Vec<BlockHash> {
        let b = self.blocks_per_prompt;
        if self.scenario == Scenario::Fresh {
            let mut c = Vec::with_capacity(b);
            extend_chain(&mut c, b, rng);
            return c;
        }
        // Chat: 25 % new conversations of ~6K tokens after a shared 1K-token system prompt; 75 %
        // next turns of a random live conversation, +1K tokens (answer + new message), up to 10K.
        let turn = b / 8;
        let mut convs = self.convs.lock();
        if convs.len() < 64 || rng.below(4) == 0 {
            let mut c = self.system[rng.below(16) as usize].clone();
            let fresh = (b * 3 / 4).saturating_sub(c.len());
            extend_chain(&mut c, fresh, rng);
            if convs.len() < 4096 {
                convs.push(c.clone());
            } else {
                let i = rng.below(convs.len() as u64) as usize;
                convs[i] = c.clone();
            }
            return c;
        }
        let i = rng.below(convs.len() as u64) as usize;
        let mut c = convs[i].clone();
        extend_chain(&mut c, turn, rng);
        if c.len() > b * 5 / 4 {
            convs.swap_remove(i);
        } else {
            convs[i] = c.clone();
        }
        c
    }
}

/// One routing decision as the gateway makes it; returns (instance, new blocks).
fn decide(
    node: &Node,
    prompt: &[BlockHash],
    instances: usize,
    rng: &mut Rng,
) -> (InstanceId, usize) {
    let now = now_ms();
    let t = Instant::now();
    node.gossip.materialize(prompt, now);
    MATERIALIZE_NS.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    MATERIALIZE_CALLS.fetch_add(1, Ordering::Relaxed);
    let mut m = PrefixMatches::default();
    node.index.match_prefix(prompt, now, &mut m);
    let best = m
        .rows
        .iter()
        .max_by_key(|r| (r.total(), std::cmp::Reverse(r.instance)));
    let (inst, matched) = match best {
        Some(r) if r.total() > 0 => (r.instance, r.total() as usize),
        _ => (InstanceId(rng.below(instances as u64) as u32), 0),
    };
    node.index.predict(inst, prompt, Source::Local, TTL_MS, now);
    node.gossip.record_decision(inst, prompt, matched, now);
    (inst, prompt.len() - matched.min(prompt.len()))
}

fn lag_samples(snap: &Snapshotter) -> Vec<f64> {
    let mut v = Vec::new();
    for (k, _, _, val) in snap.snapshot().into_vec() {
        if k.key().name() == kvgate_gossip::metrics::CONVERGENCE_LAG_SECONDS {
            if let DebugValue::Histogram(h) = val {
                v.extend(h.into_iter().map(|x| x.0));
            }
        }
    }
    v
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Recent prompts with the instance they were routed to.
type Samples = Vec<(InstanceId, Vec<BlockHash>)>;

async fn run(args: &Args, scenario: Scenario, snap: &Snapshotter) -> Result<()> {
    let name = if scenario == Scenario::Chat {
        "chat"
    } else {
        "fresh"
    };
    println!(
        "\n== scenario {name}: {} replicas x {} decisions/s, ~8K-token prompts ({} blocks of {} tokens), checkpoint stride {}, {} s",
        args.nodes,
        args.rate,
        8192 / args.block_tokens,
        args.block_tokens,
        args.stride,
        args.secs
    );
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    let mut nodes = vec![Arc::new(start_node(any, &[], args).await?)];
    let seed = nodes[0].addr;
    for _ in 1..args.nodes {
        nodes.push(Arc::new(start_node(any, &[seed], args).await?));
    }
    let t0 = Instant::now();
    while nodes.iter().any(|n| n.gossip.live_peers() < args.nodes - 1) {
        if t0.elapsed() > Duration::from_secs(20) {
            bail!("cluster did not form");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("cluster formed in {:?}", t0.elapsed());
    let _ = lag_samples(snap); // drop warm-up samples

    let work = Arc::new(Workload::new(scenario, args.block_tokens));
    let before: Vec<(u64, u64)> = nodes
        .iter()
        .map(|n| {
            let s = n.gossip.cluster_status();
            (s.bytes_in, s.bytes_out)
        })
        .collect();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.secs);
    // Recent prompts per origin, to check catch-up after the restart.
    let recent: Arc<Mutex<Samples>> = Arc::default();
    let mut tasks = Vec::new();
    for (ni, node) in nodes.iter().enumerate() {
        let node = node.clone();
        let work = work.clone();
        let recent = recent.clone();
        let rate = args.rate;
        let instances = args.instances;
        let restart_target = ni == args.nodes - 1;
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (ni as u64 + 1));
            let period = Duration::from_secs_f64(1.0 / rate as f64);
            let mut next = tokio::time::Instant::now();
            let (mut decisions, mut new_blocks, mut all_blocks) = (0u64, 0u64, 0u64);
            while Instant::now() < deadline {
                let prompt = work.next(&mut rng);
                let (inst, new) = decide(&node, &prompt, instances, &mut rng);
                decisions += 1;
                new_blocks += new as u64;
                all_blocks += prompt.len() as u64;
                if !restart_target && decisions % 25 == 0 {
                    let mut r = recent.lock();
                    if r.len() >= 400 {
                        r.remove(0);
                    }
                    r.push((inst, prompt));
                }
                next += period;
                tokio::time::sleep_until(next).await;
            }
            (decisions, new_blocks, all_blocks)
        }));
    }
    let (mut decisions, mut new_blocks, mut all_blocks) = (0u64, 0u64, 0u64);
    for t in tasks {
        let (d, n, a) = t.await?;
        decisions += d;
        new_blocks += n;
        all_blocks += a;
    }
    let elapsed = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(300)).await; // let the last flush land
    let mut lags = lag_samples(snap);
    lags.sort_by(|a, b| a.total_cmp(b));
    println!(
        "decisions: {decisions} ({:.0}/s total, {:.0}/s per replica); mean prompt {:.0} blocks, mean new blocks shared {:.1}",
        decisions as f64 / elapsed,
        decisions as f64 / elapsed / args.nodes as f64,
        all_blocks as f64 / decisions.max(1) as f64,
        new_blocks as f64 / decisions.max(1) as f64
    );
    println!(
        "convergence lag (decision at origin -> applied in each peer's index), {} samples: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        lags.len(),
        pct(&lags, 0.50) * 1e3,
        pct(&lags, 0.90) * 1e3,
        pct(&lags, 0.99) * 1e3,
        lags.last().copied().unwrap_or(f64::NAN) * 1e3
    );
    let calls = MATERIALIZE_CALLS.swap(0, Ordering::Relaxed).max(1);
    println!(
        "materialize on the routing path: mean {:.1} us per decision",
        MATERIALIZE_NS.swap(0, Ordering::Relaxed) as f64 / calls as f64 / 1e3
    );
    let secs = elapsed + 0.3;
    for (i, n) in nodes.iter().enumerate() {
        let s = n.gossip.cluster_status();
        println!(
            "replica {i}: out {:.0} KB/s, in {:.0} KB/s, repairs {}, rejected {:?}, dropped decisions {}",
            (s.bytes_out - before[i].1) as f64 / secs / 1e3,
            (s.bytes_in - before[i].0) as f64 / secs / 1e3,
            s.members.iter().map(|m| m.repairs).sum::<u64>(),
            s.rejected,
            s.dropped_decisions
        );
    }

    // Restart the last replica on the same address with an empty index.
    let victim = nodes.pop().context("nodes")?;
    let addr = victim.addr;
    let local_entries = victim.index.stats().entries_by_source;
    match Arc::try_unwrap(victim) {
        Ok(v) => v.gossip.shutdown().await,
        Err(_) => bail!("victim still shared"),
    }
    let t_down = Instant::now();
    while nodes
        .iter()
        .any(|n| n.gossip.live_peers() != args.nodes - 2)
    {
        if t_down.elapsed() > Duration::from_secs(10) {
            bail!("departure not seen");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let sample = recent.lock().clone();
    let t_restart = Instant::now();
    let fresh = start_node(addr, &[seed], args).await?;
    let mut done = false;
    while t_restart.elapsed() < Duration::from_secs(30) {
        let mut m = PrefixMatches::default();
        let now = now_ms();
        let ok = sample.iter().all(|(inst, p)| {
            fresh.gossip.materialize(p, now);
            fresh.index.match_prefix(p, now, &mut m);
            m.get(*inst).total() as usize == p.len()
        });
        if ok {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let caught = t_restart.elapsed();
    let st = fresh.index.stats();
    println!(
        "restart catch-up: {} of {} sampled recent prompts fully visible after {:.0} ms (replica had {} local + {} peer entries before; restarted one holds {} peer entries)",
        if done { "all" } else { "NOT all" },
        sample.len(),
        caught.as_secs_f64() * 1e3,
        local_entries[Source::Local as usize],
        local_entries[Source::Peer as usize],
        st.entries_by_source[Source::Peer as usize]
    );
    fresh.gossip.shutdown().await;
    for n in nodes {
        if let Ok(n) = Arc::try_unwrap(n) {
            n.gossip.shutdown().await;
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    rec.install().context("install recorder")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        for &s in &args.scenarios {
            run(&args, s, &snap).await?;
        }
        Ok(())
    })
}
