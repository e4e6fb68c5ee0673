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
//! redo_c     = min((max_k credit_k − credit_c)·tpb, prompt_tokens)   (recompute beyond the best match)
//! fleet_c    = redo_c / r_c × φ_c,   φ_c = min(fleet_weight + fleet_load_weight × w_c, fleet_max_factor)
//! cost_c     = ttft_c + fleet_c
//! ```
//!
//! `w_c` is the number of requests waiting for their first token on `c`: router-tracked plus
//! foreign waiting requests.
//!
//! Why each term:
//! - `ttft_c` is what this request waits there. Blocks every instance holds (a shared system prompt)
//!   reduce every `uncached_c` equally and cancel out, so load decides: no funnelling.
//! - `fleet_c` is what this choice costs everyone else: prefill work the fleet already did once and
//!   would redo here. Work redone on `c` delays the requests that queue behind it there, and how
//!   many will queue there grows with its queue, hence `φ_c` grows with `w_c`: recomputing on an
//!   idle instance is cheap for the fleet, recomputing when every queue is deep (overload) is
//!   priced up to `fleet_max_factor` times the work. A TTFT-only greedy choice trades
//!   cache hits for a shorter queue until total prefill work outgrows the fleet; pricing redundant
//!   work higher as queues fill keeps the hit ratio as load rises.
//! - A hot prefix still spreads to a second instance when the holder's queue costs more than
//!   `(1 + φ)` times recomputing the prefix elsewhere; once the second copy is indexed both hold it
//!   and load decides between them.
//! - A request that matches nowhere (cold prefix) has `fleet_c = 0` everywhere and goes to the
//!   instance with the least predicted queue: new prefixes spread over the fleet.
//! - Scores within `tie_epsilon_ms`, or within `tie_relative` of the best, tie: smaller differences
//!   are below what learned rates and load snapshots resolve (left to decide, rate noise alone
//!   would keep sending idle-time traffic to whichever instance looks a few percent faster). Ties
//!   go to the fewest requests in flight, which also evens out decode batches, then to the lowest
//!   hash of (request seed, instance id), so slice position never matters.
//!
//! Engine-scraped load is used only when fresh (`stale == false`) and only for the part the router
//! cannot see itself ("foreign" load: requests from other clients, or replicas not sharing load).
//! The router's own counts are updated at dispatch and first token and never lag; a scrape does lag,
//! so it would keep reporting a request as waiting after it started. Foreign load is therefore the
//! engine's waiting + running in excess of the router's in-flight count for that instance, taken
//! from the waiting queue first.

use super::config::KvgateParams;
use super::util::{argmin_seeded, decision, prefilling, tie_key};
use super::{Candidate, Decision, Policy, Reason, RouteRequest};

/// The cost-based default policy.
#[derive(Clone, Debug, Default)]
pub struct Kvgate {
    params: KvgateParams,
}

/// One candidate's priced terms (exposed for explanations and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KvgateTerms {
    /// Predicted time to first token on this candidate, ms.
    pub ttft_ms: f64,
    /// Fleet cost of the recompute beyond the best available match, ms.
    pub fleet_ms: f64,
}

impl KvgateTerms {
    /// The score: lower wins.
    pub fn cost_ms(&self) -> f64 {
        self.ttft_ms + self.fleet_ms
    }
}

impl Kvgate {
    /// A policy with these parameters.
    pub fn new(params: KvgateParams) -> Self {
        Self { params }
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

    /// Priced terms of every candidate, in candidate order, appended to `out`.
    pub fn terms(
        &self,
        req: &RouteRequest<'_>,
        candidates: &[Candidate],
        out: &mut Vec<KvgateTerms>,
    ) {
        let p = &self.params;
        let tpb = f64::from(req.tokens_per_block.max(1));
        let prompt = f64::from(req.prompt_tokens);
        let best = candidates
            .iter()
            .map(|c| self.credit(c))
            .fold(0.0, f64::max);
        out.extend(candidates.iter().map(|c| {
            let rate_per_ms = c.rates.prefill_tokens_per_s.max(1.0) / 1000.0;
            let credit = self.credit(c);
            let uncached = prompt - (credit * tpb).min(prompt);
            let other = foreign(c);
            let queued = c.load.pending_prefill_tokens as f64
                + f64::from(other.waiting) * p.engine_waiting_tokens;
            let decoding = f64::from(c.load.decoding) + f64::from(other.running);
            let ttft_ms = (queued + uncached) / rate_per_ms
                + c.rates.decode_interference_ms.max(0.0) * decoding;
            let redo = ((best - credit) * tpb).clamp(0.0, prompt);
            let phi = (p.fleet_weight + p.fleet_load_weight * Self::waiting(c))
                .clamp(0.0, p.fleet_max_factor.max(0.0));
            KvgateTerms {
                ttft_ms,
                fleet_ms: redo / rate_per_ms * phi,
            }
        }));
    }
}

impl Kvgate {
    /// The lowest cost; costs within `tie_epsilon_ms` or `tie_relative` of it tie, and ties go
    /// to the fewest requests in flight (router-tracked plus foreign), then to the lowest
    /// [`tie_key`]. NaN costs never win.
    fn pick(&self, candidates: &[Candidate], scores: &[f64], seed: u64) -> Option<usize> {
        let min = scores
            .iter()
            .copied()
            .filter(|s| !s.is_nan())
            .fold(f64::INFINITY, f64::min);
        if !min.is_finite() {
            return argmin_seeded(candidates, scores, 0.0, seed);
        }
        let p = &self.params;
        let slack = p.tie_epsilon_ms.max(0.0) + (p.tie_relative.max(0.0) * min).max(0.0);
        candidates
            .iter()
            .zip(scores)
            .enumerate()
            .filter(|(_, (_, &s))| s <= min + slack)
            .min_by_key(|(_, (c, _))| {
                let f = foreign(c);
                (
                    c.load
                        .in_flight
                        .saturating_add(f.waiting)
                        .saturating_add(f.running),
                    tie_key(seed, c.id),
                )
            })
            .map(|(i, _)| i)
    }
}

/// Engine-reported requests the router does not account for itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Foreign {
    waiting: u32,
    running: u32,
}

/// The fresh scrape's waiting + running beyond the router's in-flight count, waiting first.
fn foreign(c: &Candidate) -> Foreign {
    let Some(e) = c.engine.filter(|e| !e.stale) else {
        return Foreign::default();
    };
    let excess = e
        .waiting
        .saturating_add(e.running)
        .saturating_sub(c.load.in_flight);
    let waiting = excess.min(e.waiting);
    Foreign {
        waiting,
        running: excess - waiting,
    }
}

impl Policy for Kvgate {
    fn name(&self) -> &'static str {
        "kvgate"
    }
    fn decide(&self, req: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<Decision> {
        if candidates.is_empty() {
            return None;
        }
        let mut terms = Vec::with_capacity(candidates.len());
        self.terms(req, candidates, &mut terms);
        let scores: Vec<f64> = terms.iter().map(KvgateTerms::cost_ms).collect();
        let i = self.pick(candidates, &scores, req.seed)?;
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
