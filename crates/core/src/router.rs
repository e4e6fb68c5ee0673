//! The one decision sequence: match → candidates → decide → record → predict → dispatch, and the
//! learning that follows a dispatched request (first token, end of its decode).
//!
//! The gateway and the offline simulator both route through [`Router::route`], so a decision is
//! the same function of the same inputs wherever it is made; what differs between them is only
//! what they offer (which instances are usable, what their engines last reported) and when they
//! report back (real streams or virtual time).
//!
//! Invariants:
//! - Pure: no clock (the request carries `now`), no I/O; the peer plane enters through [`Peers`].
//! - Every dispatch returns a [`LoadGuard`]: router-tracked load is released exactly once, when
//!   the caller drops it.
//! - A decision is recorded in the index (as a prediction) and shared with peers only when
//!   [`RouterConfig::predict`] is on, and never for a prompt without a full block. Its leading
//!   blocks that the chosen instance already holds fresh (referenced, and engine-reported or
//!   predicted here within the last eighth of the TTL) are not written again.

use std::sync::Arc;

use crate::index::{PlacementIndex, PrefixMatches};
use crate::load::{
    extend_at_mean, ConcurrentDecisions, DecodeEstimator, DecodeObservation, DecodeRateConfig,
    EngineLoad, LoadGuard, LoadTracker, OutputLengths, RateConfig, RateEstimator, RequestSize,
    RouterLoad,
};
use crate::policy::{Candidate, Decision, Policy, RouteRequest};
use crate::{BlockHash, InstanceId, Millis, Source};

/// What the router needs beyond the policy. The gateway builds it from its `[routing]` config
/// (where the defaults live); the offline simulator reads the same.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterConfig {
    /// Lifetime of a predicted placement, ms.
    pub predicted_ttl_ms: u64,
    /// Whether decisions are inserted into the index as predictions and shared with peers.
    pub predict: bool,
    /// Whether the index is consulted (off: every candidate is reported holding nothing).
    pub match_index: bool,
    /// Prefill-rate learning.
    pub rates: RateConfig,
    /// Decode-rate learning.
    pub decode_rates: DecodeRateConfig,
    /// Expected output tokens of a request that does not bound its output, before any response
    /// has been seen.
    pub initial_output_tokens: f64,
}

/// The replica plane: peers' placements and load. The gateway implements it over gossip.
pub trait Peers {
    /// Brings peers' placements of `hashes` into the index before it is matched.
    fn materialize(&self, hashes: &[BlockHash], now: Millis);
    /// Peers' share of `instance`'s load.
    fn load(&self, instance: InstanceId) -> PeerLoad;
    /// Shares a decision: `chosen` now holds `hashes`, of which `known_blocks` it already held.
    fn record(&self, chosen: InstanceId, hashes: &[BlockHash], known_blocks: usize, now: Millis);
    /// Takes a shared decision back: the request never reached `chosen`, so the blocks past
    /// `known_blocks` will not be there.
    fn retract(&self, chosen: InstanceId, hashes: &[BlockHash], known_blocks: usize, now: Millis);
    /// Peers currently live (deciding requests of their own).
    fn live_peers(&self) -> u32 {
        0
    }
    /// How long a peer's dispatch can go unseen in [`Peers::load`], ms.
    fn unseen_window_ms(&self) -> Millis {
        0
    }
}

/// Peers' share of one instance's load.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PeerLoad {
    /// Their requests there, summed.
    pub load: RouterLoad,
    /// Whether `load`'s decoding sizes cover all of its decoding requests. False when no peer
    /// sent sizes (replicas that predate them, or that do not share them); the sizes are then 0
    /// and the reader estimates them.
    pub sizes_known: bool,
}

/// A usable instance offered to a decision.
#[derive(Clone, Copy, Debug)]
pub struct Offer {
    /// The instance.
    pub id: InstanceId,
    /// What its engine last reported (the caller marks it stale).
    pub engine: Option<EngineLoad>,
    /// Capacity of its KV cache in blocks, if known.
    pub cache_capacity_blocks: Option<u64>,
}

/// Buffers reused across decisions (no allocation per request once warm).
#[derive(Debug, Default)]
pub struct Scratch {
    matches: PrefixMatches,
    candidates: Vec<Candidate>,
}

impl Scratch {
    /// The candidates of the last decision, in offer order.
    pub fn candidates(&self) -> &[Candidate] {
        &self.candidates
    }
}

/// A dispatched request.
#[derive(Debug)]
pub struct Routed {
    /// The decision, with every candidate's score.
    pub decision: Decision,
    /// The request's share of the chosen instance's load (release by dropping).
    pub guard: LoadGuard,
    /// The chosen instance's fleet-wide load just before this dispatch.
    pub at_dispatch: RouterLoad,
    /// The longest leading run any candidate held.
    pub best_blocks: u32,
    /// Leading blocks the index already placed on the chosen instance before this decision
    /// (live entries of any source): what a retraction leaves in place.
    pub known_blocks: u32,
}

impl Routed {
    /// What the request occupies: prefill tokens, decode context, expected output.
    pub fn size(&self) -> RequestSize {
        self.guard.size()
    }
}

/// The decode batch on an instance at one moment, for a decode observation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatchSample {
    /// Sequences decoding.
    pub seqs: f64,
    /// Their total context, tokens.
    pub context_tokens: f64,
    /// Uncached prompt tokens this router's requests had had prefilled on the instance by then
    /// (a running count: between two samples, the prefill work done beside the decode).
    pub prefilled_tokens: u64,
}

impl BatchSample {
    /// The mean batch over a stream's decode, from samples at its first token and at its end
    /// (`other`, whose running prefill count it keeps).
    pub fn mean(self, other: BatchSample) -> BatchSample {
        BatchSample {
            seqs: (self.seqs + other.seqs) / 2.0,
            context_tokens: (self.context_tokens + other.context_tokens) / 2.0,
            prefilled_tokens: other.prefilled_tokens,
        }
    }

    /// Prefill tokens computed on the instance between `self` and a later sample `end`.
    pub fn prefilled_until(self, end: BatchSample) -> u64 {
        end.prefilled_tokens.wrapping_sub(self.prefilled_tokens)
    }
}

/// Routing state shared by every request: index, load, learned rates and output lengths.
pub struct Router {
    cfg: RouterConfig,
    index: Arc<PlacementIndex>,
    load: Arc<LoadTracker>,
    rates: RateEstimator,
    decode: DecodeEstimator,
    outputs: OutputLengths,
    concurrent: ConcurrentDecisions,
}

impl Router {
    /// A router over `instances` instances in `pools` pools, routing against `index`.
    pub fn new(
        cfg: RouterConfig,
        index: Arc<PlacementIndex>,
        instances: usize,
        pools: usize,
    ) -> Self {
        Self {
            rates: RateEstimator::new(cfg.rates.clone(), instances),
            decode: DecodeEstimator::new(cfg.decode_rates.clone(), instances),
            outputs: OutputLengths::new(pools, cfg.initial_output_tokens),
            concurrent: ConcurrentDecisions::default(),
            load: Arc::new(LoadTracker::new(instances)),
            index,
            cfg,
        }
    }

    /// Entries expiring at or after this need no refresh by a decision at `now`: they were
    /// predicted within the last eighth of the TTL (never, when decisions are not predicted).
    fn fresh_from(&self, now: Millis) -> Millis {
        if !self.cfg.predict {
            return Millis::MAX;
        }
        let ttl = self.cfg.predicted_ttl_ms;
        now.saturating_add(ttl - ttl / 8)
    }

    /// The configuration.
    pub fn config(&self) -> &RouterConfig {
        &self.cfg
    }

    /// The placement index.
    pub fn index(&self) -> &Arc<PlacementIndex> {
        &self.index
    }

    /// The router-tracked load.
    pub fn load(&self) -> &Arc<LoadTracker> {
        &self.load
    }

    /// Learned prefill rates.
    pub fn rates(&self) -> &RateEstimator {
        &self.rates
    }

    /// Learned decode rates.
    pub fn decode_rates(&self) -> &DecodeEstimator {
        &self.decode
    }

    /// Learned output lengths.
    pub fn outputs(&self) -> &OutputLengths {
        &self.outputs
    }

    /// Forgets `instance` (it left the fleet; its id may be given to a new instance): its index
    /// entries and capacity, and its learned prefill and decode rates. Its load counters are
    /// untouched: they fall to zero as the requests holding them end.
    pub fn forget_instance(&self, instance: InstanceId) {
        self.index.forget_instance(instance);
        self.rates.reset(instance);
        self.decode.reset(instance);
    }

    /// Expected output tokens of a request to `pool` bounded by `max_tokens`.
    pub fn expected_output(&self, pool: usize, max_tokens: Option<u32>) -> u32 {
        self.outputs.expected(pool, max_tokens)
    }

    /// Decides among `offers` for `req` with `policy`, records the decision and dispatches the
    /// request. `None` when nothing is offered.
    pub fn route(
        &self,
        policy: &dyn Policy,
        req: &RouteRequest<'_>,
        offers: impl IntoIterator<Item = Offer>,
        peers: Option<&dyn Peers>,
        scratch: &mut Scratch,
    ) -> Option<Routed> {
        let now = req.now;
        // With live peers, a policy that decides with them in mind learns how many decisions
        // they take on this same view.
        let concurrent = match peers {
            Some(p) if policy.decides_with_peers() => {
                self.concurrent
                    .observe(now, p.unseen_window_ms(), p.live_peers())
            }
            _ => 0.0,
        };
        let with_peers;
        let req = if concurrent > 0.0 {
            with_peers = RouteRequest {
                concurrent_decisions: concurrent,
                ..*req
            };
            &with_peers
        } else {
            req
        };
        let matched = self.cfg.match_index && !req.hashes.is_empty();
        if matched {
            if let Some(p) = peers {
                p.materialize(req.hashes, now);
            }
            self.index.match_prefix_fresh(
                req.hashes,
                now,
                self.fresh_from(now),
                &mut scratch.matches,
            );
        } else {
            scratch.matches.rows.clear();
        }
        scratch.candidates.clear();
        {
            let rates = self.rates.view();
            let decode = self.decode.view();
            for o in offers {
                scratch.candidates.push(Candidate {
                    id: o.id,
                    matched: scratch.matches.get(o.id),
                    load: fleet_load(self.load.snapshot(o.id), peers, o.id),
                    engine: o.engine,
                    rates: rates.rates(o.id),
                    decode: decode.rates(o.id),
                    cache_capacity_blocks: o.cache_capacity_blocks,
                });
            }
        }
        let decision = policy.decide(req, &scratch.candidates)?;
        policy.on_routed(req, decision.chosen);
        let chosen = scratch.matches.get(decision.chosen);
        let known = chosen.total();
        if self.cfg.predict && !req.hashes.is_empty() {
            // The leading blocks the chosen instance holds fresh are not predicted again: that
            // would only set CLOCK bits already set and push expiries by under an eighth of the
            // TTL, under a write lock per shard.
            let fresh = (chosen.fresh as usize).min(req.hashes.len());
            if fresh < req.hashes.len() {
                self.index.predict(
                    decision.chosen,
                    &req.hashes[fresh..],
                    Source::Local,
                    self.cfg.predicted_ttl_ms,
                    now,
                );
            }
            if let Some(p) = peers {
                p.record(decision.chosen, req.hashes, known as usize, now);
            }
        }
        let at_dispatch = scratch
            .candidates
            .iter()
            .find(|c| c.id == decision.chosen)
            .map(|c| c.load)
            .unwrap_or_default();
        let cached = u64::from(decision.matched_blocks) * u64::from(req.tokens_per_block);
        let prompt = u64::from(req.prompt_tokens);
        let size = RequestSize::new(
            prompt,
            prompt.saturating_sub(cached),
            u64::from(req.expected_output_tokens),
        );
        let guard = self.load.dispatch_sized(decision.chosen, size);
        Some(Routed {
            decision,
            guard,
            at_dispatch,
            best_blocks: scratch.matches.best(),
            known_blocks: known,
        })
    }

    /// Takes back the prediction a decision made (and shared) for `hashes`: its attempt failed
    /// before the instance could compute them (connect error, 502/503), so they will not be
    /// cached there. Blocks the index already placed there before the decision stay; so do
    /// engine-reported ones. Without it the prediction would attract the prompt's next requests
    /// for its whole TTL, and peers would believe it too.
    /// `chosen` and `known_blocks` are the decision's ([`Routed::known_blocks`]).
    pub fn retract(
        &self,
        chosen: InstanceId,
        known_blocks: u32,
        hashes: &[BlockHash],
        peers: Option<&dyn Peers>,
        now: Millis,
    ) {
        if !self.cfg.predict {
            return;
        }
        let known = (known_blocks as usize).min(hashes.len());
        if known == hashes.len() {
            return;
        }
        self.index.retract(chosen, &hashes[known..], Source::Local);
        if let Some(p) = peers {
            p.retract(chosen, hashes, known, now);
        }
    }

    /// Predicts `hashes` on `instance`, which served a request a decision sent elsewhere (a
    /// gateway's fallback, when the endpoint picker's choice could not take it): the blocks will
    /// be cached there, as a decision for it would have predicted, and peers are told. Pair it
    /// with [`Router::retract`] of the decision's own choice. Peers are told the whole chain
    /// (nothing is assumed known of it there).
    pub fn predict_served(
        &self,
        instance: InstanceId,
        hashes: &[BlockHash],
        peers: Option<&dyn Peers>,
        now: Millis,
    ) {
        if !self.cfg.predict || hashes.is_empty() {
            return;
        }
        self.index.predict(
            instance,
            hashes,
            Source::Local,
            self.cfg.predicted_ttl_ms,
            now,
        );
        if let Some(p) = peers {
            p.record(instance, hashes, 0, now);
        }
    }

    /// The decode batch on `instance` now, fleet-wide (this router's sequences and peers').
    pub fn batch(&self, instance: InstanceId, peers: Option<&dyn Peers>) -> BatchSample {
        let l = fleet_load(self.load.snapshot(instance), peers, instance);
        BatchSample {
            seqs: f64::from(l.decoding),
            context_tokens: l.decoding_context_tokens as f64,
            prefilled_tokens: self.load.prefilled_tokens(instance),
        }
    }

    /// Learns from a first token `ttft_ms` after dispatch of a request that had `uncached`
    /// tokens to prefill with `at_dispatch` load on `instance`.
    pub fn observe_first_token(
        &self,
        instance: InstanceId,
        uncached: u64,
        at_dispatch: RouterLoad,
        ttft_ms: f64,
    ) {
        self.rates.observe(
            instance,
            uncached,
            ttft_ms,
            at_dispatch.pending_prefill_tokens,
            at_dispatch.decoding,
        );
    }

    /// Learns from a finished stream on `instance` of `pool`: `output_tokens` produced,
    /// `decode_ms` from its first token to its last, in the batches sampled `at_first` and
    /// `at_end`.
    ///
    /// The decode step model learns decode steps only: the prefill this router placed on the
    /// instance meanwhile (at its learned prefill rate) is taken out of `decode_ms`, because a
    /// step carrying a prefill chunk stalls every sequence decoding there and the policy prices
    /// that stall separately, per prefill. Left in, it would pass for per-sequence cost (arrivals
    /// grow with the batch) and price every busy instance's batch twice. At most
    /// `MAX_STALL_SHARE` of the observed time is taken out: the learned rate may be off, and a
    /// step is never free.
    pub fn observe_finish(
        &self,
        pool: usize,
        instance: InstanceId,
        output_tokens: u32,
        decode_ms: f64,
        at_first: BatchSample,
        at_end: BatchSample,
    ) {
        self.outputs.observe(pool, output_tokens);
        let batch = at_first.mean(at_end);
        let prefilled = at_first.prefilled_until(at_end) as f64;
        let rate = self.rates.rates(instance).prefill_tokens_per_s;
        let stall_ms = (prefilled * 1e3 / rate).min(MAX_STALL_SHARE * decode_ms);
        self.decode.observe(
            instance,
            DecodeObservation {
                gaps: output_tokens.saturating_sub(1),
                decode_ms: decode_ms - stall_ms.max(0.0),
                seqs: batch.seqs,
                context_tokens: batch.context_tokens,
            },
        );
    }
}

/// The largest share of a stream's observed decode time taken to be prefill stalls.
const MAX_STALL_SHARE: f64 = 0.9;

/// This router's load on `id` plus its peers' shares: the fleet-wide queue. Peers share their
/// decoding sequences' sizes with their counts; when none of them did (replicas that predate
/// sizes), peers' sequences are taken to be the size of this router's own on average.
pub fn fleet_load(own: RouterLoad, peers: Option<&dyn Peers>, id: InstanceId) -> RouterLoad {
    let Some(peers) = peers else { return own };
    let PeerLoad {
        load: p,
        sizes_known,
    } = peers.load(id);
    let known = u64::from(own.decoding);
    let count = if sizes_known {
        known
    } else {
        known + u64::from(p.decoding)
    };
    let own_sizes = |total: u64| extend_at_mean(total, known, count);
    RouterLoad {
        in_flight: own.in_flight.saturating_add(p.in_flight),
        pending_prefill_tokens: own
            .pending_prefill_tokens
            .saturating_add(p.pending_prefill_tokens),
        decoding: own.decoding.saturating_add(p.decoding),
        decoding_context_tokens: own_sizes(own.decoding_context_tokens)
            .saturating_add(p.decoding_context_tokens),
        decoding_output_tokens: own_sizes(own.decoding_output_tokens)
            .saturating_add(p.decoding_output_tokens),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::IndexConfig;
    use crate::policy::{build_policy, PolicyConfig};
    use parking_lot::Mutex;

    fn router(instances: usize) -> Router {
        let cfg = RouterConfig {
            predicted_ttl_ms: 60_000,
            predict: true,
            match_index: true,
            rates: RateConfig::default(),
            decode_rates: DecodeRateConfig::default(),
            initial_output_tokens: 200.0,
        };
        let index = Arc::new(PlacementIndex::new(IndexConfig {
            shards: 4,
            max_entries: 100_000,
            default_instance_capacity: 10_000,
        }));
        Router::new(cfg, index, instances, 1)
    }

    fn offers(n: u32) -> Vec<Offer> {
        (0..n)
            .map(|i| Offer {
                id: InstanceId(i),
                engine: None,
                cache_capacity_blocks: None,
            })
            .collect()
    }

    fn request<'a>(hashes: &'a [u64], seed: u64) -> RouteRequest<'a> {
        RouteRequest {
            hashes,
            tokens_per_block: 16,
            prompt_tokens: hashes.len() as u32 * 16,
            expected_output_tokens: 50,
            kv_block_tokens: 16,
            text: b"",
            seed,
            concurrent_decisions: 0.0,
            now: 1_000,
        }
    }

    #[derive(Default)]
    struct Recorder {
        live: u32,
        materialized: Mutex<usize>,
        recorded: Mutex<Vec<(InstanceId, usize, usize)>>,
        retracted: Mutex<Vec<(InstanceId, usize, usize)>>,
    }

    impl Peers for Recorder {
        fn materialize(&self, _: &[BlockHash], _: Millis) {
            *self.materialized.lock() += 1;
        }
        fn load(&self, _: InstanceId) -> PeerLoad {
            PeerLoad {
                load: RouterLoad {
                    in_flight: 2,
                    pending_prefill_tokens: 100,
                    decoding: 1,
                    decoding_context_tokens: 7,
                    decoding_output_tokens: 3,
                },
                sizes_known: true,
            }
        }
        fn record(&self, chosen: InstanceId, hashes: &[BlockHash], known: usize, _: Millis) {
            self.recorded.lock().push((chosen, hashes.len(), known));
        }
        fn retract(&self, chosen: InstanceId, hashes: &[BlockHash], known: usize, _: Millis) {
            self.retracted.lock().push((chosen, hashes.len(), known));
        }
        fn live_peers(&self) -> u32 {
            self.live
        }
        fn unseen_window_ms(&self) -> Millis {
            50
        }
    }

    /// Peers whose share of every instance is one fixed load.
    struct Fixed(PeerLoad);

    impl Peers for Fixed {
        fn materialize(&self, _: &[BlockHash], _: Millis) {}
        fn load(&self, _: InstanceId) -> PeerLoad {
            self.0
        }
        fn record(&self, _: InstanceId, _: &[BlockHash], _: usize, _: Millis) {}
        fn retract(&self, _: InstanceId, _: &[BlockHash], _: usize, _: Millis) {}
    }

    #[test]
    fn fleet_load_adds_peers_sizes_and_scales_its_own_only_when_peers_send_none() {
        let own = RouterLoad {
            in_flight: 3,
            pending_prefill_tokens: 1_000,
            decoding: 2,
            decoding_context_tokens: 4_000,
            decoding_output_tokens: 200,
        };
        let fleet = |load: RouterLoad, sizes_known: bool| {
            let p = Fixed(PeerLoad { load, sizes_known });
            fleet_load(own, Some(&p as &dyn Peers), InstanceId(0))
        };
        let peers = RouterLoad {
            in_flight: 5,
            pending_prefill_tokens: 500,
            decoding: 4,
            decoding_context_tokens: 40_000,
            decoding_output_tokens: 1_000,
        };
        assert_eq!(
            fleet(peers, true),
            RouterLoad {
                in_flight: 8,
                pending_prefill_tokens: 1_500,
                decoding: 6,
                decoding_context_tokens: 44_000,
                decoding_output_tokens: 1_200,
            },
            "peers' own sizes, not this router's mean"
        );
        let blind = RouterLoad {
            decoding_context_tokens: 0,
            decoding_output_tokens: 0,
            ..peers
        };
        assert_eq!(
            fleet(blind, false).decoding_context_tokens,
            12_000,
            "without sizes, 6 sequences at this router's mean of 2,000"
        );
        assert_eq!(fleet(blind, false).decoding_output_tokens, 600);
        let idle = RouterLoad {
            decoding: 0,
            ..blind
        };
        assert_eq!(
            fleet(idle, true).decoding_context_tokens,
            4_000,
            "nothing of peers' decoding"
        );
        assert_eq!(fleet_load(own, None, InstanceId(0)), own);
    }

    /// A policy that remembers the concurrent decisions each request was routed with.
    #[derive(Default)]
    struct Concurrency {
        seen: Mutex<Vec<f64>>,
        with_peers: bool,
    }

    impl Policy for Concurrency {
        fn name(&self) -> &'static str {
            "concurrency"
        }
        fn decides_with_peers(&self) -> bool {
            self.with_peers
        }
        fn decide(&self, req: &RouteRequest<'_>, cs: &[Candidate]) -> Option<Decision> {
            self.seen.lock().push(req.concurrent_decisions);
            build_policy(&PolicyConfig::default()).decide(req, cs)
        }
    }

    /// Routes bursts of two requests a second (the same millisecond) for 40 seconds with each of
    /// `peers` in turn; returns what `policy` was told of concurrent decisions.
    fn bursts(r: &Router, policy: &Concurrency, peers: &[&Recorder]) -> Vec<f64> {
        let mut scratch = Scratch::default();
        for peers in peers {
            for burst in 0..40u64 {
                for j in 0..2u64 {
                    let hashes = [burst * 10 + j + 1];
                    let req = RouteRequest {
                        now: burst * 1_000,
                        ..request(&hashes, j)
                    };
                    let peers: &dyn Peers = *peers;
                    r.route(policy, &req, offers(3), Some(peers), &mut scratch)
                        .expect("routed");
                }
            }
        }
        policy.seen.lock().clone()
    }

    #[test]
    fn the_policy_is_told_of_peers_deciding_with_it_only_when_there_are_any() {
        let policy = Concurrency {
            with_peers: true,
            ..Concurrency::default()
        };
        let alone = Recorder::default();
        let seven = Recorder {
            live: 7,
            ..Recorder::default()
        };
        let seen = bursts(&router(3), &policy, &[&alone, &seven]);
        assert!(seen[..80].iter().all(|&c| c == 0.0), "no live peers");
        // Half of the decisions find one of its own before it: 7 × 2 × ½ = 7 from peers.
        let last = seen[159];
        assert!((5.0..=7.5).contains(&last), "{last}");
    }

    #[test]
    fn a_policy_that_decides_as_alone_is_never_told_of_peers() {
        let r = router(3);
        let seven = Recorder {
            live: 7,
            ..Recorder::default()
        };
        let alone = bursts(&r, &Concurrency::default(), &[&seven]);
        assert!(alone.iter().all(|&c| c == 0.0));
        // Nothing was counted meanwhile: a policy that asks later starts from an empty estimate.
        let with_peers = Concurrency {
            with_peers: true,
            ..Concurrency::default()
        };
        let seen = bursts(&r, &with_peers, &[&seven]);
        assert_eq!(seen[0], 0.0, "first decision after the policy changed");
    }

    /// Routes `hashes` (request seed `seed`) over the first 3 instances with the default policy.
    fn route3(
        r: &Router,
        scratch: &mut Scratch,
        hashes: &[u64],
        seed: u64,
        peers: Option<&dyn Peers>,
    ) -> Routed {
        let policy = build_policy(&PolicyConfig::default());
        r.route(&*policy, &request(hashes, seed), offers(3), peers, scratch)
            .expect("routed")
    }

    /// Blocks of `hashes` the index places on `id`, leading run.
    fn held(r: &Router, hashes: &[u64], id: InstanceId) -> u32 {
        let mut m = PrefixMatches::default();
        r.index().match_prefix(hashes, 1_000, &mut m);
        m.get(id).total()
    }

    #[test]
    fn a_failed_attempt_takes_its_prediction_back_and_keeps_what_was_known() {
        let r = router(3);
        let peers = Recorder::default();
        let mut scratch = Scratch::default();
        let shared: Vec<u64> = (0..4).collect();
        let first = route3(&r, &mut scratch, &shared, 1, None);
        let chosen = first.decision.chosen;
        drop(first);
        // A longer prompt on the same prefix goes where the prefix is, then fails there.
        let longer: Vec<u64> = (0..10).collect();
        let second = route3(&r, &mut scratch, &longer, 2, Some(&peers));
        assert_eq!(second.decision.chosen, chosen);
        assert_eq!(second.known_blocks, 4);
        assert_eq!(held(&r, &longer, chosen), 10);
        r.retract(chosen, second.known_blocks, &longer, Some(&peers), 1_000);
        assert_eq!(held(&r, &longer, chosen), 4, "the earlier prefix stays");
        assert_eq!(peers.retracted.lock()[0], (chosen, 10, 4));
        // Engine-reported blocks are never taken back.
        r.index().store(chosen, &longer, crate::Tier::Gpu, 1_000);
        r.retract(chosen, second.known_blocks, &longer, None, 1_000);
        assert_eq!(held(&r, &longer, chosen), 10);
    }

    #[test]
    fn a_placement_is_predicted_again_only_once_an_eighth_of_its_ttl_has_passed() {
        // TTL 60 s: routed again 5 s later the blocks are fresh and keep their first expiry
        // (61 s); 8 s later they are predicted again and expire at 69 s.
        for (again_at, held_at_65s) in [(6_000, 0), (9_000, 10)] {
            let r = router(3);
            let mut scratch = Scratch::default();
            let policy = build_policy(&PolicyConfig::default());
            let hashes: Vec<u64> = (0..10).collect();
            let first = r
                .route(
                    &*policy,
                    &request(&hashes, 1),
                    offers(3),
                    None,
                    &mut scratch,
                )
                .expect("routed");
            let chosen = first.decision.chosen;
            drop(first);
            let mut again = request(&hashes, 2);
            again.now = again_at;
            let second = r
                .route(&*policy, &again, offers(3), None, &mut scratch)
                .expect("routed");
            assert_eq!(second.decision.chosen, chosen);
            assert_eq!(second.known_blocks, 10);
            let mut m = PrefixMatches::default();
            r.index().match_prefix(&hashes, 65_000, &mut m);
            assert_eq!(
                m.get(chosen).total(),
                held_at_65s,
                "routed again at {again_at}"
            );
        }
    }

    #[test]
    fn a_request_served_elsewhere_moves_its_prediction_there() {
        let r = router(3);
        let peers = Recorder::default();
        let mut scratch = Scratch::default();
        let hashes: Vec<u64> = (0..6).collect();
        let routed = route3(&r, &mut scratch, &hashes, 1, Some(&peers));
        let chosen = routed.decision.chosen;
        let other = InstanceId((chosen.0 + 1) % 3);
        r.retract(chosen, routed.known_blocks, &hashes, Some(&peers), 1_000);
        r.predict_served(other, &hashes, Some(&peers), 1_000);
        assert_eq!(
            held(&r, &hashes, chosen),
            0,
            "taken off the decision's choice"
        );
        assert_eq!(held(&r, &hashes, other), 6, "placed where it was served");
        assert_eq!(peers.recorded.lock().last(), Some(&(other, 6, 0)));
        // Without prediction the index is left alone.
        let mut off = router(3);
        off.cfg.predict = false;
        off.predict_served(other, &hashes, None, 1_000);
        assert_eq!(held(&off, &hashes, other), 0);
    }

    #[test]
    fn a_decision_is_predicted_dispatched_shared_and_released() {
        let r = router(3);
        let policy = build_policy(&PolicyConfig::default());
        let peers = Recorder::default();
        let hashes: Vec<u64> = (0..8).collect();
        let mut scratch = Scratch::default();
        let first = route3(&r, &mut scratch, &hashes, 1, Some(&peers));
        let chosen = first.decision.chosen;
        assert_eq!(first.size().uncached_prefill_tokens, 128);
        assert_eq!(first.size().expected_output_tokens, 50);
        assert_eq!(r.load().snapshot(chosen).in_flight, 1);
        assert_eq!(first.at_dispatch.in_flight, 2, "peers' load is counted");
        assert_eq!(*peers.materialized.lock(), 1);
        assert_eq!(peers.recorded.lock()[0], (chosen, 8, 0));
        // The prediction makes the next identical prompt a full match there.
        let second = route3(&r, &mut scratch, &hashes, 2, None);
        let held = scratch
            .candidates()
            .iter()
            .find(|c| c.id == chosen)
            .map(|c| c.matched.total());
        assert_eq!(held, Some(8));
        assert_eq!(second.best_blocks, 8);
        drop(first);
        drop(second);
        for i in 0..3 {
            assert_eq!(r.load().snapshot(InstanceId(i)), RouterLoad::default());
        }
        // Nothing offered, nothing routed.
        assert!(r
            .route(
                &*policy,
                &request(&hashes, 3),
                Vec::new(),
                None,
                &mut scratch
            )
            .is_none());
    }

    #[test]
    fn without_prediction_the_index_is_left_alone() {
        let mut r = router(2);
        r.cfg.predict = false;
        let policy = build_policy(&PolicyConfig::default());
        let hashes: Vec<u64> = (0..4).collect();
        let mut scratch = Scratch::default();
        let _g = r.route(
            &*policy,
            &request(&hashes, 1),
            offers(2),
            None,
            &mut scratch,
        );
        assert!(r.index().is_empty());
    }

    #[test]
    fn the_decode_batch_counts_peers_with_their_sizes() {
        let r = router(1);
        let mut g = r
            .load()
            .dispatch_sized(InstanceId(0), RequestSize::new(1000, 1000, 100));
        g.first_token();
        let own = r.batch(InstanceId(0), None);
        assert_eq!(
            own,
            BatchSample {
                seqs: 1.0,
                context_tokens: 1050.0,
                prefilled_tokens: 1000,
            }
        );
        let peers = Recorder::default();
        let both = r.batch(InstanceId(0), Some(&peers));
        // One own sequence of 1050 and one peer's of the 7 it says.
        assert_eq!(both.seqs, 2.0);
        assert_eq!(both.context_tokens, 1057.0);
        assert_eq!(own.mean(both).seqs, 1.5);
    }

    #[test]
    fn finished_streams_teach_decode_rates_and_output_lengths() {
        let r = router(1);
        let before = r.decode_rates().rates(InstanceId(0));
        let batch = BatchSample {
            seqs: 4.0,
            context_tokens: 40_000.0,
            prefilled_tokens: 0,
        };
        for _ in 0..500 {
            r.observe_finish(0, InstanceId(0), 101, 100.0 * 40.0, batch, batch);
        }
        let after = r.decode_rates().rates(InstanceId(0));
        assert!(after.tpot_ms(4.0, 40_000.0) > 2.0 * before.tpot_ms(4.0, 40_000.0));
        assert!(
            (after.tpot_ms(4.0, 40_000.0) - 40.0).abs() < 4.0,
            "{after:?}"
        );
        assert!(r.expected_output(0, None) < 200);
        assert_eq!(r.expected_output(0, Some(9)), 9);
    }

    /// Streams that decoded beside prefills teach the pace of their decode steps, not of the
    /// stalls: the same steps (40 ms) with 8,000 tokens prefilled beside each stream, at the
    /// configured 8,000 tokens/s (1 s of stall per stream), are learned at the same pace as
    /// without them.
    #[test]
    fn prefill_stalls_beside_a_stream_are_not_learned_as_decode_pace() {
        let r = router(1);
        let rate = r.rates().rates(InstanceId(0)).prefill_tokens_per_s;
        let stall_ms = 8_000.0 * 1e3 / rate;
        let at_first = BatchSample {
            seqs: 4.0,
            context_tokens: 40_000.0,
            prefilled_tokens: u64::MAX - 1_000,
        };
        // The running count wraps.
        let at_end = BatchSample {
            prefilled_tokens: 6_999,
            ..at_first
        };
        assert_eq!(at_first.prefilled_until(at_end), 8_000);
        for _ in 0..500 {
            r.observe_finish(
                0,
                InstanceId(0),
                101,
                100.0 * 40.0 + stall_ms,
                at_first,
                at_end,
            );
        }
        let tpot = r.decode_rates().rates(InstanceId(0)).tpot_ms(4.0, 40_000.0);
        assert!((tpot - 40.0).abs() < 4.0, "{tpot}");
        // Taken whole, the stalls would have read as 50 ms steps.
        let naive = router(1);
        for _ in 0..500 {
            naive.observe_finish(
                0,
                InstanceId(0),
                101,
                100.0 * 40.0 + stall_ms,
                at_first,
                at_first,
            );
        }
        let naive = naive
            .decode_rates()
            .rates(InstanceId(0))
            .tpot_ms(4.0, 40_000.0);
        assert!(naive > tpot + 0.5 * stall_ms / 100.0, "{naive} vs {tpot}");
    }

    /// A prefill count beyond what the observed time allows (a learned rate too low) never
    /// makes a decode look free.
    #[test]
    fn an_overestimated_stall_leaves_part_of_the_observed_time() {
        let r = router(1);
        let at_first = BatchSample {
            seqs: 1.0,
            context_tokens: 1_000.0,
            prefilled_tokens: 0,
        };
        let at_end = BatchSample {
            prefilled_tokens: 100_000_000,
            ..at_first
        };
        for _ in 0..500 {
            r.observe_finish(0, InstanceId(0), 101, 1_000.0, at_first, at_end);
        }
        let tpot = r.decode_rates().rates(InstanceId(0)).tpot_ms(1.0, 1_000.0);
        assert!(tpot > 0.5, "{tpot}");
        assert!(tpot.is_finite());
    }
}
