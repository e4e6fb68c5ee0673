//! The connection cap's places, and eviction of the longest-idle connection when it is reached.
//!
//! Each open client connection holds a [`Place`]: one of `max_connections` places, and one slot
//! of a table in which it says whether it waits for a request (idle, since when) or not (busy).
//! When the cap is reached and `evict_idle_at_capacity` is on, the acceptor looks for the
//! connection idle the longest, marks it evicted and tells it, and gives its place to the new
//! connection at once; the evicted one closes as soon as its thread runs it. Only when no
//! connection is idle does the cap refuse (see [`super::Limits::refuse`]).
//!
//! Idle means: waiting for the first byte of a request, since accept or since the end of the
//! previous answer (HTTP/1.1), or with no stream open (HTTP/2). A connection that has sent part
//! of a head, is reading a body, is being handled, is being answered, or holds pipelined bytes is
//! busy and is never evicted: eviction never cuts a request or an answer. (A partial head is
//! bounded by the header timeout instead.) A TLS connection is busy until its handshake is done.
//!
//! Invariants:
//! - `taken ≤ max` (places) and `evicting ≤ EVICTING`; open sockets ≤ `taken + evicting`.
//! - A slot's state moves FREE → (BUSY | IDLE(t)) on admission; between BUSY and IDLE(t) only by
//!   its own connection (compare-and-swap from the value it last wrote); IDLE(t) → EVICTED only by
//!   the acceptor; anything → FREE only when its `Place` drops. So a connection seen busy cannot
//!   be evicted, and one evicted learns it at its next transition or wait (its waker is woken).
//! - An evicted connection's place went to the newcomer: its drop counts down `evicting`, any
//!   other drop counts down `taken`. A slot goes back to the free list before its count drops,
//!   so an admission the counts allow always finds a slot.
//! - The table grows in chunks as connections arrive (the free list reuses the lowest slots
//!   first), so its memory follows the most connections open at once: [`SLOT_BYTES`] each.
//! - Cost on the hot path: admission below the cap is a compare-and-swap, a clock read and a lock
//!   of the free list (uncontended: the acceptor pops, closes push); a request's transitions are
//!   one compare-and-swap each, and waiting for one registers a waker. At the cap, an eviction
//!   scans the slots in use once (at most [`SCANS`] times when states change under it).

use crate::metrics::{self, EvictReason};
use futures_util::task::AtomicWaker;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use tokio::time::Instant;

/// Most evicted connections not yet closed; beyond, the cap refuses as without eviction, so the
/// sockets open stay under `max_connections + EVICTING`.
pub const EVICTING: usize = 256;
/// Slots allocated at once.
const CHUNK: usize = 256;
/// Most scans of the table for one admission (a scan's choice may turn busy under it).
pub const SCANS: usize = 3;
/// Bytes of table per connection slot (a cache line, so that connections on different threads
/// do not share one).
pub const SLOT_BYTES: usize = std::mem::size_of::<Slot>();

const FREE: u64 = 0;
const BUSY: u64 = 1;
const EVICTED: u64 = 2;
/// Idle states are `IDLE + (µs since the table's start << 1 | used)`: ordered by when the wait
/// began, `used` set after a first request (a keep-alive wait rather than a fresh connection).
const IDLE: u64 = 4;

#[repr(align(64))]
struct Slot {
    state: AtomicU64,
    /// The connection's task while it waits for a request.
    waker: AtomicWaker,
}

impl Slot {
    fn new() -> Self {
        Self {
            state: AtomicU64::new(FREE),
            waker: AtomicWaker::new(),
        }
    }
}

/// Free slots: those given back (reused lowest first), then the never used from `next`.
struct Free {
    stack: Vec<u32>,
    next: usize,
}

/// The places of the connection cap.
pub struct Places {
    chunks: Box<[OnceLock<Box<[Slot]>>]>,
    free: Mutex<Free>,
    /// Slots ever handed out (those an eviction scans).
    used: AtomicUsize,
    /// Places held, at most `max`.
    taken: AtomicUsize,
    /// Evicted connections not yet closed, at most [`EVICTING`].
    evicting: AtomicUsize,
    max: usize,
    /// Evict the longest-idle connection at the cap (`evict_idle_at_capacity`).
    evict: bool,
    start: Instant,
}

/// A connection's place under the cap, held until it closes.
pub struct Place {
    places: Arc<Places>,
    index: u32,
    /// What this connection last wrote to its slot.
    state: u64,
}

impl Places {
    /// `max` places; `evict`: evict the longest-idle connection at the cap.
    pub fn new(max: usize, evict: bool) -> Arc<Self> {
        let slots = max + if evict { EVICTING } else { 0 };
        Arc::new(Self {
            chunks: (0..slots.div_ceil(CHUNK))
                .map(|_| OnceLock::new())
                .collect(),
            free: Mutex::new(Free {
                stack: Vec::new(),
                next: 0,
            }),
            used: AtomicUsize::new(0),
            taken: AtomicUsize::new(0),
            evicting: AtomicUsize::new(0),
            max,
            evict,
            start: Instant::now(),
        })
    }

    /// A place for a new connection: a free one, or the place of the connection idle the
    /// longest (evicted), or none. `idle`: the connection waits for a request from now (plain
    /// TCP); otherwise it is busy until it says so (a TLS handshake).
    pub fn admit(self: &Arc<Self>, idle: bool) -> Option<Place> {
        let state = if idle {
            self.idle_state(Instant::now(), false)
        } else {
            BUSY
        };
        let free = self
            .taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                (t < self.max).then(|| t + 1)
            })
            .is_ok();
        // At the cap: the evicted connection's place is the newcomer's; it counts in `evicting`.
        if !free && (!self.evict || !self.evict_one()) {
            return None;
        }
        match self.pop(state) {
            Some(index) => Some(Place {
                places: self.clone(),
                index,
                state,
            }),
            None => {
                // Unreachable by the counts; give the place back rather than overrun.
                self.taken.fetch_sub(1, Ordering::AcqRel);
                None
            }
        }
    }

    /// Client connections open: places held and evicted connections not yet closed.
    pub fn open(&self) -> usize {
        self.taken.load(Ordering::Acquire) + self.evicting.load(Ordering::Acquire)
    }

    fn idle_state(&self, now: Instant, used: bool) -> u64 {
        let us = now.saturating_duration_since(self.start).as_micros() as u64;
        IDLE + ((us << 1) | u64::from(used))
    }

    fn slot(&self, index: usize) -> Option<&Slot> {
        self.chunks
            .get(index / CHUNK)?
            .get()
            .and_then(|c| c.get(index % CHUNK))
    }

    /// A free slot, set to `state`.
    fn pop(&self, state: u64) -> Option<u32> {
        let index = {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            match free.stack.pop() {
                Some(i) => i as usize,
                None => {
                    let i = free.next;
                    let chunk = self.chunks.get(i / CHUNK)?;
                    chunk.get_or_init(|| (0..CHUNK).map(|_| Slot::new()).collect());
                    free.next += 1;
                    self.used.store(free.next, Ordering::Release);
                    i
                }
            }
        };
        self.slot(index)?.state.store(state, Ordering::Release);
        Some(index as u32)
    }

    /// Evicts the connection idle the longest, if any and if fewer than [`EVICTING`] are still
    /// closing; `true` when one was.
    fn evict_one(&self) -> bool {
        let counted = self
            .evicting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
                (e < EVICTING).then(|| e + 1)
            })
            .is_ok();
        if !counted {
            return false;
        }
        for _ in 0..SCANS {
            let Some((slot, seen)) = self.longest_idle() else {
                break;
            };
            if slot
                .state
                .compare_exchange(seen, EVICTED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                slot.waker.wake();
                metrics::record_connection_evicted(if seen & 1 == 1 {
                    EvictReason::KeepAlive
                } else {
                    EvictReason::Fresh
                });
                return true;
            }
        }
        self.evicting.fetch_sub(1, Ordering::AcqRel);
        false
    }

    /// The idle slot whose wait began first, and its state.
    fn longest_idle(&self) -> Option<(&Slot, u64)> {
        let used = self.used.load(Ordering::Acquire);
        let mut best: Option<(&Slot, u64)> = None;
        for chunk in self.chunks.iter().take(used.div_ceil(CHUNK)) {
            let Some(chunk) = chunk.get() else { break };
            for slot in chunk.iter() {
                let s = slot.state.load(Ordering::Acquire);
                if s >= IDLE && best.is_none_or(|(_, b)| s < b) {
                    best = Some((slot, s));
                }
            }
        }
        best
    }
}

impl Place {
    fn slot(&self) -> &Slot {
        // A place's slot exists for as long as the place: it was allocated to hand it out.
        match self.places.slot(self.index as usize) {
            Some(s) => s,
            None => unreachable!("a place's slot is allocated"),
        }
    }

    fn set(&mut self, to: u64) -> bool {
        if self.state == EVICTED {
            // Never back: the place is the newcomer's.
            return false;
        }
        if self.state == to {
            return true;
        }
        let ok = self
            .slot()
            .state
            .compare_exchange(self.state, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if ok {
            self.state = to;
        } else {
            // Only the acceptor changes a slot under its connection: it was evicted.
            self.state = EVICTED;
        }
        ok
    }

    /// The connection waits for a request from `now`; `used`: it served one before. `false`:
    /// it was evicted, and closes.
    pub fn idle(&mut self, now: Instant, used: bool) -> bool {
        let to = self.places.idle_state(now, used);
        self.set(to)
    }

    /// A request began (a byte of it arrived, or a stream opened). `false`: the connection was
    /// evicted just before, and closes.
    pub fn busy(&mut self) -> bool {
        self.set(BUSY)
    }

    /// Whether the connection was evicted.
    pub fn is_evicted(&self) -> bool {
        self.state == EVICTED || self.slot().state.load(Ordering::Acquire) == EVICTED
    }

    /// Ready once the connection is evicted (wakes the task that polls it).
    pub fn poll_evicted(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.state == EVICTED {
            return Poll::Ready(());
        }
        let slot = self.slot();
        slot.waker.register(cx.waker());
        if slot.state.load(Ordering::Acquire) == EVICTED {
            self.state = EVICTED;
            return Poll::Ready(());
        }
        Poll::Pending
    }

    /// Resolves once the connection is evicted.
    pub fn evicted(&mut self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(|cx| self.poll_evicted(cx))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let places = &self.places;
        let Some(slot) = places.slot(self.index as usize) else {
            return;
        };
        // A waker left behind would keep the closed connection's task allocated.
        drop(slot.waker.take());
        let was = slot.state.swap(FREE, Ordering::AcqRel);
        places
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stack
            .push(self.index);
        if was == EVICTED {
            places.evicting.fetch_sub(1, Ordering::AcqRel);
        } else {
            places.taken.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn without_eviction_the_cap_refuses() {
        let p = Places::new(2, false);
        let _a = p.admit(true).unwrap();
        let b = p.admit(true).unwrap();
        assert!(p.admit(true).is_none());
        assert_eq!(p.open(), 2);
        drop(b);
        assert_eq!(p.open(), 1);
        assert!(p.admit(true).is_some());
    }

    #[test]
    fn at_the_cap_the_longest_idle_is_evicted_and_busy_ones_never() {
        let p = Places::new(3, true);
        let t = Instant::now();
        let mut old = p.admit(true).unwrap();
        assert!(old.idle(t + Duration::from_millis(10), false));
        let mut young = p.admit(true).unwrap();
        let mut busy = p.admit(false).unwrap();
        assert!(young.idle(t + Duration::from_millis(20), true));

        // The oldest wait goes first; its place is the newcomer's.
        let mut new = p.admit(true).expect("an idle connection was evicted");
        assert!(old.is_evicted());
        assert!(!old.busy(), "an evicted connection stays evicted");
        assert!(
            !old.busy() && !old.idle(Instant::now(), true),
            "and never comes back"
        );
        assert_eq!(p.open(), 4, "the evicted one is still closing");
        drop(old);
        assert_eq!(p.open(), 3);

        // Then the keep-alive one; then nothing idle is left: refused.
        assert!(new.busy());
        let _n2 = p.admit(true).unwrap();
        assert!(young.is_evicted());
        drop(young);
        // `_n2` (fresh) is idle: it is the only candidate.
        let mut n3 = p.admit(true).unwrap();
        assert!(n3.busy() && busy.busy() && new.busy());
        assert!(
            p.admit(true).is_none(),
            "busy connections are never evicted"
        );
        assert!(!busy.is_evicted() && !new.is_evicted());
    }

    #[tokio::test]
    async fn an_evicted_waiter_is_woken() {
        let p = Places::new(1, true);
        let mut idle = p.admit(true).unwrap();
        let waiting = tokio::spawn(async move {
            idle.evicted().await;
            drop(idle);
        });
        // Let the waiter register.
        tokio::task::yield_now().await;
        let _new = p.admit(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .unwrap();
        assert_eq!(p.open(), 1);
    }

    #[test]
    fn evictions_in_progress_are_bounded() {
        let p = Places::new(EVICTING + 1, true);
        let mut held: Vec<Place> = (0..=EVICTING).map(|_| p.admit(true).unwrap()).collect();
        // Every admission past the cap evicts one that has not closed yet, until EVICTING.
        let newcomers: Vec<Place> = (0..EVICTING).map(|_| p.admit(false).unwrap()).collect();
        assert!(p.admit(false).is_none());
        assert_eq!(p.open(), 2 * EVICTING + 1);
        held.clear();
        assert_eq!(p.open(), EVICTING, "the newcomers hold the places");
        drop(newcomers);
        assert_eq!(p.open(), 0);
        // Every slot went back: a full cap admits again.
        let again: Vec<Place> = (0..=EVICTING).map(|_| p.admit(true).unwrap()).collect();
        assert_eq!(again.len(), EVICTING + 1);
    }

    #[test]
    fn slots_are_a_cache_line() {
        assert_eq!(SLOT_BYTES, 64);
    }
}
