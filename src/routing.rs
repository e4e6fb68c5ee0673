//! Routing glue: the only module that calls the routing core.
//!
//! For each request: the parsed prompt becomes a block-hash chain (text or token mode), the usable
//! instances not yet tried are offered to the core's [`Router::route`] (the same decision sequence
//! the offline simulator runs: index match, the pool's policy, prediction, load guard), gossip
//! takes part as the router's [`Peers`], and the decision is kept in a bounded log for
//! `/admin/decisions`. The response body reports the first token and the end of a stream back
//! here, where they teach the prefill rates, the decode step model and the output lengths.
//!
//! Invariants:
//! - Time enters the core only as [`Clock::now_ms`].
//! - Engine-reported load older than `load.stale_after_ms` is passed to the core marked stale.
//! - The decision log shows the newest `routing.decision_log_size` decisions and holds at most
//!   [`crate::decision_log::MAX_SHARDS`] times as many.

use crate::clock::Clock;
use crate::config::{Config, HashMode};
use crate::decision_log::ShardedLog;
use crate::error::GatewayError;
use crate::fleet::{Fleet, Instance, Pool};
use crate::metrics;
use crate::proxy::parse::{Prompt, RouteInput};
use kvgate_core::hash::{
    hash_text_blocks, hash_token_blocks, namespace_root, CanonicalPrompt, CanonicalSink, Namespace,
    TextChain,
};
use kvgate_core::index::PlacementIndex;
use kvgate_core::load::{DecodeRates, InstanceRates, LoadGuard, LoadTracker, RouterLoad};
use kvgate_core::policy::util::mix;
use kvgate_core::policy::{build_policy, Decision, Policy, RouteRequest};
use kvgate_core::router::{BatchSample, Offer, PeerLoad, Peers, Router, Scratch};
use kvgate_core::{BlockHash, InstanceId, Millis};
use kvgate_tokenizer::TokenMode;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A request's prompt, hashed for one pool.
#[derive(Debug, Default)]
pub struct Prepared {
    /// Block hash chain (full blocks only).
    pub hashes: Vec<BlockHash>,
    /// Canonical prompt bytes (for character-based policies).
    pub text: Vec<u8>,
    /// Prompt tokens (exact in token mode, estimated in text mode).
    pub prompt_tokens: u32,
    /// Tokens per block (exact in token mode, estimated in text mode).
    pub tokens_per_block: u32,
    /// The request's output bound, if it gave one.
    pub max_tokens: Option<u32>,
    /// How many other instances the decision should also name, best first, for a gateway that
    /// retries on them itself (the endpoint picker's fallback list); 0: none (the proxy retries
    /// through new decisions).
    pub fallbacks: usize,
}

/// A decision and the load it holds.
pub struct Routed {
    /// The chosen instance.
    pub chosen: InstanceId,
    /// It, held for the request's life (it may be removed from the fleet meanwhile).
    pub instance: Arc<Instance>,
    /// Up to [`Prepared::fallbacks`] other candidates, best first by the policy's scores.
    pub fallbacks: Vec<Arc<Instance>>,
    /// Leading prompt blocks it holds.
    pub matched_blocks: u32,
    /// Leading blocks the index placed there before this decision (what a retraction keeps).
    pub known_blocks: u32,
    /// The policy's predicted time to first token there, in ms.
    pub predicted_cost_ms: f64,
    /// Requests its engine last reported waiting (not yet scheduled), when that report is fresh.
    pub engine_waiting: Option<u32>,
    /// The dispatched request's share of the chosen instance's load (release by dropping).
    pub guard: LoadGuard,
    /// What learning from the response needs.
    pub learning: Learning,
}

/// What the response teaches the router, and what it needs to know to learn it.
#[derive(Clone, Copy, Debug)]
pub struct Learning {
    /// The request's pool.
    pub pool: usize,
    /// Prompt tokens the chosen instance must compute.
    pub uncached_tokens: u64,
    /// The chosen instance's fleet-wide load just before the dispatch.
    pub at_dispatch: RouterLoad,
}

/// When a decision is taken: the core's time, its tie-breaking seed, and the instant its latency
/// is measured from.
#[derive(Clone, Copy, Debug)]
pub struct Moment {
    /// Milliseconds on the gateway's clock.
    pub now: Millis,
    /// Seed for the policy's tie-breaks.
    pub seed: u64,
    /// Start of the decision, for its latency metric.
    pub started: Instant,
}

/// A decision as kept in the log: names are resolved only when the log is read.
struct Logged {
    request_id: http::HeaderValue,
    pool: usize,
    policy: &'static str,
    attempt: u32,
    prompt_blocks: usize,
    decision: Decision,
}

/// One entry of `/admin/decisions`.
#[derive(Clone, Debug, Serialize)]
pub struct DecisionRecord {
    /// Milliseconds since gateway start.
    pub at_ms: u64,
    /// The request id.
    pub request_id: String,
    /// Pool model.
    pub model: String,
    /// Policy name.
    pub policy: &'static str,
    /// Attempt number (1 = first choice).
    pub attempt: u32,
    /// Blocks in the prompt's chain.
    pub prompt_blocks: usize,
    /// Chosen instance name.
    pub chosen: String,
    /// The decision with every candidate's score.
    pub decision: Decision,
}

/// Per-pool routing state.
struct PoolRouting {
    policy: Box<dyn Policy>,
    mode: HashMode,
    block_size: u32,
    /// Token mode's tokenizer and chat template.
    tokens: Option<TokenMode>,
}

/// Loads a pool's tokenizer: `builtin`, a model directory, or a `tokenizer.json` file.
fn load_tokenizer(spec: &str, template: Option<&std::path::Path>) -> Result<TokenMode, String> {
    use kvgate_tokenizer::{ChatTemplate, Tokenizer};
    if spec == "builtin" {
        return TokenMode::builtin().map_err(|e| e.to_string());
    }
    let path = std::path::Path::new(spec);
    if path.is_dir() {
        return TokenMode::from_model_dir(path).map_err(|e| format!("{spec}: {e}"));
    }
    let tokenizer = Tokenizer::from_file(path).map_err(|e| format!("{spec}: {e}"))?;
    let template = match template {
        None => ChatTemplate::builtin(),
        Some(t) => {
            let src = std::fs::read_to_string(t).map_err(|e| format!("{}: {e}", t.display()))?;
            ChatTemplate::from_jinja(&src, None, None)
                .map_err(|e| format!("{}: {e}", t.display()))?
        }
    };
    Ok(TokenMode::new(tokenizer, template))
}

/// The routing glue, shared by all requests.
pub struct Routing {
    router: Router,
    pools: Vec<PoolRouting>,
    text_block_bytes: usize,
    bytes_per_token: u32,
    stale_after_ms: u64,
    log: ShardedLog<Logged>,
    /// Threads that have drawn seeds so far (see [`Routing::next_seed`]).
    seq: AtomicU64,
    clock: Clock,
    /// Replica gossip, once started: peers' placements and load.
    gossip: std::sync::OnceLock<kvgate_gossip::Gossip>,
}

impl Routing {
    /// Builds the index, load tracker and one policy per pool.
    pub fn new(cfg: &Config, fleet: &Fleet, clock: Clock) -> Result<Routing, GatewayError> {
        // Sized for every id slot the fleet may hand out, so instances discovered later have
        // their own load counters and learned rates.
        let n = fleet.capacity();
        let index = Arc::new(PlacementIndex::new(cfg.routing.index.to_core()));
        let router = Router::new(cfg.routing.router_config(), index, n, fleet.pools().len());
        let mut pools = Vec::new();
        for p in fleet.pools() {
            let policy = build_policy(&cfg.routing.policy);
            let mode = match (cfg.routing.hash_mode, &p.config.tokenizer) {
                (HashMode::Auto, Some(_)) | (HashMode::Token, _) => HashMode::Token,
                (HashMode::Auto, None) | (HashMode::Text, _) => HashMode::Text,
            };
            let tokens = match mode {
                HashMode::Token => {
                    let spec = p.config.tokenizer.as_deref().unwrap_or("builtin");
                    Some(
                        load_tokenizer(spec, p.config.chat_template.as_deref())
                            .map_err(|e| {
                                GatewayError::Internal(format!("pools[{}].tokenizer: {e}", p.index))
                            })?
                            .with_cache(cfg.routing.tokenizer_cache_bytes),
                    )
                }
                _ => None,
            };
            pools.push(PoolRouting {
                policy,
                mode,
                block_size: p.config.block_size(),
                tokens,
            });
        }
        Ok(Routing {
            router,
            pools,
            text_block_bytes: cfg.routing.text_block_bytes,
            bytes_per_token: cfg.routing.text_bytes_per_token,
            stale_after_ms: cfg.load.stale_after_ms,
            log: ShardedLog::new(
                cfg.routing.decision_log_size,
                match cfg.server.threads {
                    0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
                    n => n,
                },
            ),
            seq: AtomicU64::new(0),
            clock,
            gossip: std::sync::OnceLock::new(),
        })
    }

    /// Attaches running gossip (once): decisions are shared and peers' load is scored; every
    /// change of this gateway's load (dispatch, first token, release) is published to it at once
    /// (pushed to peers with `gossip.push_on_change`, else on the next load tick); every engine
    /// eviction makes it forget peers' pending checkpoints of the evicted blocks.
    pub fn set_gossip(&self, gossip: kvgate_gossip::Gossip) {
        let publish = gossip.clone();
        let evicted = gossip.eviction_hook();
        if self.gossip.set(gossip).is_ok() {
            self.router.load().set_on_change(Arc::new(move |id, load| {
                publish.publish_load_change(id, load)
            }));
            // Peers' pending checkpoints of what an engine evicted are forgotten, not
            // materialized back as predictions.
            self.router.index().set_on_remove(evicted);
        }
    }

    /// Running gossip, if any.
    pub fn gossip(&self) -> Option<&kvgate_gossip::Gossip> {
        self.gossip.get()
    }

    /// The placement index (shared with event ingestion and gossip).
    pub fn index(&self) -> &Arc<PlacementIndex> {
        self.router.index()
    }

    /// The router-tracked load.
    pub fn load(&self) -> &Arc<LoadTracker> {
        self.router.load()
    }

    /// Requests in flight to `id` from this gateway and, with gossip, its peers.
    pub fn fleet_in_flight(&self, id: InstanceId) -> u32 {
        let gossip = self.gossip.get().map(GossipPeers);
        let peers = gossip.as_ref().map(|g| g as &dyn Peers);
        kvgate_core::router::fleet_load(self.router.load().snapshot(id), peers, id).in_flight
    }

    /// Forgets a freed instance slot: index entries, capacity, learned rates and what the
    /// policies remember of it.
    pub fn forget_instance(&self, id: InstanceId) {
        self.router.forget_instance(id);
        for pool in &self.pools {
            pool.policy.forget_instance(id);
        }
    }

    /// The policy name of `pool`.
    pub fn policy_name(&self, pool: usize) -> &'static str {
        self.pools[pool].policy.name()
    }

    /// Token mode when any pool hashes tokens (tokenizing is what is worth moving off the
    /// serving threads), else text mode.
    pub fn strictest_mode(&self) -> HashMode {
        if self.pools.iter().any(|p| p.mode == HashMode::Token) {
            HashMode::Token
        } else {
            HashMode::Text
        }
    }

    /// The hash mode in effect for `pool`.
    pub fn hash_mode(&self, pool: usize) -> HashMode {
        self.pools[pool].mode
    }

    /// Counters and size of `pool`'s token cache (token mode with a cache only).
    pub fn tokenizer_cache_stats(&self, pool: usize) -> Option<kvgate_tokenizer::CacheStats> {
        self.pools.get(pool)?.tokens.as_ref()?.cache_stats()
    }

    /// Current rates of an instance.
    pub fn rates(&self, id: InstanceId) -> InstanceRates {
        self.router.rates().rates(id)
    }

    /// Current decode step model of an instance.
    pub fn decode_rates(&self, id: InstanceId) -> DecodeRates {
        self.router.decode_rates().rates(id)
    }

    /// Learned fixed overhead before an instance's first token, ms.
    pub fn overhead_ms(&self, id: InstanceId) -> f64 {
        self.router.rates().overhead_ms(id)
    }

    /// Hashes the request's prompt for `pool`.
    pub fn prepare(&self, pool: &Pool, input: &RouteInput<'_>) -> Result<Prepared, GatewayError> {
        let pr = &self.pools[pool.index];
        let lora = input.model.as_deref().filter(|m| *m != pool.model.as_str());
        let ns = Namespace {
            model: &pool.model,
            lora,
            cache_salt: input.cache_salt.as_deref(),
        };
        let root = namespace_root(&ns);
        // The canonical rendering is kept only for a policy that reads it; otherwise text mode
        // hashes it as it is produced and token mode never renders it.
        let keep_text = pr.policy.reads_text();
        let token_ids = match &input.prompt {
            Prompt::Tokens(ids) => Some(ids.as_slice()),
            _ => None,
        };
        let mut hashes = Vec::new();
        if let Some(tm) = pr.tokens.as_ref().filter(|_| pr.mode == HashMode::Token) {
            let owned;
            let ids: Option<&[u32]> = match token_ids {
                Some(ids) => Some(ids),
                None => match tokenize(tm, &input.prompt) {
                    Ok(v) => {
                        owned = v;
                        Some(&owned)
                    }
                    Err(e) => {
                        // Routing quality only: fall back to text hashing for this request.
                        tracing::debug!(error = %e, "tokenization failed; hashing text instead");
                        None
                    }
                },
            };
            if let Some(ids) = ids {
                hash_token_blocks(root, ids, pr.block_size as usize, &mut hashes);
                let text = if keep_text {
                    let mut canon = CanonicalPrompt::with_capacity(rendered_len(&input.prompt));
                    render(&mut canon, &input.prompt);
                    canon.into_bytes()
                } else {
                    Vec::new()
                };
                return Ok(Prepared {
                    hashes,
                    prompt_tokens: ids.len().min(u32::MAX as usize) as u32,
                    tokens_per_block: pr.block_size,
                    text,
                    max_tokens: input.max_tokens,
                    fallbacks: 0,
                });
            }
        }
        let (text, rendered) = if keep_text {
            let mut canon = CanonicalPrompt::with_capacity(rendered_len(&input.prompt));
            render(&mut canon, &input.prompt);
            let text = canon.into_bytes();
            hash_text_blocks(root, &text, self.text_block_bytes, &mut hashes);
            let n = text.len();
            (text, n)
        } else {
            let mut chain =
                TextChain::new(root, self.text_block_bytes, rendered_len(&input.prompt));
            render(&mut chain, &input.prompt);
            let n = chain.len();
            hashes = chain.finish();
            (Vec::new(), n)
        };
        let tpb = (self.text_block_bytes as u32 / self.bytes_per_token).max(1);
        let tokens = token_ids
            .map(|ids| ids.len())
            .unwrap_or(rendered / self.bytes_per_token as usize);
        Ok(Prepared {
            hashes,
            prompt_tokens: tokens.min(u32::MAX as usize) as u32,
            tokens_per_block: tpb,
            text,
            max_tokens: input.max_tokens,
            fallbacks: 0,
        })
    }

    /// Expected output tokens of a request to `pool` bounded by `max_tokens`.
    pub fn expected_output(&self, pool: usize, max_tokens: Option<u32>) -> u32 {
        self.router.expected_output(pool, max_tokens)
    }

    /// Chooses an instance of `pool` for `prep`, skipping `exclude` (already tried), unusable
    /// instances and, with `full_at`, those with that many requests in flight fleet-wide
    /// (admission control's capacity), and records the choice.
    pub fn decide(
        &self,
        fleet: &Fleet,
        pool: &Pool,
        prep: &Prepared,
        exclude: &[InstanceId],
        request_id: &http::HeaderValue,
        full_at: Option<u32>,
    ) -> Result<Routed, GatewayError> {
        let started = Instant::now();
        let at = Moment {
            now: self.clock.ms_at(started),
            seed: self.next_seed(),
            started,
        };
        self.decide_at(fleet, pool, prep, (exclude, full_at), request_id, at)
    }

    /// [`Routing::decide`] at a given moment and tie-breaking seed: the whole decision but for
    /// reading the clock and drawing the seed, so that it can be replayed in virtual time
    /// (`loadtest/tests/router_parity.rs` pins it to the offline simulator's router).
    /// `skip`: the instances already tried, and admission control's in-flight capacity.
    pub fn decide_at(
        &self,
        fleet: &Fleet,
        pool: &Pool,
        prep: &Prepared,
        skip: (&[InstanceId], Option<u32>),
        request_id: &http::HeaderValue,
        at: Moment,
    ) -> Result<Routed, GatewayError> {
        let Moment { now, seed, started } = at;
        let (exclude, full_at) = skip;
        let gossip = self.gossip.get().map(GossipPeers);
        let peers = gossip.as_ref().map(|g| g as &dyn Peers);
        let view = fleet.view();
        let offers = view.members(pool.index).iter().filter_map(|&id| {
            let inst = view.instance(id)?;
            if exclude.contains(&id) || !inst.health.usable(now) {
                return None;
            }
            if full_at.is_some_and(|cap| self.fleet_in_flight(id) >= cap) {
                return None;
            }
            Some(Offer {
                id,
                engine: inst.engine.get(now, self.stale_after_ms),
                cache_capacity_blocks: inst.capacity(),
            })
        });
        let req = RouteRequest {
            hashes: &prep.hashes,
            tokens_per_block: prep.tokens_per_block,
            prompt_tokens: prep.prompt_tokens,
            expected_output_tokens: self.router.expected_output(pool.index, prep.max_tokens),
            kv_block_tokens: self.pools[pool.index].block_size,
            text: &prep.text,
            seed,
            concurrent_decisions: 0.0,
            now,
        };
        let pr = &self.pools[pool.index];
        let routed = SCRATCH.with(|scratch| {
            self.router
                .route(&*pr.policy, &req, offers, peers, &mut scratch.borrow_mut())
        });
        let Some(routed) = routed else {
            return Err(GatewayError::NoHealthyInstance {
                model: pool.model.clone(),
            });
        };
        let decision = routed.decision;
        let ratio = (!prep.hashes.is_empty())
            .then(|| decision.matched_blocks as f64 / prep.hashes.len() as f64);
        metrics::record_decision(
            pr.policy.name(),
            decision.reason.as_str(),
            ratio,
            started.elapsed().as_secs_f64(),
        );
        let learning = Learning {
            pool: pool.index,
            uncached_tokens: routed.guard.size().uncached_prefill_tokens,
            at_dispatch: routed.at_dispatch,
        };
        let Some(instance) = view.instance(decision.chosen).cloned() else {
            // Unreachable: the core chooses among the offers, all taken from this view.
            return Err(GatewayError::NoHealthyInstance {
                model: pool.model.clone(),
            });
        };
        let fallbacks = if prep.fallbacks == 0 {
            Vec::new()
        } else {
            ranked_others(&decision, prep.fallbacks)
                .into_iter()
                .filter_map(|id| view.instance(id).cloned())
                .collect()
        };
        let routed = Routed {
            fallbacks,
            chosen: decision.chosen,
            matched_blocks: decision.matched_blocks,
            known_blocks: routed.known_blocks,
            predicted_cost_ms: decision.predicted_cost_ms,
            engine_waiting: instance
                .engine
                .get(now, self.stale_after_ms)
                .filter(|l| !l.stale)
                .map(|l| l.waiting),
            guard: routed.guard,
            learning,
            instance,
        };
        if self.log.enabled() {
            let rec = Logged {
                request_id: request_id.clone(),
                pool: pool.index,
                policy: pr.policy.name(),
                attempt: exclude.len() as u32 + 1,
                prompt_blocks: prep.hashes.len(),
                decision,
            };
            self.log.push(now, rec);
        }
        Ok(routed)
    }

    /// Takes back what `routed` predicted and shared for `prep`: its attempt failed before the
    /// instance saw the request (connect error, 502/503), so the prompt will not be cached there.
    pub fn retract(&self, prep: &Prepared, routed: &Routed) {
        let gossip = self.gossip.get().map(GossipPeers);
        self.router.retract(
            routed.chosen,
            routed.known_blocks,
            &prep.hashes,
            gossip.as_ref().map(|g| g as &dyn Peers),
            self.clock.now_ms(),
        );
        metrics::record_retraction();
    }

    /// `prep`'s blocks were computed on `served`, not on the instance the decision chose (a
    /// gateway's fallback served it): the decision's prediction is taken back, the blocks are
    /// predicted on `served`, and gossip peers are told both.
    pub fn served_elsewhere(&self, prep: &Prepared, routed: &Routed, served: InstanceId) {
        self.retract(prep, routed);
        let gossip = self.gossip.get().map(GossipPeers);
        self.router.predict_served(
            served,
            &prep.hashes,
            gossip.as_ref().map(|g| g as &dyn Peers),
            self.clock.now_ms(),
        );
    }

    /// A well-mixed seed for one decision. Each thread counts on its own, its counter starting
    /// 2^40 past the previous thread's: a shared counter would be one more cache line that every
    /// serving thread writes on every request. Replicas salt it with their gossip node id: each
    /// counts from zero, and equal seeds would make equal random choices on the same view.
    fn next_seed(&self) -> u64 {
        let salt = self.gossip.get().map_or(0, kvgate_gossip::Gossip::node_id);
        thread_local! {
            static NEXT: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
        }
        NEXT.with(|next| {
            let v = next
                .get()
                .unwrap_or_else(|| self.seq.fetch_add(1, Ordering::Relaxed) << 40);
            next.set(Some(v.wrapping_add(1)));
            mix(v) ^ salt
        })
    }

    /// Folds an observed time to first token into the instance's rate estimate, and returns the
    /// decode batch the request joins there (the start of its decode observation).
    pub fn observe_ttft(&self, inst: &Instance, learning: &Learning, ttft_ms: f64) -> BatchSample {
        let id = inst.id;
        // A removed instance teaches nothing: what is learned about its slot must not outlive
        // it and pass to the slot's next instance.
        if inst.is_removed() {
            return self.batch(id);
        }
        self.router.observe_first_token(
            id,
            learning.uncached_tokens,
            learning.at_dispatch,
            ttft_ms,
        );
        self.batch(id)
    }

    /// The decode batch on `id` now, fleet-wide.
    pub fn batch(&self, id: InstanceId) -> BatchSample {
        let gossip = self.gossip.get().map(GossipPeers);
        self.router
            .batch(id, gossip.as_ref().map(|g| g as &dyn Peers))
    }

    /// Folds a finished stream into `id`'s decode step model and its pool's output lengths:
    /// `output_tokens` in `decode_ms` after the first, joining the batch `at_first`.
    pub fn observe_decode(
        &self,
        inst: &Instance,
        learning: &Learning,
        output_tokens: u32,
        decode_ms: f64,
        at_first: BatchSample,
    ) {
        if inst.is_removed() {
            return;
        }
        let id = inst.id;
        let at_end = self.batch(id);
        self.router.observe_finish(
            learning.pool,
            id,
            output_tokens,
            decode_ms,
            at_first,
            at_end,
        );
    }

    /// Recent decisions, newest last.
    pub fn decisions(&self, fleet: &Fleet) -> Vec<DecisionRecord> {
        // Names are resolved after the shards' locks are released.
        let log = self.log.recent(|_, l| {
            (
                l.request_id.clone(),
                l.pool,
                l.policy,
                l.attempt,
                l.prompt_blocks,
                l.decision.clone(),
            )
        });
        log.into_iter()
            .map(
                |(at_ms, (rid, pool, policy, attempt, prompt_blocks, decision))| DecisionRecord {
                    at_ms,
                    request_id: rid.to_str().unwrap_or("").to_string(),
                    model: fleet.pools()[pool].model.clone(),
                    policy,
                    attempt,
                    prompt_blocks,
                    // The slot's current occupant: a slot is reused only after the drain
                    // grace, so only decisions older than that can name a successor.
                    chosen: fleet
                        .instance(decision.chosen)
                        .map_or_else(|| format!("#{}", decision.chosen.0), |i| i.name.clone()),
                    decision,
                },
            )
            .collect()
    }

    /// Periodically drops expired predictions until `token` fires.
    pub async fn expire_loop(
        self: Arc<Self>,
        period_ms: u64,
        token: tokio_util::sync::CancellationToken,
    ) {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(period_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tick.tick() => { self.index().expire(self.clock.now_ms()); }
            }
        }
    }
}

/// The canonical rendering's size in bytes (what [`render`] produces), to size its buffer once.
fn rendered_len(prompt: &Prompt<'_>) -> usize {
    match prompt {
        Prompt::Chat { messages, tools } => {
            tools.map_or(0, |t| CanonicalPrompt::record_len("tools".len(), t.len()))
                + messages
                    .iter()
                    .map(|m| CanonicalPrompt::record_len(m.role.len(), m.content.len()))
                    .sum::<usize>()
        }
        Prompt::Text(t) => t.len(),
        Prompt::Tokens(ids) => CanonicalPrompt::record_len("tokens".len(), ids.len() * 4),
    }
}

/// Text mode's canonical rendering of a prompt into `sink` (kept or hashed as produced).
fn render(sink: &mut impl CanonicalSink, prompt: &Prompt<'_>) {
    match prompt {
        Prompt::Chat { messages, tools } => {
            if let Some(t) = tools {
                sink.push_part("tools", t.as_bytes());
            }
            for m in messages {
                sink.push_message(&m.role, &m.content);
            }
        }
        Prompt::Text(t) => sink.push_prompt(t),
        Prompt::Tokens(ids) => {
            let mut bytes = Vec::with_capacity(ids.len() * 4);
            for id in ids {
                bytes.extend_from_slice(&id.to_le_bytes());
            }
            sink.push_part("tokens", &bytes);
        }
    }
}

/// Token ids of a prompt, the way vLLM computes them (chat: template, no special tokens;
/// completions: special tokens added).
fn tokenize(tm: &TokenMode, prompt: &Prompt<'_>) -> Result<Vec<u32>, String> {
    match prompt {
        Prompt::Chat { messages, tools } => {
            let msgs: Vec<kvgate_tokenizer::ChatMessage> = messages
                .iter()
                .map(|m| kvgate_tokenizer::ChatMessage::new(m.role.as_ref(), m.content.as_ref()))
                .collect();
            let tools: Option<serde_json::Value> = match tools {
                Some(t) => Some(serde_json::from_str(t).map_err(|e| e.to_string())?),
                None => None,
            };
            tm.chat_tokens_with_tools(&msgs, tools.as_ref())
                .map_err(|e| e.to_string())
        }
        Prompt::Text(t) => tm.completion_tokens(t).map_err(|e| e.to_string()),
        Prompt::Tokens(ids) => Ok(ids.clone()),
    }
}

/// Gossip as the core router's peer plane.
struct GossipPeers<'a>(&'a kvgate_gossip::Gossip);

impl Peers for GossipPeers<'_> {
    fn materialize(&self, hashes: &[BlockHash], now: Millis) {
        self.0.materialize(hashes, now);
    }
    fn load(&self, instance: InstanceId) -> PeerLoad {
        self.0.peer_load(instance)
    }
    fn record(&self, chosen: InstanceId, hashes: &[BlockHash], known: usize, now: Millis) {
        self.0.record_decision(chosen, hashes, known, now);
    }
    fn retract(&self, chosen: InstanceId, hashes: &[BlockHash], known: usize, now: Millis) {
        self.0.retract_decision(chosen, hashes, known, now);
    }
    fn live_peers(&self) -> u32 {
        u32::try_from(self.0.live_peers()).unwrap_or(u32::MAX)
    }
    fn unseen_window_ms(&self) -> Millis {
        self.0.unseen_window_ms()
    }
}

thread_local! {
    /// Each serving thread's decision buffers (a decision allocates nothing once warm).
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// The candidates of `decision` other than the chosen one, at most `n`, best first. Scores are
/// policy-specific in direction (a cost for kvgate's policy, a preference for others), so the
/// direction is the one the chosen candidate's score is an extreme of; with neither (a random or
/// tie-broken choice) the candidates keep their offer order.
pub fn ranked_others(decision: &Decision, n: usize) -> Vec<InstanceId> {
    let Some(chosen) = decision.scores.iter().find(|c| c.id == decision.chosen) else {
        return Vec::new();
    };
    let mut others: Vec<_> = decision
        .scores
        .iter()
        .filter(|c| c.id != decision.chosen)
        .collect();
    let lowest = others.iter().all(|c| chosen.score <= c.score);
    let highest = others.iter().all(|c| chosen.score >= c.score);
    if lowest && !highest {
        others.sort_by(|a, b| a.score.total_cmp(&b.score));
    } else if highest && !lowest {
        others.sort_by(|a, b| b.score.total_cmp(&a.score));
    }
    others.into_iter().take(n).map(|c| c.id).collect()
}
