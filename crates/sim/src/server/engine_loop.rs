//! The task that drives one [`EngineModel`] in (scaled) real time.
//!
//! Loop: take commands (submit, reset, restart) → run one step at the current virtual time →
//! sleep the step's duration × slow factor ÷ time scale → refresh the metrics snapshot → deliver
//! tokens → publish the step's KV events as one batch. Idle engines block on the command channel
//! and use no CPU. The snapshot comes before the tokens so that a client holding a response
//! always finds it counted in `/metrics`.
//!
//! Stopping: [`Core::stop`] ends the loop at once, whether it is idle or sleeping through a step;
//! requests still in flight or queued are marked [`status::ABORTED`] so their handlers finish.
//! The loop cannot rely on the command channel closing, because [`Core`] (which it shares with the
//! handlers) holds the sender.
//!
//! Invariants: the model is owned by this task only; handlers see per-request [`ReqState`]
//! (counters + `Notify`, no queue, so nothing grows with a slow client); a request whose handler
//! is gone (client disconnected) is aborted at the next step, freeing its blocks; virtual time is
//! `wall elapsed × time_scale` while idle, and advances by exactly each step's duration while busy
//! (sleeps that overshoot are paid back, up to one virtual second of lag; how late each wake-up
//! was and what was skipped beyond that bound are counted in the metrics snapshot).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio_util::sync::CancellationToken;

use super::faults::Faults;
use super::metrics::Snapshot;
use crate::kv_events::Publisher;
use crate::model::{EngineModel, SimRequest};

/// Request status values in [`ReqState::status`].
pub mod status {
    /// Queued or running.
    pub const ACTIVE: u8 = 0;
    /// All tokens produced.
    pub const DONE: u8 = 1;
    /// Refused by the engine (queue full or too long).
    pub const REJECTED: u8 = 2;
    /// Cut by an engine restart.
    pub const ABORTED: u8 = 3;
}

/// What a handler sees of its request.
#[derive(Debug, Default)]
pub struct ReqState {
    /// Output tokens produced so far.
    pub produced: AtomicU32,
    /// Prompt tokens served from the cache (valid once `produced > 0`).
    pub cached: AtomicU32,
    /// See [`status`].
    pub status: AtomicU8,
    /// Set when the first token is out.
    pub first: AtomicBool,
    /// Woken on every change.
    pub notify: Notify,
}

/// Commands to the loop.
pub enum Cmd {
    /// Queue a request with the token ids it will generate (may be empty), received by its
    /// handler at the given instant.
    Submit(SimRequest, Vec<u32>, Arc<ReqState>, Instant),
    /// `POST /reset_prefix_cache`; answers whether it succeeded.
    Reset(oneshot::Sender<bool>),
    /// Restart the engine; answers when done.
    Restart(oneshot::Sender<()>),
    /// The engine hashes cached on the GPU (at most the capacity, so bounded).
    CachedHashes(oneshot::Sender<Vec<u64>>),
}

/// State shared between the loop and the HTTP handlers.
pub struct Core {
    /// Commands to the loop (bounded).
    pub cmd_tx: mpsc::Sender<Cmd>,
    /// Latest metrics snapshot.
    pub snapshot: Mutex<Snapshot>,
    /// Current faults.
    pub faults: Mutex<Faults>,
    /// Notified whenever `faults` is replaced (ends a hanging `/metrics`).
    pub faults_changed: tokio::sync::Notify,
    /// Cancelled to stop the loop (see the module doc).
    pub stop: CancellationToken,
}

/// How far (virtual µs) the engine may fall behind the wall clock before it skips ahead: catching
/// up longer than this would replay an overload as a burst.
const MAX_LAG_US: u64 = 1_000_000;

struct Inflight {
    state: Arc<ReqState>,
    /// When its handler received it (the start of the engine's own TTFT).
    received: Instant,
}

/// Runs until `core.stop` is cancelled or every command sender is dropped.
pub async fn run(
    mut model: EngineModel,
    core: Arc<Core>,
    mut rx: mpsc::Receiver<Cmd>,
    publisher: Option<Arc<Publisher>>,
    time_scale: f64,
) {
    let epoch = Instant::now();
    let scale = if time_scale.is_finite() && time_scale > 0.0 {
        time_scale
    } else {
        1.0
    };
    let vnow = move || (epoch.elapsed().as_secs_f64() * scale * 1e6) as u64;
    let mut inflight: HashMap<u64, Inflight> = HashMap::new();
    let mut vclock: u64 = 0;
    loop {
        if model.is_idle() {
            let next = tokio::select! {
                biased;
                _ = core.stop.cancelled() => None,
                c = rx.recv() => c,
            };
            match next {
                None => break,
                Some(c) => {
                    handle(
                        c,
                        &mut model,
                        &mut inflight,
                        &core,
                        publisher.as_deref(),
                        vnow(),
                    )
                    .await
                }
            }
            // Idle time passes at wall speed.
            vclock = vclock.max(vnow());
        }
        while let Ok(c) = rx.try_recv() {
            handle(
                c,
                &mut model,
                &mut inflight,
                &core,
                publisher.as_deref(),
                vnow(),
            )
            .await;
        }
        // Clients that went away: abort, freeing their blocks.
        let gone: Vec<u64> = inflight
            .iter()
            .filter(|(_, f)| Arc::strong_count(&f.state) == 1)
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            model.abort(id);
            inflight.remove(&id);
        }
        if model.is_idle() {
            core.snapshot.lock().update(&model);
            continue;
        }
        // The virtual clock follows the model, not the wall: a step starts where the previous one
        // ended (or now, after an idle period), and the task sleeps until the wall clock reaches
        // that end. Timer overshoot (1 ms tokio ticks are large against a 1 ms scaled step) is
        // thus paid back by shorter sleeps instead of slowing the engine down.
        let floor = vnow().saturating_sub(MAX_LAG_US);
        let skipped = floor.saturating_sub(vclock);
        let t0 = vclock.max(floor);
        let Some(out) = model.step(t0) else { continue };
        let slow = core.faults.lock().slow_factor.max(1.0);
        let end_v = t0 + ((out.end_us.saturating_sub(t0)) as f64 * slow) as u64;
        vclock = end_v;
        let wake = epoch + Duration::from_secs_f64(end_v as f64 / 1e6 / scale);
        tokio::select! {
            biased;
            _ = core.stop.cancelled() => break,
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
        let late = vnow().saturating_sub(end_v);
        // Metrics first, then the handlers: a client that has its tokens (or its whole response)
        // must find them counted when it reads /metrics right after.
        {
            let mut snap = core.snapshot.lock();
            snap.update(&model);
            snap.clock.steps += 1;
            snap.clock.late_us += late;
            snap.clock.skipped_us += skipped;
            for (id, _) in &out.first_tokens {
                if let Some(f) = inflight.get(id) {
                    // First tokens reach their handlers now, at the wake-up: the engine's own
                    // TTFT runs from the handler's receipt (the loop takes requests only between
                    // steps, so it includes the wait for the running one) to here, in wall time
                    // × scale, as a real engine times it.
                    snap.ttft
                        .observe(f.received.elapsed().as_secs_f64() * scale);
                }
            }
            snap.request_success += out
                .finished
                .iter()
                .filter(|id| inflight.contains_key(id))
                .count() as u64;
        }
        for (id, cached) in &out.first_tokens {
            if let Some(f) = inflight.get(id) {
                f.state.cached.store(*cached, Ordering::Relaxed);
                f.state.first.store(true, Ordering::Relaxed);
                f.state.produced.fetch_add(1, Ordering::Relaxed);
            }
        }
        for id in &out.decoded {
            if let Some(f) = inflight.get(id) {
                f.state.produced.fetch_add(1, Ordering::Relaxed);
            }
        }
        for id in &out.finished {
            if let Some(f) = inflight.remove(id) {
                f.state.status.store(status::DONE, Ordering::Release);
                f.state.notify.notify_one();
            }
        }
        for id in &out.rejected {
            if let Some(f) = inflight.remove(id) {
                f.state.status.store(status::REJECTED, Ordering::Release);
                f.state.notify.notify_one();
            }
        }
        for (id, _) in &out.first_tokens {
            if let Some(f) = inflight.get(id) {
                f.state.notify.notify_one();
            }
        }
        for id in &out.decoded {
            if let Some(f) = inflight.get(id) {
                f.state.notify.notify_one();
            }
        }
        let events = model.drain_kv_events();
        if let Some(p) = &publisher {
            if !events.is_empty() && !core.faults.lock().stop_events {
                p.publish(events);
            }
        }
    }
    // Nothing will run any more: release every waiting handler, queued submissions included.
    rx.close();
    while let Ok(c) = rx.try_recv() {
        if let Cmd::Submit(_, _, state, _) = c {
            abort_state(&state);
        }
    }
    for (_, f) in inflight.drain() {
        abort_state(&f.state);
    }
}

fn abort_state(state: &ReqState) {
    state.status.store(status::ABORTED, Ordering::Release);
    state.notify.notify_one();
}

async fn handle(
    cmd: Cmd,
    model: &mut EngineModel,
    inflight: &mut HashMap<u64, Inflight>,
    core: &Core,
    publisher: Option<&Publisher>,
    now_v: u64,
) {
    match cmd {
        Cmd::Submit(req, output_ids, state, received) => {
            let id = req.id;
            match model.try_submit_with_output(req, output_ids, now_v) {
                Ok(()) => {
                    inflight.insert(id, Inflight { state, received });
                }
                Err(_) => {
                    // Reported by the next step too; nobody waits for it there.
                    state.status.store(status::REJECTED, Ordering::Release);
                    state.notify.notify_one();
                }
            }
        }
        Cmd::Reset(tx) => {
            let ok = model.reset_prefix_cache(now_v);
            let _ = tx.send(ok);
        }
        Cmd::CachedHashes(tx) => {
            let _ = tx.send(model.cached_hashes());
        }
        Cmd::Restart(tx) => {
            model.restart();
            for (_, f) in inflight.drain() {
                abort_state(&f.state);
            }
            if let Some(p) = publisher {
                p.restart().await;
            }
            core.snapshot.lock().reset();
            let _ = tx.send(());
        }
    }
    core.snapshot.lock().update(model);
}
