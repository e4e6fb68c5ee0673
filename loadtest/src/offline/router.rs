//! The routing side of the simulation: the gateway's routing core, [`Router::route`], called
//! exactly as the gateway calls it, but fed virtual time.
//!
//! Invariants:
//! - Per request: every engine is offered with its last scraped load and capacity; the core
//!   router matches, decides, predicts (when predictions are on) and dispatches, as in the
//!   gateway.
//! - The load guard advances at the request's first token and is dropped at completion, like the
//!   gateway's response-body guards, so router-tracked load never leaks; when learning, the first
//!   token teaches the prefill rates and the completion the decode step model, as a stream does.
//! - Engine KV events (when on) are applied to the index at the end of the step that produced them.
//! - Engine-reported load is refreshed on the gateway's scrape interval, never fresher.
//! - Tie-breaking seeds are a pure function of the run seed and the request number.

use std::sync::Arc;

use kvgate_core::index::{IndexConfig, PlacementIndex};
use kvgate_core::load::{DecodeRateConfig, EngineLoad, InstanceRates, RateConfig};
use kvgate_core::policy::{Policy, RouteRequest};
use kvgate_core::router::{
    BatchSample, Offer, Routed as Dispatched, Router, RouterConfig, Scratch,
};
use kvgate_core::{InstanceId, Millis, Source, Tier};
use kvgate_sim::model::timing::BatchShape;
use kvgate_sim::model::{EngineParams, KvEvent, Medium};

use super::workload::OfflineRequest;

/// Which sources feed the placement index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexMode {
    /// Only the router's own predictions (engines publish no events).
    Predicted,
    /// Only engine KV events.
    Events,
    /// Both, as in production with KV events enabled.
    Both,
    /// No placement index: every candidate is reported with no cached blocks. Routing is then
    /// cache-blind, so this is only faithful for policies that never read the index (round robin,
    /// whose utilisation probes use it to skip all index work).
    Off,
}

impl std::str::FromStr for IndexMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "predicted" => Ok(Self::Predicted),
            "events" => Ok(Self::Events),
            "both" => Ok(Self::Both),
            "off" => Ok(Self::Off),
            other => Err(format!(
                "expected predicted, events, both or off, got `{other}`"
            )),
        }
    }
}

impl IndexMode {
    /// Whether routing decisions are inserted as predictions.
    pub fn predicts(self) -> bool {
        matches!(self, Self::Predicted | Self::Both)
    }
    /// Whether engine KV events are applied.
    pub fn uses_events(self) -> bool {
        matches!(self, Self::Events | Self::Both)
    }
    /// Whether the placement index is consulted at all.
    pub fn is_on(self) -> bool {
        self != Self::Off
    }
}

/// Router-side settings. [`RouterSettings::gateway_defaults`] reads the gateway's `[routing]`
/// defaults, so the simulation routes exactly as a gateway with no routing configuration.
#[derive(Clone, Debug)]
pub struct RouterSettings {
    /// Index sources.
    pub index_mode: IndexMode,
    /// Lifetime of a predicted placement.
    pub predicted_ttl_ms: u64,
    /// Index bounds.
    pub index: IndexConfig,
    /// Sweep interval for expired predictions.
    pub expire_interval_ms: u64,
    /// Starting rates of every instance.
    pub rates: InstanceRates,
    /// When set, rates are learned from every request's time to first token and decode steps
    /// from its inter-token timing, as the gateway learns them (starting from these settings,
    /// whose starting prefill values are used instead of `rates`); otherwise `rates` and
    /// `decode_rates`' starting values stay fixed.
    pub learn_rates: Option<RateConfig>,
    /// Decode step model: starting values and learning bounds.
    pub decode_rates: DecodeRateConfig,
    /// Expected output tokens of a request that does not bound them (simulated requests always
    /// do, as the live replayer sets `max_tokens` to the trace's output length).
    pub initial_output_tokens: f64,
    /// Capacity of each instance's KV cache in blocks, as the engine would report it, in
    /// instance order (instances of different classes differ).
    pub capacity_blocks: Vec<u64>,
    /// The index's per-instance entry bound as a multiple of `capacity_blocks`: above 1 leaves
    /// room for predictions beside the event-sourced entries that mirror a full engine cache.
    pub index_capacity_factor: f64,
    /// How often engine-reported load is scraped; 0 disables scraping.
    pub scrape_interval_ms: u64,
    /// How long after the step that produced them an engine's KV events reach the index, ms
    /// (0: at the step's end, as a subscriber with no transport or ingest delay sees them).
    pub event_lag_ms: u64,
    /// Small requests routed before the workload, as `compare` warms every router under test up
    /// with one before its replay: they move stateful rotations (round robin's next instance)
    /// and leave a prediction of one block, and finish before the first arrival.
    pub warm_up_requests: u32,
    /// Whether requests arriving at the same instant reach the router in a seeded random order
    /// rather than the workload's (see `engine_loop::arrival_order`).
    pub shuffle_simultaneous: bool,
    /// How long a request takes from its arrival to the policy, virtual µs per 1,000 prompt
    /// tokens (0: at once). Live, the body is built, sent, read, parsed and hashed first, in time
    /// that grows with the prompt, so a long prompt reaches the decision after a short one sent
    /// a few milliseconds later: the order the router decides in is not the trace's.
    pub ingest_us_per_ktoken: f64,
    /// Each request's extra delay to the policy, uniform in `[0, ingest_jitter_us)` virtual µs,
    /// drawn from the seed (0: none): the live path's jitter, which reorders requests sent
    /// within it of each other.
    pub ingest_jitter_us: u64,
}

impl RouterSettings {
    /// The gateway's `[routing]` and `[load]` defaults (predicted TTL, index bounds and sweep,
    /// starting rates, decode step model, scrape interval), both index sources, and
    /// `capacity_blocks` of each instance as the engines report it.
    pub fn gateway_defaults(capacity_blocks: Vec<u64>) -> Self {
        let cfg = kvgate::config::Config::default();
        let r = &cfg.routing;
        let core = r.router_config();
        Self {
            index_mode: IndexMode::Both,
            predicted_ttl_ms: core.predicted_ttl_ms,
            index: r.index.to_core(),
            expire_interval_ms: r.index.expire_interval_ms,
            rates: core.rates.initial(),
            learn_rates: None,
            decode_rates: core.decode_rates,
            initial_output_tokens: core.initial_output_tokens,
            capacity_blocks,
            index_capacity_factor: r.index.capacity_factor,
            scrape_interval_ms: cfg.load.poll_interval_ms,
            event_lag_ms: 0,
            warm_up_requests: 0,
            shuffle_simultaneous: false,
            ingest_us_per_ktoken: 0.0,
            ingest_jitter_us: 0,
        }
    }

    /// When request number `id` (arriving at `arrival_us` with `prompt_tokens`) reaches the
    /// policy, virtual µs: its arrival plus the ingest time of
    /// [`RouterSettings::ingest_us_per_ktoken`] and a draw of
    /// [`RouterSettings::ingest_jitter_us`] from `seed`. Saturates at the end of the clock.
    pub fn decision_at_us(&self, id: usize, arrival_us: u64, prompt_tokens: u32, seed: u64) -> u64 {
        // Float to integer saturates (and maps NaN to 0); a negative rate is no delay.
        let ingest =
            (f64::from(prompt_tokens) * self.ingest_us_per_ktoken.max(0.0) / 1000.0) as u64;
        let jitter = if self.ingest_jitter_us > 0 {
            request_seed(seed ^ INGEST_SALT, id as u64) % self.ingest_jitter_us
        } else {
            0
        };
        arrival_us.saturating_add(ingest).saturating_add(jitter)
    }

    /// The core router's configuration for these settings.
    fn router_config(&self) -> RouterConfig {
        let rates = self.learn_rates.clone().unwrap_or_else(|| RateConfig {
            prefill_tokens_per_s: self.rates.prefill_tokens_per_s,
            decode_interference_ms: self.rates.decode_interference_ms,
            ..RateConfig::default()
        });
        RouterConfig {
            predicted_ttl_ms: self.predicted_ttl_ms,
            predict: self.index_mode.predicts(),
            match_index: self.index_mode.is_on(),
            rates,
            decode_rates: self.decode_rates.clone(),
            initial_output_tokens: self.initial_output_tokens,
        }
    }
}

/// The rates a well-calibrated gateway would use for engines of `params`: the prefill throughput
/// of one full chunk from an empty context, and the step time one decoding sequence with
/// `typical_ctx_tokens` of context adds (what a request's prefill step pays per decoding
/// neighbour).
pub fn nominal_rates(params: &EngineParams, typical_ctx_tokens: u32) -> InstanceRates {
    let t = &params.timing;
    let mut chunk = BatchShape::default();
    chunk.add_prefill(0, params.max_num_batched_tokens.max(1));
    let chunk_s = t.step_us(&chunk) as f64 / 1e6;
    let mut one = BatchShape::default();
    one.add_decode(typical_ctx_tokens);
    let per_seq_us = t.step_us(&one) as f64 - t.step_base_us;
    InstanceRates {
        prefill_tokens_per_s: f64::from(params.max_num_batched_tokens.max(1)) / chunk_s.max(1e-9),
        decode_interference_ms: (per_seq_us / 1e3).max(0.0),
    }
}

/// The decode step model of engines of `params`, as a calibrated gateway would start from.
pub fn nominal_decode_rates(params: &EngineParams) -> DecodeRateConfig {
    let t = &params.timing;
    DecodeRateConfig {
        step_ms: t.step_base_us / 1e3,
        per_seq_ms: t.decode_us_per_seq / 1e3,
        per_kctx_ms: t.decode_ns_per_ctx_token / 1e3,
        ..DecodeRateConfig::default()
    }
}

/// Block hash of the warm-up requests' prompt (one block; no workload's chain starts with it but
/// by a 2⁻⁶⁴ accident).
const WARM_UP_HASH: u64 = 0x7761_726d_2d75_7000;

/// Routing state of one simulated gateway: the core [`Router`] driven in virtual time.
pub struct SimRouter {
    router: Router,
    policy: Box<dyn Policy>,
    settings: RouterSettings,
    block_tokens: u32,
    seed: u64,
    scratch: Scratch,
    text: Vec<u8>,
    engine_loads: Vec<Option<EngineLoad>>,
    next_scrape_ms: Millis,
    next_expire_ms: Millis,
    /// Outstanding requests by number; `None` once finished (or never dispatched).
    live: Vec<Option<Live>>,
}

/// A dispatched request, until it finishes.
struct Live {
    routed: Dispatched,
    /// Its first token, in virtual ms, and the decode batch then.
    first_token: Option<(f64, BatchSample)>,
}

/// What the router decided for one request.
#[derive(Clone, Copy, Debug)]
pub struct Routed {
    /// Chosen engine.
    pub instance: usize,
    /// Leading blocks the index believed the chosen engine held.
    pub matched_blocks: u32,
    /// The longest leading run the index believed any engine held.
    pub best_blocks: u32,
    /// The policy's predicted cost of the chosen engine, ms.
    pub predicted_cost_ms: f64,
}

impl SimRouter {
    /// A router over `instances` engines for `requests` requests.
    pub fn new(
        policy: Box<dyn Policy>,
        settings: RouterSettings,
        instances: usize,
        requests: usize,
        block_tokens: u32,
        seed: u64,
    ) -> Self {
        let index = Arc::new(PlacementIndex::new(settings.index.clone()));
        // An instance without a listed capacity keeps the index's default bound; one with a
        // capacity gets the bound the gateway gives an engine reporting it.
        let bounds = kvgate::config::IndexSection {
            capacity_factor: settings.index_capacity_factor,
            ..kvgate::config::IndexSection::default()
        };
        for (i, &cap) in settings.capacity_blocks.iter().enumerate().take(instances) {
            let bound = bounds.instance_capacity(cap).max(1);
            index.set_instance_capacity(InstanceId(i as u32), bound);
        }
        let mut live = Vec::with_capacity(requests);
        live.resize_with(requests, || None);
        Self {
            router: Router::new(settings.router_config(), index, instances, 1),
            policy,
            settings,
            block_tokens,
            seed,
            scratch: Scratch::default(),
            text: Vec::new(),
            engine_loads: vec![None; instances],
            next_scrape_ms: 0,
            next_expire_ms: 0,
            live,
        }
    }

    /// Whether engine-reported load should be refreshed at `now` (the caller then calls
    /// [`SimRouter::set_engine_load`] for every instance).
    pub fn scrape_due(&self, now: Millis) -> bool {
        self.settings.scrape_interval_ms > 0 && now >= self.next_scrape_ms
    }

    /// Records a scraped engine load.
    pub fn set_engine_load(&mut self, instance: usize, load: EngineLoad) {
        if let Some(slot) = self.engine_loads.get_mut(instance) {
            *slot = Some(load);
        }
    }

    /// Requests this router has in flight to `instance` (what a scrape taken now is compared
    /// against: see [`EngineLoad::tracked_in_flight`]).
    pub fn in_flight(&self, instance: usize) -> u32 {
        self.router
            .load()
            .snapshot(InstanceId(instance as u32))
            .in_flight
    }

    /// How long KV events take to reach the index, ms (see [`RouterSettings::event_lag_ms`]).
    pub fn event_lag_ms(&self) -> u64 {
        self.settings.event_lag_ms
    }

    /// Routes the configured warm-up requests at `now`: each a one-block prompt of its own
    /// (`compare`'s "warm-up" message) asking for one token. They are not run on an engine: live,
    /// each finishes before the replay starts, so its load is released at once here.
    pub fn warm_up(&mut self, now: Millis) {
        for k in 0..self.settings.warm_up_requests {
            let req = OfflineRequest {
                arrival_us: now.saturating_mul(1000),
                prompt_tokens: self.block_tokens,
                output_tokens: 1,
                blocks: vec![WARM_UP_HASH ^ u64::from(k)],
            };
            // An id past every request's slot: nothing is kept for it, so its load guard drops
            // when `route` returns.
            self.route(usize::MAX - k as usize, &req, now);
        }
    }

    /// Whether simultaneous arrivals are shuffled (see [`RouterSettings::shuffle_simultaneous`]).
    pub fn shuffles_simultaneous(&self) -> bool {
        self.settings.shuffle_simultaneous
    }

    /// When request number `id` reaches the policy (see [`RouterSettings::decision_at_us`]).
    pub fn decision_at_us(&self, id: usize, arrival_us: u64, prompt_tokens: u32, seed: u64) -> u64 {
        self.settings
            .decision_at_us(id, arrival_us, prompt_tokens, seed)
    }

    /// Marks the scrape at `now` done.
    pub fn scraped(&mut self, now: Millis) {
        self.next_scrape_ms = now + self.settings.scrape_interval_ms;
    }

    /// Routes request number `id`.
    pub fn route(&mut self, id: usize, req: &OfflineRequest, now: Millis) -> Routed {
        if self.settings.index_mode.is_on() && now >= self.next_expire_ms {
            self.router.index().expire(now);
            self.next_expire_ms = now + self.settings.expire_interval_ms.max(1);
        }
        render_text(
            &req.blocks,
            req.prompt_tokens,
            self.block_tokens,
            id,
            &mut self.text,
        );
        let route_req = RouteRequest {
            hashes: &req.blocks,
            tokens_per_block: self.block_tokens,
            prompt_tokens: req.prompt_tokens,
            expected_output_tokens: self.router.expected_output(0, Some(req.output_tokens)),
            kv_block_tokens: self.block_tokens,
            text: &self.text,
            seed: request_seed(self.seed, id as u64),
            concurrent_decisions: 0.0,
            now,
        };
        let capacities = &self.settings.capacity_blocks;
        let offers = self
            .engine_loads
            .iter()
            .enumerate()
            .map(|(i, &engine)| Offer {
                id: InstanceId(i as u32),
                engine,
                cache_capacity_blocks: capacities.get(i).copied(),
            });
        let Some(routed) =
            self.router
                .route(&*self.policy, &route_req, offers, None, &mut self.scratch)
        else {
            // The fleet has at least one engine (checked by the caller), so this is unreachable;
            // answer like an empty decision rather than panic.
            return Routed {
                instance: 0,
                matched_blocks: 0,
                best_blocks: 0,
                predicted_cost_ms: 0.0,
            };
        };
        let out = Routed {
            instance: routed.decision.chosen.index(),
            matched_blocks: routed.decision.matched_blocks,
            best_blocks: routed.best_blocks,
            predicted_cost_ms: routed.decision.predicted_cost_ms,
        };
        if let Some(slot) = self.live.get_mut(id) {
            *slot = Some(Live {
                routed,
                first_token: None,
            });
        }
        out
    }

    /// Request `id`, routed to `instance`, produced its first token `ttft_ms` after dispatch, at
    /// virtual time `now_ms`.
    pub fn first_token(&mut self, id: usize, instance: usize, ttft_ms: f64, now_ms: f64) {
        let inst = InstanceId(instance as u32);
        let learn = self.settings.learn_rates.is_some();
        let Some(Some(live)) = self.live.get_mut(id) else {
            return;
        };
        live.routed.guard.first_token();
        live.first_token = Some((now_ms, self.router.batch(inst, None)));
        if learn {
            let uncached = live.routed.size().uncached_prefill_tokens;
            self.router
                .observe_first_token(inst, uncached, live.routed.at_dispatch, ttft_ms);
        }
    }

    /// Request `id` finished at virtual time `now_ms` after producing `output_tokens`: its load
    /// is released and, when learning, its decode observed.
    pub fn finished(&mut self, id: usize, now_ms: f64, output_tokens: u32) {
        let Some(live) = self.live.get_mut(id).and_then(Option::take) else {
            return;
        };
        let inst = live.routed.guard.instance();
        if let (Some((first_ms, at_first)), true) =
            (live.first_token, self.settings.learn_rates.is_some())
        {
            let at_end = self.router.batch(inst, None);
            self.router
                .observe_finish(0, inst, output_tokens, now_ms - first_ms, at_first, at_end);
        }
    }

    /// Applies one engine KV event from `instance` (a no-op unless events are on).
    pub fn apply_event(&mut self, instance: usize, event: &KvEvent, now: Millis) {
        if !self.settings.index_mode.uses_events() {
            return;
        }
        let inst = InstanceId(instance as u32);
        let index = self.router.index();
        match event {
            KvEvent::BlockStored {
                block_hashes,
                medium,
                ..
            } => index.store(inst, block_hashes, tier(*medium), now),
            KvEvent::BlockRemoved {
                block_hashes,
                medium,
            } => index.remove(inst, block_hashes, tier(*medium)),
            KvEvent::AllBlocksCleared => index.clear_instance(inst, &[Source::Event]),
        }
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// The learned (or fixed) decode step model of `instance`.
    pub fn decode_rates(&self, instance: usize) -> kvgate_core::load::DecodeRates {
        self.router
            .decode_rates()
            .rates(InstanceId(instance as u32))
    }
}

fn tier(m: Medium) -> Tier {
    match m {
        Medium::Gpu => Tier::Gpu,
        Medium::Cpu => Tier::Cpu,
    }
}

/// Separates the ingest jitter's draws from the other draws of the same seed.
const INGEST_SALT: u64 = 0x696e_6765_7374_2121;

/// Per-request tie-breaking seed: SplitMix64 of the run seed and the request number.
pub fn request_seed(seed: u64, n: u64) -> u64 {
    let mut z = seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Prompt "text" for character-based policies: 8 bytes per full block (the block hash, so two
/// prompts share leading bytes exactly as far as they share blocks), then, for a trailing partial
/// block, bytes unique to this request in proportion to its length. Prefix match *rates* are thus
/// the same as over real text, at an eighth of a byte per token.
pub fn render_text(
    blocks: &[u64],
    prompt_tokens: u32,
    block_tokens: u32,
    id: usize,
    out: &mut Vec<u8>,
) {
    out.clear();
    out.reserve(blocks.len() * 8 + 8);
    for h in blocks {
        out.extend_from_slice(&h.to_le_bytes());
    }
    let tail_tokens = prompt_tokens.saturating_sub(blocks.len() as u32 * block_tokens);
    if tail_tokens > 0 {
        let tail_bytes = ((tail_tokens as usize * 8) / block_tokens.max(1) as usize).max(1);
        let mark = request_seed(0x7461_696c, id as u64).to_le_bytes();
        out.extend(mark.iter().cycle().take(tail_bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_shares_prefix_exactly_as_blocks_do() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        render_text(&[1, 2, 3], 48, 16, 0, &mut a);
        render_text(&[1, 2, 4], 50, 16, 1, &mut b);
        assert_eq!(a.len(), 24);
        assert_eq!(b.len(), 25);
        assert_eq!(a[..16], b[..16]);
        assert_ne!(a[16..24], b[16..24]);
    }

    #[test]
    fn a_request_reaches_the_policy_after_its_ingest_time() {
        let mut s = RouterSettings::gateway_defaults(vec![]);
        // Off by default: at its arrival.
        assert_eq!(s.decision_at_us(3, 1_000, 50_000, 1), 1_000);
        s.ingest_us_per_ktoken = 400.0;
        assert_eq!(s.decision_at_us(3, 1_000, 50_000, 1), 21_000);
        assert_eq!(s.decision_at_us(3, 1_000, 0, 1), 1_000);
        // A long prompt arriving first reaches it after a short one arriving 5 ms later.
        assert!(s.decision_at_us(0, 0, 50_000, 1) > s.decision_at_us(1, 5_000, 1_000, 1));
        // Jitter: within its bound, drawn per request and seed, the same for the same draw.
        s.ingest_us_per_ktoken = 0.0;
        s.ingest_jitter_us = 1_000;
        let draws: Vec<u64> = (0..64)
            .map(|i| s.decision_at_us(i, 10, 100, 7) - 10)
            .collect();
        assert!(draws.iter().all(|&d| d < 1_000), "{draws:?}");
        assert!(draws.iter().any(|&d| d != draws[0]), "{draws:?}");
        assert_eq!(
            s.decision_at_us(5, 10, 100, 7),
            s.decision_at_us(5, 10, 100, 7)
        );
        assert_ne!(
            (0..64)
                .map(|i| s.decision_at_us(i, 10, 100, 8))
                .collect::<Vec<_>>(),
            draws.iter().map(|d| d + 10).collect::<Vec<_>>()
        );
        // Never past the end of the clock, whatever the rate.
        s.ingest_us_per_ktoken = f64::INFINITY;
        assert_eq!(s.decision_at_us(1, u64::MAX - 5, 1, 1), u64::MAX);
        s.ingest_us_per_ktoken = f64::NAN;
        s.ingest_jitter_us = 0;
        assert_eq!(s.decision_at_us(1, 7, 100, 1), 7);
    }

    #[test]
    fn seeds_are_deterministic_and_spread() {
        assert_eq!(request_seed(1, 2), request_seed(1, 2));
        assert_ne!(request_seed(1, 2), request_seed(1, 3));
        assert_ne!(request_seed(1, 2), request_seed(2, 2));
    }

    #[test]
    fn nominal_rates_of_the_default_class() {
        let r = nominal_rates(&EngineParams::default(), 8192);
        assert!(
            (15_000.0..22_000.0).contains(&r.prefill_tokens_per_s),
            "{r:?}"
        );
        assert!((0.1..2.0).contains(&r.decode_interference_ms), "{r:?}");
    }

    #[test]
    fn index_mode_parses() {
        assert_eq!("both".parse::<IndexMode>(), Ok(IndexMode::Both));
        assert!("x".parse::<IndexMode>().is_err());
        assert_eq!("off".parse::<IndexMode>(), Ok(IndexMode::Off));
        assert!(!IndexMode::Off.predicts() && !IndexMode::Off.uses_events());
        assert!(IndexMode::Predicted.predicts() && !IndexMode::Predicted.uses_events());
        assert!(IndexMode::Events.uses_events() && !IndexMode::Events.predicts());
    }
}
