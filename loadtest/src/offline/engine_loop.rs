//! The discrete-event loop: arrivals and engine steps in virtual time.
//!
//! Invariants:
//! - Events are processed in (time, seeded tie-break) order; the tie-break is a pure function of
//!   the run seed and a sequence number, so a run is a pure function of (workload, fleet, policy
//!   configuration, router settings, seed).
//! - An engine with work always has exactly one step in flight: a step is started when a request
//!   reaches an engine that is not stepping, and again at the end of each step while the engine
//!   still has work. A step's effects (first tokens, completions, KV events) become visible at
//!   its end time; KV events reach the router's index `event_lag_ms` later (in the order the
//!   steps ended), before any event at or after that time is processed.
//! - A request reaches the router at its decision time (its arrival plus the router settings'
//!   ingest time: `RouterSettings::decision_at_us`), requests in the order of those times; its
//!   latencies count from its arrival.
//! - Everything is bounded by the workload: one arrival event pending at a time, at most one step
//!   event per engine, per-request state in vectors sized once.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Instant;

use kvgate_core::load::EngineLoad;
use kvgate_sim::model::{EngineModel, EngineParams, KvEvent, SimRequest, StepOutcome};

use super::result::{ClassResult, PolicyResult, TimelinePoint};
use super::router::{nominal_rates, request_seed, SimRouter};
use super::summary::Dist;
use super::workload::Workload;
use super::OfflineError;

/// One engine of the simulated fleet.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineSpec {
    /// Its class (the preset name), a label in reports.
    pub preset: String,
    /// Its parameters.
    pub params: EngineParams,
}

/// The simulated fleet: one parameter set per engine, so engines of different classes (GPU
/// generations, TP sizes) can serve side by side.
///
/// Invariants checked by [`FleetSpec::validate`] (and so by every simulation): at least one
/// engine, every engine's parameters valid, one block size for all of them (the workload is cut
/// in it, and a router hashes in it).
#[derive(Clone, Debug, PartialEq)]
pub struct FleetSpec {
    /// The engines, in instance order.
    pub engines: Vec<EngineSpec>,
}

/// Label of the engines of a fleet built from bare parameters.
pub const CUSTOM_CLASS: &str = "custom";

impl FleetSpec {
    /// `engines` identical engines of `params`, labelled [`CUSTOM_CLASS`].
    pub fn uniform(engines: usize, params: EngineParams) -> Self {
        Self::of_class(engines, CUSTOM_CLASS, params)
    }

    /// `engines` identical engines of `params`, labelled `preset`.
    pub fn of_class(engines: usize, preset: &str, params: EngineParams) -> Self {
        FleetSpec {
            engines: (0..engines)
                .map(|_| EngineSpec {
                    preset: preset.to_string(),
                    params: params.clone(),
                })
                .collect(),
        }
    }

    /// The engines a simulator fleet configuration describes (presets, fleet string, overrides).
    pub fn from_config(cfg: &kvgate_sim::FleetConfig) -> Result<Self, OfflineError> {
        let engines = cfg
            .per_engine_params()
            .map_err(|e| OfflineError::Engine(e.to_string()))?
            .into_iter()
            .map(|(preset, params)| EngineSpec { preset, params })
            .collect();
        Ok(FleetSpec { engines })
    }

    /// Number of engines.
    pub fn len(&self) -> usize {
        self.engines.len()
    }

    /// Whether the fleet has no engine.
    pub fn is_empty(&self) -> bool {
        self.engines.is_empty()
    }

    /// Tokens per block (the first engine's; [`FleetSpec::validate`] checks they all agree).
    pub fn block_size(&self) -> u32 {
        self.engines.first().map_or(0, |e| e.params.block_size)
    }

    /// KV capacity of each engine in blocks, GPU + CPU, in instance order.
    pub fn instance_capacity_blocks(&self) -> Vec<u64> {
        self.engines
            .iter()
            .map(|e| u64::from(e.params.num_gpu_blocks) + u64::from(e.params.num_cpu_blocks))
            .collect()
    }

    /// KV capacity of each engine in blocks as the engine reports it to a router (its GPU
    /// blocks, as vLLM's `num_gpu_blocks`; the index bound's capacity factor leaves room for the
    /// CPU tier), in instance order.
    pub fn reported_capacity_blocks(&self) -> Vec<u64> {
        self.engines
            .iter()
            .map(|e| u64::from(e.params.num_gpu_blocks))
            .collect()
    }

    /// Total KV capacity of the fleet in blocks, over all engines and tiers.
    pub fn capacity_blocks(&self) -> u64 {
        self.instance_capacity_blocks().iter().sum()
    }

    /// The engine classes in order of first appearance: preset label, engine count and
    /// parameters (engines with the same label and parameters form one class).
    pub fn classes(&self) -> Vec<(String, usize, EngineParams)> {
        let mut out: Vec<(String, usize, EngineParams)> = Vec::new();
        for e in &self.engines {
            match out
                .iter_mut()
                .find(|(p, _, q)| *p == e.preset && *q == e.params)
            {
                Some(c) => c.1 += 1,
                None => out.push((e.preset.clone(), 1, e.params.clone())),
            }
        }
        out
    }

    /// `8 × llama3-8b-h100 (24576 GPU + 0 CPU blocks of 16 tokens)`, one such part per class,
    /// joined by ` + `.
    pub fn describe(&self) -> String {
        self.classes()
            .iter()
            .map(|(preset, n, p)| {
                format!(
                    "{n} × {preset} ({} GPU + {} CPU blocks of {} tokens)",
                    p.num_gpu_blocks, p.num_cpu_blocks, p.block_size
                )
            })
            .collect::<Vec<_>>()
            .join(" + ")
    }

    /// Checks the invariants above.
    pub fn validate(&self) -> Result<(), OfflineError> {
        if self.engines.is_empty() {
            return Err(OfflineError::Param(
                "the fleet needs at least one engine".into(),
            ));
        }
        let bs = self.block_size();
        for (i, e) in self.engines.iter().enumerate() {
            e.params
                .validate()
                .map_err(|err| OfflineError::Engine(format!("engine {i} ({}): {err}", e.preset)))?;
            if e.params.block_size != bs {
                return Err(OfflineError::Param(format!(
                    "engine {i} ({}) uses {}-token blocks, engine 0 {bs}: a fleet shares one block size",
                    e.preset, e.params.block_size
                )));
            }
        }
        Ok(())
    }
}

/// Number of timeline buckets a run reports (at most).
const TIMELINE_BUCKETS: u64 = 120;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// The `k`-th arrival in [`arrival_order`] (not request number `k`).
    Arrival(u32),
    StepEnd(u32),
}

/// Per-bucket accumulators of the timeline.
#[derive(Clone, Copy, Default)]
struct Bucket {
    prompt: u64,
    cached: u64,
    ttft_sum: f64,
    ttft_n: u64,
    spread_weighted: f64,
    in_flight_weighted: f64,
    weight: f64,
}

/// Time-weighted load-spread accumulator over the per-instance in-flight counts.
struct Spread {
    in_flight: Vec<u32>,
    total: u64,
    max: u32,
    last_us: u64,
    weighted: f64,
    weight: f64,
}

impl Spread {
    fn new(n: usize) -> Self {
        Self {
            in_flight: vec![0; n],
            total: 0,
            max: 0,
            last_us: 0,
            weighted: 0.0,
            weight: 0.0,
        }
    }

    /// Closes the interval since the last change; returns (duration, spread, mean in flight).
    fn close(&mut self, now_us: u64) -> (f64, f64, f64) {
        let dt = now_us.saturating_sub(self.last_us) as f64;
        self.last_us = now_us;
        if self.total == 0 || dt == 0.0 {
            return (dt, 0.0, 0.0);
        }
        let mean = self.total as f64 / self.in_flight.len() as f64;
        let spread = f64::from(self.max) / mean;
        self.weighted += spread * dt;
        self.weight += dt;
        (dt, spread, mean)
    }

    fn add(&mut self, i: usize) {
        self.in_flight[i] += 1;
        self.total += 1;
        self.max = self.max.max(self.in_flight[i]);
    }

    fn remove(&mut self, i: usize) {
        let was = self.in_flight[i];
        self.in_flight[i] = was.saturating_sub(1);
        self.total = self.total.saturating_sub(1);
        if was == self.max {
            self.max = self.in_flight.iter().copied().max().unwrap_or(0);
        }
    }
}

/// Request numbers in the order they reach the policy, given the time each does (`at`, one per
/// request): time order, equal times in request order, and with `shuffle` each run of requests
/// reaching it at the same instant in a random order drawn from `seed` (live, the replayer sends
/// such a burst concurrently and its requests reach the gateway in no fixed order; in index
/// order, a rotation would pin the same request to the same place every run).
fn arrival_order(at: &[u64], seed: u64, shuffle: bool) -> Vec<u32> {
    let mut order: Vec<u32> = (0..at.len() as u32).collect();
    // Stable: equal times keep request order.
    order.sort_by_key(|&i| at[i as usize]);
    if !shuffle {
        return order;
    }
    let mut draws = 0u64;
    let mut start = 0;
    while start < order.len() {
        let t = at[order[start] as usize];
        let end = start
            + order[start..]
                .iter()
                .take_while(|&&i| at[i as usize] == t)
                .count();
        // Fisher–Yates over the run.
        for j in (start + 1..end).rev() {
            draws += 1;
            let pick = start
                + (request_seed(seed ^ SHUFFLE_SALT, draws) % (j - start + 1) as u64) as usize;
            order.swap(j, pick);
        }
        start = end;
    }
    order
}

/// Separates the shuffle's draws from the tie-break's, which use the same seed.
const SHUFFLE_SALT: u64 = 0x7368_7566_666c_6521;

/// Runs the workload through the fleet with `router` deciding. `seed` orders simultaneous events.
pub fn simulate(
    workload: &Workload,
    fleet: &FleetSpec,
    mut router: SimRouter,
    seed: u64,
) -> Result<PolicyResult, OfflineError> {
    let started = Instant::now();
    fleet.validate()?;
    if fleet.block_size() != workload.block_tokens {
        return Err(OfflineError::Param(format!(
            "workload cut in {}-token blocks but engines use {}",
            workload.block_tokens,
            fleet.block_size()
        )));
    }
    let n_engines = fleet.len();
    let mut engines: Vec<EngineModel> = fleet
        .engines
        .iter()
        .map(|e| EngineModel::new(e.params.clone()))
        .collect();
    let reqs = &workload.requests;
    let n = reqs.len();
    let first_arrival = reqs.first().map_or(0, |r| r.arrival_us);
    let last_arrival = reqs.last().map_or(0, |r| r.arrival_us);
    let bucket_us = (workload.span_us() / TIMELINE_BUCKETS).max(1_000_000);

    let mut heap: BinaryHeap<Reverse<(u64, u64, Ev)>> = BinaryHeap::new();
    let mut seq: u64 = 0;
    let mut push = |heap: &mut BinaryHeap<Reverse<(u64, u64, Ev)>>, t: u64, ev: Ev| {
        seq += 1;
        heap.push(Reverse((t, request_seed(seed, seq), ev)));
    };
    // When each request reaches the policy (its arrival plus the router's ingest time); times
    // (TTFT, E2E) still count from its arrival.
    let decide_at: Vec<u64> = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| router.decision_at_us(i, r.arrival_us, r.prompt_tokens, seed))
        .collect();
    let order = arrival_order(&decide_at, seed, router.shuffles_simultaneous());
    if let Some(&i) = order.first() {
        push(&mut heap, decide_at[i as usize], Ev::Arrival(0));
    }

    let mut steps = Steps {
        pending: (0..n_engines).map(|_| None).collect(),
        start: vec![0; n_engines],
        prefill: vec![0; n_engines],
        tokens: vec![0; n_engines],
    };
    let mut busy_in_window = vec![0u64; n_engines];
    // Prefill work in seconds at each engine's own nominal rate, so engines of different classes
    // count by the share of their own capacity they used.
    let mut prefill_s_in_window = 0f64;
    let mut work_in_window = 0f64;
    let base_us: Vec<f64> = fleet
        .engines
        .iter()
        .map(|e| e.params.timing.step_base_us)
        .collect();
    let budget: Vec<f64> = fleet
        .engines
        .iter()
        .map(|e| f64::from(e.params.max_num_batched_tokens.max(1)))
        .collect();
    let prefill_rate: Vec<f64> = fleet
        .engines
        .iter()
        .map(|e| nominal_rates(&e.params, 0).prefill_tokens_per_s.max(1e-9))
        .collect();
    let mut placed: Vec<u32> = vec![u32::MAX; n];
    let mut ttft_us: Vec<Option<u64>> = vec![None; n];
    let mut done_us: Vec<Option<u64>> = vec![None; n];
    let mut rejected = vec![false; n];
    let mut cached_at_first = vec![0u32; n];
    let mut per_instance = vec![0u64; n_engines];
    let mut router_matched_tokens = 0u64;
    let mut router_best_tokens = 0u64;
    let mut spread = Spread::new(n_engines);
    let mut buckets: Vec<Bucket> = Vec::new();
    let mut now = first_arrival;
    spread.last_us = first_arrival;
    // KV events on their way to the index: (time they arrive, engine, event), in arrival order
    // (the lag is one constant, so steps' end order is arrival order). Holds at most the events
    // of the steps ending within one lag.
    let event_lag_us = router.event_lag_ms().saturating_mul(1000);
    let mut in_transit: VecDeque<(u64, usize, KvEvent)> = VecDeque::new();
    router.warm_up(first_arrival / 1000);

    let bucket_of = |t: u64| ((t.saturating_sub(first_arrival)) / bucket_us) as usize;
    // Attributes the closed in-flight interval ending at `t` to its bucket (by its end).
    let close_spread = |spread: &mut Spread, buckets: &mut Vec<Bucket>, t: u64| {
        let (dt, s, mean) = spread.close(t);
        if dt > 0.0 && mean > 0.0 {
            let b = bucket_of(t);
            if buckets.len() <= b {
                buckets.resize(b + 1, Bucket::default());
            }
            buckets[b].spread_weighted += s * dt;
            buckets[b].in_flight_weighted += mean * dt;
            buckets[b].weight += dt;
        }
    };

    while let Some(Reverse((t, _, ev))) = heap.pop() {
        now = t;
        let now_ms = now / 1000;
        while in_transit.front().is_some_and(|(at, _, _)| *at <= now) {
            if let Some((at, e, kv)) = in_transit.pop_front() {
                router.apply_event(e, &kv, at / 1000);
            }
        }
        match ev {
            Ev::Arrival(k) => {
                let k = k as usize;
                if let Some(&next) = order.get(k + 1) {
                    push(
                        &mut heap,
                        decide_at[next as usize],
                        Ev::Arrival((k + 1) as u32),
                    );
                }
                let Some(&i) = order.get(k) else { continue };
                let i = i as usize;
                if router.scrape_due(now_ms) {
                    for (e, eng) in engines.iter().enumerate() {
                        let l = eng.load();
                        let tracked = router.in_flight(e);
                        router.set_engine_load(
                            e,
                            EngineLoad {
                                running: l.running,
                                waiting: l.waiting,
                                kv_usage: l.kv_usage as f32,
                                at: now_ms,
                                stale: false,
                                tracked_in_flight: Some(tracked),
                            },
                        );
                    }
                    router.scraped(now_ms);
                }
                let r = &reqs[i];
                let routed = router.route(i, r, now_ms);
                let e = routed.instance.min(n_engines - 1);
                placed[i] = e as u32;
                per_instance[e] += 1;
                router_matched_tokens += (u64::from(routed.matched_blocks)
                    * u64::from(workload.block_tokens))
                .min(u64::from(r.prompt_tokens));
                router_best_tokens += (u64::from(routed.best_blocks)
                    * u64::from(workload.block_tokens))
                .min(u64::from(r.prompt_tokens));
                close_spread(&mut spread, &mut buckets, now);
                spread.add(e);
                let sim_req = SimRequest {
                    id: i as u64,
                    blocks: r.blocks.clone(),
                    block_tokens: Vec::new(),
                    prompt_tokens: r.prompt_tokens,
                    output_tokens: r.output_tokens,
                };
                engines[e].submit(sim_req, now);
                if steps.pending[e].is_none() {
                    start_step(&mut engines[e], e, now, &mut steps, &mut push, &mut heap);
                }
            }
            Ev::StepEnd(e) => {
                let e = e as usize;
                let Some(out) = steps.pending[e].take() else {
                    continue;
                };
                let begun = steps.start[e];
                let (lo, hi) = (begun.max(first_arrival), now.min(last_arrival));
                let inside = hi.saturating_sub(lo);
                busy_in_window[e] += inside;
                if now > begun {
                    let share = inside as f64 / (now - begun) as f64;
                    prefill_s_in_window += steps.prefill[e] as f64 * share / prefill_rate[e];
                    // The fixed per-step cost counts as work in proportion to the token budget
                    // the step used: a step running a handful of decodes is mostly spare capacity.
                    let step_us = (now - begun) as f64;
                    let fixed = base_us[e].min(step_us);
                    let fill = (steps.tokens[e] as f64 / budget[e]).min(1.0);
                    work_in_window += (step_us - fixed + fixed * fill) * share;
                }
                for &(id, cached) in &out.first_tokens {
                    let i = id as usize;
                    if i >= n || ttft_us[i].is_some() {
                        continue;
                    }
                    let ttft = now.saturating_sub(reqs[i].arrival_us);
                    ttft_us[i] = Some(ttft);
                    cached_at_first[i] = cached;
                    router.first_token(i, placed[i] as usize, ttft as f64 / 1e3, now as f64 / 1e3);
                    let b = bucket_of(now);
                    if buckets.len() <= b {
                        buckets.resize(b + 1, Bucket::default());
                    }
                    buckets[b].prompt += u64::from(reqs[i].prompt_tokens);
                    buckets[b].cached += u64::from(cached);
                    buckets[b].ttft_sum += ttft as f64 / 1e6;
                    buckets[b].ttft_n += 1;
                }
                for &id in out.finished.iter().chain(out.rejected.iter()) {
                    let i = id as usize;
                    if i >= n || done_us[i].is_some() {
                        continue;
                    }
                    done_us[i] = Some(now);
                    let produced = if out.rejected.contains(&id) {
                        rejected[i] = true;
                        0
                    } else {
                        reqs[i].output_tokens
                    };
                    router.finished(i, now as f64 / 1e3, produced);
                    close_spread(&mut spread, &mut buckets, now);
                    spread.remove(placed[i] as usize);
                }
                for ev in engines[e].drain_kv_events() {
                    if event_lag_us == 0 {
                        router.apply_event(e, &ev, now_ms);
                    } else {
                        in_transit.push_back((now + event_lag_us, e, ev));
                    }
                }
                if !engines[e].is_idle() {
                    start_step(&mut engines[e], e, now, &mut steps, &mut push, &mut heap);
                }
            }
        }
    }

    // Collect.
    let mut ttfts: Vec<f64> = Vec::with_capacity(n);
    let mut e2es: Vec<f64> = Vec::with_capacity(n);
    let mut completed = 0usize;
    let mut n_rejected = 0usize;
    let mut output_tokens = 0u64;
    let mut last_done = first_arrival;
    for i in 0..n {
        if rejected[i] {
            n_rejected += 1;
            continue;
        }
        if let Some(t) = ttft_us[i] {
            ttfts.push(t as f64 / 1e6);
        }
        if let Some(d) = done_us[i] {
            completed += 1;
            output_tokens += u64::from(reqs[i].output_tokens);
            e2es.push(d.saturating_sub(reqs[i].arrival_us) as f64 / 1e6);
            last_done = last_done.max(d);
        }
    }
    let (mut cached, mut prompt) = (0u64, 0u64);
    for eng in &engines {
        let s = eng.stats();
        cached += s.prefix_cache_hits;
        prompt += s.prefix_cache_queries;
    }
    let classes = class_results(
        fleet, &engines, &placed, &rejected, &ttft_us, &done_us, reqs,
    );
    let instances =
        super::instances::instance_results(&engines, &placed, &rejected, &ttft_us, &done_us, reqs);
    let makespan_s = last_done.max(now).saturating_sub(first_arrival) as f64 / 1e6;
    let total_reqs: u64 = per_instance.iter().sum();
    let instance_share: Vec<f64> = per_instance
        .iter()
        .map(|&c| {
            if total_reqs == 0 {
                0.0
            } else {
                c as f64 / total_reqs as f64
            }
        })
        .collect();
    let mean_share = 1.0 / n_engines as f64;
    let max_share = instance_share.iter().copied().fold(0.0, f64::max);
    let window = last_arrival.saturating_sub(first_arrival) as f64 * n_engines as f64;
    let busy: u64 = busy_in_window.iter().sum();
    let total_prompt_all = workload.prompt_tokens();
    let timeline = buckets
        .iter()
        .enumerate()
        .map(|(b, k)| TimelinePoint {
            t_s: (b as u64 * bucket_us) as f64 / 1e6,
            hit_ratio: ratio(k.cached as f64, k.prompt as f64),
            load_spread: ratio(k.spread_weighted, k.weight),
            mean_in_flight: ratio(k.in_flight_weighted, k.weight),
            mean_ttft_s: ratio(k.ttft_sum, k.ttft_n as f64),
        })
        .collect();
    Ok(PolicyResult {
        policy: router.policy_name().to_string(),
        requests: n,
        completed,
        rejected: n_rejected,
        unfinished: n - completed - n_rejected,
        ttft_s: Dist::of(&mut ttfts),
        e2e_s: Dist::of(&mut e2es),
        output_tokens_per_s: ratio(output_tokens as f64, makespan_s),
        requests_per_s: ratio(completed as f64, makespan_s),
        hit_ratio: ratio(cached as f64, prompt as f64),
        cached_tokens: cached,
        prompt_tokens: prompt,
        router_matched_ratio: ratio(router_matched_tokens as f64, total_prompt_all as f64),
        router_best_ratio: ratio(router_best_tokens as f64, total_prompt_all as f64),
        instance_share,
        classes,
        instances,
        share_max_over_mean: max_share / mean_share,
        load_spread: ratio(spread.weighted, spread.weight),
        busy: ratio(busy as f64, window),
        utilisation: ratio(work_in_window, window),
        prefill_utilisation: ratio(prefill_s_in_window * 1e6, window),
        makespan_s,
        wall_ms: started.elapsed().as_secs_f64() * 1e3,
        timeline,
        records: super::records::request_records(&super::records::RequestTimes {
            reqs,
            placed: &placed,
            rejected: &rejected,
            ttft_us: &ttft_us,
            done_us: &done_us,
            cached: &cached_at_first,
        }),
    })
}

/// Per engine class (by preset label): request share, latencies of the requests its engines
/// served, and their hit ratio from the engines' own counters.
fn class_results(
    fleet: &FleetSpec,
    engines: &[EngineModel],
    placed: &[u32],
    rejected: &[bool],
    ttft_us: &[Option<u64>],
    done_us: &[Option<u64>],
    reqs: &[super::workload::OfflineRequest],
) -> Vec<ClassResult> {
    let mut labels: Vec<&str> = Vec::new();
    for e in &fleet.engines {
        if !labels.contains(&e.preset.as_str()) {
            labels.push(&e.preset);
        }
    }
    let routed = placed.iter().filter(|&&p| p != u32::MAX).count();
    labels
        .into_iter()
        .map(|label| {
            let members: Vec<usize> = (0..fleet.len())
                .filter(|&e| fleet.engines[e].preset == label)
                .collect();
            let (mut ttfts, mut e2es, mut requests) = (Vec::new(), Vec::new(), 0usize);
            for (i, &p) in placed.iter().enumerate() {
                if p == u32::MAX || !members.contains(&(p as usize)) {
                    continue;
                }
                requests += 1;
                if rejected[i] {
                    continue;
                }
                if let Some(t) = ttft_us[i] {
                    ttfts.push(t as f64 / 1e6);
                }
                if let Some(d) = done_us[i] {
                    e2es.push(d.saturating_sub(reqs[i].arrival_us) as f64 / 1e6);
                }
            }
            let (mut cached, mut prompt) = (0u64, 0u64);
            for &e in &members {
                let s = engines[e].stats();
                cached += s.prefix_cache_hits;
                prompt += s.prefix_cache_queries;
            }
            ClassResult {
                preset: label.to_string(),
                engines: members.len(),
                request_share: ratio(requests as f64, routed as f64),
                ttft_s: Dist::of(&mut ttfts),
                e2e_s: Dist::of(&mut e2es),
                hit_ratio: ratio(cached as f64, prompt as f64),
            }
        })
        .collect()
}

pub(crate) fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// The step in flight on each engine.
struct Steps {
    /// Its outcome, revealed at its end; `None` when the engine is not stepping.
    pending: Vec<Option<StepOutcome>>,
    /// When it started.
    start: Vec<u64>,
    /// Prompt tokens it computes.
    prefill: Vec<u64>,
    /// Tokens it processes (prompt tokens computed plus tokens generated).
    tokens: Vec<u64>,
}

fn start_step(
    engine: &mut EngineModel,
    e: usize,
    now: u64,
    steps: &mut Steps,
    push: &mut impl FnMut(&mut BinaryHeap<Reverse<(u64, u64, Ev)>>, u64, Ev),
    heap: &mut BinaryHeap<Reverse<(u64, u64, Ev)>>,
) {
    let before = engine.stats();
    if let Some(out) = engine.step(now) {
        let end = out.end_us.max(now + 1);
        steps.pending[e] = Some(out);
        steps.start[e] = now;
        let after = engine.stats();
        steps.prefill[e] = after
            .prefill_computed_tokens
            .saturating_sub(before.prefill_computed_tokens);
        steps.tokens[e] = steps.prefill[e]
            + after
                .generation_tokens
                .saturating_sub(before.generation_tokens);
        push(heap, end, Ev::StepEnd(e as u32));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_shuffle_requests_arrive_in_workload_order() {
        assert_eq!(
            arrival_order(&[0, 0, 0, 5, 5, 9], 7, false),
            vec![0, 1, 2, 3, 4, 5]
        );
    }

    #[test]
    fn requests_reach_the_policy_in_the_order_of_their_times() {
        // Request 0 arrived first but is decided last (a long prompt's ingest time).
        assert_eq!(arrival_order(&[30, 5, 5, 12], 7, false), vec![1, 2, 3, 0]);
        let a = arrival_order(&[30, 5, 5, 5, 5, 5, 5, 12], 3, true);
        assert_eq!(a[6..], [7, 0]);
        let mut first: Vec<u32> = a[..6].to_vec();
        first.sort_unstable();
        assert_eq!(first, vec![1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn shuffling_permutes_only_requests_of_one_instant() {
        let times: Vec<u64> = (0..40)
            .flat_map(|t| std::iter::repeat_n(t * 10, 9))
            .collect();
        let a = arrival_order(&times, 1, true);
        // A permutation, in time order, equal for equal seeds and not the identity.
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..times.len() as u32).collect::<Vec<_>>());
        assert!(a
            .windows(2)
            .all(|w| times[w[0] as usize] <= times[w[1] as usize]));
        assert_eq!(a, arrival_order(&times, 1, true));
        let moved = a
            .iter()
            .enumerate()
            .filter(|(k, &i)| *k != i as usize)
            .count();
        assert!(moved > times.len() / 2, "{moved} of {} moved", times.len());
        // Another seed, another order; a lone request never moves.
        assert_ne!(a, arrival_order(&times, 2, true));
        assert_eq!(arrival_order(&[0, 3, 8], 1, true), vec![0, 1, 2]);
    }
}
