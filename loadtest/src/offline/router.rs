//! The routing side of the simulation: the gateway's routing core, used exactly as the gateway
//! uses it, but fed virtual time.
//!
//! Invariants:
//! - Per request: match the chain against the placement index, build one [`Candidate`] per
//!   instance (matched blocks by tier, router-tracked load, last scraped engine load, rates,
//!   capacity), let the policy decide, tell it where the request went, insert the prediction
//!   (`Source::Local`, the gateway's TTL) when predictions are on, and take a [`LoadGuard`].
//! - The guard advances at the request's first token and is dropped at completion, like the
//!   gateway's response-body guards, so router-tracked load never leaks.
//! - Engine KV events (when on) are applied to the index at the end of the step that produced them.
//! - Engine-reported load is refreshed on the gateway's scrape interval, never fresher.
//! - Tie-breaking seeds are a pure function of the run seed and the request number.

use std::sync::Arc;

use kvgate_core::index::{IndexConfig, PlacementIndex, PrefixMatches};
use kvgate_core::load::{
    EngineLoad, InstanceRates, LoadGuard, LoadTracker, RateConfig, RateEstimator,
};
use kvgate_core::policy::{Candidate, Policy, RouteRequest};
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

/// Router-side settings (defaults mirror the gateway's `[routing]` section).
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
    /// When set, rates are learned from every request's time to first token as the gateway
    /// learns them (starting from these settings, whose starting values are used instead of
    /// `rates`); otherwise `rates` stay fixed.
    pub learn_rates: Option<RateConfig>,
    /// Capacity of each instance's KV cache in blocks, as the engine would report it, in
    /// instance order (instances of different classes differ).
    pub capacity_blocks: Vec<u64>,
    /// The index's per-instance entry bound as a multiple of `capacity_blocks`: above 1 leaves
    /// room for predictions beside the event-sourced entries that mirror a full engine cache.
    pub index_capacity_factor: f64,
    /// How often engine-reported load is scraped; 0 disables scraping.
    pub scrape_interval_ms: u64,
}

impl RouterSettings {
    /// The gateway's `[routing]` defaults (predicted TTL 120 s, 64 index shards, 8 M entries,
    /// expiry sweep every second, starting rates 8,000 prefill tokens/s and 0.5 ms decode
    /// interference), both index sources, metrics scraped every second, and `capacity_blocks`
    /// of each instance as the engines report it, with an index bound of twice that.
    pub fn gateway_defaults(capacity_blocks: Vec<u64>) -> Self {
        Self {
            index_mode: IndexMode::Both,
            predicted_ttl_ms: 120_000,
            index: IndexConfig {
                shards: 64,
                max_entries: 8_000_000,
                default_instance_capacity: 262_144,
            },
            expire_interval_ms: 1_000,
            rates: InstanceRates {
                prefill_tokens_per_s: 8_000.0,
                decode_interference_ms: 0.5,
            },
            learn_rates: None,
            capacity_blocks,
            index_capacity_factor: 2.0,
            scrape_interval_ms: 1_000,
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

/// Routing state of one simulated gateway.
pub struct SimRouter {
    index: PlacementIndex,
    tracker: Arc<LoadTracker>,
    policy: Box<dyn Policy>,
    settings: RouterSettings,
    block_tokens: u32,
    seed: u64,
    matches: PrefixMatches,
    candidates: Vec<Candidate>,
    text: Vec<u8>,
    engine_loads: Vec<Option<EngineLoad>>,
    next_scrape_ms: Millis,
    next_expire_ms: Millis,
    /// Outstanding guards by request number; `None` once finished (or never dispatched).
    guards: Vec<Option<LoadGuard>>,
    /// Learned rates, when learning.
    estimator: Option<RateEstimator>,
    /// What each request's rate observation needs from its dispatch: uncached tokens, prefill
    /// tokens queued ahead of it and sequences decoding on its instance.
    dispatched: Vec<(u64, u64, u32)>,
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
        let index = PlacementIndex::new(settings.index.clone());
        let estimator = settings
            .learn_rates
            .clone()
            .map(|cfg| RateEstimator::new(cfg, instances));
        // An instance without a listed capacity keeps the index's default bound.
        for (i, &cap) in settings.capacity_blocks.iter().enumerate().take(instances) {
            let bound = (cap as f64 * settings.index_capacity_factor.max(0.0)).ceil();
            index.set_instance_capacity(InstanceId(i as u32), (bound as usize).max(1));
        }
        let mut guards = Vec::with_capacity(requests);
        guards.resize_with(requests, || None);
        Self {
            index,
            tracker: Arc::new(LoadTracker::new(instances)),
            policy,
            settings,
            block_tokens,
            seed,
            matches: PrefixMatches::default(),
            candidates: Vec::with_capacity(instances),
            text: Vec::new(),
            engine_loads: vec![None; instances],
            next_scrape_ms: 0,
            next_expire_ms: 0,
            guards,
            estimator,
            dispatched: vec![(0, 0, 0); requests],
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

    /// Marks the scrape at `now` done.
    pub fn scraped(&mut self, now: Millis) {
        self.next_scrape_ms = now + self.settings.scrape_interval_ms;
    }

    /// Routes request number `id`.
    pub fn route(&mut self, id: usize, req: &OfflineRequest, now: Millis) -> Routed {
        if self.settings.index_mode.is_on() {
            if now >= self.next_expire_ms {
                self.index.expire(now);
                self.next_expire_ms = now + self.settings.expire_interval_ms.max(1);
            }
            self.index.match_prefix(&req.blocks, now, &mut self.matches);
        }
        render_text(
            &req.blocks,
            req.prompt_tokens,
            self.block_tokens,
            id,
            &mut self.text,
        );
        self.candidates.clear();
        for i in 0..self.engine_loads.len() {
            let inst = InstanceId(i as u32);
            self.candidates.push(Candidate {
                id: inst,
                matched: self.matches.get(inst),
                load: self.tracker.snapshot(inst),
                engine: self.engine_loads[i],
                rates: match &self.estimator {
                    Some(e) => e.rates(inst),
                    None => self.settings.rates,
                },
                cache_capacity_blocks: self.settings.capacity_blocks.get(i).copied(),
            });
        }
        let route_req = RouteRequest {
            hashes: &req.blocks,
            tokens_per_block: self.block_tokens,
            prompt_tokens: req.prompt_tokens,
            text: &self.text,
            seed: request_seed(self.seed, id as u64),
            now,
        };
        // Candidates are never empty (the fleet has at least one engine, checked by the caller).
        let (chosen, matched) = match self.policy.decide(&route_req, &self.candidates) {
            Some(d) => (d.chosen, d.matched_blocks),
            None => (InstanceId(0), 0),
        };
        self.policy.on_routed(&route_req, chosen);
        if self.settings.index_mode.predicts() {
            self.index.predict(
                chosen,
                &req.blocks,
                Source::Local,
                self.settings.predicted_ttl_ms,
                now,
            );
        }
        let cached_tokens = u64::from(matched) * u64::from(self.block_tokens);
        let uncached = u64::from(req.prompt_tokens).saturating_sub(cached_tokens);
        let at_dispatch = self.tracker.snapshot(chosen);
        if let Some(slot) = self.dispatched.get_mut(id) {
            *slot = (
                uncached,
                at_dispatch.pending_prefill_tokens,
                at_dispatch.decoding,
            );
        }
        let guard = self.tracker.dispatch(chosen, uncached);
        if let Some(slot) = self.guards.get_mut(id) {
            *slot = Some(guard);
        }
        Routed {
            instance: chosen.index(),
            matched_blocks: matched,
            best_blocks: self.matches.best(),
        }
    }

    /// Request `id`, routed to `instance`, produced its first token `ttft_ms` after dispatch.
    pub fn first_token(&mut self, id: usize, instance: usize, ttft_ms: f64) {
        if let Some(Some(g)) = self.guards.get_mut(id) {
            g.first_token();
        }
        if let (Some(est), Some(&(uncached, ahead, decoding))) =
            (&self.estimator, self.dispatched.get(id))
        {
            est.observe(
                InstanceId(instance as u32),
                uncached,
                ttft_ms,
                ahead,
                decoding,
            );
        }
    }

    /// Request `id` finished: its guard is released.
    pub fn finished(&mut self, id: usize) {
        if let Some(slot) = self.guards.get_mut(id) {
            *slot = None;
        }
    }

    /// Applies one engine KV event from `instance` (a no-op unless events are on).
    pub fn apply_event(&mut self, instance: usize, event: &KvEvent, now: Millis) {
        if !self.settings.index_mode.uses_events() {
            return;
        }
        let inst = InstanceId(instance as u32);
        match event {
            KvEvent::BlockStored {
                block_hashes,
                medium,
                ..
            } => self.index.store(inst, block_hashes, tier(*medium), now),
            KvEvent::BlockRemoved {
                block_hashes,
                medium,
            } => self.index.remove(inst, block_hashes, tier(*medium)),
            KvEvent::AllBlocksCleared => self.index.clear_instance(inst, &[Source::Event]),
        }
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }
}

fn tier(m: Medium) -> Tier {
    match m {
        Medium::Gpu => Tier::Gpu,
        Medium::Cpu => Tier::Cpu,
    }
}

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
fn render_text(
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
