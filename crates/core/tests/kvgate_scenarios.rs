//! The default policy's required behaviours, as explicit scenarios with expected outcomes.

use kvgate_core::index::{IndexConfig, InstanceMatch, PlacementIndex, PrefixMatches};
use kvgate_core::load::{InstanceRates, LoadGuard, LoadTracker, RouterLoad};
use kvgate_core::policy::kvgate::Kvgate;
use kvgate_core::policy::{Candidate, KvgateParams, Policy, RouteRequest};
use kvgate_core::{InstanceId, Source};
use std::collections::VecDeque;
use std::sync::Arc;

const TPB: u32 = 16;
const RATE: f64 = 10_000.0;

fn cand(id: u32, gpu: u32, pending: u64, in_flight: u32) -> Candidate {
    Candidate {
        id: InstanceId(id),
        matched: InstanceMatch {
            instance: InstanceId(id),
            gpu,
            cpu: 0,
            disk: 0,
            fresh: 0,
        },
        load: RouterLoad {
            in_flight,
            pending_prefill_tokens: pending,
            decoding: 0,
            ..RouterLoad::default()
        },
        engine: None,
        rates: InstanceRates {
            prefill_tokens_per_s: RATE,
            decode_interference_ms: 1.0,
        },
        decode: Default::default(),
        cache_capacity_blocks: None,
    }
}

fn req(hashes: &[u64], seed: u64) -> RouteRequest<'_> {
    RouteRequest {
        hashes,
        tokens_per_block: TPB,
        prompt_tokens: hashes.len() as u32 * TPB,
        expected_output_tokens: 100,
        kv_block_tokens: 16,
        text: b"",
        seed,
        concurrent_decisions: 0.0,
        now: 0,
    }
}

fn pick(p: &Kvgate, hashes: &[u64], cs: &[Candidate], seed: u64) -> u32 {
    p.decide(&req(hashes, seed), cs)
        .map_or(u32::MAX, |d| d.chosen.0)
}

/// A closed loop over the real index and load tracker: every routed request is predicted into the
/// index and holds a load guard until `window` later requests have been dispatched.
struct Fleet {
    n: u32,
    index: PlacementIndex,
    load: Arc<LoadTracker>,
    policy: Kvgate,
    guards: VecDeque<LoadGuard>,
    window: usize,
    counts: Vec<u32>,
    buf: PrefixMatches,
}

impl Fleet {
    fn new(n: u32, window: usize) -> Self {
        Self {
            n,
            index: PlacementIndex::new(IndexConfig {
                shards: 8,
                max_entries: 1 << 20,
                default_instance_capacity: 1 << 18,
            }),
            load: Arc::new(LoadTracker::new(n as usize)),
            policy: Kvgate::new(KvgateParams::default()),
            guards: VecDeque::new(),
            window,
            counts: vec![0; n as usize],
            buf: PrefixMatches::default(),
        }
    }

    fn route(&mut self, hashes: &[u64], seed: u64) -> u32 {
        self.index.match_prefix(hashes, 0, &mut self.buf);
        let cs: Vec<Candidate> = (0..self.n)
            .map(|i| Candidate {
                matched: self.buf.get(InstanceId(i)),
                load: self.load.snapshot(InstanceId(i)),
                ..cand(i, 0, 0, 0)
            })
            .collect();
        let r = req(hashes, seed);
        let d = self.policy.decide(&r, &cs).expect("non-empty candidates");
        let uncached = u64::from(r.prompt_tokens - d.matched_blocks * TPB);
        self.index
            .predict(d.chosen, hashes, Source::Local, 60_000, 0);
        self.guards
            .push_back(self.load.dispatch(d.chosen, uncached));
        if self.guards.len() > self.window {
            self.guards.pop_front();
        }
        self.counts[d.chosen.index()] += 1;
        d.chosen.0
    }
}

fn chain(prefix: &[u64], unique: u64, blocks: u64) -> Vec<u64> {
    let mut v = prefix.to_vec();
    v.extend((0..blocks).map(|b| (unique << 20) | b | (1 << 62)));
    v
}

#[test]
fn a_shared_system_prompt_is_not_funnelled() {
    let system: Vec<u64> = (0..32).collect();
    let mut fleet = Fleet::new(4, 16);
    for k in 0..400 {
        fleet.route(&chain(&system, k, 8), k);
    }
    // Every instance learned the system prompt and takes a fair share of the traffic.
    assert!(fleet.counts.iter().all(|&c| c >= 60), "{:?}", fleet.counts);
    let mut out = PrefixMatches::default();
    fleet.index.match_prefix(&system, 0, &mut out);
    assert_eq!(out.rows.len(), 4);

    // When every instance already holds it, it cancels out and load alone decides.
    let p = Kvgate::default();
    let cs = vec![
        cand(0, 32, 4000, 3),
        cand(1, 32, 0, 0),
        cand(2, 32, 2000, 1),
    ];
    assert_eq!(pick(&p, &chain(&system, 1, 8), &cs, 1), 1);
}

#[test]
fn b_single_turn_traffic_spreads_evenly() {
    let mut fleet = Fleet::new(8, 32);
    for k in 0..800 {
        fleet.route(&chain(&[], k, 40), k);
    }
    assert!(
        fleet.counts.iter().all(|&c| (80..=120).contains(&c)),
        "{:?}",
        fleet.counts
    );
}

#[test]
fn c_hot_prefix_spreads_when_its_queue_costs_more_than_a_recompute() {
    let p = Kvgate::default();
    let hashes = chain(&[], 7, 100);
    // Instance 0 holds 90 of 100 blocks. Short queue there: stay (116 ms vs 160 + 180 ms).
    let cs = vec![cand(0, 90, 1_000, 1), cand(1, 0, 0, 0)];
    assert_eq!(pick(&p, &hashes, &cs, 3), 0);
    // Long queue there: its wait (1 016 ms) exceeds recomputing on instance 1 (160 + 288 ms).
    let cs = vec![cand(0, 90, 10_000, 4), cand(1, 0, 0, 0)];
    assert_eq!(pick(&p, &hashes, &cs, 3), 1);

    // Closed loop: one hot prefix, all traffic on it. A second instance picks it up, then both share.
    let hot: Vec<u64> = (0..90).collect();
    let mut fleet = Fleet::new(4, 24);
    for k in 0..300 {
        fleet.route(&chain(&hot, k, 10), k);
    }
    let serving = fleet.counts.iter().filter(|&&c| c >= 30).count();
    assert!(serving >= 2, "{:?}", fleet.counts);
}

#[test]
fn d_recompute_is_priced_higher_as_load_rises() {
    let p = Kvgate::default();
    let hashes = chain(&[], 9, 100);
    // Same absolute imbalance (4 000 tokens more queued on the holder of 90 blocks).
    // Light load: moving is cheaper overall.
    let light = vec![cand(0, 90, 4_000, 2), cand(1, 0, 0, 0)];
    assert_eq!(pick(&p, &hashes, &light, 5), 1);
    // Heavy load (20 waiting requests per instance): redundant prefill would delay everyone, so
    // the cache holder keeps it.
    let heavy = vec![cand(0, 90, 44_000, 22), cand(1, 0, 40_000, 20)];
    assert_eq!(pick(&p, &hashes, &heavy, 5), 0);
    // A TTFT-only greedy scorer (no fleet term) would have moved it: the difference is the fleet term.
    let greedy = Kvgate::new(KvgateParams {
        objective: kvgate_core::policy::Objective::Ttft,
        fleet_weight: 0.0,
        fleet_load_weight: 0.0,
        ..Default::default()
    });
    assert_eq!(pick(&greedy, &hashes, &heavy, 5), 1);
}

#[test]
fn e_ties_are_broken_by_seed_not_position() {
    let p = Kvgate::default();
    let hashes = chain(&[], 11, 20);
    let cs: Vec<Candidate> = (0..8).map(|i| cand(i, 0, 0, 0)).collect();
    let mut rev = cs.clone();
    rev.reverse();
    let mut counts = [0u32; 8];
    for seed in 0..8000 {
        let a = pick(&p, &hashes, &cs, seed);
        assert_eq!(a, pick(&p, &hashes, &rev, seed), "position must not matter");
        assert_eq!(a, pick(&p, &hashes, &cs, seed), "deterministic");
        counts[a as usize] += 1;
    }
    assert!(
        counts.iter().all(|&c| (850..=1150).contains(&c)),
        "{counts:?}"
    );
}

/// A scrape lags: it still reports the router's own request as waiting after it started. Load the
/// router already tracks must not be counted twice, so the cache holder keeps the repeat.
#[test]
fn lagging_scrape_of_own_request_does_not_move_a_cached_prefix() {
    let p = Kvgate::new(KvgateParams::default());
    let hashes: Vec<u64> = (1..=32).collect();
    let mut holder = cand(0, 32, 0, 1);
    holder.load.decoding = 1;
    holder.engine = Some(fresh_scrape(0, 1, 0.1));
    let idle = cand(1, 0, 0, 0);
    for seed in 0..16 {
        assert_eq!(pick(&p, &hashes, &[holder, idle], seed), 0);
    }
}

/// A fresh (not stale) engine scrape.
fn fresh_scrape(running: u32, waiting: u32, kv_usage: f32) -> kvgate_core::load::EngineLoad {
    kvgate_core::load::EngineLoad {
        running,
        waiting,
        kv_usage,
        at: 0,
        stale: false,
        tracked_in_flight: None,
    }
}

/// Work the router cannot see (another client's queue on the engine) still counts.
#[test]
fn foreign_engine_queue_counts_as_load() {
    let p = Kvgate::new(KvgateParams::default());
    let hashes: Vec<u64> = (1..=4).collect();
    let mut busy = cand(0, 0, 0, 0);
    busy.engine = Some(fresh_scrape(8, 20, 0.9));
    let idle = cand(1, 0, 0, 0);
    for seed in 0..16 {
        assert_eq!(pick(&p, &hashes, &[busy, idle], seed), 1);
    }
    // The same scrape, marked stale, is ignored: both are idle and ties spread.
    busy.engine = busy
        .engine
        .map(|e| kvgate_core::load::EngineLoad { stale: true, ..e });
    let picks: std::collections::HashSet<u32> = (0..32)
        .map(|s| pick(&p, &hashes, &[busy, idle], s))
        .collect();
    assert_eq!(picks.len(), 2);
}

/// A scrape taken while the router's own requests ran there, read after they finished: compared
/// with the router's count when it was taken, it holds no foreign work, and the instance that just
/// emptied is the idle one it is. Work beyond that count is still foreign.
#[test]
fn the_routers_own_finished_requests_are_not_foreign_load() {
    let p = Kvgate::new(KvgateParams::default());
    let hashes: Vec<u64> = (1..=4).collect();
    // Instance 0 ran 8 of the router's requests at the scrape; all have finished since.
    let mut emptied = cand(0, 0, 0, 0);
    emptied.engine = Some(kvgate_core::load::EngineLoad {
        tracked_in_flight: Some(8),
        ..fresh_scrape(8, 0, 0.5)
    });
    // Instance 1 streams to one of the router's users.
    let mut one = cand(1, 0, 0, 1);
    one.load.decoding = 1;
    for seed in 0..16 {
        assert_eq!(pick(&p, &hashes, &[emptied, one], seed), 0);
    }
    // Without the count at the scrape, the 8 would pass for another client's work.
    let mut unrecorded = emptied;
    unrecorded.engine = unrecorded.engine.map(|e| kvgate_core::load::EngineLoad {
        tracked_in_flight: None,
        ..e
    });
    for seed in 0..16 {
        assert_eq!(pick(&p, &hashes, &[unrecorded, one], seed), 1);
    }
    // 12 in the engine against 8 of the router's at the scrape: 4 from elsewhere.
    let mut shared = emptied;
    shared.engine = Some(kvgate_core::load::EngineLoad {
        tracked_in_flight: Some(8),
        ..fresh_scrape(12, 0, 0.5)
    });
    for seed in 0..16 {
        assert_eq!(pick(&p, &hashes, &[shared, one], seed), 1);
    }
}

/// A prefix shared by all traffic, held by two instances that are busy (a request prefilling
/// and several users streaming on each) while a third sits idle: the idle instance's time is
/// free for the fleet, so it recomputes the prefix and takes the request. In a closed loop where
/// the holders keep sequences decoding, every instance ends up holding the prefix and serving.
#[test]
fn f_shared_prefix_holders_busier_than_an_idle_instance_lose_traffic_to_it() {
    let p = Kvgate::default();
    let system: Vec<u64> = (0..64).collect();
    let hashes = chain(&system, 1, 36);
    let busy_holder = |id| {
        let mut c = cand(id, 64, 576, 7);
        c.load.decoding = 6;
        c
    };
    let cs = [busy_holder(0), busy_holder(1), cand(2, 0, 0, 0)];
    for seed in 0..32 {
        assert_eq!(pick(&p, &hashes, &cs, seed), 2);
    }
    // Idle holders keep it: the recompute would only add to this request's wait.
    let cs = [cand(0, 64, 0, 0), cand(1, 64, 0, 0), cand(2, 0, 0, 0)];
    for seed in 0..32 {
        assert_ne!(pick(&p, &hashes, &cs, seed), 2);
    }

    // Closed loop with no prefill queue at all: each request's prefill ends before the next
    // arrives and it then decodes while the next 48 requests are dispatched. Only the stall its
    // prefill imposes on a holder's decoding users moves traffic; every instance ends up holding
    // the prefix and serving.
    let mut fleet = Fleet::new(4, 48);
    for k in 0..300 {
        fleet.route(&chain(&system, k, 36), k);
        if let Some(g) = fleet.guards.back_mut() {
            g.first_token();
        }
    }
    assert!(fleet.counts.iter().all(|&c| c >= 40), "{:?}", fleet.counts);
    let mut out = PrefixMatches::default();
    fleet.index.match_prefix(&system, 0, &mut out);
    assert_eq!(out.rows.len(), 4);
}
