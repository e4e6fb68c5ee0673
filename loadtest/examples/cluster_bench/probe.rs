//! Measurements taken inside the replicas: placement convergence, restart catch-up and the
//! spread of in-flight requests over instances.
//!
//! Definitions (documented in `docs/gossip.md`):
//! - A replica **holds** a prompt on instance `i` when, after `Gossip::materialize` (what the
//!   gateway does before matching), its index matches the prompt's whole block chain on `i`.
//! - **Convergence** of a probe prompt first routed through replica A: the time until every other
//!   replica holds it on the instance A chose (A's own hold marks the decision). Measured from the
//!   moment the request was sent (conservative: includes upload and parsing) and from A's decision
//!   (first poll that sees A hold it). Polled every `POLL`; a probe not converged within
//!   `PROBE_TIMEOUT` is counted as such.
//! - **In-flight spread**: every `SPREAD_EVERY`, the fleet-wide in-flight requests per instance
//!   (the sum of every replica's router-tracked load, i.e. what the engines are working on) →
//!   max / mean over instances, for samples with any load.
//!
//! Invariant: every loop is bounded in time; pending probes are bounded by `MAX_PENDING`.

use kvgate::app::AppState;
use kvgate_core::index::PrefixMatches;
use kvgate_core::{BlockHash, InstanceId};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Poll period of the convergence probe.
pub const POLL: Duration = Duration::from_millis(5);
/// A probe not converged by then counts as not converged.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on probes being watched.
const MAX_PENDING: usize = 512;
/// Spread sampling period.
pub const SPREAD_EVERY: Duration = Duration::from_millis(20);

/// A probe prompt sent through `origin`.
pub struct Sample {
    /// When the request was sent.
    pub sent: Instant,
    /// Replica it was sent to.
    pub origin: usize,
    /// Its block chain, as the gateway hashes it.
    pub hashes: Arc<[BlockHash]>,
}

/// The instance holding the whole of `hashes` in `state`'s index (gossip checkpoints materialized
/// first), if any.
pub fn holder(state: &AppState, hashes: &[BlockHash]) -> Option<InstanceId> {
    let now = state.clock.now_ms();
    if let Some(g) = state.routing.gossip() {
        g.materialize(hashes, now);
    }
    let mut m = PrefixMatches::default();
    state.routing.index().match_prefix(hashes, now, &mut m);
    let want = hashes.len() as u32;
    state
        .fleet
        .view()
        .instances()
        .map(|i| i.id)
        .find(|&id| m.get(id).total() >= want)
}

/// What the convergence probe measured.
#[derive(Default)]
pub struct Convergence {
    /// Per (probe, other replica): ms from sending.
    pub from_send_ms: Vec<f64>,
    /// Per (probe, other replica): ms from the origin's decision.
    pub from_decision_ms: Vec<f64>,
    /// Probes whose origin never held them (request failed) — not counted.
    pub undecided: usize,
    /// (probe, other replica) pairs not converged within the timeout.
    pub timeouts: usize,
    /// (probe, other replica) pairs that converged on another instance than the origin's.
    pub other_instance: usize,
}

/// Converged probes, newest last: (origin, chosen instance, hashes, sent), for catch-up checks.
pub type Recent = Arc<std::sync::Mutex<std::collections::VecDeque<Converged>>>;
/// One converged probe.
pub type Converged = (usize, InstanceId, Arc<[BlockHash]>, Instant);
/// Bound on [`Recent`].
const MAX_RECENT: usize = 4096;

struct Pending {
    s: Sample,
    chosen: Option<(InstanceId, Instant)>,
    done: Vec<bool>,
}

/// Watches probes arriving on `rx` against `replicas` until `rx` closes and nothing is pending.
pub async fn convergence(
    replicas: Vec<AppState>,
    mut rx: mpsc::Receiver<Sample>,
    recent: Recent,
) -> Convergence {
    let mut out = Convergence::default();
    let mut pending: Vec<Pending> = Vec::new();
    let mut open = true;
    let mut tick = tokio::time::interval(POLL);
    loop {
        tick.tick().await;
        while open {
            match rx.try_recv() {
                Ok(s) if pending.len() < MAX_PENDING => pending.push(Pending {
                    done: (0..replicas.len()).map(|r| r == s.origin).collect(),
                    s,
                    chosen: None,
                }),
                Ok(_) => {}
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => open = false,
            }
        }
        if !open && pending.is_empty() {
            return out;
        }
        let now = Instant::now();
        pending.retain_mut(|p| {
            let timed_out = now.duration_since(p.s.sent) > PROBE_TIMEOUT;
            if p.chosen.is_none() {
                match holder(&replicas[p.s.origin], &p.s.hashes) {
                    Some(id) => p.chosen = Some((id, now)),
                    None if timed_out => {
                        out.undecided += 1;
                        return false;
                    }
                    None => return true,
                }
            }
            let Some((chosen, decided)) = p.chosen else {
                return true;
            };
            for (r, state) in replicas.iter().enumerate() {
                if p.done[r] {
                    continue;
                }
                match holder(state, &p.s.hashes) {
                    Some(id) => {
                        p.done[r] = true;
                        if id != chosen {
                            out.other_instance += 1;
                        }
                        out.from_send_ms
                            .push(now.duration_since(p.s.sent).as_secs_f64() * 1e3);
                        out.from_decision_ms
                            .push(now.duration_since(decided).as_secs_f64() * 1e3);
                    }
                    None if timed_out => {
                        p.done[r] = true;
                        out.timeouts += 1;
                    }
                    None => {}
                }
            }
            if p.done.iter().all(|d| *d) {
                let mut r = recent.lock().unwrap_or_else(|e| e.into_inner());
                if r.len() >= MAX_RECENT {
                    r.pop_front();
                }
                r.push_back((p.s.origin, chosen, p.s.hashes.clone(), p.s.sent));
                return false;
            }
            true
        });
    }
}

/// What a restarted replica caught up on.
pub struct CatchUp {
    /// Time until it held 99 % of the placements still held by their origin.
    pub t99: Option<Duration>,
    /// Time until it held all of them.
    pub all: Option<Duration>,
    /// Placements it held.
    pub held: usize,
    /// Placements their origin evicted (index bound) before the restarted replica got them: not
    /// counted either way.
    pub evicted: usize,
    /// Placements checked.
    pub total: usize,
}

/// Times how long `state` takes to hold `wanted` ((origin, instance, chain) still held by their
/// origin in `origins`), giving up after `limit`.
pub async fn catch_up(
    state: &AppState,
    origins: &[AppState],
    wanted: &[(usize, InstanceId, Arc<[BlockHash]>)],
    limit: Duration,
) -> CatchUp {
    let start = Instant::now();
    // 0 = waiting, 1 = held, 2 = evicted at its origin meanwhile.
    let mut st = vec![0u8; wanted.len()];
    let mut out = CatchUp {
        t99: None,
        all: None,
        held: 0,
        evicted: 0,
        total: wanted.len(),
    };
    loop {
        for (k, (origin, id, hashes)) in wanted.iter().enumerate() {
            if st[k] != 0 {
                continue;
            }
            if holder(state, hashes) == Some(*id) {
                st[k] = 1;
            } else if holder(&origins[*origin], hashes) != Some(*id) {
                st[k] = 2;
            }
        }
        out.held = st.iter().filter(|s| **s == 1).count();
        out.evicted = st.iter().filter(|s| **s == 2).count();
        let live = wanted.len() - out.evicted;
        if out.t99.is_none() && out.held * 100 >= live * 99 {
            out.t99 = Some(start.elapsed());
        }
        if out.held == live {
            out.all = Some(start.elapsed());
            return out;
        }
        if start.elapsed() > limit {
            return out;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// In-flight spread samples: max / mean over instances of the fleet-wide in-flight count.
#[derive(Default)]
pub struct Spread {
    /// One ratio per sample with load.
    pub ratios: Vec<f64>,
    /// Time-averaged in-flight per instance.
    pub mean_per_instance: Vec<f64>,
    samples: usize,
}

impl Spread {
    /// Folds in one sample of every replica's load.
    pub fn sample(&mut self, replicas: &[AppState]) {
        let Some(first) = replicas.first() else {
            return;
        };
        let ids: Vec<InstanceId> = first.fleet.view().instances().map(|i| i.id).collect();
        if self.mean_per_instance.len() != ids.len() {
            self.mean_per_instance = vec![0.0; ids.len()];
        }
        let per: Vec<f64> = ids
            .iter()
            .map(|&id| {
                replicas
                    .iter()
                    .map(|r| f64::from(r.routing.load().snapshot(id).in_flight))
                    .sum()
            })
            .collect();
        self.samples += 1;
        for (m, v) in self.mean_per_instance.iter_mut().zip(&per) {
            *m += (v - *m) / self.samples as f64;
        }
        let mean = per.iter().sum::<f64>() / per.len().max(1) as f64;
        if mean > 0.0 {
            let max = per.iter().cloned().fold(0.0, f64::max);
            self.ratios.push(max / mean);
        }
    }

    /// Mean in-flight over instances and samples.
    pub fn mean_in_flight(&self) -> f64 {
        let n = self.mean_per_instance.len().max(1) as f64;
        self.mean_per_instance.iter().sum::<f64>() / n
    }
}
