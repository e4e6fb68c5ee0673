//! End-to-end over real ZMQ sockets on 127.0.0.1: a test-driven "engine" (PUB socket plus a ROUTER
//! replay socket speaking vLLM's protocol) and [`EventsHandle`] ingesting into an index.
//! Covers both socket directions, gap → replay, restart → wipe, silence → flag, block-size
//! mismatch → warning, malformed messages → counted and skipped.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use kvgate_core::index::PlacementIndex;
use kvgate_core::InstanceId;
use kvgate_events::{EventSource, EventsConfig, EventsHandle, StreamStatus};
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

const I: InstanceId = InstanceId(0);

/// Messages an engine published: (seq, payload).
type History = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// A fake engine: publishes `[topic, seq, payload]` and answers replay requests from its buffer.
struct Engine {
    pub_sock: PubSocket,
    history: History,
    replay_endpoint: String,
    replay_task: JoinHandle<()>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.replay_task.abort();
    }
}

impl Engine {
    async fn start(bind_pub: bool) -> (Engine, String) {
        let mut pub_sock = PubSocket::new();
        let ep = if bind_pub {
            pub_sock
                .bind("tcp://127.0.0.1:0")
                .await
                .unwrap()
                .to_string()
        } else {
            String::new()
        };
        let mut router = RouterSocket::new();
        let replay_endpoint = router.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
        let history: History = Arc::default();
        let h = history.clone();
        let replay_task = tokio::spawn(async move {
            while let Ok(msg) = router.recv().await {
                let frames = msg.into_vec();
                let (Some(id), Some(start)) = (frames.first(), frames.last()) else {
                    continue;
                };
                let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
                    continue;
                };
                let start = u64::from_be_bytes(start);
                let buffered: Vec<(u64, Vec<u8>)> = h
                    .lock()
                    .iter()
                    .filter(|(s, _)| *s >= start)
                    .cloned()
                    .collect();
                for (seq, payload) in buffered {
                    let reply = vec![
                        id.clone(),
                        Bytes::new(),
                        Bytes::copy_from_slice(&seq.to_be_bytes()),
                        Bytes::from(payload),
                    ];
                    let _ = router.send(ZmqMessage::try_from(reply).unwrap()).await;
                }
                let end = vec![
                    id.clone(),
                    Bytes::new(),
                    Bytes::copy_from_slice(&(-1i64).to_be_bytes()),
                    Bytes::new(),
                ];
                let _ = router.send(ZmqMessage::try_from(end).unwrap()).await;
            }
        });
        (
            Engine {
                pub_sock,
                history,
                replay_endpoint,
                replay_task,
            },
            ep,
        )
    }

    /// Records `payload` as message `seq` and publishes it unless `lose` (a lost message stays in
    /// the replay buffer, as in vLLM when a subscriber falls behind).
    async fn publish(&mut self, seq: u64, payload: Vec<u8>, lose: bool) {
        self.history.lock().push((seq, payload.clone()));
        if !lose {
            self.send_raw(vec![
                Bytes::new(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                Bytes::from(payload),
            ])
            .await;
        }
    }

    async fn send_raw(&mut self, frames: Vec<Bytes>) {
        self.pub_sock
            .send(ZmqMessage::try_from(frames).unwrap())
            .await
            .unwrap();
    }

    /// A restarted engine: new process, sequence from 0, empty buffer.
    fn restart(&mut self) {
        self.history.lock().clear();
    }
}

fn cfg() -> EventsConfig {
    EventsConfig {
        replay_timeout_ms: 3_000,
        silence_threshold_ms: 300,
        silence_min_requests: 2,
        reconnect_initial_ms: 20,
        reconnect_max_ms: 200,
        ..EventsConfig::default()
    }
}

fn start(
    cfg: &EventsConfig,
    endpoint: &str,
    replay: Option<&str>,
    block_size: u32,
) -> (EventsHandle, Arc<PlacementIndex>) {
    let idx = index();
    let mut src = EventSource::new(I, "engine-a", endpoint, MODEL, block_size);
    src.replay_endpoint = replay.map(str::to_owned);
    let origin = Instant::now();
    let clock = Arc::new(move || origin.elapsed().as_millis() as u64 + 1);
    let h = EventsHandle::start(cfg, vec![src], idx.clone(), clock).unwrap();
    (h, idx)
}

/// Polls `f` every 20 ms for up to 10 s.
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn status(h: &EventsHandle) -> StreamStatus {
    h.status().remove(0)
}

/// Message `seq` of a simple engine workload: stores block `seq` of `toks(0, ..)` chained on the
/// previous one.
fn block_msg(seq: u64, tokens: &[u32]) -> Vec<u8> {
    let lo = seq as usize * BS as usize;
    let parent = (seq > 0).then_some(seq);
    batch(&[stored(&[seq + 1], parent, &tokens[lo..lo + BS as usize])])
}

#[tokio::test]
async fn connect_to_a_binding_engine_with_gap_replay_and_restart() {
    let (mut engine, ep) = Engine::start(true).await;
    let replay = engine.replay_endpoint.clone();
    let (h, idx) = start(&cfg(), &ep, Some(&replay), BS);
    until("connection", || status(&h).connected).await;
    // Let the subscription reach the publisher; anything lost before is replayed anyway.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = toks(0, 40);
    for seq in 0..3 {
        engine.publish(seq, block_msg(seq, &t), false).await;
    }
    until("three blocks", || credited(&idx, I, &t) == 3).await;

    // Messages 3 and 4 are lost on the wire; 5 reveals the gap and replay fills it.
    engine.publish(3, block_msg(3, &t), true).await;
    engine.publish(4, block_msg(4, &t), true).await;
    engine.publish(5, block_msg(5, &t), false).await;
    until("gap replayed", || credited(&idx, I, &t) == 6).await;
    let st = status(&h);
    assert!(st.gaps >= 1);
    assert!(st.replays_covered >= 1);
    assert_eq!(st.last_seq, Some(5));
    assert_eq!(st.wipes, 0);

    // The engine restarts: sequence from 0 and an empty cache. Old blocks must not be credited.
    engine.restart();
    let other = toks(500, 4);
    engine
        .publish(0, batch(&[stored(&[1000], None, &other)]), false)
        .await;
    until("restart detected", || status(&h).restarts == 1).await;
    until("new block", || credited(&idx, I, &other) == 1).await;
    assert_eq!(credited(&idx, I, &t), 0);
    assert_eq!(idx.instance_entries(I), 1);
}

#[tokio::test]
async fn bind_for_engines_that_connect() {
    let c = cfg();
    let (h, idx) = start(&c, "bind:tcp://127.0.0.1:0", None, BS);
    until("bound", || status(&h).connected).await;
    let bound = status(&h).endpoint;
    assert!(bound.starts_with("tcp://127.0.0.1:"), "{bound}");
    assert!(!bound.ends_with(":0"), "{bound}");
    let (mut engine, _) = Engine::start(false).await;
    engine.pub_sock.connect(&bound).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = toks(0, 12);
    engine.publish(0, block_msg(0, &t), false).await;
    engine.publish(1, block_msg(1, &t), false).await;
    until("two blocks", || credited(&idx, I, &t) == 2).await;
    // No replay endpoint: a gap drops what cannot be proven and rebuilds from the live stream.
    engine.publish(2, block_msg(2, &t), true).await;
    let fresh = toks(700, 4);
    engine
        .publish(3, batch(&[stored(&[55], None, &fresh)]), false)
        .await;
    until("rebuilt after gap", || credited(&idx, I, &fresh) == 1).await;
    assert_eq!(credited(&idx, I, &t), 0);
    assert_eq!(status(&h).gaps, 1);
}

#[tokio::test]
async fn malformed_and_oversized_messages_are_counted_and_skipped() {
    let c = EventsConfig {
        max_message_bytes: 4096,
        ..cfg()
    };
    let (mut engine, ep) = Engine::start(true).await;
    let (h, idx) = start(&c, &ep, None, BS);
    until("connection", || status(&h).connected).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = toks(0, 8);
    engine.publish(0, block_msg(0, &t), false).await;
    until("first block", || credited(&idx, I, &t) == 1).await;
    // Wrong frame count, short sequence frame, garbage payload, oversized payload.
    engine.send_raw(vec![Bytes::from_static(b"x")]).await;
    engine
        .send_raw(vec![
            Bytes::new(),
            Bytes::from_static(b"\x01"),
            Bytes::from_static(b"\x90"),
        ])
        .await;
    engine
        .publish(1, b"\xc1\xc1 not msgpack".to_vec(), false)
        .await;
    engine.publish(2, vec![0x90; 10_000], false).await;
    engine.publish(3, block_msg(1, &t), false).await;
    until("block after garbage", || status(&h).last_seq == Some(3)).await;
    let st = status(&h);
    assert_eq!(st.decode_errors, 4);
    assert_eq!(st.gaps, 0);
    assert_eq!(credited(&idx, I, &t), 2);
}

#[tokio::test]
async fn silent_stream_is_flagged_and_falls_back() {
    let (mut engine, ep) = Engine::start(true).await;
    let (h, idx) = start(&cfg(), &ep, None, BS);
    until("connection", || status(&h).connected).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = toks(0, 8);
    engine.publish(0, block_msg(0, &t), false).await;
    until("first block", || credited(&idx, I, &t) == 1).await;
    assert!(!h.is_silent(I));
    // Requests keep being dispatched, the engine publishes nothing.
    for _ in 0..3 {
        h.note_dispatch(I);
    }
    until("silence flagged", || h.is_silent(I)).await;
    assert_eq!(idx.instance_entries(I), 0, "event entries dropped");
    assert!(status(&h).silent);
    engine.publish(1, block_msg(1, &t), false).await;
    until("active again", || !h.is_silent(I)).await;
}

#[tokio::test]
async fn idle_stream_without_requests_is_not_silent() {
    let (_engine, ep) = Engine::start(true).await;
    let (h, _idx) = start(&cfg(), &ep, None, BS);
    until("connection", || status(&h).connected).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!h.is_silent(I));
}

#[tokio::test]
async fn block_size_mismatch_is_reported() {
    let (mut engine, ep) = Engine::start(true).await;
    let (h, idx) = start(&cfg(), &ep, None, BS * 2);
    until("connection", || status(&h).connected).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = toks(0, 8);
    engine.publish(0, block_msg(0, &t), false).await;
    until("mismatch", || status(&h).block_size_mismatch == Some(BS)).await;
    assert_eq!(idx.instance_entries(I), 0);
}

#[tokio::test]
async fn one_broken_stream_does_not_stall_another() {
    let (mut good, good_ep) = Engine::start(true).await;
    let idx = index();
    let bad = EventSource::new(InstanceId(1), "bad", "tcp://127.0.0.1:1", MODEL, BS);
    let ok = EventSource::new(I, "good", good_ep.as_str(), MODEL, BS);
    let origin = Instant::now();
    let clock = Arc::new(move || origin.elapsed().as_millis() as u64 + 1);
    let h = EventsHandle::start(&cfg(), vec![bad, ok], idx.clone(), clock).unwrap();
    // Status comes by instance id: "good" is instance 0, "bad" instance 1.
    until("good connection", || h.status()[0].connected).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = toks(0, 4);
    good.publish(0, block_msg(0, &t), false).await;
    until("good stream applied", || credited(&idx, I, &t) == 1).await;
    assert!(!h.status()[1].connected);
}

#[tokio::test]
async fn overload_drops_are_recovered_by_replay() {
    let c = EventsConfig {
        channel_capacity: 1,
        ..cfg()
    };
    let (mut engine, ep) = Engine::start(true).await;
    let replay = engine.replay_endpoint.clone();
    let (h, idx) = start(&c, &ep, Some(&replay), BS);
    until("connection", || status(&h).connected).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let n = 300u64;
    let t = toks(0, n as usize * BS as usize);
    for seq in 0..n {
        engine.publish(seq, block_msg(seq, &t), false).await;
    }
    // Whatever the channel dropped, replay restores every block of the chain.
    until("all blocks credited", || credited(&idx, I, &t) == n as u32).await;
    let st = status(&h);
    assert_eq!(st.last_seq, Some(n - 1));
    assert_eq!(st.wipes, 0, "{st:?}");
    assert_eq!(st.replays_failed, 0, "{st:?}");
    eprintln!(
        "dropped {} messages, {} gaps, {} replays",
        st.dropped_messages, st.gaps, st.replays_covered
    );
}
