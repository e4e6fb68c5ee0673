//! The envelope's claims, checked over real UDP between real replicas: a rolling key rotation
//! drops nothing and a key taken out of `previous_secrets` is refused; a datagram with any one
//! byte changed (ciphertext, tag, or any header field bound as associated data) is dropped and
//! counted in `kvgate_gossip_rejected_total{reason}` without using up the genuine datagram's
//! replay slot; a truncated one too; placements are not readable on the wire; the replay window
//! accepts late-but-new counters and refuses ones behind it. Every wait is bounded.

mod common;

use common::*;
use kvgate_gossip::wire::envelope::{Keys, HEADER_LEN, NONCE_LEN, OVERHEAD};
use kvgate_gossip::GossipConfig;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};

const OLD: &str = "rotation-old-secret-0123";
const NEW: &str = "rotation-new-secret-4567";

/// The process-wide metrics recorder (installed once; tests in this binary share it, so they
/// compare counts before and after, and only ever ask for at least their own increments).
fn snapshotter() -> &'static Snapshotter {
    static S: OnceLock<Snapshotter> = OnceLock::new();
    S.get_or_init(|| {
        let r = DebuggingRecorder::new();
        let s = r.snapshotter();
        // Fails only if another recorder is installed, which nothing in this binary does.
        let _ = r.install();
        s
    })
}

/// `kvgate_gossip_rejected_total{reason}` summed over the process so far (a snapshot drains the
/// recorder's counters, so every reading is added to running totals).
fn rejected_metric(reason: &str) -> u64 {
    static TOTALS: OnceLock<Mutex<BTreeMap<String, u64>>> = OnceLock::new();
    let mut totals = TOTALS.get_or_init(Mutex::default).lock().expect("lock");
    for (k, _, _, v) in snapshotter().snapshot().into_vec() {
        let key = k.key();
        if key.name() != kvgate_gossip::metrics::REJECTED_TOTAL {
            continue;
        }
        if let (Some(l), DebugValue::Counter(c)) = (key.labels().find(|l| l.key() == "reason"), v) {
            *totals.entry(l.value().to_string()).or_default() += c;
        }
    }
    totals.get(reason).copied().unwrap_or(0)
}

fn keyed(seeds: &[SocketAddr], secret: &str, previous: &[&str]) -> GossipConfig {
    GossipConfig {
        secret: secret.into(),
        previous_secrets: previous.iter().map(|s| s.to_string()).collect(),
        ..fast_config(seeds)
    }
}

/// Both replicas see each other, and a fresh decision of each reaches the other.
async fn converge(a: &Node, b: &Node, step: u64) {
    let ok = wait_until(CONVERGE, || {
        a.gossip.live_peers() == 1 && b.gossip.live_peers() == 1
    })
    .await;
    assert!(ok, "step {step}: the replicas did not see each other");
    let from_a = chain(100 + step, 30);
    let from_b = chain(200 + step, 30);
    a.decide(1, &from_a);
    b.decide(2, &from_b);
    let ok = wait_until(CONVERGE, || {
        b.holds(1, &from_a) == 30 && a.holds(2, &from_b) == 30
    })
    .await;
    assert!(ok, "step {step}: placements did not cross");
}

/// Replaces `old` by a new process with `cfg` (a rolling restart), checking that the one it
/// replaces never refused a datagram for its key.
async fn roll(old: Node, cfg: GossipConfig) -> Node {
    assert_eq!(
        old.rejected("auth"),
        0,
        "a datagram was refused during rotation"
    );
    old.gossip.shutdown().await;
    let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    Node::start(any, cfg, false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_key_rotation_drops_nothing_and_a_retired_key_is_refused() {
    snapshotter();
    let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let mut a = Node::start(any, keyed(&[], OLD, &[]), false).await;
    let mut b = Node::start(any, keyed(&[a.addr], OLD, &[]), true).await;
    converge(&a, &b, 0).await;

    // The documented procedure, one replica at a time; after each restart the cluster mixes
    // the previous and the next configuration, and must still converge both ways.
    let steps: [(bool, &str, &[&str]); 6] = [
        // 1. accept the new key everywhere (still sealing with the old one)
        (false, OLD, &[NEW]),
        (true, OLD, &[NEW]),
        // 2. seal with the new key, still accepting the old one
        (false, NEW, &[OLD]),
        (true, NEW, &[OLD]),
        // 3. retire the old key
        (false, NEW, &[]),
        (true, NEW, &[]),
    ];
    for (i, (roll_a, secret, previous)) in steps.into_iter().enumerate() {
        if roll_a {
            a = roll(a, keyed(&[b.addr], secret, previous)).await;
        } else {
            b = roll(b, keyed(&[a.addr], secret, previous)).await;
        }
        converge(&a, &b, i as u64 + 1).await;
        assert_eq!(a.rejected("auth") + b.rejected("auth"), 0, "step {}", i + 1);
    }

    // A replica that missed the rotation still seals with the retired key: refused, counted,
    // never a member, its placements never applied.
    let metric_before = rejected_metric("auth");
    let straggler = Node::start(any, keyed(&[a.addr], OLD, &[]), false).await;
    let forged = chain(300, 30);
    straggler.decide(1, &forged);
    assert!(
        wait_until(CONVERGE, || a.rejected("auth") > 0).await,
        "datagrams under the retired key were not refused"
    );
    // A datagram sealed under the retired key and sent directly is refused too; the control
    // under the current key is applied.
    send_raw(
        a.addr,
        &sealed_delta(&Keys::new("test", OLD.as_bytes()), 77, 1, 3, &forged),
    )
    .await;
    let legit = chain(301, 30);
    send_raw(
        a.addr,
        &sealed_delta(&Keys::new("test", NEW.as_bytes()), 78, 1, 3, &legit),
    )
    .await;
    assert!(wait_until(CONVERGE, || a.holds(3, &legit) == 30).await);
    assert_eq!(
        a.holds(1, &forged) + a.holds(3, &forged),
        0,
        "retired key's placements applied"
    );
    assert_eq!(a.gossip.live_peers(), 1, "the straggler became a member");
    assert!(rejected_metric("auth") > metric_before, "not in the metric");
    straggler.gossip.shutdown().await;
    a.gossip.shutdown().await;
    b.gossip.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_datagram_is_rejected_and_counted() {
    snapshotter();
    let c = cluster(2).await;
    let a = &c[0];
    let keys = Keys::new("test", SECRET.as_bytes());
    let hashes = chain(50, 20);
    let genuine = sealed_delta(&keys, 60, 1, 1, &hashes);
    // Confidential: no placement hash appears on the wire.
    for h in &hashes {
        let b = h.to_le_bytes();
        assert!(
            !genuine.windows(8).any(|w| w == b),
            "a hash travels in clear"
        );
    }

    // One flipped byte at each place that matters, with the reason it must be dropped for.
    let header = |at: usize| (at, "auth");
    let cases = [
        (0, "version"),                                      // version
        (2, "cluster"),                                      // cluster tag
        header(10),                                          // sender id (associated data)
        header(18),                                          // counter (associated data)
        header(26),                                          // timestamp (associated data)
        header(HEADER_LEN - NONCE_LEN),                      // nonce
        (HEADER_LEN, "auth"),                                // first ciphertext byte
        (genuine.len() - OVERHEAD + HEADER_LEN - 1, "auth"), // last ciphertext byte
        (genuine.len() - 1, "auth"),                         // tag
    ];
    let mut expected = BTreeMap::<&str, u64>::new();
    let metric_before: Vec<u64> = ["version", "cluster", "auth"]
        .iter()
        .map(|r| rejected_metric(r))
        .collect();
    for (at, reason) in cases {
        let mut t = genuine.clone();
        t[at] ^= 0x01;
        send_raw(a.addr, &t).await;
        *expected.entry(reason).or_default() += 1;
    }
    // Truncated by one byte: the tag no longer verifies.
    send_raw(a.addr, &genuine[..genuine.len() - 1]).await;
    *expected.entry("auth").or_default() += 1;
    let ok = wait_until(CONVERGE, || {
        expected.iter().all(|(r, n)| a.rejected(r) >= *n)
    })
    .await;
    assert!(
        ok,
        "not every tampered datagram was counted: {:?}",
        a.gossip.cluster_status().rejected
    );
    assert_eq!(a.holds(1, &hashes), 0, "a tampered datagram was applied");
    for (i, r) in ["version", "cluster", "auth"].iter().enumerate() {
        assert!(
            rejected_metric(r) >= metric_before[i] + expected[r],
            "kvgate_gossip_rejected_total{{reason={r}}} not incremented"
        );
    }
    // The tampered copies did not use up the genuine datagram's replay slot: it is accepted.
    send_raw(a.addr, &genuine).await;
    assert!(
        wait_until(CONVERGE, || a.holds(1, &hashes) == 20).await,
        "the genuine datagram was refused after its tampered copies"
    );
    assert_eq!(a.rejected("replay"), 0);
    for n in c {
        n.gossip.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_window_takes_late_new_counters_and_refuses_old_ones() {
    let c = cluster(2).await;
    let a = &c[0];
    let keys = Keys::new("test", SECRET.as_bytes());
    let (top, late, too_old) = (chain(70, 10), chain(71, 10), chain(72, 10));
    send_raw(a.addr, &sealed_delta(&keys, 80, 100, 2, &top)).await;
    assert!(wait_until(CONVERGE, || a.holds(2, &top) == 10).await);
    // 40 behind the highest counter and never seen: reordered, not replayed; applied.
    send_raw(a.addr, &sealed_delta(&keys, 80, 60, 2, &late)).await;
    assert!(wait_until(CONVERGE, || a.holds(2, &late) == 10).await);
    // 64 or more behind: outside the window, refused even though never seen.
    send_raw(a.addr, &sealed_delta(&keys, 80, 36, 2, &too_old)).await;
    assert!(wait_until(CONVERGE, || a.rejected("replay") >= 1).await);
    assert_eq!(a.holds(2, &too_old), 0);
    for n in c {
        n.gossip.shutdown().await;
    }
}
