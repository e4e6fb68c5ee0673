//! `kvgate`: the default policy. Lowest predicted cost in milliseconds wins.
//!
//! # Model
//!
//! For each candidate `c` (rate `r_c` in prefill tokens/s, `tpb` tokens per block):
//!
//! ```text
//! credit_c   = gpu_c·κ_gpu + cpu_c·κ_cpu + disk_c·κ_disk            (leading blocks, tier-weighted)
//! uncached_c = prompt_tokens − min(credit_c·tpb, prompt_tokens)
//! queued_c   = router pending prefill tokens + foreign waiting × engine_waiting_tokens
//! ttft_c     = (queued_c + uncached_c) / r_c + decode_interference_c × decoding_c
//! stall_c    = stall_weight × decoding_c × uncached_c / r_c
//! redo_c     = min((max_k credit_k − credit_c)·tpb, prompt_tokens)   (recompute beyond the best match)
//! fleet_c    = redo_c / r_c × φ_c,   φ_c = min(base_c + fleet_load_weight × w_c, fleet_max_factor)
//! base_c     = fleet_weight if c has requests in flight, idle_fleet_weight (default 0) if not
//! replica_c  = −replica_credit × redo_c / r_c   if c has nothing in flight and the best match is
//!              held by ≥ 2 instances, all with requests in flight; 0 otherwise
//! cost_c     = ttft_c + stall_c + fleet_c + replica_c                       (objective ttft)
//! ```
//!
//! `w_c` is the number of requests waiting for their first token on `c`: router-tracked plus
//! foreign waiting requests; `decoding_c` the sequences past their first token there.
//!
//! With the `e2e` objective (the default) the cost covers the whole request and what it does to
//! the others on `c` (`o` expected output tokens, `ctx` = prompt + o/2 its mean context while
//! decoding, `K_c` the decoding sequences' total context, `D_c` the learned decode step model
//! `tpot(seqs, context) = step + per_seq·seqs + per_kctx·context/1000`):
//!
//! ```text
//! stall_c    = ω × decoding_c × uncached_c / r_c              (each decoding neighbour waits out its prefill)
//! tpot_c     = D_c.tpot(decoding_c + 1, K_c + ctx)             (its own pace in the batch it joins)
//! decode_c   = ω × (o − 1) × (tpot_c − min_k D_k.tpot(1, ctx)) (its own decode, beyond the best pace)
//! impact_c   = ω × decoding_c × D_c.added(ctx) × min(o, left_c) (every neighbour's later steps grow)
//! cost_c     = ttft_c + stall_c + fleet_c + replica_c + decode_c + impact_c
//! ```
//!
//! and its time to first token includes the wait for KV memory: when the batch's context plus
//! its own exceeds the instance's KV capacity, the excess must be freed by sequences finishing
//! (spread over their remaining decode). This is what stops a cache-sticky instance from
//! collecting conversations until it queues for memory.
//!
//! `ω` is `decode_weight` (default 0.5; at 1 every user's milliseconds count alike, so the policy
//! minimises the sum of everyone's end-to-end latency, the mean E2E); `left_c` the decoding
//! sequences' mean remaining output (half their expected totals). With `size_weight` `τ > 0`,
//! `stall_c` and `impact_c` are multiplied by `min(1, (s_n / s_r)^τ)` (at least 1/4), `s` being a
//! request's time alone on `c` and `n` the batch's mean sequence: a request larger than its
//! neighbours discounts their delays. A sum of latencies is minimised by sorting requests by
//! size, which leaves the largest ones (a long prompt stalls every neighbour, so it avoids busy
//! instances for the few with few neighbours and queues there behind other long prompts) with
//! the p99; the discount trades some of the mean for that tail. The `slo` objective adds
//! `slo_penalty_ms` for each request pushed past a target: this one if its predicted first token is later than
//! `ttft_slo_ms` or its pace slower than `tpot_slo_ms`, and each neighbour whose pace this
//! request pushes over `tpot_slo_ms`.
//!
//! Why the decode terms: a time-to-first-token cost sees an instance with few prefills queued as
//! cheap however many sequences it is streaming, so it keeps collecting requests while its decode
//! batch — and every sequence's time per token — grows. With long prompts each decoding sequence
//! reads tens of thousands of tokens of KV per step, so one instance can end up decoding at a
//! fraction of its neighbours' pace; the decode terms price exactly that, and mixed hardware
//! (an instance that decodes slower) is priced by its learned step model.
//!
//! Why each term:
//! - `ttft_c` is what this request waits there. Blocks every instance holds (a shared system prompt)
//!   reduce every `uncached_c` equally and cancel out, so load decides: no funnelling.
//! - `stall_c` is what its prefill costs the users already streaming there: a continuous-batching
//!   step that carries a prefill chunk makes every decoding sequence in the batch wait for it, so
//!   `decoding_c` users each lose `uncached_c / r_c`. It is weighted low (a first token matters
//!   more to its user than one later token to each of the others; at higher weights the policy
//!   trades queue for decode balance and mean TTFT suffers); it moves a request off an instance
//!   streaming to many users when one streaming to fewer serves it about as fast, which shortens
//!   mean end-to-end latency.
//! - `fleet_c` is what this choice costs everyone else: prefill work the fleet already did once and
//!   would redo here. Work redone on `c` delays the requests that queue behind it there, and how
//!   many will queue there grows with its queue, hence `φ_c` grows with `w_c`: recomputing when
//!   every queue is deep (overload) is priced up to `fleet_max_factor` times the work. A
//!   TTFT-only greedy choice trades cache hits for a shorter queue until total prefill work
//!   outgrows the fleet; pricing redundant work higher as queues fill keeps the hit ratio as load
//!   rises.
//! - An instance with nothing in flight has no one to delay: its time is otherwise lost to the
//!   fleet, and a recompute there is not redundant work but a new replica of a prefix that the
//!   busy holders would otherwise keep serving alone (later requests then have one more holder
//!   to choose from). So the base price `fleet_weight` applies only to occupied instances;
//!   an empty one pays `idle_fleet_weight` (default 0) plus the request's own longer prefill,
//!   which `ttft_c` already counts. Without this, a prefix shared by all traffic stayed on its
//!   first holders: recomputing it elsewhere was priced at twice its prefill time, more than the
//!   short queues of a lightly loaded fleet ever cost.
//! - `replica_c` is what a new copy of a shared prefix is worth to later requests. A prefix held
//!   by several instances is shared across traffic (one conversation's history lives on one
//!   instance): later requests will need it again. When every holder is busy and `c` is empty,
//!   the recompute on `c` buys the fleet one more instance those requests can use without
//!   queueing or stalling anyone, so it is an investment that later requests pay back, not a cost
//!   of this request alone: `replica_credit` (default 1) of it is taken off this request's
//!   price. The request is then priced as if `c` held the prefix, and being idle, `c` wins the
//!   tie with busy holders. Nothing changes where an instance is never empty (the load that
//!   matters for queueing) or for a prefix held by one instance. Without this term a lightly
//!   loaded fleet kept a shared system prompt on two or three instances: their short queues never
//!   cost more than the recompute, yet mean TTFT and E2E fell behind round robin because every
//!   request shared a batch with the others on those few instances.
//! - A hot prefix still spreads to a second instance when the holder's queue (and stall) costs
//!   more than recomputing the prefix elsewhere, `(1 + φ)` times the recompute on an occupied
//!   instance, once on an idle one; once the second copy is indexed both hold it and load decides
//!   between them.
//! - A request that matches nowhere (cold prefix) has `fleet_c = 0` everywhere and goes to the
//!   instance with the least predicted queue: new prefixes spread over the fleet.
//! - Scores within `tie_epsilon_ms`, or within `tie_relative` of the best, tie: smaller differences
//!   are below what learned rates and load snapshots resolve (left to decide, rate noise alone
//!   would keep sending idle-time traffic to whichever instance looks a few percent faster). Ties
//!   go to the fewest requests in flight, which also evens out decode batches, then to the lowest
//!   hash of (request seed, instance id), so slice position never matters.
//! - With gateway replicas, other replicas decide at the same moment on the same view
//!   ([`RouteRequest::concurrent_decisions`], scaled by `concurrency_weight`). A deterministic
//!   choice would be theirs too: a burst split across replicas would pile onto one instance,
//!   where a single gateway fills the cheapest instances one request after another. So the
//!   decision places the peers' (cold) requests first, one after another under the tie rule; a
//!   cold request then takes one of the burst's places at random, any other the cheapest once the
//!   burst's queue is added (see `policy::concurrent`). Below 0.05 expected concurrent
//!   decisions the choice is as alone.
//!
//! A routing decision is inserted into the placement index at once (a predicted placement), so
//! requests routed while the holder is still computing the prefix are credited with it there.
//! That is deliberate: the engine computes it once and later requests queue behind it, which
//! `queued_c` (pending prefill tokens until the first token) prices; with the idle base price at
//! 0, a burst of early requests still spreads once the first holder's queue exceeds a recompute.
//!
//! Engine-scraped load is used only when fresh (`stale == false`) and only for the part the router
//! cannot see itself ("foreign" load: requests from other clients, or replicas not sharing load).
//! The router's own counts are updated at dispatch and first token and never lag; a scrape does lag,
//! so it would keep reporting a request as waiting after it started. Foreign load is therefore the
//! engine's waiting + running in excess of the router's in-flight count for that instance when the
//! scrape was taken ([`crate::load::EngineLoad::tracked_in_flight`]), taken from the waiting queue
//! first. Compared with the count at decision time instead, a scrape up to an interval old would
//! report the router's own requests that finished since as foreign work, on exactly the instances
//! that just emptied: they would look busy until the next scrape.

use super::concurrent::Burst;
use super::config::{KvgateParams, Objective};
use super::share::ShareLedger;
use super::util::{argmin_seeded, decision, mix, prefilling, tie_key, unit_f64};
use super::{Candidate, Decision, Policy, Reason, RouteRequest};

/// The cost-based default policy.
#[derive(Clone, Debug, Default)]
pub struct Kvgate {
    params: KvgateParams,
    /// Requests each instance took beyond the share bound (`max_share`; empty while it is off).
    share: ShareLedger,
}

/// One candidate's priced terms (exposed for explanations and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KvgateTerms {
    /// Predicted time to first token on this candidate, ms.
    pub ttft_ms: f64,
    /// Price of the wait its prefill imposes on the sequences decoding there, ms.
    pub stall_ms: f64,
    /// Fleet cost of the recompute beyond the best available match, ms.
    pub fleet_ms: f64,
    /// Value to later requests of the new replica this choice would make, ms (0 or negative).
    pub replica_ms: f64,
    /// Its own decode after the first token at its predicted pace there, beyond the decode at the
    /// best pace any candidate offers (the fastest with an empty batch), ms (0 under `ttft`).
    pub decode_ms: f64,
    /// What it adds to the decode of the sequences already there, ms (0 under `ttft`).
    pub impact_ms: f64,
    /// Price of the requests it pushes past a target, ms (0 unless `slo`).
    pub slo_ms: f64,
    /// Price of the requests it took beyond the share bound, ms (0 while `max_share` is off).
    pub share_ms: f64,
    /// Predicted time per output token there once it joins the batch, ms.
    pub tpot_ms: f64,
    /// Time to first token plus stall, as they would be were the prompt's prefix held nowhere
    /// beyond what every candidate holds (a *cold* request of its size), ms (0 while
    /// `concurrency_weight` is off: only a decision among peers reads it).
    pub cold_ms: f64,
    /// That cold request's prefill there, ms: what one more of it adds to the queue there (see
    /// `policy::concurrent`; 0 while `concurrency_weight` is off).
    pub cold_prefill_ms: f64,
}

/// The candidates' credited matches: the best, and what every candidate holds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CreditRange {
    /// The largest tier-weighted credit of any candidate.
    pub best: f64,
    /// The smallest (what all hold), at most `best`.
    pub common: f64,
}

impl CreditRange {
    /// Whether no candidate holds more of the prompt than another (a *cold* request).
    pub fn is_cold(&self) -> bool {
        self.best <= self.common
    }
}

impl KvgateTerms {
    /// The score: lower wins.
    pub fn cost_ms(&self) -> f64 {
        self.ttft_ms
            + self.stall_ms
            + self.fleet_ms
            + self.replica_ms
            + self.decode_ms
            + self.impact_ms
            + self.slo_ms
            + self.share_ms
    }

    /// The score of a cold request of this size (no fleet or replica terms: it matches nowhere
    /// more than anywhere else).
    pub fn cold_cost_ms(&self) -> f64 {
        self.cold_ms + self.decode_ms + self.impact_ms + self.slo_ms + self.share_ms
    }
}

impl Kvgate {
    /// A policy with these parameters.
    pub fn new(params: KvgateParams) -> Self {
        Self {
            params,
            share: ShareLedger::default(),
        }
    }

    /// Whether decisions take the peers' concurrent ones into account.
    fn with_peers(&self) -> bool {
        self.params.concurrency_weight > 0.0
    }

    /// Whether the share bound is on.
    fn bounds_share(&self) -> bool {
        self.params.max_share > 0.0 && self.params.share_price > 0.0
    }

    /// Tier-weighted credited leading blocks of a candidate.
    fn credit(&self, c: &Candidate) -> f64 {
        let p = &self.params;
        f64::from(c.matched.gpu) * p.gpu_credit
            + f64::from(c.matched.cpu) * p.cpu_credit
            + f64::from(c.matched.disk) * p.disk_credit
    }

    /// Requests waiting for their first token on `c`: router-tracked plus foreign ones.
    fn waiting(c: &Candidate) -> f64 {
        f64::from(prefilling(c)) + f64::from(foreign(c).waiting)
    }

    /// Priced terms of every candidate, in candidate order, appended to `out`; returns the
    /// candidates' credit range.
    pub fn terms(
        &self,
        req: &RouteRequest<'_>,
        candidates: &[Candidate],
        out: &mut Vec<KvgateTerms>,
    ) -> CreditRange {
        let p = &self.params;
        let start = out.len();
        let tpb = f64::from(req.tokens_per_block.max(1));
        let prompt = f64::from(req.prompt_tokens);
        let best = candidates
            .iter()
            .map(|c| self.credit(c))
            .fold(0.0, f64::max);
        let common = candidates
            .iter()
            .map(|c| self.credit(c))
            .fold(f64::INFINITY, f64::min)
            .min(best);
        let with_peers = self.with_peers();
        let cold_uncached = prompt - (common * tpb).min(prompt);
        // The best match is a shared prefix worth another replica when several instances hold it
        // (one conversation's history lives on one instance) and all of them have work in flight.
        let (mut holders, mut all_busy) = (0usize, true);
        if best > 0.0 {
            for c in candidates.iter().filter(|c| self.credit(c) >= best) {
                holders += 1;
                all_busy &= occupancy(c) > 0;
            }
        }
        let shared_and_busy = holders >= SHARED_HOLDERS && all_busy;
        let whole = p.objective != Objective::Ttft;
        let omega = if whole { p.decode_weight.max(0.0) } else { 0.0 };
        let output = f64::from(req.expected_output_tokens.max(1));
        let own_ctx = prompt + output / 2.0;
        // Own decode is priced beyond the best pace any candidate offers (the fastest one with an
        // empty batch): a constant taken off every candidate changes no choice, but left in, the
        // relative tie (`tie_relative` of the best cost) would widen with the output length until
        // it swallowed the differences that matter.
        let pace_floor = candidates
            .iter()
            .map(|c| c.decode.tpot_ms(1.0, own_ctx))
            .fold(f64::INFINITY, f64::min);
        out.extend(candidates.iter().map(|c| {
            let rate_per_ms = c.rates.prefill_tokens_per_s.max(1.0) / 1000.0;
            let credit = self.credit(c);
            let uncached = prompt - (credit * tpb).min(prompt);
            let other = foreign(c);
            let queued = c.load.pending_prefill_tokens as f64
                + f64::from(other.waiting) * p.engine_waiting_tokens;
            let decoding = f64::from(c.load.decoding) + f64::from(other.running);
            let prefill_ms = uncached / rate_per_ms;
            let ttft_ms = queued / rate_per_ms
                + prefill_ms
                + c.rates.decode_interference_ms.max(0.0) * decoding;
            // Under e2e every request in flight there shares the batch with this one while it
            // prefills and decodes: the ones waiting ahead of it decode by the time it runs.
            let sharing = if whole {
                f64::from(occupancy(c))
            } else {
                decoding
            };
            let stall_weight = if whole {
                omega
            } else {
                p.stall_weight.max(0.0)
            };
            let stall_ms = stall_weight * sharing * prefill_ms;
            let (cold_ms, cold_prefill_ms) = if with_peers {
                let cold_prefill_ms = cold_uncached / rate_per_ms;
                let cold_ms =
                    ttft_ms - prefill_ms + cold_prefill_ms * (1.0 + stall_weight * sharing);
                (cold_ms, cold_prefill_ms)
            } else {
                (0.0, 0.0)
            };
            let redo = ((best - credit) * tpb).clamp(0.0, prompt);
            let occupied = occupancy(c) > 0;
            let base = if occupied {
                p.fleet_weight
            } else {
                p.idle_fleet_weight
            };
            let phi = (base + p.fleet_load_weight * Self::waiting(c))
                .clamp(0.0, p.fleet_max_factor.max(0.0));
            let replica_ms = if shared_and_busy && !occupied {
                -p.replica_credit.clamp(0.0, 1.0) * redo / rate_per_ms
            } else {
                0.0
            };
            let batch = Batch::of(c, sharing, own_ctx, output);
            let tpot_before = c.decode.tpot_ms(sharing, batch.context_tokens);
            let memory_ms = if whole {
                batch.memory_wait_ms(c, req.kv_block_tokens, own_ctx, tpot_before)
            } else {
                0.0
            };
            let ttft_ms = ttft_ms + memory_ms;
            let added = c.decode.added_per_step_ms(own_ctx);
            let tpot_ms = tpot_before + added;
            let decode_ms = omega * (output - 1.0) * (tpot_ms - pace_floor).max(0.0);
            let sized = if whole {
                batch.neighbour_weight(c, sharing, prompt, output, p.size_weight)
            } else {
                1.0
            };
            let stall_ms = stall_ms * sized;
            let impact_ms = sized * omega * sharing * added * output.min(batch.mean_left_tokens);
            let slo_ms = if p.objective == Objective::Slo {
                let mut missed = f64::from(u8::from(ttft_ms > p.ttft_slo_ms))
                    + f64::from(u8::from(tpot_ms > p.tpot_slo_ms));
                if tpot_before <= p.tpot_slo_ms && tpot_ms > p.tpot_slo_ms {
                    missed += sharing;
                }
                missed * p.slo_penalty_ms
            } else {
                0.0
            };
            KvgateTerms {
                ttft_ms,
                stall_ms,
                fleet_ms: redo / rate_per_ms * phi,
                replica_ms,
                decode_ms,
                impact_ms,
                slo_ms,
                share_ms: 0.0,
                tpot_ms,
                cold_ms: if with_peers { cold_ms + memory_ms } else { 0.0 },
                cold_prefill_ms,
            }
        }));
        if self.bounds_share() {
            self.price_share(candidates, &mut out[start..]);
        }
        CreditRange { best, common }
    }

    /// Adds each candidate's share price (see [`super::share`]) to its terms.
    fn price_share(&self, candidates: &[Candidate], terms: &mut [KvgateTerms]) {
        let best = terms
            .iter()
            .map(KvgateTerms::cost_ms)
            .filter(|c| c.is_finite())
            .fold(f64::INFINITY, f64::min);
        if !best.is_finite() || best <= 0.0 {
            return;
        }
        let mut queues = Vec::with_capacity(candidates.len());
        self.share.queues(candidates, &mut queues);
        for (t, q) in terms.iter_mut().zip(queues) {
            t.share_ms = best * ((self.params.share_price * q).min(MAX_SHARE_EXPONENT).exp() - 1.0);
        }
    }
}

/// The decode batch a request would join on a candidate, as far as the router knows it.
struct Batch {
    /// Total context of the sequences decoding there, tokens.
    context_tokens: f64,
    /// Their mean remaining output, tokens.
    mean_left_tokens: f64,
}

impl Batch {
    /// Weight of a neighbour's delay against this request's own under `size_weight` `τ`:
    /// `min(1, (s_neighbour / s_own)^τ)`, at least `MIN_SIZE_WEIGHT`, `s` being a request's time
    /// alone on `c` (its prefill at `c`'s rate plus its decode at an empty batch's pace). A
    /// neighbour is the batch's mean sequence: its prompt is its mean context less half its
    /// expected output. 1 at `τ = 0`, without neighbours, or for a request no larger than them.
    fn neighbour_weight(
        &self,
        c: &Candidate,
        sharing: f64,
        prompt: f64,
        output: f64,
        tau: f64,
    ) -> f64 {
        if tau <= 0.0 || sharing <= 0.0 {
            return 1.0;
        }
        let rate_per_ms = c.rates.prefill_tokens_per_s.max(1.0) / 1000.0;
        let alone = |prompt: f64, output: f64| {
            prompt / rate_per_ms + output * c.decode.tpot_ms(1.0, prompt + output / 2.0)
        };
        let mean_out = 2.0 * self.mean_left_tokens;
        let mean_prompt = (self.context_tokens / sharing - self.mean_left_tokens).max(0.0);
        let (theirs, own) = (alone(mean_prompt, mean_out), alone(prompt, output));
        if !(theirs > 0.0 && own > 0.0) {
            return 1.0;
        }
        (theirs / own).powf(tau).clamp(MIN_SIZE_WEIGHT, 1.0)
    }

    /// Time this request waits for KV memory on `c`: when the batch's context plus its own
    /// exceeds the instance's KV capacity, the excess has to be freed by sequences finishing,
    /// which finish spread over their remaining decode (about twice their mean remaining output
    /// at the current pace).
    fn memory_wait_ms(&self, c: &Candidate, block_tokens: u32, own_ctx: f64, tpot_ms: f64) -> f64 {
        let Some(blocks) = c.cache_capacity_blocks.filter(|&b| b > 0) else {
            return 0.0;
        };
        let capacity = blocks as f64 * f64::from(block_tokens.max(1));
        let excess = self.context_tokens + own_ctx - capacity;
        if excess <= 0.0 || self.context_tokens <= 0.0 {
            return 0.0;
        }
        let freed = (excess / self.context_tokens).min(1.0);
        freed * 2.0 * self.mean_left_tokens * tpot_ms
    }

    /// `decoding` sequences (router-tracked and foreign) on `c`. Sequences the router tracks
    /// carry their context and expected output; the others (foreign, or peers' whose sizes gossip
    /// does not carry) are assumed to be like the tracked ones, or like this request when none is
    /// tracked.
    fn of(c: &Candidate, decoding: f64, own_ctx: f64, own_out: f64) -> Batch {
        let tracked = f64::from(c.load.decoding);
        let (mean_ctx, mean_out) = if tracked > 0.0 && c.load.decoding_context_tokens > 0 {
            (
                c.load.decoding_context_tokens as f64 / tracked,
                c.load.decoding_output_tokens as f64 / tracked,
            )
        } else {
            (own_ctx, own_out)
        };
        Batch {
            context_tokens: mean_ctx * decoding,
            mean_left_tokens: mean_out / 2.0,
        }
    }
}

impl Kvgate {
    /// The lowest cost; costs within `tie_epsilon_ms` or `tie_relative` of it tie, and ties go
    /// to the fewest requests in flight (router-tracked plus foreign), then to the lowest
    /// [`tie_key`]. NaN costs never win.
    fn pick(&self, candidates: &[Candidate], scores: &[f64], seed: u64) -> Option<usize> {
        self.cheapest(
            scores,
            |i| occupancy(&candidates[i]),
            |i| tie_key(seed, candidates[i].id),
        )
        .or_else(|| argmin_seeded(candidates, scores, 0.0, seed))
    }

    /// The lowest of `scores` under the tie rule of [`Kvgate::pick`], with the requests in
    /// flight and the tie keys given per index. `None` when no score is finite.
    fn cheapest(
        &self,
        scores: &[f64],
        in_flight: impl Fn(usize) -> u32,
        key: impl Fn(usize) -> u64,
    ) -> Option<usize> {
        let min = scores
            .iter()
            .copied()
            .filter(|s| !s.is_nan())
            .fold(f64::INFINITY, f64::min);
        if !min.is_finite() {
            return None;
        }
        let p = &self.params;
        let slack = p.tie_epsilon_ms.max(0.0) + (p.tie_relative.max(0.0) * min).max(0.0);
        (0..scores.len())
            .filter(|&i| scores[i] <= min + slack)
            .min_by_key(|&i| (in_flight(i), key(i)))
    }
}

impl Kvgate {
    /// The choice when `concurrent` decisions by peers are expected on this same view (see
    /// [`super::concurrent`]): the peers' requests are placed first, one after another as a
    /// single router would (cold, under the tie rule); a cold request then takes one of the
    /// burst's places at random, any other the cheapest once the peers' are priced in.
    fn pick_among_peers(
        &self,
        candidates: &[Candidate],
        terms: &[KvgateTerms],
        credits: CreditRange,
        scores: &[f64],
        concurrent: f64,
        seed: u64,
    ) -> Option<usize> {
        let whole = concurrent.floor();
        let round_up = unit_f64(mix(seed ^ ROUNDING_SALT)) < concurrent - whole;
        let peers = (whole as usize + usize::from(round_up)).min(MAX_PEER_DECISIONS);
        let cold_request = credits.is_cold();
        let mut burst = Burst::new(
            terms.iter().map(KvgateTerms::cold_cost_ms).collect(),
            terms.iter().map(|t| t.cold_prefill_ms).collect(),
            candidates.iter().map(occupancy).collect(),
        );
        let mut places = Vec::with_capacity(peers + 1);
        for j in 0..peers + usize::from(cold_request) {
            let decision_seed = mix(seed ^ PEER_SALT ^ j as u64);
            let Some(i) = self.cheapest(
                &burst.cold,
                |i| burst.in_flight[i],
                |i| tie_key(decision_seed, candidates[i].id),
            ) else {
                break;
            };
            places.push(i);
            burst.place(i);
        }
        if cold_request && !places.is_empty() {
            let u = unit_f64(mix(seed ^ CONCURRENT_SALT));
            let slot = ((u * places.len() as f64) as usize).min(places.len() - 1);
            return Some(places[slot]);
        }
        let expected: Vec<f64> = scores
            .iter()
            .zip(&burst.added)
            .map(|(s, a)| s + a)
            .collect();
        self.cheapest(
            &expected,
            |i| burst.in_flight[i],
            |i| tie_key(seed, candidates[i].id),
        )
        .or_else(|| self.pick(candidates, scores, seed))
    }
}

/// Least weight of a neighbour's delay under `size_weight`: below it the estimate of the
/// neighbours' sizes (their mean) is too coarse to price one user's time a small fraction of
/// another's.
const MIN_SIZE_WEIGHT: f64 = 0.25;

/// Peers' concurrent decisions placed at most (a bound on the work of one decision).
const MAX_PEER_DECISIONS: usize = 64;

/// Salts of the draws a decision among peers makes (independent of the seed's tie keys).
const ROUNDING_SALT: u64 = 0x726f_756e_6469_6e67;
const PEER_SALT: u64 = 0x7065_6572_7365_6564;

/// Largest exponent of the share price: `e^40` times the best cost outprices any instance a
/// decision could prefer, and keeps the price finite.
const MAX_SHARE_EXPONENT: f64 = 40.0;

/// Concurrent decisions by peers from which on the choice is mixed (below it, rare coincidences
/// are left to the deterministic rule and its tie-breaking).
const MIN_CONCURRENT: f64 = 0.05;

/// Salt of the draw of a cold request's place in a burst.
const CONCURRENT_SALT: u64 = 0x636f_6e63_7572_7265;

/// Holders of the best match from which on it counts as a prefix shared across traffic.
const SHARED_HOLDERS: usize = 2;

/// Requests in flight on `c`: router-tracked plus foreign ones.
fn occupancy(c: &Candidate) -> u32 {
    let f = foreign(c);
    c.load
        .in_flight
        .saturating_add(f.waiting)
        .saturating_add(f.running)
}

/// Engine-reported requests the router does not account for itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Foreign {
    waiting: u32,
    running: u32,
}

/// The fresh scrape's waiting + running beyond the router's in-flight count when it was taken
/// (the count now when the scrape did not record it), waiting first.
fn foreign(c: &Candidate) -> Foreign {
    let Some(e) = c.engine.filter(|e| !e.stale) else {
        return Foreign::default();
    };
    let excess = e
        .waiting
        .saturating_add(e.running)
        .saturating_sub(e.tracked_in_flight.unwrap_or(c.load.in_flight));
    let waiting = excess.min(e.waiting);
    Foreign {
        waiting,
        running: excess - waiting,
    }
}

impl Policy for Kvgate {
    fn reads_text(&self) -> bool {
        false
    }
    fn name(&self) -> &'static str {
        "kvgate"
    }
    fn forget_instance(&self, instance: crate::InstanceId) {
        self.share.forget(instance);
    }
    fn decides_with_peers(&self) -> bool {
        self.with_peers()
    }
    fn decide(&self, req: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<Decision> {
        if candidates.is_empty() {
            return None;
        }
        let mut terms = Vec::with_capacity(candidates.len());
        let credits = self.terms(req, candidates, &mut terms);
        let scores: Vec<f64> = terms.iter().map(KvgateTerms::cost_ms).collect();
        let concurrent = req.concurrent_decisions * self.params.concurrency_weight;
        let i = if concurrent >= MIN_CONCURRENT {
            self.pick_among_peers(candidates, &terms, credits, &scores, concurrent, req.seed)?
        } else {
            self.pick(candidates, &scores, req.seed)?
        };
        if self.bounds_share() {
            self.share.record(
                candidates,
                i,
                self.params.max_share,
                self.params.share_window,
            );
        }
        let any_match = candidates.iter().any(|c| c.matched.total() > 0);
        let reason = if !any_match {
            Reason::LeastLoaded
        } else if candidates[i].matched.total() > 0 {
            Reason::CacheMatch
        } else {
            Reason::LowestCost
        };
        Some(decision(candidates, i, &scores, terms[i].ttft_ms, reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::util::testing::{cand, req};

    fn terms(p: &Kvgate, hashes: &[u64], cs: &[Candidate]) -> Vec<KvgateTerms> {
        let mut out = Vec::new();
        p.terms(&req(hashes, b"", 1), cs, &mut out);
        out
    }

    #[test]
    fn peers_deciding_at_the_same_moment_spread_a_cold_burst_but_not_a_cached_turn() {
        // On by default.
        let p = Kvgate::default();
        let cold: Vec<u64> = (1_000..1_100).collect();
        // Instance 0 is idle, the others have one short prefill queued: alone, every request of
        // a burst takes 0 (the next ones then see it loaded).
        let cs: Vec<Candidate> = std::iter::once(cand(0, 0, 0, 0))
            .chain((1..6).map(|i| cand(i, 0, 160, 1)))
            .collect();
        let chosen = |concurrent: f64, hashes: &[u64]| -> Vec<u32> {
            (0..400u64)
                .map(|seed| {
                    let r = RouteRequest {
                        concurrent_decisions: concurrent,
                        ..req(hashes, b"", mix(seed))
                    };
                    p.decide(&r, &cs).expect("decision").chosen.0
                })
                .collect()
        };
        assert!(chosen(0.0, &cold).iter().all(|&c| c == 0));
        // At weight 0: as alone whatever the estimate.
        let alone = Kvgate::new(KvgateParams {
            concurrency_weight: 0.0,
            ..Default::default()
        });
        assert!((0..100u64).all(|seed| {
            let r = RouteRequest {
                concurrent_decisions: 7.0,
                ..req(&cold, b"", mix(seed))
            };
            alone.decide(&r, &cs).expect("decision").chosen.0 == 0
        }));
        assert!(
            chosen(0.01, &cold).iter().all(|&c| c == 0),
            "rare coincidences"
        );
        // Seven peers deciding on this view: the burst of eight fills every instance, so each
        // takes at least one eighth of the draws.
        let spread = chosen(7.0, &cold);
        for id in 0..6 {
            let n = spread.iter().filter(|&&c| c == id).count();
            assert!(n > 40, "instance {id}: {n} of 400");
        }
        // A turn whose history instance 3 holds (90 of 100 blocks) stays there.
        let mut held = cs.clone();
        held[3] = cand(3, 90, 160, 1);
        let turn: Vec<u64> = (0..100).collect();
        let d = |seed: u64| {
            let r = RouteRequest {
                concurrent_decisions: 7.0,
                ..req(&turn, b"", mix(seed))
            };
            p.decide(&r, &held).expect("decision").chosen.0
        };
        assert!((0..400).all(|seed| d(seed) == 3));
    }

    #[test]
    fn recompute_on_an_empty_instance_is_not_priced_as_redundant_work() {
        let p = Kvgate::default();
        let hashes: Vec<u64> = (0..100).collect();
        // Instance 0 holds 60 blocks and has one request in flight; 1 and 2 hold nothing.
        let mut empty = cand(1, 0, 0, 0);
        let occupied = cand(2, 0, 0, 1);
        let t = terms(&p, &hashes, &[cand(0, 60, 0, 1), empty, occupied]);
        assert_eq!(t[0].fleet_ms, 0.0);
        assert_eq!(t[1].fleet_ms, 0.0, "nobody to delay on an empty instance");
        // 960 tokens at 10 tokens/ms on the occupied one, whose request still waits for its first
        // token: φ = fleet_weight 1 + fleet_load_weight 0.5.
        assert!((t[2].fleet_ms - 144.0).abs() < 1e-9, "{:?}", t[2]);
        // A configured idle price applies to the empty instance only.
        let priced = Kvgate::new(KvgateParams {
            idle_fleet_weight: 0.5,
            ..Default::default()
        });
        let t = terms(&priced, &hashes, &[cand(0, 60, 0, 1), empty]);
        assert!((t[1].fleet_ms - 48.0).abs() < 1e-9, "{:?}", t[1]);
        // Foreign (engine-reported) work occupies an instance too.
        empty.engine = Some(crate::load::EngineLoad {
            running: 2,
            waiting: 0,
            kv_usage: 0.1,
            at: 0,
            stale: false,
            tracked_in_flight: None,
        });
        let t = terms(&p, &hashes, &[cand(0, 60, 0, 1), empty]);
        assert!((t[1].fleet_ms - 96.0).abs() < 1e-9, "{:?}", t[1]);
    }

    fn ttft_only() -> Kvgate {
        Kvgate::new(KvgateParams {
            objective: Objective::Ttft,
            ..Default::default()
        })
    }

    fn e2e() -> Kvgate {
        Kvgate::new(KvgateParams {
            objective: Objective::E2e,
            ..Default::default()
        })
    }

    #[test]
    fn a_prefill_is_priced_for_every_sequence_decoding_beside_it() {
        let p = ttft_only();
        let hashes: Vec<u64> = (0..100).collect();
        let mut busy = cand(0, 60, 0, 4);
        busy.load.decoding = 4;
        let t = terms(&p, &hashes, &[busy, cand(1, 60, 0, 0)]);
        // 640 uncached tokens = 64 ms of prefill, stalling 4 decoders, weighted 0.1.
        assert!((t[0].stall_ms - 25.6).abs() < 1e-9, "{:?}", t[0]);
        assert_eq!(t[1].stall_ms, 0.0);
        assert!((t[0].cost_ms() - (t[0].ttft_ms + t[0].stall_ms)).abs() < 1e-12);
        // The reported prediction is the time to first token alone.
        let d = p
            .decide(&req(&hashes, b"", 1), &[busy, cand(1, 60, 0, 0)])
            .expect("decision");
        assert_eq!(d.chosen.0, 1);
        assert!((d.predicted_cost_ms - 64.0).abs() < 1e-9, "{d:?}");
    }

    #[test]
    fn a_shared_prefix_is_replicated_onto_an_idle_instance_when_its_holders_are_busy() {
        // Under `ttft`; under `e2e` the six users streaming on each holder make even the occupied
        // non-holder the better place (tested below).
        let p = ttft_only();
        // 64 shared blocks, 36 unique: recomputing the prefix costs 102.4 ms more prefill.
        let hashes: Vec<u64> = (0..100).collect();
        let holder = |id, pending, decoding| {
            let mut c = cand(id, 64, pending, decoding + u32::from(pending > 0));
            c.load.decoding = decoding;
            c
        };
        // Holders idle: stay on the prefix.
        let cs = [holder(0, 0, 0), holder(1, 0, 0), cand(2, 0, 0, 0)];
        for seed in 0..32 {
            assert_ne!(
                p.decide(&req(&hashes, b"", seed), &cs).map(|d| d.chosen.0),
                Some(2)
            );
        }
        // Holders each prefilling one request and streaming to several users: replicate.
        let cs = [holder(0, 576, 6), holder(1, 576, 6), cand(2, 0, 0, 0)];
        for seed in 0..32 {
            assert_eq!(
                p.decide(&req(&hashes, b"", seed), &cs).map(|d| d.chosen.0),
                Some(2)
            );
        }
        // The same holders against an occupied non-holder: it pays the base price and they keep it.
        let cs = [holder(0, 576, 6), holder(1, 576, 6), cand(3, 0, 0, 1)];
        for seed in 0..32 {
            assert_ne!(
                p.decide(&req(&hashes, b"", seed), &cs).map(|d| d.chosen.0),
                Some(3)
            );
        }
    }

    #[test]
    fn a_new_replica_of_a_busy_shared_prefix_is_credited_to_the_idle_instance_only() {
        // Under `ttft` the credit makes the idle instance tie exactly with the holders (no one
        // decodes there to be stalled); the default objective prices the holders' requests in
        // flight on top, so it goes to the idle instance as well.
        let hashes: Vec<u64> = (0..100).collect();
        let cs = [cand(0, 64, 0, 1), cand(1, 64, 0, 2), cand(2, 0, 0, 0)];
        for seed in 0..16 {
            let d = Kvgate::default().decide(&req(&hashes, b"", seed), &cs);
            assert_eq!(d.map(|d| d.chosen.0), Some(2));
        }
        let p = ttft_only();
        // Two busy holders of 64 blocks: a copy on the empty instance is worth its recompute.
        let cs = [
            cand(0, 64, 0, 1),
            cand(1, 64, 0, 2),
            cand(2, 0, 0, 0),
            cand(3, 0, 0, 1),
        ];
        let t = terms(&p, &hashes, &cs);
        assert!((t[2].replica_ms + 102.4).abs() < 1e-9, "{:?}", t[2]);
        assert_eq!(
            (t[0].replica_ms, t[1].replica_ms, t[3].replica_ms),
            (0.0, 0.0, 0.0)
        );
        // Priced as if it held the prefix: it ties with the holders and, being idle, wins.
        assert!((t[2].cost_ms() - t[0].cost_ms()).abs() < 1e-9);
        for seed in 0..16 {
            assert_eq!(
                p.decide(&req(&hashes, b"", seed), &cs).map(|d| d.chosen.0),
                Some(2)
            );
        }
        // One holder (one conversation's history) is not a shared prefix.
        let t = terms(&p, &hashes, &[cand(0, 64, 0, 1), cand(2, 0, 0, 0)]);
        assert_eq!(t[1].replica_ms, 0.0);
        // An idle holder can serve it: no new replica is needed.
        let t = terms(
            &p,
            &hashes,
            &[cand(0, 64, 0, 1), cand(1, 64, 0, 0), cand(2, 0, 0, 0)],
        );
        assert_eq!(t[2].replica_ms, 0.0);
        // replica_credit = 0 turns it off.
        let off = Kvgate::new(KvgateParams {
            replica_credit: 0.0,
            ..Default::default()
        });
        assert_eq!(terms(&off, &hashes, &cs)[2].replica_ms, 0.0);
    }

    /// A candidate decoding `seqs` sequences of `ctx_each` context tokens (expected 100 output
    /// tokens each) with `pending` prefill tokens queued.
    fn streaming(id: u32, pending: u64, seqs: u32, ctx_each: u64) -> Candidate {
        let mut c = cand(id, 0, pending, seqs + u32::from(pending > 0));
        c.load.decoding = seqs;
        c.load.decoding_context_tokens = u64::from(seqs) * ctx_each;
        c.load.decoding_output_tokens = u64::from(seqs) * 100;
        c
    }

    #[test]
    fn a_long_decode_batch_is_priced_under_e2e_but_not_under_ttft() {
        let hashes: Vec<u64> = (0..100).collect();
        // A: nothing queued, but 30 users streaming with 20K tokens of context each (~43 ms per
        // token); B: 600 ms of prefill queued, 2 users streaming (~12 ms per token).
        let cs = [streaming(0, 0, 30, 20_000), streaming(1, 6000, 2, 20_000)];
        for seed in 0..16 {
            let r = req(&hashes, b"", seed);
            assert_eq!(ttft_only().decide(&r, &cs).map(|d| d.chosen.0), Some(0));
            assert_eq!(e2e().decide(&r, &cs).map(|d| d.chosen.0), Some(1));
        }
        let t = terms(&e2e(), &hashes, &cs);
        assert!(t[0].tpot_ms > 3.0 * t[1].tpot_ms, "{t:?}");
        assert!(t[0].impact_ms > t[1].impact_ms && t[0].decode_ms > t[1].decode_ms);
        // The reported prediction is still the time to first token.
        let d = e2e().decide(&req(&hashes, b"", 1), &cs).expect("decision");
        assert!((d.predicted_cost_ms - t[1].ttft_ms).abs() < 1e-9);
        // Under ttft the decode terms are not priced at all.
        let t = terms(&ttft_only(), &hashes, &cs);
        assert_eq!((t[0].decode_ms, t[0].impact_ms), (0.0, 0.0));
    }

    #[test]
    fn an_instance_that_decodes_slower_is_avoided_under_e2e() {
        let hashes: Vec<u64> = (0..100).collect();
        let fast = streaming(0, 0, 4, 8_000);
        let mut slow = streaming(1, 0, 4, 8_000);
        slow.decode.step_ms *= 2.0;
        slow.decode.per_kctx_ms *= 2.0;
        let cs = [fast, slow];
        let mut ttft_picks = [0; 2];
        for seed in 0..64 {
            let r = req(&hashes, b"", seed);
            assert_eq!(e2e().decide(&r, &cs).map(|d| d.chosen.0), Some(0));
            if let Some(d) = ttft_only().decide(&r, &cs) {
                ttft_picks[d.chosen.index()] += 1;
            }
        }
        // Time to first token cannot tell them apart: seeded ties split the traffic.
        assert!(ttft_picks[0] > 0 && ttft_picks[1] > 0, "{ttft_picks:?}");
    }

    fn sized(tau: f64) -> Kvgate {
        Kvgate::new(KvgateParams {
            objective: Objective::E2e,
            size_weight: tau,
            ..Default::default()
        })
    }

    #[test]
    fn a_request_larger_than_its_neighbours_weighs_their_delays_less_under_size_weight() {
        // 32K prompt tokens, 800 output tokens. A: nothing queued, 12 short sequences streaming
        // (2K context each); B: 8 s of prefill queued behind one long sequence (30K context).
        let hashes: Vec<u64> = (0..2000).collect();
        let mut r = req(&hashes, b"", 1);
        r.expected_output_tokens = 800;
        let cs = [streaming(0, 0, 12, 2_000), streaming(1, 80_000, 1, 30_000)];
        let mut plain = Vec::new();
        sized(0.0).terms(&r, &cs, &mut plain);
        let mut weighed = Vec::new();
        sized(1.0).terms(&r, &cs, &mut weighed);
        // At 0 its prefill stalling the twelve outprices B's queue: it goes to queue there.
        // Weighed by size (its time alone is ~10× theirs: clamped to 1/4) it stays on A.
        assert!(
            (weighed[0].stall_ms - 0.25 * plain[0].stall_ms).abs() < 1e-9,
            "{weighed:?}"
        );
        assert!((weighed[0].impact_ms - 0.25 * plain[0].impact_ms).abs() < 1e-9);
        assert!(
            weighed[1].stall_ms < plain[1].stall_ms
                && weighed[1].stall_ms > 0.25 * plain[1].stall_ms
        );
        // Its own terms are not weighed.
        assert_eq!(
            (weighed[0].ttft_ms, weighed[0].decode_ms),
            (plain[0].ttft_ms, plain[0].decode_ms)
        );
        for seed in 0..16 {
            r.seed = seed;
            assert_eq!(sized(0.0).decide(&r, &cs).map(|d| d.chosen.0), Some(1));
            assert_eq!(sized(1.0).decide(&r, &cs).map(|d| d.chosen.0), Some(0));
        }
    }

    #[test]
    fn a_request_no_larger_than_its_neighbours_is_priced_alike_at_any_size_weight() {
        let hashes: Vec<u64> = (0..10).collect();
        let r = req(&hashes, b"", 1);
        let cs = [
            streaming(0, 0, 12, 20_000),
            streaming(1, 8_000, 3, 30_000),
            cand(2, 0, 0, 0),
        ];
        let mut plain = Vec::new();
        sized(0.0).terms(&r, &cs, &mut plain);
        let mut weighed = Vec::new();
        sized(2.0).terms(&r, &cs, &mut weighed);
        assert_eq!(plain, weighed);
        // And the objective `ttft` never reads it.
        let ttft = |tau| {
            let p = Kvgate::new(KvgateParams {
                objective: Objective::Ttft,
                size_weight: tau,
                ..Default::default()
            });
            let mut out = Vec::new();
            p.terms(
                &req(&(0..2000).collect::<Vec<u64>>(), b"", 1),
                &cs,
                &mut out,
            );
            out
        };
        assert_eq!(ttft(0.0), ttft(1.0));
    }

    #[test]
    fn the_slo_objective_prices_requests_pushed_past_their_targets() {
        let hashes: Vec<u64> = (0..100).collect();
        let slo = Kvgate::new(KvgateParams {
            objective: Objective::Slo,
            tpot_slo_ms: 37.6,
            ..Default::default()
        });
        // A: 25 users at 37.5 ms per token; one more sequence pushes all of them past 37.6 ms.
        // B: 2 users, but 2.5 s of prefill queued (past the 2 s TTFT target).
        let cs = [streaming(0, 0, 25, 20_000), streaming(1, 25_000, 2, 20_000)];
        let t = terms(&slo, &hashes, &cs);
        assert!(t[0].tpot_ms > 37.6, "{t:?}");
        assert!((t[0].slo_ms - 26.0 * 30_000.0).abs() < 1e-6, "{t:?}");
        assert!((t[1].slo_ms - 30_000.0).abs() < 1e-6, "{t:?}");
        assert_eq!(
            slo.decide(&req(&hashes, b"", 1), &cs).map(|d| d.chosen.0),
            Some(1)
        );
        // Without the targets, e2e alone weighs 25 slower streams against one long wait.
        let e2e = terms(&e2e(), &hashes, &cs);
        assert_eq!((e2e[0].slo_ms, e2e[1].slo_ms), (0.0, 0.0));
    }
}

#[cfg(test)]
mod share_tests {
    use super::*;
    use crate::policy::util::testing::{cand, req};

    /// An instance far cheaper than the others for every request keeps at most the bound's
    /// share of them once the share price is on, and all of them while it is off.
    #[test]
    fn the_share_bound_holds_against_a_persistently_cheapest_instance() {
        let hashes: Vec<u64> = (0..64).collect();
        // Instance 0 has an empty queue; the others have 20K tokens of prefill queued each.
        let cs: Vec<Candidate> = (0..8)
            .map(|i| cand(i, 0, if i == 0 { 0 } else { 20_000 }, 1))
            .collect();
        for (max_share, bound) in [(0.0, 1.0), (1.3, 1.3 / 8.0 + 0.02)] {
            let p = Kvgate::new(KvgateParams {
                max_share,
                ..Default::default()
            });
            let n = 2000;
            let to_cheapest = (0..n)
                .filter(|&s| {
                    p.decide(&req(&hashes, b"", s), &cs)
                        .is_some_and(|d| d.chosen == crate::InstanceId(0))
                })
                .count();
            let share = to_cheapest as f64 / n as f64;
            assert!(
                if max_share == 0.0 {
                    share == 1.0
                } else {
                    share <= bound
                },
                "max_share {max_share}: share {share}"
            );
        }
    }
}
