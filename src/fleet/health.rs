//! Instance health: the active checker's verdict, passive ejection on connect failures, and the
//! verdict of gossip peers.
//!
//! Invariants:
//! - An instance is usable iff its last active verdict is healthy, it is not ejected, and no live
//!   gossip peer currently observes it dead.
//! - Only this replica's own observations ([`Health::own_usable`]) are published to peers; a
//!   peer's verdict is never re-published, so a dead verdict lasts exactly as long as the replica
//!   that observed it keeps reporting it (it clears when that replica sees the instance recover,
//!   dies, or goes silent), and verdicts cannot circulate between replicas.
//! - Instances start healthy, so a fresh gateway routes at once; the first failed checks or connect
//!   failures correct that within `unhealthy_threshold` intervals or `passive_failure_threshold`
//!   requests.
//! - An ejection ends when `eject_ms` elapses or an active check succeeds, whichever comes first.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Health state of one instance. All fields are atomics: read on every request.
#[derive(Debug)]
pub struct Health {
    active_ok: AtomicBool,
    ejected_until_ms: AtomicU64,
    connect_failures: AtomicU32,
    peer_down: AtomicBool,
}

impl Health {
    /// Healthy, not ejected.
    pub fn new() -> Self {
        Self {
            active_ok: AtomicBool::new(true),
            ejected_until_ms: AtomicU64::new(0),
            connect_failures: AtomicU32::new(0),
            peer_down: AtomicBool::new(false),
        }
    }

    /// May receive traffic at `now_ms`: this replica sees it usable and no gossip peer sees it
    /// dead.
    pub fn usable(&self, now_ms: u64) -> bool {
        self.own_usable(now_ms) && !self.peer_down()
    }

    /// This replica's own observation at `now_ms` (active verdict and passive ejection, peers
    /// ignored): what is published to gossip peers.
    pub fn own_usable(&self, now_ms: u64) -> bool {
        self.active_ok.load(Ordering::Relaxed) && !self.ejected(now_ms)
    }

    /// Some live gossip peer currently observes the instance dead.
    pub fn peer_down(&self) -> bool {
        self.peer_down.load(Ordering::Relaxed)
    }

    /// Sets the merged verdict of live gossip peers (true = some peer observes it dead).
    pub fn set_peer_down(&self, down: bool) {
        if self.peer_down.load(Ordering::Relaxed) != down {
            self.peer_down.store(down, Ordering::Relaxed);
        }
    }

    /// The last active check verdict.
    pub fn active_ok(&self) -> bool {
        self.active_ok.load(Ordering::Relaxed)
    }

    /// Passively ejected at `now_ms`.
    pub fn ejected(&self, now_ms: u64) -> bool {
        now_ms < self.ejected_until_ms.load(Ordering::Relaxed)
    }

    /// Records a connect failure on the request path; returns true when this one ejected it.
    pub fn record_connect_failure(&self, now_ms: u64, threshold: u32, eject_ms: u64) -> bool {
        let n = self.connect_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= threshold {
            self.connect_failures.store(0, Ordering::Relaxed);
            self.ejected_until_ms
                .store(now_ms.saturating_add(eject_ms), Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Records a request that reached the instance.
    pub fn record_success(&self) {
        if self.connect_failures.load(Ordering::Relaxed) != 0 {
            self.connect_failures.store(0, Ordering::Relaxed);
        }
    }

    /// Sets the active verdict; a healthy verdict also ends an ejection.
    pub fn set_active(&self, ok: bool) {
        self.active_ok.store(ok, Ordering::Relaxed);
        if ok {
            self.ejected_until_ms.store(0, Ordering::Relaxed);
            self.connect_failures.store(0, Ordering::Relaxed);
        }
    }
}

impl Default for Health {
    fn default() -> Self {
        Self::new()
    }
}

/// Consecutive-result counter of the active checker for one instance (owned by its task).
#[derive(Debug, Default, Clone, Copy)]
pub struct Streak {
    ok: u32,
    failed: u32,
}

impl Streak {
    /// Folds in one check; returns the new verdict if it changed.
    pub fn observe(
        &mut self,
        ok: bool,
        current: bool,
        healthy_after: u32,
        unhealthy_after: u32,
    ) -> Option<bool> {
        if ok {
            self.ok = self.ok.saturating_add(1);
            self.failed = 0;
            (!current && self.ok >= healthy_after).then_some(true)
        } else {
            self.failed = self.failed.saturating_add(1);
            self.ok = 0;
            (current && self.failed >= unhealthy_after).then_some(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passive_ejection_and_expiry() {
        let h = Health::new();
        assert!(!h.record_connect_failure(0, 2, 100));
        assert!(h.record_connect_failure(0, 2, 100));
        assert!(!h.usable(50));
        assert!(h.usable(100));
    }

    #[test]
    fn active_success_ends_ejection() {
        let h = Health::new();
        h.record_connect_failure(0, 1, 1_000);
        assert!(!h.usable(1));
        h.set_active(true);
        assert!(h.usable(1));
    }

    #[test]
    fn peer_verdict_gates_usable_but_not_own_observation() {
        let h = Health::new();
        h.set_peer_down(true);
        assert!(!h.usable(0));
        assert!(
            h.own_usable(0),
            "a peer's verdict is not this replica's observation"
        );
        h.set_peer_down(false);
        assert!(h.usable(0));
        h.set_active(false);
        h.set_peer_down(false);
        assert!(!h.usable(0) && !h.own_usable(0));
    }

    #[test]
    fn streak_thresholds() {
        let mut s = Streak::default();
        assert_eq!(s.observe(false, true, 2, 2), None);
        assert_eq!(s.observe(false, true, 2, 2), Some(false));
        assert_eq!(s.observe(true, false, 2, 2), None);
        assert_eq!(s.observe(true, false, 2, 2), Some(true));
    }
}
