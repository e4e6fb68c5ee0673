//! `EngineModel`: the pure engine (prefix cache + continuous batching) in virtual time.
//!
//! The caller owns the clock: it submits requests at a time, calls [`EngineModel::step`] with the
//! time the step starts, and gets back when it ends and which requests got tokens. The HTTP server
//! drives it from a tokio task (sleeping for each step's duration); the offline simulator drives it
//! directly. No I/O, no threads, deterministic.

use serde::Serialize;

use super::events::KvEvent;
use super::params::EngineParams;
use super::scheduler::{Scheduler, Seq};

/// One request as the engine sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimRequest {
    /// Caller-chosen id, unique among in-flight requests.
    pub id: u64,
    /// Chained hashes of the full prompt blocks, in the engine's block size (extra entries beyond
    /// `prompt_tokens / block_size` are ignored).
    pub blocks: Vec<u64>,
    /// Token ids of those blocks (`block_size` per block) for KV events; may be empty. May also
    /// hold every prompt token (needed to cache blocks of generated tokens).
    pub block_tokens: Vec<u32>,
    /// Prompt length in tokens (0 counts as 1).
    pub prompt_tokens: u32,
    /// Output tokens to generate (0 counts as 1).
    pub output_tokens: u32,
}

/// What one step did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepOutcome {
    /// Virtual time at which the step ends (its tokens become visible then).
    pub end_us: u64,
    /// Requests that produced their first token: (id, prompt tokens served from the cache).
    pub first_tokens: Vec<(u64, u32)>,
    /// Requests that produced one further token this step.
    pub decoded: Vec<u64>,
    /// Requests that produced their last token this step (also listed above).
    pub finished: Vec<u64>,
    /// Requests refused (waiting queue full, or longer than the model or the whole cache).
    pub rejected: Vec<u64>,
}

/// Instantaneous load, as an engine's metrics would show it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct EngineLoadView {
    /// Running sequences.
    pub running: u32,
    /// Waiting sequences.
    pub waiting: u32,
    /// Fraction of KV blocks pinned by running sequences (0..1).
    pub kv_usage: f64,
    /// Prompt tokens not yet prefilled (waiting prompts counted in full).
    pub pending_prefill_tokens: u64,
}

/// Cumulative counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EngineStats {
    /// Requests submitted (accepted or not).
    pub requests_submitted: u64,
    /// Requests refused.
    pub requests_rejected: u64,
    /// Requests that produced all their tokens.
    pub requests_finished: u64,
    /// Requests aborted by the caller.
    pub requests_aborted: u64,
    /// Prefix cache queries, in prompt tokens (vLLM `prefix_cache_queries`).
    pub prefix_cache_queries: u64,
    /// Prefix cache hits, in tokens (vLLM `prefix_cache_hits`), CPU-tier hits included.
    pub prefix_cache_hits: u64,
    /// Hit tokens served from the CPU tier.
    pub cpu_cache_hits: u64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: u64,
    /// Output tokens generated.
    pub generation_tokens: u64,
    /// Prompt tokens actually computed (uncached; recomputation after preemption included).
    pub prefill_computed_tokens: u64,
    /// Preemptions (recompute).
    pub preemptions: u64,
    /// GPU block evictions.
    pub evictions: u64,
    /// Engine steps run.
    pub steps: u64,
    /// Virtual microseconds spent in steps.
    pub busy_us: u64,
    /// KV events dropped because the buffer was full.
    pub kv_events_dropped: u64,
}

/// The engine model. See the module doc.
#[derive(Debug)]
pub struct EngineModel {
    sched: Scheduler,
}

impl EngineModel {
    /// A cold engine. Parameters are clamped to sane minimums (use
    /// [`EngineParams::validate`] to reject bad ones first).
    pub fn new(params: EngineParams) -> Self {
        let mut params = params;
        params.block_size = params.block_size.clamp(1, 4096);
        params.num_gpu_blocks = params.num_gpu_blocks.max(1);
        params.max_num_seqs = params.max_num_seqs.max(1);
        params.max_num_batched_tokens = params.max_num_batched_tokens.max(1);
        params.max_waiting = params.max_waiting.max(1);
        params.max_kv_events = params.max_kv_events.max(1);
        EngineModel {
            sched: Scheduler::new(params),
        }
    }

    /// The parameters in force.
    pub fn params(&self) -> &EngineParams {
        &self.sched.params
    }

    /// Queues a request. A refused request (queue full, too long) is reported in the next
    /// step's `rejected`.
    pub fn submit(&mut self, req: SimRequest, now_us: u64) {
        // The caller may ignore the result; refusals still surface through `step`.
        let _ = self.try_submit(req, now_us);
    }

    /// Queues a request, or refuses it now (it is then also reported by the next step).
    pub fn try_submit(&mut self, req: SimRequest, now_us: u64) -> Result<(), SimRequest> {
        self.try_submit_with_output(req, Vec::new(), now_us)
    }

    /// Like [`EngineModel::try_submit`], also giving the token ids the request will generate.
    /// With them, and with `block_tokens` holding *every* prompt token (not only the full
    /// blocks'), full blocks of generated tokens are cached as vLLM does, chained from the last
    /// prompt block with [`crate::hashing::engine_chain_hash`].
    pub fn try_submit_with_output(
        &mut self,
        req: SimRequest,
        output_ids: Vec<u32>,
        now_us: u64,
    ) -> Result<(), SimRequest> {
        let s = &mut self.sched;
        s.counters.submitted += 1;
        if s.waiting.len() >= s.params.max_waiting as usize || !s.admissible(&req) {
            s.counters.rejected += 1;
            if s.rejected.len() < s.params.max_waiting as usize {
                s.rejected.push(req.id);
            }
            return Err(req);
        }
        let _ = now_us;
        s.waiting.push_back(Seq::new(req, output_ids));
        Ok(())
    }

    /// When idle: `None`. Otherwise runs ONE step starting at `now_us` and returns what happened.
    pub fn step(&mut self, now_us: u64) -> Option<StepOutcome> {
        self.sched.step(now_us)
    }

    /// Whether there is nothing to run or report.
    pub fn is_idle(&self) -> bool {
        self.sched.running.is_empty()
            && self.sched.waiting.is_empty()
            && self.sched.rejected.is_empty()
    }

    /// Current load.
    pub fn load(&self) -> EngineLoadView {
        let s = &self.sched;
        let pending_running: u64 = s
            .running
            .iter()
            .map(|q| u64::from(q.prefill_target.saturating_sub(q.computed)))
            .sum();
        let pending_waiting: u64 = s.waiting.iter().map(|q| u64::from(q.prefill_target)).sum();
        EngineLoadView {
            running: s.running.len() as u32,
            waiting: s.waiting.len() as u32,
            kv_usage: s.pool.usage(),
            pending_prefill_tokens: pending_running + pending_waiting,
        }
    }

    /// Cumulative counters.
    pub fn stats(&self) -> EngineStats {
        let c = &self.sched.counters;
        EngineStats {
            requests_submitted: c.submitted,
            requests_rejected: c.rejected,
            requests_finished: c.finished,
            requests_aborted: c.aborted,
            prefix_cache_queries: c.prefix_queries,
            prefix_cache_hits: c.prefix_hits,
            cpu_cache_hits: c.cpu_hit_tokens,
            prompt_tokens: c.prompt_tokens,
            generation_tokens: c.generation_tokens,
            prefill_computed_tokens: c.prefill_computed_tokens,
            preemptions: c.preemptions,
            evictions: self.sched.pool.evictions(),
            steps: c.steps,
            busy_us: c.busy_us,
            kv_events_dropped: self.sched.pool.events_dropped(),
        }
    }

    /// Clears the prefix cache like vLLM's `POST /reset_prefix_cache`: refused (false) while any
    /// request holds blocks; on success an `AllBlocksCleared` event is buffered (a server
    /// publishes it with the next step's batch, as vLLM does).
    pub fn reset_prefix_cache(&mut self, now_us: u64) -> bool {
        let _ = now_us;
        self.sched.pool.reset(true)
    }

    /// Aborts a request (client gone): frees its blocks. Returns whether it was in flight.
    pub fn abort(&mut self, id: u64) -> bool {
        self.sched.abort(id)
    }

    /// Simulates a process restart: every request dropped, cache and buffered events gone, no
    /// `AllBlocksCleared` (a restarted vLLM announces nothing). Returns the dropped request ids.
    pub fn restart(&mut self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.sched.running.iter().map(|s| s.req.id).collect();
        ids.extend(self.sched.waiting.iter().map(|s| s.req.id));
        let params = self.sched.params.clone();
        self.sched = Scheduler::new(params);
        ids
    }

    /// Takes the KV events buffered since the last call.
    pub fn drain_kv_events(&mut self) -> Vec<KvEvent> {
        self.sched.pool.drain_events()
    }

    /// Usable GPU blocks (`num_gpu_blocks − 1`: one is vLLM's reserved null block).
    pub fn capacity_blocks(&self) -> u32 {
        self.sched.pool.capacity()
    }

    /// Blocks currently cached on the GPU (pinned or evictable).
    pub fn cached_blocks(&self) -> usize {
        self.sched.pool.num_cached()
    }

    /// Whether the engine hash is cached on the GPU.
    pub fn is_cached(&self, hash: u64) -> bool {
        self.sched.pool.contains(hash)
    }

    /// Engine hashes cached on the GPU (unordered).
    pub fn cached_hashes(&self) -> Vec<u64> {
        self.sched.pool.cached_hashes()
    }
}
