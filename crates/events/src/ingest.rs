//! Applying one event stream to the placement index: pure, no I/O, clock passed in.
//!
//! Invariants:
//! - Each `BlockStored` is re-hashed with kvgate's token-mode chain, continuing from the parent
//!   block's *kvgate* hash (looked up through the engine-hash map) or from the namespace root when
//!   the parent is nil (model, LoRA name and the chain's `cache_salt`, which vLLM lists among the
//!   first block's `extra_keys`). A block whose parent is unknown cannot be re-hashed and is
//!   skipped; so are events with `extra_keys` kvgate cannot reproduce (multimodal inputs).
//! - The engine-hash map holds exactly the blocks this stream indexed, with copies per tier, and
//!   never more than `max_tracked_blocks` entries; each store adds one copy to the index, each
//!   removal takes one away, so the index's event-sourced entries for the stream mirror the map.
//! - Only full-attention groups are indexed (the first full-attention group seen), and only
//!   events in the gateway's block size; a mismatch is reported, never silently matched.
//! - Sequence: [`StreamIngest::check_seq`] classifies each message; the caller replays gaps.
//!   Whatever cannot be proven current is dropped ([`StreamIngest::wipe`]): the index may miss
//!   blocks an engine holds, but never keeps crediting blocks it lost.

use std::collections::HashMap;
use std::sync::Arc;

use kvgate_core::hash::{hash_token_blocks, namespace_root, Namespace};
use kvgate_core::index::PlacementIndex;
use kvgate_core::{BlockHash, InstanceId, Millis, Source, Tier};
use parking_lot::Mutex;
use serde::Serialize;

use crate::decode::{
    decode_batch, BlockRemoved, BlockStored, DecodeLimits, Dialect, EngineHash, EventBatch, KvEvent,
};
use crate::metrics::StreamMetrics;

/// The current time, as ingestion needs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Now {
    /// Monotonic milliseconds (the index's clock).
    pub mono_ms: Millis,
    /// Wall-clock seconds since the Unix epoch (to measure lag against event timestamps).
    pub unix_s: f64,
}

/// Static parameters of one stream.
#[derive(Debug, Clone)]
pub struct StreamParams {
    /// Instance credited with the blocks.
    pub instance: InstanceId,
    /// Instance name (logs, admin).
    pub name: Arc<str>,
    /// Data-parallel rank of this stream.
    pub dp_rank: u32,
    /// Model name requests for this instance are hashed under.
    pub model: String,
    /// The gateway's block size in tokens.
    pub block_size: u32,
    /// Hash folding of the engine.
    pub dialect: Dialect,
    /// Bound of the engine-hash map.
    pub max_tracked_blocks: usize,
    /// Decoder limits.
    pub limits: DecodeLimits,
    /// True when this is the instance's only stream: a wipe may then clear the whole instance's
    /// event-sourced entries at once instead of removing this stream's blocks one by one.
    pub sole_stream: bool,
}

/// How a message's sequence number relates to the stream so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqVerdict {
    /// The first message seen on this stream.
    First,
    /// The expected next message.
    Next,
    /// Messages `from..seq` are missing.
    Gap {
        /// First missing sequence number.
        from: u64,
    },
    /// The sequence went backwards: the engine restarted.
    Restart,
}

/// Why a stream's entries were dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WipeReason {
    /// The engine announced `AllBlocksCleared`.
    Cleared,
    /// The sequence went backwards.
    Restart,
    /// Missing messages that replay could not provide.
    Gap,
    /// The stream was silent while the instance served requests.
    Silent,
}

impl WipeReason {
    fn label(self) -> &'static str {
        match self {
            WipeReason::Cleared => "cleared",
            WipeReason::Restart => "restart",
            WipeReason::Gap => "gap",
            WipeReason::Silent => "silent",
        }
    }
}

/// A snapshot of one stream's state, for `/admin/index` and tests.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StreamStatus {
    /// Instance name.
    pub instance: String,
    /// Data-parallel rank.
    pub dp_rank: u32,
    /// Endpoint listened on.
    pub endpoint: String,
    /// Whether the socket is connected / bound.
    pub connected: bool,
    /// Last applied sequence number.
    pub last_seq: Option<u64>,
    /// Monotonic ms of the last message applied.
    pub last_message_ms: Option<Millis>,
    /// Batches applied.
    pub batches: u64,
    /// Events applied (all types).
    pub events: u64,
    /// Blocks indexed by `BlockStored`.
    pub blocks_stored: u64,
    /// Block copies removed by `BlockRemoved`.
    pub blocks_removed: u64,
    /// Engine blocks currently tracked.
    pub tracked_blocks: usize,
    /// Blocks skipped because their parent was unknown (joined mid-chain, after a wipe).
    pub orphan_blocks: u64,
    /// Blocks not indexed because the tracking map was full.
    pub untracked_blocks: u64,
    /// Events skipped: another KV cache group, non-full attention, unknown LoRA, bad token count,
    /// `extra_keys` kvgate cannot reproduce (multimodal inputs, prompt embeddings).
    pub ignored_events: u64,
    /// Events of unknown type skipped by the decoder.
    pub unknown_events: u64,
    /// Payloads that failed to decode.
    pub decode_errors: u64,
    /// Messages dropped because the ingestion channel was full.
    pub dropped_messages: u64,
    /// Sequence gaps detected.
    pub gaps: u64,
    /// Replays that covered their gap.
    pub replays_covered: u64,
    /// Replays that could not cover their gap (or failed).
    pub replays_failed: u64,
    /// Engine restarts detected.
    pub restarts: u64,
    /// Wipes of this stream's entries, all reasons.
    pub wipes: u64,
    /// Reason of the latest wipe.
    pub last_wipe: Option<WipeReason>,
    /// The engine's block size when it differs from the gateway's (events are then not indexed).
    pub block_size_mismatch: Option<u32>,
    /// The KV cache group indexed.
    pub group_idx: Option<u32>,
    /// True while the stream is flagged silent.
    pub silent: bool,
}

/// One tracked engine block: its kvgate hash and the copies the engine announced per tier.
#[derive(Debug, Clone, Copy)]
struct Tracked {
    kv: BlockHash,
    copies: [u32; 3],
}

impl Tracked {
    fn is_empty(&self) -> bool {
        self.copies.iter().all(|&c| c == 0)
    }
}

/// Most distinct LoRA roots cached per stream.
const MAX_LORA_ROOTS: usize = 256;

/// Applies one stream's events to the index.
pub struct StreamIngest {
    params: StreamParams,
    index: Arc<PlacementIndex>,
    metrics: StreamMetrics,
    root: BlockHash,
    lora_roots: HashMap<String, BlockHash, ahash::RandomState>,
    map: HashMap<EngineHash, Tracked, ahash::RandomState>,
    next_seq: Option<u64>,
    status: StreamStatus,
    shared: Arc<Mutex<StreamStatus>>,
    scratch: Vec<BlockHash>,
}

impl StreamIngest {
    /// A fresh stream with nothing applied.
    pub fn new(params: StreamParams, index: Arc<PlacementIndex>, metrics: StreamMetrics) -> Self {
        let root = namespace_root(&Namespace {
            model: &params.model,
            lora: None,
            cache_salt: None,
        });
        let status = StreamStatus {
            instance: params.name.to_string(),
            dp_rank: params.dp_rank,
            ..StreamStatus::default()
        };
        Self {
            shared: Arc::new(Mutex::new(status.clone())),
            status,
            params,
            index,
            metrics,
            root,
            lora_roots: HashMap::default(),
            map: HashMap::default(),
            next_seq: None,
            scratch: Vec::new(),
        }
    }

    /// The shared status cell, updated after every message.
    pub fn status_cell(&self) -> Arc<Mutex<StreamStatus>> {
        self.shared.clone()
    }

    /// The current status.
    pub fn status(&self) -> &StreamStatus {
        &self.status
    }

    /// Mutable status for the I/O layer (connection state, drop counts).
    pub fn status_mut(&mut self) -> &mut StreamStatus {
        &mut self.status
    }

    /// The stream's parameters.
    pub fn params(&self) -> &StreamParams {
        &self.params
    }

    /// The metric handles.
    pub fn metrics(&self) -> &StreamMetrics {
        &self.metrics
    }

    /// Copies the status into the shared cell.
    pub fn publish_status(&mut self) {
        self.status.tracked_blocks = self.map.len();
        self.shared.lock().clone_from(&self.status);
    }

    /// The kvgate hash of a tracked engine block.
    pub fn kv_hash_of(&self, engine: EngineHash) -> Option<BlockHash> {
        self.map.get(&engine).map(|t| t.kv)
    }

    /// Classifies a message's sequence number.
    pub fn check_seq(&self, seq: u64) -> SeqVerdict {
        match self.next_seq {
            None => SeqVerdict::First,
            Some(next) if seq == next => SeqVerdict::Next,
            Some(next) if seq > next => SeqVerdict::Gap { from: next },
            Some(_) => SeqVerdict::Restart,
        }
    }

    /// Records a detected gap (metrics, status).
    pub fn note_gap(&mut self) {
        self.status.gaps += 1;
        self.metrics.gaps.increment(1);
    }

    /// Records a detected restart (metrics, status); the caller wipes.
    pub fn note_restart(&mut self) {
        self.status.restarts += 1;
        self.metrics.restarts.increment(1);
    }

    /// Records a replay's outcome.
    pub fn note_replay(&mut self, covered: bool, partial: bool) {
        if covered {
            self.status.replays_covered += 1;
            self.metrics.replay_covered.increment(1);
        } else {
            self.status.replays_failed += 1;
            if partial {
                self.metrics.replay_partial.increment(1);
            } else {
                self.metrics.replay_failed.increment(1);
            }
        }
    }

    /// Records a message dropped before ingestion.
    pub fn note_dropped(&mut self, n: u64) {
        self.status.dropped_messages += n;
        self.metrics.dropped.increment(n);
    }

    /// Decodes and applies one payload with sequence `seq`, and expects `seq + 1` next. A payload
    /// that does not decode is counted and skipped (the sequence still advances: the message
    /// arrived, it just carried nothing usable).
    pub fn apply_payload(
        &mut self,
        seq: u64,
        payload: &[u8],
        now: Now,
    ) -> Result<(), crate::decode::DecodeError> {
        self.next_seq = Some(seq.wrapping_add(1));
        self.status.last_seq = Some(seq);
        self.status.last_message_ms = Some(now.mono_ms);
        match decode_batch(payload, self.params.dialect, &self.params.limits) {
            Ok(batch) => {
                self.apply_batch(&batch, now);
                Ok(())
            }
            Err(e) => {
                self.status.decode_errors += 1;
                self.metrics.decode_errors.increment(1);
                Err(e)
            }
        }
    }

    /// Applies a decoded batch.
    pub fn apply_batch(&mut self, batch: &EventBatch, now: Now) {
        self.status.batches += 1;
        self.status.unknown_events += batch.unknown_events as u64;
        if batch.ts.is_finite() && batch.ts > 0.0 {
            self.metrics.lag.record((now.unix_s - batch.ts).max(0.0));
        }
        for event in &batch.events {
            self.status.events += 1;
            match event {
                KvEvent::BlockStored(e) => {
                    self.metrics.stored.increment(1);
                    self.apply_stored(e, now);
                }
                KvEvent::BlockRemoved(e) => {
                    self.metrics.removed.increment(1);
                    self.apply_removed(e);
                }
                KvEvent::AllBlocksCleared => {
                    self.metrics.cleared.increment(1);
                    self.wipe(WipeReason::Cleared);
                }
            }
        }
    }

    /// True when events of group `group` belong to the indexed full-attention group; locks onto
    /// the first full-attention group seen.
    fn accept_group(&mut self, group: Option<u32>, kind: Option<&str>) -> bool {
        if let Some(kind) = kind {
            if !kind.eq_ignore_ascii_case("full_attention") && !kind.is_empty() {
                return false;
            }
        }
        match (group, self.status.group_idx) {
            (None, _) => true,
            (Some(g), Some(locked)) => g == locked,
            (Some(g), None) => {
                self.status.group_idx = Some(g);
                true
            }
        }
    }

    fn root_for(&mut self, lora: Option<&str>) -> BlockHash {
        let Some(lora) = lora else {
            return self.root;
        };
        if let Some(&r) = self.lora_roots.get(lora) {
            return r;
        }
        let r = namespace_root(&Namespace {
            model: &self.params.model,
            lora: Some(lora),
            cache_salt: None,
        });
        if self.lora_roots.len() < MAX_LORA_ROOTS {
            self.lora_roots.insert(lora.to_owned(), r);
        }
        r
    }

    fn apply_stored(&mut self, e: &BlockStored, now: Now) {
        if !self.accept_group(e.group_idx, e.kv_cache_spec_kind.as_deref()) {
            self.status.ignored_events += 1;
            return;
        }
        if e.block_size != self.params.block_size {
            if self.status.block_size_mismatch != Some(e.block_size) {
                tracing::warn!(
                    instance = %self.params.name,
                    engine_block_size = e.block_size,
                    gateway_block_size = self.params.block_size,
                    "KV events use another block size than the gateway: this instance's events are not indexed; set the pool's block_size to the engine's"
                );
            }
            self.status.block_size_mismatch = Some(e.block_size);
            self.metrics.mismatch.set(1.0);
            return;
        }
        if self.status.block_size_mismatch.take().is_some() {
            self.metrics.mismatch.set(0.0);
        }
        let bs = self.params.block_size as usize;
        let n = e.block_hashes.len();
        if n == 0 || e.token_ids.len() != n * bs {
            self.status.ignored_events += 1;
            return;
        }
        // vLLM lists, per block, the LoRA name and, on a chain's first block only, the request's
        // `cache_salt` as strings; multimodal inputs and prompt embeddings are not strings.
        let mut salt: Option<&str> = None;
        let mut unknown = e.extra_keys_opaque;
        for k in &e.extra_key_strings {
            if Some(k.as_str()) == e.lora_name.as_deref() {
                continue;
            }
            match salt {
                None if e.parent.is_none() => salt = Some(k),
                Some(s) if s == k => {}
                _ => unknown = true,
            }
        }
        if unknown {
            // Multimodal inputs, prompt embeddings, a string that is neither: the engine's blocks
            // differ from what the same tokens hash to in kvgate's namespace, so indexing them
            // would credit requests the engine would not serve from cache.
            self.status.ignored_events += 1;
            return;
        }
        if e.lora_id.is_some() && e.lora_name.is_none() {
            // The adapter's name is part of the namespace; an id alone cannot be mapped to it.
            self.status.ignored_events += 1;
            return;
        }
        let parent_kv = match e.parent {
            // A salted chain (an isolated tenant's, or a client's own `cache_salt`) continues
            // from the root kvgate hashes that salt's requests under, so it credits exactly them.
            None if salt.is_some() => namespace_root(&Namespace {
                model: &self.params.model,
                lora: e.lora_name.as_deref(),
                cache_salt: salt,
            }),
            None => self.root_for(e.lora_name.as_deref()),
            Some(p) => match self.map.get(&p) {
                Some(t) => t.kv,
                None => {
                    self.status.orphan_blocks += n as u64;
                    return;
                }
            },
        };
        let tier = Tier::from_medium(e.medium.as_deref());
        let mut kv = std::mem::take(&mut self.scratch);
        kv.clear();
        hash_token_blocks(parent_kv, &e.token_ids, bs, &mut kv);
        let mut keep = 0;
        for i in 0..n {
            let engine = e.block_hashes[i];
            let h = kv[i];
            let room = self.map.len() < self.params.max_tracked_blocks;
            let tracked = match self.map.entry(engine) {
                std::collections::hash_map::Entry::Occupied(o) => Some(o.into_mut()),
                std::collections::hash_map::Entry::Vacant(v) if room => Some(v.insert(Tracked {
                    kv: h,
                    copies: [0; 3],
                })),
                std::collections::hash_map::Entry::Vacant(_) => None,
            };
            match tracked {
                Some(t) => {
                    t.copies[tier as usize] += 1;
                    kv[keep] = t.kv;
                    keep += 1;
                }
                None => self.status.untracked_blocks += 1,
            }
        }
        kv.truncate(keep);
        self.index
            .store(self.params.instance, &kv, tier, now.mono_ms);
        self.status.blocks_stored += keep as u64;
        self.scratch = kv;
    }

    fn apply_removed(&mut self, e: &BlockRemoved) {
        if let (Some(g), Some(locked)) = (e.group_idx, self.status.group_idx) {
            if g != locked {
                self.status.ignored_events += 1;
                return;
            }
        }
        let tier = Tier::from_medium(e.medium.as_deref());
        let mut kv = std::mem::take(&mut self.scratch);
        kv.clear();
        for engine in &e.block_hashes {
            let Some(t) = self.map.get_mut(engine) else {
                continue;
            };
            let c = &mut t.copies[tier as usize];
            if *c == 0 {
                continue;
            }
            *c -= 1;
            kv.push(t.kv);
            if t.is_empty() {
                self.map.remove(engine);
            }
        }
        self.index.remove(self.params.instance, &kv, tier);
        self.status.blocks_removed += kv.len() as u64;
        self.scratch = kv;
    }

    /// Drops everything this stream indexed (and forgets the engine-hash map). The sequence
    /// position is kept: the live stream continues from where it is.
    pub fn wipe(&mut self, reason: WipeReason) {
        if self.params.sole_stream {
            self.index
                .clear_instance(self.params.instance, &[Source::Event]);
        } else {
            let mut by_tier: [Vec<BlockHash>; 3] = Default::default();
            for t in self.map.values() {
                for tier in Tier::ALL {
                    for _ in 0..t.copies[tier as usize] {
                        by_tier[tier as usize].push(t.kv);
                    }
                }
            }
            for tier in Tier::ALL {
                self.index
                    .remove(self.params.instance, &by_tier[tier as usize], tier);
            }
        }
        self.map.clear();
        self.map.shrink_to(1024);
        self.status.wipes += 1;
        self.status.last_wipe = Some(reason);
        self.metrics.wipe(reason.label());
        if reason != WipeReason::Cleared {
            tracing::warn!(instance = %self.params.name, dp_rank = self.params.dp_rank, ?reason, "dropped the instance's event-sourced index entries");
        }
    }

    /// The sequence number expected next, once a message was seen.
    pub fn next_seq(&self) -> Option<u64> {
        self.next_seq
    }

    /// Accepts `seq` without a payload (it arrived but was skipped, e.g. oversized).
    pub fn skip_seq(&mut self, seq: u64) {
        self.next_seq = Some(seq.wrapping_add(1));
        self.status.last_seq = Some(seq);
    }

    /// Forgets the expected sequence (after a reconnect the next message is treated as first).
    pub fn reset_seq(&mut self) {
        self.next_seq = None;
    }

    /// Marks the stream silent or not (metric, status, log on change).
    pub fn set_silent(&mut self, silent: bool) {
        if silent != self.status.silent {
            self.status.silent = silent;
            self.metrics.silent.set(if silent { 1.0 } else { 0.0 });
            if silent {
                tracing::warn!(instance = %self.params.name, "KV event stream silent while the instance serves requests; routing falls back to predicted entries");
            } else {
                tracing::info!(instance = %self.params.name, "KV event stream active again");
            }
        }
    }
}
