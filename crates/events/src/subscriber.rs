//! The I/O edge: per stream (instance × data-parallel rank) a socket task and an ingestion task.
//!
//! ```text
//! SUB socket ──try_send──▶ bounded channel ──▶ ingestion (decode, seq check, replay, apply)
//! ```
//!
//! Invariants:
//! - The socket task never blocks on ingestion: when the channel is full the message is dropped
//!   and counted, and the sequence gap it leaves triggers replay or a rebuild.
//! - Oversized or malformed messages are counted and skipped; they still advance the sequence.
//! - Each stream has its own tasks, so one broken stream never stalls another.
//! - Socket errors reconnect with exponential backoff; nothing here panics on input.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use bytes::Bytes;
use kvgate_core::index::PlacementIndex;
use kvgate_core::{InstanceId, Millis};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zeromq::{Socket, SocketRecv, SubSocket};

use crate::config::{Direction, EventSource, EventsConfig, EventsConfigError};
use crate::ingest::{Now, SeqVerdict, StreamIngest, StreamParams, StreamStatus, WipeReason};
use crate::metrics::StreamMetrics;
use crate::replay::{splice, Replayer, ZmqReplayer};

/// The clock ingestion stamps the index with: the gateway's monotonic milliseconds.
pub type ClockFn = Arc<dyn Fn() -> Millis + Send + Sync>;

/// One received message, handed from the socket task to ingestion.
#[derive(Debug)]
pub struct Message {
    /// Sequence number.
    pub seq: u64,
    /// The payload, or `None` when it was skipped (oversized) but still advances the sequence.
    pub payload: Option<Bytes>,
}

/// Per-instance state shared by its streams and the gateway.
pub struct InstanceEvents {
    /// The instance.
    pub instance: InstanceId,
    /// Its configured name.
    pub name: String,
    /// Requests dispatched to the instance (fed by the gateway through [`EventsHandle::note_dispatch`]).
    dispatches: AtomicU64,
    /// `dispatches` when the latest message arrived on any of the instance's streams.
    dispatches_at_last_message: AtomicU64,
    /// Monotonic ms of the latest message on any stream (0 = none yet).
    last_message_ms: AtomicU64,
    /// Monotonic ms when ingestion started (silence is measured from here before any message).
    started_ms: Millis,
    /// One status cell per stream.
    streams: Vec<Arc<Mutex<StreamStatus>>>,
}

impl InstanceEvents {
    /// Snapshots of the instance's streams.
    pub fn status(&self) -> Vec<StreamStatus> {
        self.streams.iter().map(|s| s.lock().clone()).collect()
    }

    /// True when any of the instance's streams is flagged silent.
    pub fn is_silent(&self) -> bool {
        self.streams.iter().any(|s| s.lock().silent)
    }

    fn note_message(&self, now: Millis) {
        self.last_message_ms.store(now.max(1), Ordering::Relaxed);
        self.dispatches_at_last_message
            .store(self.dispatches.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Whether the instance's streams should count as silent at `now`.
    fn silent_at(&self, now: Millis, cfg: &EventsConfig) -> bool {
        let last = match self.last_message_ms.load(Ordering::Relaxed) {
            0 => self.started_ms,
            t => t,
        };
        let waiting = self
            .dispatches
            .load(Ordering::Relaxed)
            .saturating_sub(self.dispatches_at_last_message.load(Ordering::Relaxed));
        now.saturating_sub(last) >= cfg.silence_threshold_ms && waiting >= cfg.silence_min_requests
    }
}

/// One instance's running ingestion: its shared state and its streams' tasks, aborted on drop.
struct Running {
    events: Arc<InstanceEvents>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Running KV event ingestion for a changing set of instances. Dropping it stops every task.
///
/// Instances are added and removed while it runs ([`EventsHandle::add`],
/// [`EventsHandle::remove`]); the request path's [`EventsHandle::note_dispatch`] reads the current
/// set lock-free.
pub struct EventsHandle {
    cfg: EventsConfig,
    index: Arc<PlacementIndex>,
    clock: ClockFn,
    live: ArcSwap<HashMap<InstanceId, Arc<Running>>>,
    /// Serialises changes to `live`.
    edit: Mutex<()>,
}

impl Drop for EventsHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

impl EventsHandle {
    /// Ingestion for no instance yet, applying to `index` with times from `clock`. Fails only on
    /// invalid configuration.
    pub fn new(
        cfg: &EventsConfig,
        index: Arc<PlacementIndex>,
        clock: ClockFn,
    ) -> Result<Self, EventsConfigError> {
        cfg.validate()?;
        Ok(EventsHandle {
            cfg: cfg.clone(),
            index,
            clock,
            live: ArcSwap::from_pointee(HashMap::new()),
            edit: Mutex::new(()),
        })
    }

    /// Starts ingestion for `sources` on the current tokio runtime, applying to `index` with
    /// times from `clock`. Fails only on invalid configuration; unreachable endpoints are retried.
    pub fn start(
        cfg: &EventsConfig,
        sources: Vec<EventSource>,
        index: Arc<PlacementIndex>,
        clock: ClockFn,
    ) -> Result<Self, EventsConfigError> {
        let handle = Self::new(cfg, index, clock)?;
        for src in sources {
            handle.add(src)?;
        }
        Ok(handle)
    }

    /// Starts ingestion for one more instance (replacing what ran for its id before), on the
    /// current tokio runtime. Unreachable endpoints are retried.
    pub fn add(&self, src: EventSource) -> Result<(), EventsConfigError> {
        let running = self.spawn_source(&src)?;
        let _edit = self.edit.lock();
        let mut next = HashMap::clone(&self.live.load());
        next.insert(src.instance, Arc::new(running));
        self.live.store(Arc::new(next));
        Ok(())
    }

    /// Stops ingestion for `instance` (its tasks end; its index entries stay until the caller
    /// clears them).
    pub fn remove(&self, instance: InstanceId) {
        let _edit = self.edit.lock();
        let cur = self.live.load();
        if !cur.contains_key(&instance) {
            return;
        }
        let mut next = HashMap::clone(&cur);
        if let Some(r) = next.remove(&instance) {
            for t in &r.tasks {
                t.abort();
            }
        }
        self.live.store(Arc::new(next));
    }

    fn spawn_source(&self, src: &EventSource) -> Result<Running, EventsConfigError> {
        let cfg = &self.cfg;
        if src.dp_ranks == 0 {
            return Err(EventsConfigError {
                key: format!("kv_events of {}", src.name),
                message: "dp_ranks must be at least 1".into(),
            });
        }
        let metrics = StreamMetrics::new(&src.name);
        let mut streams = Vec::new();
        let mut ingests = Vec::new();
        for rank in 0..src.dp_ranks {
            let params = StreamParams {
                instance: src.instance,
                name: Arc::from(src.name.as_str()),
                dp_rank: rank,
                model: src.model.clone(),
                block_size: src.block_size,
                dialect: src.dialect,
                max_tracked_blocks: cfg.max_tracked_blocks,
                limits: cfg.decode_limits(),
                sole_stream: src.dp_ranks == 1,
            };
            let mut ingest = StreamIngest::new(params, self.index.clone(), metrics.clone());
            ingest.status_mut().endpoint = src.rank_endpoint(rank);
            ingest.publish_status();
            streams.push(ingest.status_cell());
            ingests.push(ingest);
        }
        let inst = Arc::new(InstanceEvents {
            instance: src.instance,
            name: src.name.clone(),
            dispatches: AtomicU64::new(0),
            dispatches_at_last_message: AtomicU64::new(0),
            last_message_ms: AtomicU64::new(0),
            started_ms: (self.clock)(),
            streams,
        });
        let mut tasks = Vec::new();
        for (rank, ingest) in (0..src.dp_ranks).zip(ingests) {
            let (tx, rx) = mpsc::channel(cfg.channel_capacity);
            let link = Arc::new(Link::default());
            let (direction, _) = src.direction();
            let sock = SocketTask {
                endpoint: src.rank_endpoint(rank),
                direction,
                topic: src.topic.clone(),
                max_payload: cfg.max_message_bytes,
                backoff: (cfg.reconnect_initial_ms, cfg.reconnect_max_ms),
                link: link.clone(),
                tx,
                name: src.name.clone(),
            };
            tasks.push(tokio::spawn(sock.run()));
            let replayer = src.rank_replay_endpoint(rank).map(|e| {
                ZmqReplayer::new(
                    e,
                    Duration::from_millis(cfg.replay_timeout_ms),
                    cfg.max_message_bytes,
                )
            });
            let task = IngestTask {
                ingest,
                replayer,
                link,
                rx,
                instance: inst.clone(),
                cfg: cfg.clone(),
                clock: self.clock.clone(),
            };
            tasks.push(tokio::spawn(task.run()));
        }
        Ok(Running {
            events: inst,
            tasks,
        })
    }

    /// Stops every task (also done on drop). Status stays readable.
    pub fn stop(&self) {
        for r in self.live.load().values() {
            for t in &r.tasks {
                t.abort();
            }
        }
    }

    /// Tells silence detection that a request was dispatched to `instance`. Cheap (one atomic).
    pub fn note_dispatch(&self, instance: InstanceId) {
        if let Some(r) = self.live.load().get(&instance) {
            r.events.dispatches.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The instance's shared state, if it has an event source.
    pub fn instance(&self, instance: InstanceId) -> Option<Arc<InstanceEvents>> {
        self.live.load().get(&instance).map(|r| r.events.clone())
    }

    /// True when `instance` has an event source and it is flagged silent.
    pub fn is_silent(&self, instance: InstanceId) -> bool {
        self.live
            .load()
            .get(&instance)
            .is_some_and(|r| r.events.is_silent())
    }

    /// Status of every stream, by instance id.
    pub fn status(&self) -> Vec<StreamStatus> {
        let live = self.live.load();
        let mut ids: Vec<&InstanceId> = live.keys().collect();
        ids.sort_unstable();
        ids.into_iter()
            .filter_map(|id| live.get(id))
            .flat_map(|r| r.events.status())
            .collect()
    }
}

/// State the socket task shares with its ingestion task.
#[derive(Default)]
struct Link {
    connected: AtomicBool,
    /// The endpoint actually bound (port 0 resolved) or connected.
    endpoint: Mutex<Option<String>>,
    dropped: AtomicU64,
    /// One past the highest sequence number dropped by a full channel (0: none): lets ingestion
    /// recover a dropped *last* message, which no later message would reveal as a gap.
    dropped_upto: AtomicU64,
    malformed: AtomicU64,
}

struct SocketTask {
    endpoint: String,
    direction: Direction,
    topic: String,
    max_payload: usize,
    backoff: (u64, u64),
    link: Arc<Link>,
    tx: mpsc::Sender<Message>,
    name: String,
}

impl SocketTask {
    async fn run(self) {
        let mut delay = self.backoff.0;
        loop {
            match self.session().await {
                Ok(()) => return, // ingestion ended: nothing left to feed
                Err(e) => {
                    self.link.connected.store(false, Ordering::Relaxed);
                    tracing::warn!(instance = %self.name, endpoint = %self.endpoint, error = %e, retry_ms = delay, "KV event socket error");
                }
            }
            tokio::time::sleep(Duration::from_millis(delay)).await;
            delay = delay.saturating_mul(2).min(self.backoff.1);
        }
    }

    /// One socket lifetime: open, then forward messages until an error.
    async fn session(&self) -> Result<(), zeromq::ZmqError> {
        let mut sock = SubSocket::new();
        sock.subscribe(&self.topic).await?;
        match self.direction {
            Direction::Bind => {
                let ep = sock.bind(&self.endpoint).await?;
                *self.link.endpoint.lock() = Some(ep.to_string());
            }
            Direction::Connect => {
                sock.connect(&self.endpoint).await?;
                *self.link.endpoint.lock() = Some(self.endpoint.clone());
            }
        }
        self.link.connected.store(true, Ordering::Relaxed);
        loop {
            let msg = sock.recv().await?;
            let Some(m) = parse_frames(msg.into_vec(), self.max_payload) else {
                self.link.malformed.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            // zeromq's receive path does not count against tokio's cooperative budget: without
            // this, a burst would keep ingestion from running on a single-threaded runtime.
            tokio::task::consume_budget().await;
            match self.tx.try_send(m) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(m)) => {
                    self.link.dropped.fetch_add(1, Ordering::Relaxed);
                    self.link
                        .dropped_upto
                        .fetch_max(m.seq.saturating_add(1), Ordering::Relaxed);
                }
                Err(mpsc::error::TrySendError::Closed(_)) => return Ok(()),
            }
        }
    }
}

/// `[topic, seq, payload]` (or `[seq, payload]`) → a message; `None` when malformed. Oversized
/// payloads keep their sequence number with no payload.
pub fn parse_frames(frames: Vec<Bytes>, max_payload: usize) -> Option<Message> {
    let (seq, payload) = match frames.len() {
        3 => (&frames[1], &frames[2]),
        2 => (&frames[0], &frames[1]),
        _ => return None,
    };
    let seq: [u8; 8] = seq.as_ref().try_into().ok()?;
    let seq = u64::from_be_bytes(seq);
    let payload = (payload.len() <= max_payload).then(|| payload.clone());
    Some(Message { seq, payload })
}

struct IngestTask<R> {
    ingest: StreamIngest,
    replayer: Option<R>,
    link: Arc<Link>,
    rx: mpsc::Receiver<Message>,
    instance: Arc<InstanceEvents>,
    cfg: EventsConfig,
    clock: ClockFn,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl<R: Replayer> IngestTask<R> {
    async fn run(mut self) {
        let period = Duration::from_millis((self.cfg.silence_threshold_ms / 4).clamp(50, 1000));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                msg = self.rx.recv() => {
                    let Some(msg) = msg else { return };
                    let now = (self.clock)();
                    self.instance.note_message(now);
                    handle_message(&mut self.ingest, self.replayer.as_mut(), msg, &self.clock).await;
                    self.recover_trailing_drops().await;
                    self.sync_link();
                    if self.ingest.status().silent {
                        self.ingest.set_silent(false);
                    }
                    self.ingest.publish_status();
                }
                _ = tick.tick() => {
                    let now = (self.clock)();
                    if !self.ingest.status().silent && self.instance.silent_at(now, &self.cfg) {
                        self.ingest.set_silent(true);
                        self.ingest.wipe(WipeReason::Silent);
                    }
                    self.recover_trailing_drops().await;
                    self.sync_link();
                    self.ingest.publish_status();
                }
            }
        }
    }

    /// When the channel is drained but messages up to `dropped_upto` were dropped, nothing will
    /// reveal that gap: replay it now (or wipe without a replay socket).
    async fn recover_trailing_drops(&mut self) {
        let upto = self.link.dropped_upto.load(Ordering::Relaxed);
        let Some(next) = self.ingest.next_seq() else {
            return;
        };
        if upto <= next || !self.rx.is_empty() {
            return;
        }
        self.ingest.note_gap();
        let clock = self.clock.clone();
        let now = move || Now {
            mono_ms: clock(),
            unix_s: unix_now(),
        };
        match self.replayer.as_mut() {
            Some(r) => {
                catch_up(&mut self.ingest, r, next, upto, true, now).await;
            }
            None => self.ingest.wipe(WipeReason::Gap),
        }
        if self.ingest.next_seq().is_some_and(|n| n < upto) {
            self.ingest.skip_seq(upto - 1);
        }
    }

    fn sync_link(&mut self) {
        let dropped = self.link.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            self.ingest.note_dropped(dropped);
        }
        let malformed = self.link.malformed.swap(0, Ordering::Relaxed);
        if malformed > 0 {
            self.ingest.status_mut().decode_errors += malformed;
            self.ingest.metrics().decode_errors.increment(malformed);
        }
        let connected = self.link.connected.load(Ordering::Relaxed);
        let endpoint = self.link.endpoint.lock().clone();
        let st = self.ingest.status_mut();
        st.connected = connected;
        if let Some(ep) = endpoint {
            st.endpoint = ep;
        }
    }
}

/// Applies one live message: sequence check, replay of a gap (when a replayer is given), wipe
/// when the stream cannot be proven complete, then the message itself.
pub async fn handle_message<R: Replayer>(
    ingest: &mut StreamIngest,
    replayer: Option<&mut R>,
    msg: Message,
    clock: &ClockFn,
) {
    let now = || Now {
        mono_ms: clock(),
        unix_s: unix_now(),
    };
    let seq = msg.seq;
    match ingest.check_seq(seq) {
        SeqVerdict::Next => {}
        SeqVerdict::First => {
            // Joined mid-stream: catch up with whatever the engine still buffers. Nothing was
            // indexed yet, so a partial catch-up needs no wipe.
            if seq > 0 {
                if let Some(r) = replayer {
                    catch_up(ingest, r, 0, seq, false, now).await;
                }
            }
        }
        SeqVerdict::Gap { from } => {
            ingest.note_gap();
            tracing::info!(instance = %ingest.params().name, from, to = seq, "KV event sequence gap");
            match replayer {
                Some(r) => {
                    catch_up(ingest, r, from, seq, true, now).await;
                }
                // Nothing proves what the missing messages removed: start over from the live stream.
                None => ingest.wipe(WipeReason::Gap),
            }
        }
        SeqVerdict::Restart => {
            ingest.note_restart();
            tracing::warn!(instance = %ingest.params().name, seq, "KV event sequence went backwards: engine restarted");
            ingest.wipe(WipeReason::Restart);
            if seq > 0 {
                if let Some(r) = replayer {
                    catch_up(ingest, r, 0, seq, false, now).await;
                }
            }
        }
    }
    match msg.payload {
        Some(p) => {
            if let Err(e) = ingest.apply_payload(seq, &p, now()) {
                tracing::debug!(instance = %ingest.params().name, seq, error = %e, "undecodable KV event payload skipped");
            }
        }
        None => {
            ingest.status_mut().decode_errors += 1;
            ingest.metrics().decode_errors.increment(1);
            ingest.skip_seq(seq);
        }
    }
}

/// Replays `from..until` and applies it; returns true when the replay covered the whole range.
/// Otherwise, with `wipe_if_uncovered`, the stream is wiped before the contiguous tail that was
/// obtained is applied (so the index never keeps blocks the missing messages may have removed).
async fn catch_up<R: Replayer>(
    ingest: &mut StreamIngest,
    replayer: &mut R,
    from: u64,
    until: u64,
    wipe_if_uncovered: bool,
    now: impl Fn() -> Now,
) -> bool {
    let s = match replayer.replay(from).await {
        Ok(frames) => splice(from, until, frames),
        Err(e) => {
            tracing::warn!(instance = %ingest.params().name, error = %e, "KV event replay failed");
            Default::default()
        }
    };
    ingest.note_replay(s.covered, !s.frames.is_empty());
    if !s.covered && wipe_if_uncovered {
        ingest.wipe(WipeReason::Gap);
    }
    for (seq, payload) in s.frames {
        let _ = ingest.apply_payload(seq, &payload, now());
    }
    s.covered
}
