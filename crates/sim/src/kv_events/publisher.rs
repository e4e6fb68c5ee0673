//! ZMQ publisher of KV event batches, wire-compatible with vLLM's `ZmqEventPublisher`.
//!
//! - PUB socket; every batch is 3 frames `[topic, seq (u64 big-endian, from 0), payload]`.
//! - Optional ROUTER replay socket: a request `[identity, (empty,) start_seq (8 bytes BE)]` is
//!   answered with one `[identity, (empty,) seq, payload]` per buffered batch with
//!   `seq >= start_seq`, then `[identity, (empty,) -1 (i64 BE, all 0xff), ""]`.
//! - The replay buffer keeps the last `buffer_steps` batches (bounded, like vLLM's 10,000).
//! - Endpoint strings follow vLLM's rule in [`BindMode::Auto`]: bind when the string contains
//!   `*` or `::` or starts with `ipc://` / `inproc://`, connect otherwise.
//! - A restart sets seq back to 0 and forgets the replay buffer (a new engine process).
//!
//! The publisher runs as one tokio task fed by a bounded channel; when the channel is full the
//! batch is dropped and counted (the engine never blocks on its subscribers).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::encode::{encode_batch, EventEncoding};
use crate::error::SimError;
use crate::model::KvEvent;

/// End-of-replay marker: seq −1 as a big-endian i64.
pub const END_SEQ: [u8; 8] = [0xff; 8];

/// Whether to bind or connect the PUB socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BindMode {
    /// vLLM's rule (see the module doc).
    #[default]
    Auto,
    /// Always bind.
    Bind,
    /// Always connect.
    Connect,
}

/// vLLM's bind-vs-connect rule for an endpoint string.
pub fn vllm_binds(endpoint: &str) -> bool {
    endpoint.contains('*')
        || endpoint.contains("::")
        || endpoint.starts_with("ipc://")
        || endpoint.starts_with("inproc://")
}

/// The zeromq crate wants an address, not `*`.
fn normalise(endpoint: &str) -> String {
    endpoint.replace("://*:", "://0.0.0.0:")
}

/// Publisher settings.
#[derive(Clone, Debug)]
pub struct PublisherConfig {
    /// PUB endpoint (`tcp://host:port`).
    pub endpoint: String,
    /// Bind or connect.
    pub mode: BindMode,
    /// ROUTER replay endpoint (always bound), if any.
    pub replay_endpoint: Option<String>,
    /// Topic frame (vLLM default: empty).
    pub topic: String,
    /// Event encoding.
    pub encoding: EventEncoding,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    /// `data_parallel_rank` field of each batch.
    pub dp_rank: Option<i64>,
    /// Channel bound between the engine and the publisher task.
    pub queue: usize,
}

enum Cmd {
    Batch(f64, Vec<KvEvent>),
    Restart,
}

/// A running publisher.
pub struct Publisher {
    tx: mpsc::Sender<Cmd>,
    endpoint: String,
    replay_endpoint: Option<String>,
    dropped: Arc<AtomicU64>,
    published: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

/// Current wall-clock time as vLLM stamps batches (seconds since the epoch).
pub fn now_ts() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Publisher {
    /// Opens the sockets and starts the task. The returned endpoints carry the real ports.
    pub async fn start(cfg: PublisherConfig) -> Result<Self, SimError> {
        let zerr = |e: zeromq::ZmqError| SimError::Zmq(e.to_string());
        let mut pub_sock = PubSocket::new();
        let bind = match cfg.mode {
            BindMode::Auto => vllm_binds(&cfg.endpoint),
            BindMode::Bind => true,
            BindMode::Connect => false,
        };
        let endpoint = if bind {
            pub_sock
                .bind(&normalise(&cfg.endpoint))
                .await
                .map_err(zerr)?
                .to_string()
        } else {
            pub_sock.connect(&cfg.endpoint).await.map_err(zerr)?;
            cfg.endpoint.clone()
        };
        let (router, replay_endpoint) = match &cfg.replay_endpoint {
            Some(ep) => {
                let mut r = RouterSocket::new();
                let bound = r.bind(&normalise(ep)).await.map_err(zerr)?.to_string();
                (Some(r), Some(bound))
            }
            None => (None, None),
        };
        let (tx, rx) = mpsc::channel(cfg.queue.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        let published = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(run(cfg, pub_sock, router, rx, published.clone()));
        Ok(Publisher {
            tx,
            endpoint,
            replay_endpoint,
            dropped,
            published,
            task,
        })
    }

    /// The PUB endpoint (resolved when bound).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The ROUTER replay endpoint, if any.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Queues one batch (stamped now). Returns false when it had to be dropped.
    pub fn publish(&self, events: Vec<KvEvent>) -> bool {
        if events.is_empty() {
            return true;
        }
        match self.tx.try_send(Cmd::Batch(now_ts(), events)) {
            Ok(()) => true,
            Err(_) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Engine restart: seq back to 0, replay buffer forgotten.
    pub async fn restart(&self) {
        let _ = self.tx.send(Cmd::Restart).await;
    }

    /// Batches dropped because the channel was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Batches handed to the PUB socket.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    /// Stops the task and closes the sockets.
    pub async fn shutdown(self) {
        drop(self.tx);
        let _ = self.task.await;
    }
}

async fn run(
    cfg: PublisherConfig,
    mut pub_sock: PubSocket,
    mut router: Option<RouterSocket>,
    mut rx: mpsc::Receiver<Cmd>,
    published: Arc<AtomicU64>,
) {
    let mut seq: u64 = 0;
    let mut buffer: VecDeque<(u64, Bytes)> = VecDeque::new();
    let topic = Bytes::from(cfg.topic.clone().into_bytes());
    loop {
        tokio::select! {
            cmd = rx.recv() => {
                match cmd {
                    None => break,
                    Some(Cmd::Restart) => {
                        seq = 0;
                        buffer.clear();
                    }
                    Some(Cmd::Batch(ts, events)) => {
                        let payload = Bytes::from(encode_batch(ts, &events, cfg.dp_rank, cfg.encoding));
                        let frames = vec![topic.clone(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload.clone()];
                        if let Ok(msg) = ZmqMessage::try_from(frames) {
                            // No subscriber or a slow one: PUB semantics drop, as in ZMQ.
                            let _ = pub_sock.send(msg).await;
                        }
                        published.fetch_add(1, Ordering::Relaxed);
                        if cfg.buffer_steps > 0 {
                            if buffer.len() >= cfg.buffer_steps {
                                buffer.pop_front();
                            }
                            buffer.push_back((seq, payload));
                        }
                        seq += 1;
                    }
                }
            }
            req = recv_opt(&mut router) => {
                if let (Some(r), Ok(msg)) = (router.as_mut(), req) {
                    serve_replay(r, msg, &buffer).await;
                }
            }
        }
    }
}

async fn recv_opt(router: &mut Option<RouterSocket>) -> Result<ZmqMessage, zeromq::ZmqError> {
    match router {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

async fn serve_replay(router: &mut RouterSocket, msg: ZmqMessage, buffer: &VecDeque<(u64, Bytes)>) {
    let frames = msg.into_vec();
    // [identity, start] or [identity, "", start] (REQ/DEALER with delimiter).
    let (identity, delimited, start) = match frames.as_slice() {
        [id, s] if s.len() == 8 => (id.clone(), false, s.clone()),
        [id, empty, s] if empty.is_empty() && s.len() == 8 => (id.clone(), true, s.clone()),
        _ => return,
    };
    let mut sb = [0u8; 8];
    sb.copy_from_slice(&start);
    let start = u64::from_be_bytes(sb);
    let reply = |seq: Bytes, payload: Bytes| {
        let mut f = vec![identity.clone()];
        if delimited {
            f.push(Bytes::new());
        }
        f.push(seq);
        f.push(payload);
        ZmqMessage::try_from(f)
    };
    for (seq, payload) in buffer.iter().filter(|(s, _)| *s >= start) {
        if let Ok(m) = reply(Bytes::copy_from_slice(&seq.to_be_bytes()), payload.clone()) {
            if router.send(m).await.is_err() {
                return;
            }
        }
    }
    if let Ok(m) = reply(Bytes::copy_from_slice(&END_SEQ), Bytes::new()) {
        let _ = router.send(m).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_rule_matches_vllm() {
        assert!(vllm_binds("tcp://*:5557"));
        assert!(vllm_binds("tcp://[::]:5557"));
        assert!(vllm_binds("ipc:///tmp/x"));
        assert!(vllm_binds("inproc://x"));
        assert!(!vllm_binds("tcp://127.0.0.1:5557"));
        assert_eq!(normalise("tcp://*:5557"), "tcp://0.0.0.0:5557");
    }
}
