//! Routing glue: the only module that calls the routing core.
//!
//! For each request: the parsed prompt becomes a block-hash chain (text or token mode), the
//! placement index says how much of it each instance holds, the pool's policy picks among the usable
//! instances not yet tried, the choice is recorded as a prediction in the index and as load in the
//! tracker (an RAII guard the response body carries), and the decision is kept in a bounded log for
//! `/admin/decisions`.
//!
//! Invariants:
//! - Time enters the core only as [`Clock::now_ms`].
//! - Engine-reported load older than `load.stale_after_ms` is passed to the core marked stale.
//! - The decision log holds at most `routing.decision_log_size` entries.

use crate::clock::Clock;
use crate::config::{Config, HashMode};
use crate::error::GatewayError;
use crate::fleet::{Fleet, Pool};
use crate::metrics;
use crate::proxy::parse::{Prompt, RouteInput};
use kvgate_core::hash::{
    hash_text_blocks, hash_token_blocks, namespace_root, CanonicalPrompt, Namespace,
};
use kvgate_core::index::{PlacementIndex, PrefixMatches};
use kvgate_core::load::{InstanceRates, LoadGuard, LoadTracker};
use kvgate_core::policy::{build_policy, Candidate, Decision, Policy, RouteRequest};
use kvgate_core::{BlockHash, InstanceId, Source};
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::VecDeque;
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
}

/// A decision and the load it holds.
pub struct Routed {
    /// The policy's decision.
    pub decision: Decision,
    /// The dispatched request's share of the chosen instance's load (release by dropping).
    pub guard: LoadGuard,
    /// Prompt tokens the chosen instance must compute.
    pub uncached_tokens: u64,
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
}

/// The routing glue, shared by all requests.
pub struct Routing {
    index: Arc<PlacementIndex>,
    load: Arc<LoadTracker>,
    pools: Vec<PoolRouting>,
    rates: Vec<Mutex<InstanceRates>>,
    text_block_bytes: usize,
    bytes_per_token: u32,
    ttl_ms: u64,
    stale_after_ms: u64,
    log: Mutex<VecDeque<DecisionRecord>>,
    log_cap: usize,
    seq: AtomicU64,
    clock: Clock,
}

impl Routing {
    /// Builds the index, load tracker and one policy per pool.
    pub fn new(cfg: &Config, fleet: &Fleet, clock: Clock) -> Result<Routing, GatewayError> {
        let n = fleet.instances().len();
        let index = Arc::new(PlacementIndex::new(cfg.routing.index.to_core()));
        let load = Arc::new(LoadTracker::new(n));
        let mut pools = Vec::new();
        for p in fleet.pools() {
            let policy = build_policy(&cfg.routing.policy);
            let mode = match cfg.routing.hash_mode {
                HashMode::Auto | HashMode::Text => HashMode::Text,
                HashMode::Token => HashMode::Token,
            };
            pools.push(PoolRouting {
                policy,
                mode,
                block_size: p.config.block_size.unwrap_or(16),
            });
        }
        let rates = (0..n)
            .map(|_| {
                Mutex::new(InstanceRates {
                    prefill_tokens_per_s: cfg.routing.prefill_tokens_per_s,
                    decode_interference_ms: cfg.routing.decode_interference_ms,
                })
            })
            .collect();
        Ok(Routing {
            index,
            load,
            pools,
            rates,
            text_block_bytes: cfg.routing.text_block_bytes,
            bytes_per_token: cfg.routing.text_bytes_per_token,
            ttl_ms: cfg.routing.predicted_ttl_ms,
            stale_after_ms: cfg.load.stale_after_ms,
            log: Mutex::new(VecDeque::with_capacity(
                cfg.routing.decision_log_size.min(1024),
            )),
            log_cap: cfg.routing.decision_log_size,
            seq: AtomicU64::new(0),
            clock,
        })
    }

    /// The placement index (shared with event ingestion and gossip).
    pub fn index(&self) -> &Arc<PlacementIndex> {
        &self.index
    }

    /// The router-tracked load.
    pub fn load(&self) -> &Arc<LoadTracker> {
        &self.load
    }

    /// The policy name of `pool`.
    pub fn policy_name(&self, pool: usize) -> &'static str {
        self.pools[pool].policy.name()
    }

    /// The hash mode in effect for `pool`.
    pub fn hash_mode(&self, pool: usize) -> HashMode {
        self.pools[pool].mode
    }

    /// Current rates of an instance.
    pub fn rates(&self, id: InstanceId) -> InstanceRates {
        *self.rates[id.index()].lock()
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
        let mut canon = CanonicalPrompt::new();
        let mut token_ids: Option<&[u32]> = None;
        match &input.prompt {
            Prompt::Chat { messages, tools } => {
                if let Some(t) = tools {
                    canon.push_part("tools", t.as_bytes());
                }
                for m in messages {
                    canon.push_message(&m.role, &m.content);
                }
            }
            Prompt::Text(t) => canon.push_prompt(t),
            Prompt::Tokens(ids) => {
                token_ids = Some(ids);
                let mut bytes = Vec::with_capacity(ids.len() * 4);
                for id in ids {
                    bytes.extend_from_slice(&id.to_le_bytes());
                }
                canon.push_part("tokens", &bytes);
            }
        }
        let mut hashes = Vec::new();
        let text = canon.into_bytes();
        match (pr.mode, token_ids) {
            (HashMode::Token, Some(ids)) | (_, Some(ids)) if pr.mode == HashMode::Token => {
                let bs = pr.block_size.max(1);
                hash_token_blocks(root, ids, bs as usize, &mut hashes);
                Ok(Prepared {
                    hashes,
                    prompt_tokens: ids.len().min(u32::MAX as usize) as u32,
                    tokens_per_block: bs,
                    text,
                })
            }
            _ => {
                hash_text_blocks(root, &text, self.text_block_bytes, &mut hashes);
                let tpb = (self.text_block_bytes as u32 / self.bytes_per_token).max(1);
                let tokens = token_ids
                    .map(|ids| ids.len())
                    .unwrap_or(text.len() / self.bytes_per_token as usize);
                Ok(Prepared {
                    hashes,
                    prompt_tokens: tokens.min(u32::MAX as usize) as u32,
                    tokens_per_block: tpb,
                    text,
                })
            }
        }
    }

    /// Chooses an instance of `pool` for `prep`, skipping `exclude` (already tried) and unusable
    /// instances, and records the choice.
    pub fn decide(
        &self,
        fleet: &Fleet,
        pool: &Pool,
        prep: &Prepared,
        exclude: &[InstanceId],
        request_id: &str,
    ) -> Result<Routed, GatewayError> {
        let started = Instant::now();
        let now = self.clock.now_ms();
        let mut matches = PrefixMatches::default();
        if !prep.hashes.is_empty() {
            self.index.match_prefix(&prep.hashes, now, &mut matches);
        }
        let mut candidates = Vec::with_capacity(pool.instances.len());
        for &id in &pool.instances {
            let inst = fleet.instance(id);
            if exclude.contains(&id) || !inst.health.usable(now) {
                continue;
            }
            let engine = inst.engine.lock().map(|mut e| {
                e.stale = now.saturating_sub(e.at) > self.stale_after_ms;
                e
            });
            candidates.push(Candidate {
                id,
                matched: matches.get(id),
                load: self.load.snapshot(id),
                engine,
                rates: self.rates(id),
                cache_capacity_blocks: inst.capacity(),
            });
        }
        let no_instance = || GatewayError::NoHealthyInstance {
            model: pool.model.clone(),
        };
        if candidates.is_empty() {
            return Err(no_instance());
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let req = RouteRequest {
            hashes: &prep.hashes,
            tokens_per_block: prep.tokens_per_block,
            prompt_tokens: prep.prompt_tokens,
            text: &prep.text,
            seed: splitmix64(seq),
            now,
        };
        let pr = &self.pools[pool.index];
        let decision = pr
            .policy
            .decide(&req, &candidates)
            .ok_or_else(no_instance)?;
        pr.policy.on_routed(&req, decision.chosen);
        if !prep.hashes.is_empty() {
            self.index.predict(
                decision.chosen,
                &prep.hashes,
                Source::Local,
                self.ttl_ms,
                now,
            );
        }
        let cached_tokens = decision.matched_blocks as u64 * prep.tokens_per_block as u64;
        let uncached_tokens = (prep.prompt_tokens as u64).saturating_sub(cached_tokens);
        let guard = self.load.dispatch(decision.chosen, uncached_tokens);
        let ratio = (!prep.hashes.is_empty())
            .then(|| decision.matched_blocks as f64 / prep.hashes.len() as f64);
        metrics::record_decision(
            pr.policy.name(),
            decision.reason.as_str(),
            ratio,
            started.elapsed().as_secs_f64(),
        );
        if self.log_cap > 0 {
            let rec = DecisionRecord {
                at_ms: now,
                request_id: request_id.to_string(),
                model: pool.model.clone(),
                policy: pr.policy.name(),
                attempt: exclude.len() as u32 + 1,
                prompt_blocks: prep.hashes.len(),
                chosen: fleet.instance(decision.chosen).name.clone(),
                decision: decision.clone(),
            };
            let mut log = self.log.lock();
            if log.len() >= self.log_cap {
                log.pop_front();
            }
            log.push_back(rec);
        }
        Ok(Routed {
            decision,
            guard,
            uncached_tokens,
        })
    }

    /// Folds an observed time to first token into the instance's prefill-rate estimate.
    pub fn observe_ttft(&self, id: InstanceId, uncached_tokens: u64, ttft_ms: f64) {
        let _ = (id, uncached_tokens, ttft_ms);
    }

    /// Recent decisions, newest last.
    pub fn decisions(&self) -> Vec<DecisionRecord> {
        self.log.lock().iter().cloned().collect()
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
                _ = tick.tick() => { self.index.expire(self.clock.now_ms()); }
            }
        }
    }
}

/// A well-mixed per-request seed from a counter.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
