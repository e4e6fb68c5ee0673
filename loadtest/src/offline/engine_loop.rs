//! The discrete-event loop: arrivals and engine steps in virtual time.
//!
//! Invariants:
//! - Events are processed in (time, seeded tie-break) order; the tie-break is a pure function of
//!   the run seed and a sequence number, so a run is a pure function of (workload, fleet, policy
//!   configuration, router settings, seed).
//! - An engine with work always has exactly one step in flight: a step is started when a request
//!   reaches an engine that is not stepping, and again at the end of each step while the engine
//!   still has work. A step's effects (first tokens, completions, KV events) become visible at
//!   its end time.
//! - Everything is bounded by the workload: one arrival event pending at a time, at most one step
//!   event per engine, per-request state in vectors sized once.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

use kvgate_core::load::EngineLoad;
use kvgate_sim::model::{EngineModel, EngineParams, SimRequest, StepOutcome};

use super::result::{PolicyResult, TimelinePoint};
use super::router::{nominal_rates, request_seed, SimRouter};
use super::summary::Dist;
use super::workload::Workload;
use super::OfflineError;

/// The simulated fleet: identical engines.
#[derive(Clone, Debug)]
pub struct FleetSpec {
    /// Number of engines.
    pub engines: usize,
    /// Parameters of each engine.
    pub params: EngineParams,
}

impl FleetSpec {
    /// Total KV capacity of the fleet in blocks, over all tiers.
    pub fn capacity_blocks(&self) -> u64 {
        self.engines as u64
            * (u64::from(self.params.num_gpu_blocks) + u64::from(self.params.num_cpu_blocks))
    }
}

/// Number of timeline buckets a run reports (at most).
const TIMELINE_BUCKETS: u64 = 120;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
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

/// Runs the workload through the fleet with `router` deciding. `seed` orders simultaneous events.
pub fn simulate(
    workload: &Workload,
    fleet: &FleetSpec,
    mut router: SimRouter,
    seed: u64,
) -> Result<PolicyResult, OfflineError> {
    let started = Instant::now();
    if fleet.engines == 0 {
        return Err(OfflineError::Param(
            "the fleet needs at least one engine".into(),
        ));
    }
    if fleet.params.block_size != workload.block_tokens {
        return Err(OfflineError::Param(format!(
            "workload cut in {}-token blocks but engines use {}",
            workload.block_tokens, fleet.params.block_size
        )));
    }
    fleet
        .params
        .validate()
        .map_err(|e| OfflineError::Engine(e.to_string()))?;
    let mut engines: Vec<EngineModel> = (0..fleet.engines)
        .map(|_| EngineModel::new(fleet.params.clone()))
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
    if let Some(r) = reqs.first() {
        push(&mut heap, r.arrival_us, Ev::Arrival(0));
    }

    let mut steps = Steps {
        pending: (0..fleet.engines).map(|_| None).collect(),
        start: vec![0; fleet.engines],
        prefill: vec![0; fleet.engines],
        tokens: vec![0; fleet.engines],
    };
    let mut busy_in_window = vec![0u64; fleet.engines];
    let mut prefill_in_window = 0f64;
    let mut work_in_window = 0f64;
    let base_us = fleet.params.timing.step_base_us;
    let budget = f64::from(fleet.params.max_num_batched_tokens.max(1));
    let prefill_rate = nominal_rates(&fleet.params, 0).prefill_tokens_per_s;
    let mut placed: Vec<u32> = vec![u32::MAX; n];
    let mut ttft_us: Vec<Option<u64>> = vec![None; n];
    let mut done_us: Vec<Option<u64>> = vec![None; n];
    let mut rejected = vec![false; n];
    let mut per_instance = vec![0u64; fleet.engines];
    let mut router_matched_tokens = 0u64;
    let mut router_best_tokens = 0u64;
    let mut spread = Spread::new(fleet.engines);
    let mut buckets: Vec<Bucket> = Vec::new();
    let mut now = first_arrival;
    spread.last_us = first_arrival;

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
        match ev {
            Ev::Arrival(i) => {
                let i = i as usize;
                if let Some(next) = reqs.get(i + 1) {
                    push(&mut heap, next.arrival_us, Ev::Arrival((i + 1) as u32));
                }
                if router.scrape_due(now_ms) {
                    for (e, eng) in engines.iter().enumerate() {
                        let l = eng.load();
                        router.set_engine_load(
                            e,
                            EngineLoad {
                                running: l.running,
                                waiting: l.waiting,
                                kv_usage: l.kv_usage as f32,
                                at: now_ms,
                                stale: false,
                            },
                        );
                    }
                    router.scraped(now_ms);
                }
                let r = &reqs[i];
                let routed = router.route(i, r, now_ms);
                let e = routed.instance.min(fleet.engines - 1);
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
                    prefill_in_window += steps.prefill[e] as f64 * share;
                    // The fixed per-step cost counts as work in proportion to the token budget
                    // the step used: a step running a handful of decodes is mostly spare capacity.
                    let step_us = (now - begun) as f64;
                    let fixed = base_us.min(step_us);
                    let fill = (steps.tokens[e] as f64 / budget).min(1.0);
                    work_in_window += (step_us - fixed + fixed * fill) * share;
                }
                for &(id, cached) in &out.first_tokens {
                    let i = id as usize;
                    if i >= n || ttft_us[i].is_some() {
                        continue;
                    }
                    let ttft = now.saturating_sub(reqs[i].arrival_us);
                    ttft_us[i] = Some(ttft);
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
                    router.apply_event(e, &ev, now_ms);
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
    let mean_share = 1.0 / fleet.engines as f64;
    let max_share = instance_share.iter().copied().fold(0.0, f64::max);
    let window = last_arrival.saturating_sub(first_arrival) as f64 * fleet.engines as f64;
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
        share_max_over_mean: max_share / mean_share,
        load_spread: ratio(spread.weighted, spread.weight),
        busy: ratio(busy as f64, window),
        utilisation: ratio(work_in_window, window),
        prefill_utilisation: ratio(prefill_in_window / prefill_rate * 1e6, window),
        makespan_s,
        wall_ms: started.elapsed().as_secs_f64() * 1e3,
        timeline,
    })
}

fn ratio(a: f64, b: f64) -> f64 {
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
