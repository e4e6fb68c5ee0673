//! Continuous-batching step scheduler (after vLLM v1's scheduler).
//!
//! Each step:
//! 1. running sequences in admission order: a decoding one takes 1 token, a prefilling one its
//!    next chunk (bounded by the remaining token budget); if its blocks cannot be allocated, the
//!    most recently admitted running sequence is preempted (recompute: its blocks are freed, it
//!    returns to the front of the waiting queue and later re-prefills prompt + output so far);
//! 2. waiting sequences in FCFS order while `max_num_seqs` and the budget allow: the prefix cache
//!    is looked up (at most `(prompt − 1) / block_size` blocks, vLLM always recomputes the last
//!    token), hit blocks are pinned, blocks for the first chunk are allocated, or admission stops;
//! 3. every scheduled sequence advances; full prompt blocks are cached (`BlockStored`), and so are
//!    full blocks of generated tokens when the request supplied its prompt and output token ids
//!    (chained with the engine hash of [`crate::hashing`]); a sequence
//!    whose prefill completes emits its first token, a decoding one its next token; finished
//!    sequences free their blocks tail-first.
//!
//! Invariants: a running sequence holds exactly `ceil(computed / block_size)` blocks after each
//! step; every block is either pinned by running sequences or in the pool's free queue; waiting
//! sequences hold no blocks.

use std::collections::VecDeque;

use super::block_pool::BlockPool;
use super::engine::{SimRequest, StepOutcome};
use super::params::EngineParams;
use super::timing::BatchShape;
use crate::hashing::engine_chain_hash;

/// One request inside the engine.
#[derive(Debug)]
pub(crate) struct Seq {
    pub req: SimRequest,
    /// Tokens whose KV is computed.
    pub computed: u32,
    /// Tokens to prefill before the next token can be sampled (prompt, or prompt + output so far
    /// after a preemption).
    pub prefill_target: u32,
    /// Output tokens produced.
    pub generated: u32,
    /// Physical blocks held, in token order.
    pub blocks: Vec<u32>,
    /// How many leading prompt blocks of `blocks` are registered in the cache.
    pub cached_blocks: usize,
    /// Prompt tokens served from the cache at first admission (reported as `cached_tokens`).
    pub cached_tokens: u32,
    /// Whether it was admitted at least once (stats count the first admission only).
    pub admitted_once: bool,
    pub first_token_done: bool,
    /// Token ids the request will generate (empty: output blocks are not cached).
    pub output_ids: Vec<u32>,
    /// Engine hashes of cached output blocks (block `prompt / bs + k` at index `k`).
    pub output_hashes: Vec<u64>,
}

impl Seq {
    pub fn new(req: SimRequest, output_ids: Vec<u32>) -> Self {
        let prompt = req.prompt_tokens.max(1);
        Seq {
            req,
            computed: 0,
            prefill_target: prompt,
            generated: 0,
            blocks: Vec::new(),
            cached_blocks: 0,
            cached_tokens: 0,
            admitted_once: false,
            first_token_done: false,
            output_ids,
            output_hashes: Vec::new(),
        }
    }

    fn prompt(&self) -> u32 {
        self.req.prompt_tokens.max(1)
    }

    fn output(&self) -> u32 {
        self.req.output_tokens.max(1)
    }

    /// Whether full blocks holding generated tokens are cached too: needs every prompt token,
    /// every full prompt block's hash (at least one, to chain from) and the output ids.
    fn caches_output(&self, bs: u32) -> bool {
        let pf = (self.prompt() / bs) as usize;
        !self.output_ids.is_empty()
            && pf >= 1
            && self.req.blocks.len() >= pf
            && self.req.block_tokens.len() >= self.prompt() as usize
    }

    /// Token at position `t` of prompt + output.
    fn token_at(&self, t: usize) -> Option<u32> {
        let p = self.prompt() as usize;
        if t < p {
            self.req.block_tokens.get(t).copied()
        } else {
            self.output_ids.get(t - p).copied()
        }
    }

    /// Prompt blocks eligible for caching: full blocks with a known hash.
    fn hashable_blocks(&self, bs: u32) -> usize {
        ((self.prompt() / bs) as usize).min(self.req.blocks.len())
    }
}

/// Counters kept by the scheduler.
#[derive(Clone, Debug, Default)]
pub(crate) struct Counters {
    pub submitted: u64,
    pub rejected: u64,
    pub finished: u64,
    pub aborted: u64,
    pub preemptions: u64,
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub cpu_hit_tokens: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub prefill_computed_tokens: u64,
    pub steps: u64,
    pub busy_us: u64,
}

/// Scheduler state.
#[derive(Debug)]
pub(crate) struct Scheduler {
    pub params: EngineParams,
    pub pool: BlockPool,
    pub waiting: VecDeque<Seq>,
    pub running: Vec<Seq>,
    pub rejected: Vec<u64>,
    pub counters: Counters,
}

fn blocks_for(tokens: u32, bs: u32) -> u32 {
    tokens.div_ceil(bs)
}

impl Scheduler {
    pub fn new(params: EngineParams) -> Self {
        // vLLM reserves one block as its null block: `num_gpu_blocks - 1` are usable.
        let pool = BlockPool::new(
            params.num_gpu_blocks.saturating_sub(1).max(1),
            params.block_size,
            params.num_cpu_blocks as usize,
            params.max_kv_events as usize,
        );
        Scheduler {
            params,
            pool,
            waiting: VecDeque::new(),
            running: Vec::new(),
            rejected: Vec::new(),
            counters: Counters::default(),
        }
    }

    /// Whether a request can ever run (fits the model length and the whole cache).
    pub fn admissible(&self, req: &SimRequest) -> bool {
        let total = req
            .prompt_tokens
            .max(1)
            .saturating_add(req.output_tokens.max(1));
        total <= self.params.max_model_len
            && blocks_for(total, self.params.block_size) <= self.pool.capacity()
    }

    /// Runs one step at `now_us`; `None` when there is nothing to do.
    pub fn step(&mut self, now_us: u64) -> Option<StepOutcome> {
        if self.running.is_empty() && self.waiting.is_empty() && self.rejected.is_empty() {
            return None;
        }
        let bs = self.params.block_size;
        let mut budget = self.params.max_num_batched_tokens;
        // (index into running, new tokens) of scheduled sequences.
        let mut scheduled: Vec<(usize, u32)> = Vec::new();
        let mut shape = BatchShape::default();

        // 1. Running sequences.
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() {
            let (computed, target) = (self.running[i].computed, self.running[i].prefill_target);
            let new = if computed < target {
                (target - computed).min(budget)
            } else {
                1
            };
            if new == 0 || new > budget {
                i += 1;
                continue;
            }
            let mut ok = false;
            loop {
                let need = blocks_for(computed + new, bs)
                    .saturating_sub(self.running[i].blocks.len() as u32);
                if let Some(b) = self.pool.allocate(need) {
                    self.running[i].blocks.extend(b);
                    ok = true;
                    break;
                }
                // Preempt the most recently admitted sequence (possibly this one).
                let victim = self.running.len() - 1;
                self.preempt(victim);
                preempted = true;
                if victim == i {
                    break;
                }
            }
            if !ok {
                break;
            }
            budget -= new;
            scheduled.push((i, new));
            i += 1;
        }

        // 2. Waiting sequences.
        while !preempted
            && budget > 0
            && (self.running.len() as u32) < self.params.max_num_seqs
            && !self.waiting.is_empty()
        {
            let Some(seq) = self.waiting.front() else {
                break;
            };
            let max_hit_blocks = ((seq.prefill_target.saturating_sub(1)) / bs) as usize;
            let hashes_len = seq.hashable_blocks(bs).min(max_hit_blocks);
            let hit = self.pool.lookup(&seq.req.blocks[..hashes_len], hashes_len);
            let gpu_hit = hit.gpu_blocks.len() as u32;
            let hit_blocks = gpu_hit + hit.cpu_blocks as u32;
            let hit_tokens = hit_blocks * bs;
            let new = (seq.prefill_target - hit_tokens).min(budget);
            let need = blocks_for(hit_tokens + new, bs) - gpu_hit;
            if self.pool.available_after_touch(&hit.gpu_blocks) < need {
                break;
            }
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            self.pool.touch(&hit.gpu_blocks);
            let Some(fresh) = self.pool.allocate(need) else {
                // Unreachable given the check above; undo and stop admitting.
                self.pool.free(&hit.gpu_blocks);
                self.waiting.push_front(seq);
                break;
            };
            seq.blocks = hit.gpu_blocks.clone();
            seq.blocks.extend(fresh);
            seq.cached_blocks = hit.gpu_blocks.len();
            if hit.cpu_blocks > 0 {
                // CPU-tier blocks are copied into the first fresh blocks and cached again.
                let from = gpu_hit as usize;
                let to = from + hit.cpu_blocks;
                let hashes: Vec<u64> = seq.req.blocks[from..to].to_vec();
                self.pool.touch_cpu(&hashes);
                let parent = if from > 0 {
                    Some(seq.req.blocks[from - 1])
                } else {
                    None
                };
                let tokens = token_slice(&seq.req.block_tokens, from, to, bs);
                self.pool
                    .cache_blocks(&seq.blocks[from..to], &hashes, parent, tokens);
                seq.cached_blocks = to;
                shape.cpu_loaded_tokens += u64::from(hit.cpu_blocks as u32 * bs);
            }
            seq.computed = hit_tokens;
            if !seq.admitted_once {
                seq.admitted_once = true;
                seq.cached_tokens = hit_tokens;
                self.counters.prefix_queries += u64::from(seq.prompt());
                self.counters.prefix_hits += u64::from(hit_tokens);
                self.counters.cpu_hit_tokens += u64::from(hit.cpu_blocks as u32 * bs);
                self.counters.prompt_tokens += u64::from(seq.prompt());
            }
            budget -= new;
            self.running.push(seq);
            scheduled.push((self.running.len() - 1, new));
        }

        // Nothing could be scheduled: only possible with no running sequences and a head of queue
        // that cannot fit, which `admissible` excludes; report rejections if any and idle.
        let rejected = std::mem::take(&mut self.rejected);
        if scheduled.is_empty() {
            if !preempted
                && rejected.is_empty()
                && self.running.is_empty()
                && !self.waiting.is_empty()
            {
                // Defensive: drop the blocked head so the engine cannot spin forever.
                if let Some(seq) = self.waiting.pop_front() {
                    self.counters.rejected += 1;
                    return Some(StepOutcome {
                        end_us: now_us,
                        rejected: vec![seq.req.id],
                        ..StepOutcome::default()
                    });
                }
            }
            return Some(StepOutcome {
                end_us: now_us,
                rejected,
                ..StepOutcome::default()
            });
        }

        // 3. Advance.
        for &(idx, new) in &scheduled {
            let s = &self.running[idx];
            if s.computed < s.prefill_target {
                shape.add_prefill(s.computed, new);
            } else {
                shape.add_decode(s.computed);
            }
        }
        let dur = self.params.timing.step_us(&shape);
        let end_us = now_us + dur;
        self.counters.steps += 1;
        self.counters.busy_us += dur;
        self.counters.prefill_computed_tokens += shape.prefill_tokens;

        let mut out = StepOutcome {
            end_us,
            rejected,
            ..StepOutcome::default()
        };
        for &(idx, new) in &scheduled {
            let s = &mut self.running[idx];
            s.computed += new;
            // Cache prompt blocks that became full.
            let full = ((s.computed.min(s.prompt()) / bs) as usize).min(s.hashable_blocks(bs));
            if full > s.cached_blocks {
                let from = s.cached_blocks;
                let parent = if from > 0 {
                    Some(s.req.blocks[from - 1])
                } else {
                    None
                };
                let tokens = token_slice(&s.req.block_tokens, from, full, bs);
                self.pool.cache_blocks(
                    &s.blocks[from..full],
                    &s.req.blocks[from..full],
                    parent,
                    tokens,
                );
                s.cached_blocks = full;
            }
            // Cache blocks of generated tokens that became full (vLLM caches them too, so the
            // next turn of a conversation hits its own previous answer).
            if s.caches_output(bs) {
                let pf = (s.prompt() / bs) as usize;
                let total_full = (s.computed / bs) as usize;
                while s.cached_blocks >= pf && s.cached_blocks < total_full {
                    let j = s.cached_blocks;
                    let k = j - pf;
                    let start = j * bs as usize;
                    let tokens: Option<Vec<u32>> = (start..start + bs as usize)
                        .map(|t| s.token_at(t))
                        .collect();
                    let Some(tokens) = tokens else { break };
                    let parent = if k == 0 {
                        s.req.blocks[pf - 1]
                    } else {
                        s.output_hashes[k - 1]
                    };
                    let h = match s.output_hashes.get(k) {
                        Some(&h) => h,
                        None => {
                            let h = engine_chain_hash(parent, &tokens);
                            s.output_hashes.push(h);
                            h
                        }
                    };
                    self.pool
                        .cache_blocks(&s.blocks[j..j + 1], &[h], Some(parent), Some(&tokens));
                    s.cached_blocks += 1;
                }
            }
            if s.computed >= s.prefill_target {
                s.generated += 1;
                self.counters.generation_tokens += 1;
                if s.first_token_done {
                    out.decoded.push(s.req.id);
                } else {
                    s.first_token_done = true;
                    out.first_tokens.push((s.req.id, s.cached_tokens));
                }
                if s.generated >= s.output() {
                    out.finished.push(s.req.id);
                }
            }
        }
        if !out.finished.is_empty() {
            let mut kept = Vec::with_capacity(self.running.len());
            for s in self.running.drain(..) {
                if s.generated >= s.output() {
                    self.pool.free(&s.blocks);
                    self.counters.finished += 1;
                } else {
                    kept.push(s);
                }
            }
            self.running = kept;
        }
        Some(out)
    }

    /// Moves `running[idx]` back to the waiting queue's front, freeing its blocks.
    fn preempt(&mut self, idx: usize) {
        let mut s = self.running.remove(idx);
        self.pool.free(&s.blocks);
        s.blocks.clear();
        s.cached_blocks = 0;
        s.computed = 0;
        s.prefill_target = s.prompt() + s.generated;
        self.counters.preemptions += 1;
        self.waiting.push_front(s);
    }

    /// Removes a request wherever it is, freeing its blocks. Returns whether it was found.
    pub fn abort(&mut self, id: u64) -> bool {
        if let Some(pos) = self.running.iter().position(|s| s.req.id == id) {
            let s = self.running.remove(pos);
            self.pool.free(&s.blocks);
            self.counters.aborted += 1;
            return true;
        }
        if let Some(pos) = self.waiting.iter().position(|s| s.req.id == id) {
            self.waiting.remove(pos);
            self.counters.aborted += 1;
            return true;
        }
        false
    }
}

/// Token ids of blocks `from..to`, when the request supplied them all.
fn token_slice(tokens: &[u32], from: usize, to: usize, bs: u32) -> Option<&[u32]> {
    let bs = bs as usize;
    tokens.get(from * bs..to * bs)
}
