//! Admission control at the gateway: while every usable instance of a pool is saturated, requests
//! wait in the pool's queue (`kvgate_core::admission`) instead of piling into the engines'
//! queues, and are admitted one per finished request on that pool.
//!
//! The request path ([`crate::proxy`]) holds one [`Gate`] per request around its routing loop:
//! the gate says which instances are full before the decision (`capacity`), judges the decision's
//! prediction after it (`check`), and waits in the queue when the pool is saturated (`enter`);
//! once admitted the request re-decides and is forwarded whatever the load, so a queue always
//! drains.
//!
//! Invariants:
//! - Disabled, a gate does nothing and costs nothing beyond its construction.
//! - While a pool's queue is non-empty, arrivals queue behind it (no overtaking by a lucky
//!   decision); while it is empty the only cost is one atomic load and, per finished request, a
//!   fence.
//! - No lost wake-up: a waiter queues and then reads the pool's in-flight count, a finishing
//!   request drops its load and then reads the queue length, each across a `SeqCst` fence; so
//!   either the finish sees the waiter (and admits it) or the waiter sees the pool idle (and
//!   admits itself).
//! - A waiter leaves the queue exactly once: admitted, rejected (expired, shed) or, when its
//!   request is dropped (client gone), removed by its guard.
//! - Every admitted request releases its pool exactly once: the relayed body's tracker does it
//!   when the response ends, or the gate itself when the request fails before that.

use crate::clock::Clock;
use crate::config::AdmissionConfig;
use crate::error::GatewayError;
use crate::fleet::Fleet;
use crate::metrics::AdmissionMetrics;
use crate::routing::Routed;
use kvgate_core::admission::{
    retry_after_secs, DrainRate, EntryId, Priority, QueueLimits, QueueStats, RejectReason,
    TenantId, WaitQueue,
};
use kvgate_core::load::LoadTracker;
use kvgate_core::Millis;
use parking_lot::Mutex;
use serde::Serialize;
use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// What a waiter is told: admitted, or why not.
type Verdict = Result<(), RejectReason>;

/// Request header choosing the priority class: `critical`, `standard` or `sheddable`. It wins
/// over the body's `priority`.
pub const PRIORITY_HEADER: &str = "x-kvgate-priority";

/// Admission state of every pool.
pub struct Admission {
    cfg: AdmissionConfig,
    /// `cfg.tenant_header`, parsed once.
    tenant_header: http::HeaderName,
    /// `cfg.tenant_weights` by tenant id.
    weights: ahash::AHashMap<TenantId, u32>,
    pools: Vec<PoolGate>,
    /// The fleet, for the pools' current instances.
    fleet: Arc<Fleet>,
    load: Arc<LoadTracker>,
    clock: Clock,
}

/// One pool's queue.
struct PoolGate {
    /// Its pool's index.
    index: usize,
    model: String,
    /// Entries queued, mirrored from `inner` for the lock-free fast path.
    waiting: AtomicUsize,
    inner: Mutex<Inner>,
    metrics: AdmissionMetrics,
}

struct Inner {
    queue: WaitQueue<oneshot::Sender<Verdict>>,
    drain: DrainRate,
    /// The chosen instance's predicted time to first token when the pool last saturated, ms:
    /// the `Retry-After` basis before a drain rate is known.
    best_ttft_ms: f64,
}

impl Admission {
    /// Queues for every pool of `fleet`, judged against the router-tracked `load`.
    pub fn new(
        cfg: &AdmissionConfig,
        fleet: &Arc<Fleet>,
        load: Arc<LoadTracker>,
        clock: Clock,
    ) -> Self {
        let limits = QueueLimits {
            max_entries: cfg.max_queue_entries,
            max_tokens: cfg.max_queued_tokens,
            max_wait_ms: cfg.max_wait_ms,
        };
        let pools = fleet
            .pools()
            .iter()
            .map(|p| PoolGate {
                index: p.index,
                model: p.model.clone(),
                waiting: AtomicUsize::new(0),
                inner: Mutex::new(Inner {
                    queue: WaitQueue::new(limits),
                    drain: DrainRate::default(),
                    best_ttft_ms: 0.0,
                }),
                metrics: AdmissionMetrics::new(&p.model),
            })
            .collect();
        Self {
            tenant_header: http::HeaderName::from_bytes(cfg.tenant_header.as_bytes())
                .unwrap_or_else(|_| http::HeaderName::from_static("x-kvgate-tenant")),
            weights: cfg
                .tenant_weights
                .iter()
                .map(|(name, &w)| (tenant_id(name.as_bytes()), w.max(1)))
                .collect(),
            cfg: cfg.clone(),
            pools,
            fleet: fleet.clone(),
            load,
            clock,
        }
    }

    /// Whether admission control is on.
    pub fn enabled(&self) -> bool {
        self.cfg.enabled
    }

    /// The header naming a request's tenant.
    pub fn tenant_header(&self) -> &http::HeaderName {
        &self.tenant_header
    }

    /// A gate for one request to pool `pool` costing `cost` tokens. `priority_header`: the
    /// [`PRIORITY_HEADER`] value; `body_priority`: the body's vLLM `priority`; `tenant`: the
    /// tenant header's value.
    pub fn gate(
        &self,
        pool: usize,
        priority_header: Option<&[u8]>,
        body_priority: Option<i64>,
        tenant: Option<&[u8]>,
        cost: u64,
    ) -> Gate<'_> {
        if !self.cfg.enabled || pool >= self.pools.len() {
            return Gate::off();
        }
        let priority = priority_header
            .and_then(Priority::parse)
            .or_else(|| body_priority.map(Priority::from_vllm))
            .unwrap_or_default();
        Gate {
            adm: Some(self),
            pool,
            priority,
            tenant: tenant.map_or(TenantId(0), tenant_id),
            weight: tenant
                .and_then(|t| self.weights.get(&tenant_id(t)))
                .copied()
                .unwrap_or(1),
            cost,
            state: State::Pending,
        }
    }

    /// A request admitted to `pool` finished: admits the next waiter, if any.
    pub fn release(&self, pool: usize) {
        let Some(pg) = self.pools.get(pool) else {
            return;
        };
        // Pairs with the fence in `wait`: the load this request held is gone before the queue
        // is read.
        fence(Ordering::SeqCst);
        if pg.waiting.load(Ordering::SeqCst) == 0 {
            return;
        }
        let now = self.clock.now_ms();
        let mut g = pg.inner.lock();
        self.expire(pg, &mut g, now);
        self.admit_next(pg, &mut g, now);
    }

    /// Requests this gateway has in flight on `pool`.
    /// Draining instances count: their requests still hold places.
    fn in_flight(&self, pg: &PoolGate) -> u64 {
        self.fleet
            .view()
            .instances()
            .filter(|i| i.pool == pg.index)
            .map(|i| u64::from(self.load.snapshot(i.id).in_flight))
            .sum()
    }

    /// Rejects every waiter past the wait bound.
    fn expire(&self, pg: &PoolGate, g: &mut Inner, now: Millis) {
        for e in g.queue.expire(now) {
            pg.metrics.rejected(RejectReason::WaitTimeout);
            let _ = e.payload.send(Err(RejectReason::WaitTimeout));
        }
        self.queue_changed(pg, g);
    }

    /// Admits the next live waiter.
    fn admit_next(&self, pg: &PoolGate, g: &mut Inner, now: Millis) {
        while let Some(e) = g.queue.pop() {
            // A waiter whose request is being dropped right now cannot take the place.
            if e.payload.send(Ok(())).is_ok() {
                g.drain.served(now, e.cost);
                pg.metrics
                    .waited(now.saturating_sub(e.enqueued_at) as f64 / 1e3);
                break;
            }
        }
        self.queue_changed(pg, g);
    }

    fn queue_changed(&self, pg: &PoolGate, g: &mut Inner) {
        let n = g.queue.len();
        pg.waiting.store(n, Ordering::SeqCst);
        pg.metrics.depth(n);
        if n == 0 {
            g.drain.idle();
        }
    }

    /// The rejection of a `priority` request to `pg` for `reason`, with its `Retry-After`.
    fn rejection(
        &self,
        pg: &PoolGate,
        g: &Inner,
        priority: Priority,
        reason: RejectReason,
    ) -> GatewayError {
        let fallback = if g.best_ttft_ms > 0.0 {
            g.best_ttft_ms
        } else {
            self.cfg.max_wait_ms as f64
        };
        let retry_after_s = retry_after_secs(
            g.queue.tokens_ahead_of(priority),
            g.drain.tokens_per_s(),
            fallback,
        );
        GatewayError::Overloaded {
            model: pg.model.clone(),
            reason: reason.as_str(),
            retry_after_s,
        }
    }

    /// Removes a waiter that gave up; true when it was still queued.
    fn forget(&self, pool: usize, id: EntryId) -> bool {
        let pg = &self.pools[pool];
        let mut g = pg.inner.lock();
        let removed = g.queue.remove(id).is_some();
        if removed {
            self.queue_changed(pg, &mut g);
        }
        removed
    }

    /// Every pool's queue, for `/admin/admission`.
    pub fn status(&self) -> AdmissionStatus {
        let now = self.clock.now_ms();
        let pools = self
            .pools
            .iter()
            .map(|pg| {
                let g = pg.inner.lock();
                let classes = Priority::ALL.map(|p| {
                    let s = g.queue.stats(p);
                    ClassView {
                        priority: p.as_str(),
                        oldest_wait_ms: s.oldest_at.map(|t| now.saturating_sub(t)),
                        stats: s,
                    }
                });
                PoolView {
                    model: pg.model.clone(),
                    entries: g.queue.len(),
                    tokens: g.queue.tokens(),
                    in_flight: self.in_flight(pg),
                    drain_tokens_per_s: g.drain.tokens_per_s(),
                    retry_after_s: retry_after_secs(
                        g.queue.tokens(),
                        g.drain.tokens_per_s(),
                        g.best_ttft_ms,
                    ),
                    classes,
                }
            })
            .collect();
        AdmissionStatus {
            enabled: self.cfg.enabled,
            max_predicted_ttft_ms: self.cfg.max_predicted_ttft_ms,
            max_inflight_per_instance: self.cfg.max_inflight_per_instance,
            max_engine_waiting: self.cfg.max_engine_waiting,
            max_queue_entries: self.cfg.max_queue_entries,
            max_queued_tokens: self.cfg.max_queued_tokens,
            max_wait_ms: self.cfg.max_wait_ms,
            pools,
        }
    }
}

/// A tenant's id: a hash of its header value (in-memory only, so `ahash` with fixed keys).
fn tenant_id(name: &[u8]) -> TenantId {
    let h = ahash::RandomState::with_seeds(1, 2, 3, 4).hash_one(name);
    // 0 is the default tenant's.
    TenantId(h.max(1))
}

/// `/admin/admission`.
#[derive(Serialize)]
pub struct AdmissionStatus {
    enabled: bool,
    max_predicted_ttft_ms: u64,
    max_inflight_per_instance: u32,
    max_engine_waiting: u32,
    max_queue_entries: usize,
    max_queued_tokens: u64,
    max_wait_ms: u64,
    pools: Vec<PoolView>,
}

#[derive(Serialize)]
struct PoolView {
    model: String,
    entries: usize,
    tokens: u64,
    /// Requests this gateway has in flight on the pool.
    in_flight: u64,
    drain_tokens_per_s: Option<f64>,
    /// What a request rejected now would be told.
    retry_after_s: u64,
    classes: [ClassView; 3],
}

#[derive(Serialize)]
struct ClassView {
    priority: &'static str,
    #[serde(flatten)]
    stats: QueueStats,
    oldest_wait_ms: Option<u64>,
}

/// Where one request stands.
enum State {
    /// Admission is off.
    Off,
    /// Not yet judged: forwarded at once if the pool has room.
    Pending,
    /// Must wait in the queue.
    Wait,
    /// Admitted: releases its pool when done. `chain`: it came from the queue and has not been
    /// dispatched yet.
    Admitted { chain: bool },
    /// Admitted, and the release handed to the response body.
    HandedOver,
}

/// One request's passage through admission (see the module docs).
pub struct Gate<'a> {
    adm: Option<&'a Admission>,
    pool: usize,
    priority: Priority,
    tenant: TenantId,
    /// The tenant's fair-share weight.
    weight: u32,
    cost: u64,
    state: State,
}

impl<'a> Gate<'a> {
    /// A gate that admits everything.
    pub fn off() -> Gate<'static> {
        Gate {
            adm: None,
            pool: 0,
            priority: Priority::Standard,
            tenant: TenantId(0),
            weight: 1,
            cost: 0,
            state: State::Off,
        }
    }

    /// The request's class.
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// Lowers the request's class to `ceiling` if it asked for a more urgent one (a key's
    /// `max_priority`); never raises it.
    pub fn with_ceiling(mut self, ceiling: Option<Priority>) -> Self {
        if let Some(c) = ceiling {
            // Ordered most urgent first: the larger of the two is the less urgent.
            self.priority = self.priority.max(c);
        }
        self
    }

    /// Instances with this many requests in flight are not offered to the decision (`None`: no
    /// bound applies, because admission is off, the request is admitted, or no count is set).
    pub fn capacity(&self) -> Option<u32> {
        match (self.adm, &self.state) {
            (Some(a), State::Pending) if a.cfg.max_inflight_per_instance > 0 => {
                Some(a.cfg.max_inflight_per_instance)
            }
            _ => None,
        }
    }

    /// Waits in the queue when the request must: the pool was found saturated, or others are
    /// already waiting. Returns once admitted; errors are the 429 rejections.
    pub async fn enter(&mut self) -> Result<(), GatewayError> {
        let Some(adm) = self.adm else { return Ok(()) };
        match self.state {
            State::Pending if adm.pools[self.pool].waiting.load(Ordering::Relaxed) > 0 => {}
            State::Wait => {}
            _ => return Ok(()),
        }
        // Boxed: only waiting requests pay for the waiting future's size.
        Box::pin(self.wait(adm)).await?;
        self.state = State::Admitted { chain: true };
        Ok(())
    }

    /// The decision found every usable instance full: the request must wait.
    pub fn all_full(&mut self) -> bool {
        if matches!(self.state, State::Pending) && self.capacity().is_some() {
            self.state = State::Wait;
            return true;
        }
        false
    }

    /// Judges a decision. Pending: if the chosen instance is saturated (it has requests in
    /// flight and its predicted time to first token is over the bound, or its engine reports
    /// `max_engine_waiting` requests queued) the request must wait
    /// (true; drop the decision and [`Gate::enter`]); otherwise it is admitted. Admitted: if the
    /// pool still has room after this dispatch, the next waiter is admitted too, so a queue
    /// drains as fast as the pool takes it.
    pub fn check(&mut self, routed: &Routed) -> bool {
        let Some(adm) = self.adm else { return false };
        let cfg = &adm.cfg;
        let at = routed.learning.at_dispatch;
        let over_ttft =
            at.in_flight > 0 && routed.predicted_cost_ms > cfg.max_predicted_ttft_ms as f64;
        // The engine's own queue: what the prediction misses when the engine is out of
        // sequences or KV memory (it then queues whatever it gets, however short the prefill).
        let engine_full = cfg.max_engine_waiting > 0
            && routed
                .engine_waiting
                .is_some_and(|w| w >= cfg.max_engine_waiting);
        let saturated = over_ttft || engine_full;
        match self.state {
            State::Pending if saturated => {
                let pg = &adm.pools[self.pool];
                pg.inner.lock().best_ttft_ms = routed.predicted_cost_ms;
                self.state = State::Wait;
                true
            }
            State::Pending => {
                self.state = State::Admitted { chain: false };
                false
            }
            State::Admitted { chain: true } => {
                self.state = State::Admitted { chain: false };
                let cap = cfg.max_inflight_per_instance;
                let full = cap > 0 && at.in_flight.saturating_add(1) >= cap;
                if !saturated && !full {
                    // Room after this dispatch: the next waiter is admitted too (this request
                    // keeps its own place).
                    adm.release(self.pool);
                }
                false
            }
            _ => false,
        }
    }

    /// Hands the pool's release to the response body: `Some(pool)` when admission is on.
    pub fn hand_over(&mut self) -> Option<usize> {
        if matches!(self.state, State::Admitted { .. }) {
            self.state = State::HandedOver;
            return Some(self.pool);
        }
        None
    }

    async fn wait(&mut self, adm: &'a Admission) -> Result<(), GatewayError> {
        let pg = &adm.pools[self.pool];
        let (tx, rx) = oneshot::channel();
        let now = adm.clock.now_ms();
        let id = {
            let mut g = pg.inner.lock();
            adm.expire(pg, &mut g, now);
            let pushed = match g.queue.push_weighted(
                self.priority,
                (self.tenant, self.weight),
                self.cost,
                now,
                tx,
            ) {
                Ok(p) => p,
                Err(r) => {
                    pg.metrics.rejected(r.reason);
                    return Err(adm.rejection(pg, &g, self.priority, r.reason));
                }
            };
            for e in pushed.evicted {
                pg.metrics.rejected(RejectReason::Shed);
                let _ = e.payload.send(Err(RejectReason::Shed));
            }
            adm.queue_changed(pg, &mut g);
            // Pairs with the fence in `release`: queued before the pool's load is read.
            fence(Ordering::SeqCst);
            if adm.in_flight(pg) == 0 {
                // Nothing will finish to admit anyone: the pool is idle, so admit now.
                adm.admit_next(pg, &mut g, now);
            }
            pushed.id
        };
        let mut queued = Queued {
            adm,
            pool: self.pool,
            id: Some(id),
            rx,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_millis(adm.cfg.max_wait_ms);
        let verdict = match tokio::time::timeout_at(deadline, &mut queued.rx).await {
            Ok(Ok(v)) => v,
            Ok(Err(_)) => Err(RejectReason::WaitTimeout),
            Err(_) => {
                if adm.forget(self.pool, id) {
                    pg.metrics.rejected(RejectReason::WaitTimeout);
                    Err(RejectReason::WaitTimeout)
                } else {
                    // It left the queue just now: its verdict was sent before the lock was free.
                    queued
                        .rx
                        .try_recv()
                        .unwrap_or(Err(RejectReason::WaitTimeout))
                }
            }
        };
        queued.id = None;
        verdict.map_err(|reason| {
            let g = pg.inner.lock();
            adm.rejection(pg, &g, self.priority, reason)
        })
    }
}

impl Drop for Gate<'_> {
    fn drop(&mut self) {
        if let (Some(adm), State::Admitted { .. }) = (self.adm, &self.state) {
            adm.release(self.pool);
        }
    }
}

/// A queued waiter's guard: removes the entry if the request is dropped while it waits.
struct Queued<'a> {
    adm: &'a Admission,
    pool: usize,
    /// Set while the entry may still be queued.
    id: Option<EntryId>,
    rx: oneshot::Receiver<Verdict>,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            if !self.adm.forget(self.pool, id) && matches!(self.rx.try_recv(), Ok(Ok(()))) {
                // Admitted in the meantime: the place it was given goes to the next waiter.
                self.adm.release(self.pool);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ceiling_lowers_but_never_raises() {
        let g = |p| {
            let mut g = Gate::off();
            g.priority = p;
            g
        };
        let capped = g(Priority::Critical).with_ceiling(Some(Priority::Standard));
        assert_eq!(capped.priority(), Priority::Standard);
        let low = g(Priority::Sheddable).with_ceiling(Some(Priority::Standard));
        assert_eq!(low.priority(), Priority::Sheddable);
        let none = g(Priority::Critical).with_ceiling(None);
        assert_eq!(none.priority(), Priority::Critical);
    }
}
