//! Instance health: the active checker's verdict, passive ejection on connect failures (and
//! connections closed before an answer), outlier ejection on consecutive 5xx answers, and the
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
//! - A passive ejection ends when `eject_ms` elapses or an active check succeeds, whichever comes
//!   first: a passing check proves the instance accepts connections again.
//! - An outlier ejection (5xx answers) ends only when `eject_ms` elapses: an instance answering
//!   500 to requests usually still answers its `/health`, so a passing check proves nothing.
//! - Connect failures and 5xx answers are counted apart; an answer that is not a 5xx resets both,
//!   a 5xx answer resets only the connect failures (the instance was reached).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Health state of one instance. All fields are atomics: read on every request.
#[derive(Debug)]
pub struct Health {
    active_ok: AtomicBool,
    ejected_until_ms: AtomicU64,
    connect_failures: AtomicU32,
    /// Outlier ejection (consecutive 5xx answers): not ended by an active check.
    outlier_until_ms: AtomicU64,
    answer_failures: AtomicU32,
    peer_down: AtomicBool,
}

impl Health {
    /// Healthy, not ejected.
    pub fn new() -> Self {
        Self {
            active_ok: AtomicBool::new(true),
            ejected_until_ms: AtomicU64::new(0),
            connect_failures: AtomicU32::new(0),
            outlier_until_ms: AtomicU64::new(0),
            answer_failures: AtomicU32::new(0),
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

    /// Ejected at `now_ms`, passively or as an outlier.
    pub fn ejected(&self, now_ms: u64) -> bool {
        self.connect_ejected(now_ms) || now_ms < self.outlier_until_ms.load(Ordering::Relaxed)
    }

    /// Passively ejected (connect failures) at `now_ms`: what a passing active check ends.
    pub fn connect_ejected(&self, now_ms: u64) -> bool {
        now_ms < self.ejected_until_ms.load(Ordering::Relaxed)
    }

    /// Records a 5xx answer (500, 502, 504) on the request path; returns true when this one
    /// ejected it as an outlier.
    pub fn record_5xx(&self, now_ms: u64, threshold: u32, eject_ms: u64) -> bool {
        if self.connect_failures.load(Ordering::Relaxed) != 0 {
            self.connect_failures.store(0, Ordering::Relaxed);
        }
        let n = self.answer_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= threshold {
            self.answer_failures.store(0, Ordering::Relaxed);
            self.outlier_until_ms
                .store(now_ms.saturating_add(eject_ms), Ordering::Relaxed);
            return true;
        }
        false
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

    /// Records a request that reached the instance and was not answered with a 5xx.
    pub fn record_success(&self) {
        if self.connect_failures.load(Ordering::Relaxed) != 0 {
            self.connect_failures.store(0, Ordering::Relaxed);
        }
        if self.answer_failures.load(Ordering::Relaxed) != 0 {
            self.answer_failures.store(0, Ordering::Relaxed);
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
    fn consecutive_5xx_eject_until_the_bound_and_a_passing_check_does_not_end_it() {
        let h = Health::new();
        assert!(!h.record_5xx(0, 3, 100));
        assert!(!h.record_5xx(0, 3, 100));
        // A good answer breaks the run.
        h.record_success();
        assert!(!h.record_5xx(0, 3, 100));
        assert!(!h.record_5xx(0, 3, 100));
        assert!(h.usable(0));
        assert!(h.record_5xx(0, 3, 100));
        assert!(!h.usable(1) && h.ejected(1) && !h.connect_ejected(1));
        h.set_active(true);
        assert!(
            !h.usable(99),
            "an active check must not end an outlier ejection"
        );
        assert!(h.usable(100));
        // 5xx answers and connect failures are separate runs.
        assert!(!h.record_connect_failure(200, 2, 100));
        assert!(!h.record_5xx(200, 3, 100));
        assert!(!h.record_connect_failure(200, 2, 100));
        assert!(h.usable(200));
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
