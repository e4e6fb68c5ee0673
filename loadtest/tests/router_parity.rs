//! The gateway's routing and the offline simulator's make the same decisions on the same inputs.
//!
//! Both drive the core's one decision sequence (`kvgate_core::router::Router::route`), each with
//! its own glue: the gateway's `Routing::decide` (fleet health, scraped engine load, configured
//! capacities, the pool's policy, the decision log) and the simulator's `SimRouter::route`. This
//! test replays one request stream through both, with the same virtual times, tie-breaking seeds,
//! engine reports, KV events, first tokens and completions, and requires every decision to agree:
//! the chosen instance, its matched blocks and its predicted cost. A default or a step that one
//! glue has and the other lacks shows up here as a diverging decision.

use axum::http::HeaderValue;
use kvgate::clock::Clock;
use kvgate::config::{Config, InstanceConfig, PoolConfig};
use kvgate::fleet::Fleet;
use kvgate::routing::{Moment, Prepared, Routed, Routing};
use kvgate_core::load::EngineLoad;
use kvgate_core::policy::{build_policy, Objective, PolicyName};
use kvgate_core::router::BatchSample;
use kvgate_core::{InstanceId, Tier};
use kvgate_loadtest::offline::router::{render_text, request_seed, SimRouter};
use kvgate_loadtest::offline::{OfflineRequest, RouterSettings, Workload};
use kvgate_sim::model::{KvEvent, Medium};

const ENGINES: usize = 6;
const BLOCK: u32 = 16;
const SEED: u64 = 7;

/// GPU blocks of each engine: two classes, as a mixed fleet reports them.
fn capacities() -> Vec<u64> {
    (0..ENGINES)
        .map(|i| if i % 2 == 0 { 24_576 } else { 12_288 })
        .collect()
}

fn gateway_config(policy: PolicyName, objective: Objective) -> Config {
    let mut c = Config::default();
    let instances = capacities()
        .into_iter()
        .enumerate()
        .map(|(i, cap)| {
            let mut inst =
                InstanceConfig::at(format!("e{i}"), format!("http://127.0.0.1:{}", 9 + i));
            inst.capacity_blocks = Some(cap);
            inst
        })
        .collect();
    let mut pool = PoolConfig::serving("m", instances);
    pool.block_size = Some(BLOCK);
    c.pools = vec![pool];
    c.routing.policy.name = policy;
    c.routing.policy.kvgate.objective = objective;
    c
}

/// The request stream: a synthetic workload in `BLOCK`-token blocks.
fn workload(kind: &str, n: usize) -> Vec<OfflineRequest> {
    let trace = kvgate_loadtest::synth::Workload::named(kind)
        .unwrap()
        .generate(SEED, BLOCK)
        .unwrap();
    let mut w = Workload::from_trace(&trace, BLOCK, 1.0).unwrap();
    w.requests.truncate(n);
    w.requests
}

/// A deterministic stand-in for an engine's answer: time to first token grows with the prompt
/// tokens computed and the requests in flight there; each output token takes 10 ms.
fn ttft_ms(uncached_tokens: u64, in_flight: usize) -> f64 {
    15.0 + uncached_tokens as f64 / 12.0 + 8.0 * in_flight as f64
}

/// A request in flight on both sides.
struct Flight {
    id: usize,
    instance: usize,
    arrival_ms: f64,
    first_ms: f64,
    done_ms: f64,
    output_tokens: u32,
    routed: Routed,
    at_first: Option<BatchSample>,
    blocks: Vec<u64>,
}

fn replay(kind: &str, policy: PolicyName, objective: Objective) {
    let requests = workload(kind, 400);
    let cfg = gateway_config(policy, objective);
    let fleet = Fleet::new(&cfg).unwrap();
    let gw = Routing::new(&cfg, &fleet, Clock::new()).unwrap();
    for inst in fleet.view().instances() {
        let cap = cfg
            .routing
            .index
            .instance_capacity(inst.capacity().unwrap());
        gw.index().set_instance_capacity(inst.id, cap);
    }
    let pool = &fleet.pools()[0];

    let mut settings = RouterSettings::gateway_defaults(capacities());
    // The gateway always learns its rates, starting from its defaults.
    settings.learn_rates = Some(cfg.routing.router_config().rates);
    let expire_ms = settings.expire_interval_ms;
    let mut sim = SimRouter::new(
        build_policy(&cfg.routing.policy),
        settings,
        ENGINES,
        requests.len(),
        BLOCK,
        SEED,
    );

    let rid = HeaderValue::from_static("parity");
    let mut flights: Vec<Flight> = Vec::new();
    let mut next_expire = 0;
    let mut text = Vec::new();
    let mut spread = [0usize; ENGINES];
    for (id, req) in requests.iter().enumerate() {
        // Arrivals are compressed so that requests overlap and load matters.
        let now_ms = req.arrival_us as f64 / 1e3 / 20.0;
        let now = now_ms as u64;
        settle(&gw, &mut sim, &mut flights, now_ms);

        // The scraper's view: one engine report per instance, refreshed on the scrape interval.
        if sim.scrape_due(now) {
            for (i, inst) in fleet.view().instances().enumerate() {
                let on = flights.iter().filter(|f| f.instance == i).count() as u32;
                let load = EngineLoad {
                    running: on.min(4),
                    waiting: on.saturating_sub(4),
                    kv_usage: (on as f32 / 16.0).min(1.0),
                    at: now,
                    stale: false,
                    tracked_in_flight: None,
                };
                inst.engine.set(load);
                sim.set_engine_load(i, load);
            }
            sim.scraped(now);
        }
        // The gateway's sweep of expired predictions, on the simulator's schedule.
        if now >= next_expire {
            gw.index().expire(now);
            next_expire = now + expire_ms.max(1);
        }

        render_text(&req.blocks, req.prompt_tokens, BLOCK, id, &mut text);
        let prep = Prepared {
            hashes: req.blocks.clone(),
            text: text.clone(),
            prompt_tokens: req.prompt_tokens,
            tokens_per_block: BLOCK,
            max_tokens: Some(req.output_tokens),
            fallbacks: 0,
        };
        let at = Moment {
            now,
            seed: request_seed(SEED, id as u64),
            started: std::time::Instant::now(),
        };
        let g = gw
            .decide_at(&fleet, pool, &prep, (&[], None), &rid, at)
            .unwrap();
        let s = sim.route(id, req, now);
        assert_eq!(
            (g.chosen.index(), g.matched_blocks),
            (s.instance, s.matched_blocks),
            "{kind} {policy:?}/{objective:?}: request {id} at {now} ms: gateway chose {} ({} blocks), \
             simulator {} ({} blocks)",
            g.chosen.index(),
            g.matched_blocks,
            s.instance,
            s.matched_blocks
        );
        let (gc, sc) = (g.predicted_cost_ms, s.predicted_cost_ms);
        assert!(
            gc == sc || (gc - sc).abs() <= 1e-9 * gc.abs().max(1.0),
            "{kind} {policy:?}/{objective:?}: request {id}: predicted {gc} vs {sc}"
        );
        spread[s.instance] += 1;

        let on = flights.iter().filter(|f| f.instance == s.instance).count();
        let first_ms = now_ms + ttft_ms(g.learning.uncached_tokens, on);
        flights.push(Flight {
            id,
            instance: s.instance,
            arrival_ms: now_ms,
            first_ms,
            done_ms: first_ms + 10.0 * f64::from(req.output_tokens.saturating_sub(1)),
            output_tokens: req.output_tokens,
            routed: g,
            at_first: None,
            blocks: req.blocks.clone(),
        });
    }
    settle(&gw, &mut sim, &mut flights, f64::MAX);
    // The stream exercised more than one instance, so the decisions compared were choices.
    assert!(
        spread.iter().filter(|&&n| n > 0).count() > 1,
        "{kind} {policy:?}: {spread:?}"
    );
    for i in 0..ENGINES {
        assert_eq!(
            gw.load().snapshot(InstanceId(i as u32)).in_flight,
            0,
            "load released"
        );
    }
}

/// Delivers every first token and completion due by `until_ms`, in time order, to both sides.
fn settle(gw: &Routing, sim: &mut SimRouter, flights: &mut Vec<Flight>, until_ms: f64) {
    loop {
        // The next event: a first token not yet delivered, or a completion.
        let next = flights
            .iter()
            .enumerate()
            .map(|(k, f)| match f.at_first {
                None => (f.first_ms, k, false),
                Some(_) => (f.done_ms, k, true),
            })
            .filter(|&(t, _, _)| t <= until_ms)
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let Some((t, k, done)) = next else { return };
        let f = &mut flights[k];
        let inst = InstanceId(f.instance as u32);
        if !done {
            let observed = t - f.arrival_ms;
            f.routed.guard.first_token();
            f.at_first = Some(gw.observe_ttft(&f.routed.instance, &f.routed.learning, observed));
            sim.first_token(f.id, f.instance, observed, t);
            // The engine reports the prompt's blocks cached once its prefill is done.
            gw.index().store(inst, &f.blocks, Tier::Gpu, t as u64);
            sim.apply_event(
                f.instance,
                &KvEvent::BlockStored {
                    block_hashes: f.blocks.clone(),
                    parent_block_hash: None,
                    token_ids: Vec::new(),
                    block_size: BLOCK,
                    medium: Medium::Gpu,
                },
                t as u64,
            );
        } else {
            let f = flights.swap_remove(k);
            let decode_ms = f.done_ms - f.first_ms;
            if let Some(at_first) = f.at_first {
                gw.observe_decode(
                    &f.routed.instance,
                    &f.routed.learning,
                    f.output_tokens,
                    decode_ms,
                    at_first,
                );
            }
            drop(f.routed);
            sim.finished(f.id, t, f.output_tokens);
        }
    }
}

#[test]
fn the_default_policy_decides_alike_on_every_workload_kind() {
    for kind in ["chat", "long", "mix"] {
        replay(kind, PolicyName::Kvgate, Objective::Ttft);
    }
}

#[test]
fn every_objective_decides_alike() {
    for objective in [Objective::E2e, Objective::Slo] {
        replay("long", PolicyName::Kvgate, objective);
    }
}

#[test]
fn every_baseline_decides_alike() {
    for policy in PolicyName::ALL.into_iter().skip(1) {
        replay("mix", policy, Objective::Ttft);
    }
}
