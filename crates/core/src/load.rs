//! Per-instance load: what the router tracks itself, what engines report, and learned rates.
//!
//! Invariants:
//! - Router-tracked counters change only through [`LoadGuard`]: taken at dispatch, advanced at the
//!   first token, released on drop (response finished, failed or the client went away), so counters
//!   can never leak or go negative. Each of the three calls the tracker's change hook, if one is
//!   set, with the instance's counters after the change (gossip pushes them to peers).
//! - Engine-reported load is a snapshot with its age; the caller marks it stale, routing never waits
//!   for it.
//! - Rate estimates start at configured values and move by bounded EWMA steps from observations.

mod concurrent;
mod decode;
mod fit;
mod outputs;
mod rates;

pub use concurrent::ConcurrentDecisions;
pub use decode::{
    DecodeEstimator, DecodeObservation, DecodeRateConfig, DecodeRates, DecodeView,
    InvalidDecodeRate,
};
pub use outputs::OutputLengths;
pub use rates::{RateConfig, RateEstimator};

use crate::{InstanceId, Millis};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Router-tracked load of one instance at a point in time.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct RouterLoad {
    /// Requests dispatched and not yet finished.
    pub in_flight: u32,
    /// Uncached prompt tokens of requests that have not produced their first token yet.
    pub pending_prefill_tokens: u64,
    /// Requests past their first token (decoding).
    pub decoding: u32,
    /// Context tokens of the decoding requests (each: its prompt plus half its expected output,
    /// its mean context over its decode), what every decode step reads.
    pub decoding_context_tokens: u64,
    /// Expected output tokens of the decoding requests, in total (half of it is what they still
    /// have to produce, on average).
    pub decoding_output_tokens: u64,
}

/// What a dispatched request will occupy on its instance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestSize {
    /// Prompt tokens it must prefill there (not cached).
    pub uncached_prefill_tokens: u64,
    /// Its mean context while it decodes: prompt tokens plus half its expected output.
    pub decode_context_tokens: u64,
    /// Output tokens it is expected to produce.
    pub expected_output_tokens: u64,
}

impl RequestSize {
    /// A request of `prompt_tokens`, `uncached` of them to prefill, expected to produce `output`.
    pub fn new(prompt_tokens: u64, uncached: u64, output: u64) -> Self {
        Self {
            uncached_prefill_tokens: uncached,
            decode_context_tokens: prompt_tokens.saturating_add(output / 2),
            expected_output_tokens: output,
        }
    }
}

/// `total`, the summed size of `known` items, extended to `count` items of the same mean size
/// (saturating): how sizes are filled in for requests counted without them. `total` as it is when
/// `known` is 0 (no mean to extend).
pub fn extend_at_mean(total: u64, known: u64, count: u64) -> u64 {
    if known == 0 {
        return total;
    }
    (u128::from(total) * u128::from(count) / u128::from(known)).min(u128::from(u64::MAX)) as u64
}

/// Load scraped from the engine (`/metrics` or SGLang `/v1/loads`).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct EngineLoad {
    /// Requests running in the engine's batch.
    pub running: u32,
    /// Requests waiting in the engine's queue.
    pub waiting: u32,
    /// KV cache utilisation, 0..1.
    pub kv_usage: f32,
    /// When this was scraped.
    pub at: Millis,
    /// True when older than the configured staleness bound; scorers then ignore it.
    pub stale: bool,
    /// The router's own fleet-wide count of requests in flight to the instance when the report
    /// was taken, if the caller recorded it. The report's excess over it is load from elsewhere;
    /// against the count at decision time instead, the router's own requests finished since the
    /// report would pass for foreign load on exactly the instances that just emptied.
    pub tracked_in_flight: Option<u32>,
}

/// Router-tracked load counters for a fixed-size fleet. Lock-free.
///
/// Ids outside `0..len()` are tolerated: [`LoadTracker::snapshot`] reports zero for them and
/// [`LoadTracker::dispatch`] returns a guard that accounts nothing, so a stale id can never panic
/// the request path.
pub struct LoadTracker {
    slots: Box<[Slot]>,
    /// Told of every change of a tracked instance's counters, set once.
    on_change: std::sync::OnceLock<LoadChangeHook>,
}

/// Receives an instance's router-tracked counters right after they changed (a dispatch, a first
/// token, a release). Runs on the request path: it must be cheap and never block.
pub type LoadChangeHook = Arc<dyn Fn(InstanceId, RouterLoad) + Send + Sync>;

#[derive(Default)]
struct Slot {
    in_flight: AtomicU32,
    pending_prefill_tokens: AtomicU64,
    decoding: AtomicU32,
    decoding_context_tokens: AtomicU64,
    decoding_output_tokens: AtomicU64,
    /// Uncached prompt tokens of every request that reached its first token here, ever
    /// (wrapping): a difference of two reads is the prefill work done between them.
    prefilled_tokens: AtomicU64,
}

impl LoadTracker {
    /// Counters for `instances` instances, all zero.
    pub fn new(instances: usize) -> Self {
        Self {
            slots: (0..instances).map(|_| Slot::default()).collect(),
            on_change: std::sync::OnceLock::new(),
        }
    }
    /// Sets the hook told of every change (once; later calls are ignored).
    pub fn set_on_change(&self, hook: LoadChangeHook) {
        let _ = self.on_change.set(hook);
    }
    fn changed(&self, instance: InstanceId) {
        if let Some(h) = self.on_change.get() {
            h(instance, self.snapshot(instance));
        }
    }
    /// Number of instances tracked.
    pub fn len(&self) -> usize {
        self.slots.len()
    }
    /// True when tracking no instance.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Current counters of `instance`.
    pub fn snapshot(&self, instance: InstanceId) -> RouterLoad {
        match self.slots.get(instance.index()) {
            Some(s) => RouterLoad {
                in_flight: s.in_flight.load(Ordering::Relaxed),
                pending_prefill_tokens: s.pending_prefill_tokens.load(Ordering::Relaxed),
                decoding: s.decoding.load(Ordering::Relaxed),
                decoding_context_tokens: s.decoding_context_tokens.load(Ordering::Relaxed),
                decoding_output_tokens: s.decoding_output_tokens.load(Ordering::Relaxed),
            },
            None => RouterLoad::default(),
        }
    }
    /// Uncached prompt tokens the router's requests have had prefilled on `instance` so far
    /// (counted at each first token, wrapping; 0 for unknown ids). Decode observations subtract
    /// the prefill work done beside them: a step that carries a prefill chunk stalls every
    /// sequence decoding there.
    pub fn prefilled_tokens(&self, instance: InstanceId) -> u64 {
        self.slots
            .get(instance.index())
            .map_or(0, |s| s.prefilled_tokens.load(Ordering::Relaxed))
    }
    /// Records a dispatch of a request with `uncached_prefill_tokens` to compute and nothing
    /// known of its decode; the returned guard undoes it when dropped.
    pub fn dispatch(
        self: &Arc<Self>,
        instance: InstanceId,
        uncached_prefill_tokens: u64,
    ) -> LoadGuard {
        self.dispatch_sized(
            instance,
            RequestSize {
                uncached_prefill_tokens,
                ..RequestSize::default()
            },
        )
    }

    /// Records a dispatch of a request of `size`; the returned guard undoes it when dropped.
    pub fn dispatch_sized(self: &Arc<Self>, instance: InstanceId, size: RequestSize) -> LoadGuard {
        let tracked = match self.slots.get(instance.index()) {
            Some(s) => {
                s.in_flight.fetch_add(1, Ordering::Relaxed);
                s.pending_prefill_tokens
                    .fetch_add(size.uncached_prefill_tokens, Ordering::Relaxed);
                true
            }
            None => false,
        };
        if tracked {
            self.changed(instance);
        }
        LoadGuard {
            tracker: Arc::clone(self),
            instance,
            tracked,
            size,
            prefilling: true,
            decoding: false,
        }
    }
}

/// RAII handle on one dispatched request's share of an instance's load.
///
/// Holds exactly what it added; dropping it subtracts exactly that, whatever state it reached.
pub struct LoadGuard {
    tracker: Arc<LoadTracker>,
    instance: InstanceId,
    /// False when the instance id was out of range at dispatch: nothing was added.
    tracked: bool,
    /// What this guard adds: its prefill tokens to `pending_prefill_tokens` until the first
    /// token, then its context and expected output to the decoding counters.
    size: RequestSize,
    /// Still counted in `pending_prefill_tokens`.
    prefilling: bool,
    /// Counted in `decoding`.
    decoding: bool,
}

impl LoadGuard {
    /// The request produced its first token: its prefill is no longer pending; it now decodes.
    /// Idempotent.
    pub fn first_token(&mut self) {
        if !self.prefilling {
            return;
        }
        self.prefilling = false;
        self.decoding = true;
        if let Some(s) = self.slot() {
            s.pending_prefill_tokens
                .fetch_sub(self.size.uncached_prefill_tokens, Ordering::Relaxed);
            s.prefilled_tokens
                .fetch_add(self.size.uncached_prefill_tokens, Ordering::Relaxed);
            s.decoding.fetch_add(1, Ordering::Relaxed);
            s.decoding_context_tokens
                .fetch_add(self.size.decode_context_tokens, Ordering::Relaxed);
            s.decoding_output_tokens
                .fetch_add(self.size.expected_output_tokens, Ordering::Relaxed);
            self.tracker.changed(self.instance);
        }
    }
    /// The instance this guard accounts against.
    pub fn instance(&self) -> InstanceId {
        self.instance
    }
    /// True once [`LoadGuard::first_token`] was called.
    pub fn is_decoding(&self) -> bool {
        self.decoding
    }
    /// Uncached prefill tokens this request was dispatched with.
    pub fn prefill_tokens(&self) -> u64 {
        self.size.uncached_prefill_tokens
    }
    /// What this request was dispatched with.
    pub fn size(&self) -> RequestSize {
        self.size
    }
    fn slot(&self) -> Option<&Slot> {
        if self.tracked {
            self.tracker.slots.get(self.instance.index())
        } else {
            None
        }
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        if let Some(s) = self.slot() {
            s.in_flight.fetch_sub(1, Ordering::Relaxed);
            if self.prefilling {
                s.pending_prefill_tokens
                    .fetch_sub(self.size.uncached_prefill_tokens, Ordering::Relaxed);
            }
            if self.decoding {
                s.decoding.fetch_sub(1, Ordering::Relaxed);
                s.decoding_context_tokens
                    .fetch_sub(self.size.decode_context_tokens, Ordering::Relaxed);
                s.decoding_output_tokens
                    .fetch_sub(self.size.expected_output_tokens, Ordering::Relaxed);
            }
            self.tracker.changed(self.instance);
        }
    }
}

impl std::fmt::Debug for LoadGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadGuard")
            .field("instance", &self.instance)
            .field("size", &self.size)
            .field("prefilling", &self.prefilling)
            .field("decoding", &self.decoding)
            .finish()
    }
}

/// Learned speed of one instance, from observed time to first token versus uncached prompt tokens.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct InstanceRates {
    /// Prefill throughput in tokens per second.
    pub prefill_tokens_per_s: f64,
    /// Added time to first token per concurrently decoding sequence, in milliseconds.
    pub decode_interference_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_extend_at_their_mean_and_saturate() {
        assert_eq!(extend_at_mean(4_000, 2, 6), 12_000);
        assert_eq!(extend_at_mean(4_000, 2, 2), 4_000);
        assert_eq!(extend_at_mean(7, 3, 4), 9, "rounds down");
        assert_eq!(extend_at_mean(5, 0, 9), 5, "no mean to extend");
        assert_eq!(extend_at_mean(u64::MAX, 1, 2), u64::MAX);
    }

    #[test]
    fn the_change_hook_sees_every_change_after_it_happened() {
        let t = Arc::new(LoadTracker::new(2));
        let seen: Arc<parking_lot::Mutex<Vec<(InstanceId, RouterLoad)>>> = Arc::default();
        let sink = seen.clone();
        t.set_on_change(Arc::new(move |id, load| sink.lock().push((id, load))));
        let i = InstanceId(1);
        let mut g = t.dispatch(i, 100);
        g.first_token();
        g.first_token(); // idempotent: no second change
        drop(g);
        // An id out of range changes nothing and tells nothing.
        drop(t.dispatch(InstanceId(9), 10));
        let seen = seen.lock();
        let at = |k: usize| seen[k].1;
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert!(seen.iter().all(|(id, _)| *id == i));
        assert_eq!((at(0).in_flight, at(0).pending_prefill_tokens), (1, 100));
        assert_eq!((at(1).pending_prefill_tokens, at(1).decoding), (0, 1));
        assert_eq!(at(2), RouterLoad::default());
    }

    #[test]
    fn guard_lifecycle() {
        let t = Arc::new(LoadTracker::new(2));
        let i = InstanceId(1);
        let mut g = t.dispatch(i, 100);
        let g2 = t.dispatch(i, 50);
        assert_eq!(
            t.snapshot(i),
            RouterLoad {
                in_flight: 2,
                pending_prefill_tokens: 150,
                decoding: 0,
                ..RouterLoad::default()
            }
        );
        g.first_token();
        g.first_token();
        assert_eq!(
            t.snapshot(i),
            RouterLoad {
                in_flight: 2,
                pending_prefill_tokens: 50,
                decoding: 1,
                ..RouterLoad::default()
            }
        );
        drop(g2);
        assert_eq!(
            t.snapshot(i),
            RouterLoad {
                in_flight: 1,
                pending_prefill_tokens: 0,
                decoding: 1,
                ..RouterLoad::default()
            }
        );
        drop(g);
        assert_eq!(t.snapshot(i), RouterLoad::default());
        assert_eq!(t.snapshot(InstanceId(0)), RouterLoad::default());
        // Only the request that reached its first token was prefilled; the count never falls.
        assert_eq!(t.prefilled_tokens(i), 100);
        assert_eq!(t.prefilled_tokens(InstanceId(0)), 0);
        assert_eq!(t.prefilled_tokens(InstanceId(9)), 0);
    }

    #[test]
    fn out_of_range_is_harmless() {
        let t = Arc::new(LoadTracker::new(1));
        let mut g = t.dispatch(InstanceId(7), 10);
        g.first_token();
        assert_eq!(g.instance(), InstanceId(7));
        drop(g);
        assert_eq!(t.snapshot(InstanceId(7)), RouterLoad::default());
        assert_eq!(t.snapshot(InstanceId(0)), RouterLoad::default());
    }

    #[test]
    fn concurrent_guards_balance() {
        let t = Arc::new(LoadTracker::new(4));
        let handles: Vec<_> = (0..4)
            .map(|k| {
                let t = Arc::clone(&t);
                std::thread::spawn(move || {
                    for n in 0..2000u64 {
                        let mut g = t.dispatch(InstanceId((n % 4) as u32), n);
                        if (n + k) % 3 == 0 {
                            g.first_token();
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            assert!(h.join().is_ok());
        }
        for i in 0..4 {
            assert_eq!(t.snapshot(InstanceId(i)), RouterLoad::default());
        }
    }
}
