//! Three replicas in one process on ephemeral ports: convergence, shared load, restart catch-up,
//! partition and rejoin, and hostile input. Every wait is bounded; no assertion is on speed.

mod common;

use common::*;
use kvgate_core::load::RouterLoad;
use kvgate_core::Source;
use kvgate_gossip::wire::envelope::{Header, Keys};
use kvgate_gossip::wire::Kind;
use std::net::SocketAddr;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decision_on_one_replica_reaches_the_others() {
    let c = cluster(3).await;
    let prompt = chain(1, 300);
    c[0].decide(2, &prompt);
    let ok = wait_until(CONVERGE, || {
        c[1].holds(2, &prompt) == 300 && c[2].holds(2, &prompt) == 300
    })
    .await;
    assert!(ok, "B and C did not learn A's placement");
    // Received as peer predictions, under each replica's own numbering of the instance.
    assert!(c[1].index.stats().entries_by_source[Source::Peer as usize] >= 300);
    assert_eq!(c[1].holds(1, &prompt), 0, "no other instance gained it");
    // A decision larger than one datagram (8,000 blocks = 64 KB of hashes) is split and still
    // arrives whole.
    let long = chain(2, 8_000);
    c[2].decide(0, &long);
    let ok = wait_until(CONVERGE, || {
        c[0].holds(0, &long) == 8_000 && c[1].holds(0, &long) == 8_000
    })
    .await;
    assert!(ok, "a multi-datagram decision did not converge");
    let st = c[0].gossip.cluster_status();
    assert_eq!(st.members.len(), 2);
    assert!(st.bytes_in > 64_000 && st.bytes_out > 0);
    assert!(st.members.iter().all(|m| m.state == "alive"));
    for n in c {
        n.gossip.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_mode_converges_with_stride_fewer_bytes() {
    let c = cluster_with(3, 16).await;
    let base = c[0].gossip.cluster_status().bytes_out;
    let prompt = chain(50, 500);
    c[0].decide(1, &prompt);
    let ok = wait_until(CONVERGE, || {
        c[1].holds(1, &prompt) == 500 && c[2].holds(1, &prompt) == 500
    })
    .await;
    assert!(ok, "checkpoints did not converge");
    // 32 checkpoints instead of 500 hashes, to each of two peers (plus membership and load).
    let sent = c[0].gossip.cluster_status().bytes_out - base;
    assert!(sent < 2 * 500 * 8, "sent {sent} bytes");
    // A prompt sharing only the first 100 blocks matches up to the last checkpoint inside them.
    let mut branch = prompt[..100].to_vec();
    branch.extend(chain(51, 50));
    assert!(wait_until(CONVERGE, || c[2].holds(1, &branch) >= 96).await);
    // Continuing a conversation on B: only its new turn's checkpoints are shared, and A finds the
    // whole extended prompt on the same instance.
    let mut next = prompt.clone();
    next.extend(chain(52, 64));
    c[1].decide(1, &next);
    assert!(wait_until(CONVERGE, || c[0].holds(1, &next) == 564).await);
    for n in c {
        n.gossip.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_score_on_each_others_load() {
    let c = cluster(3).await;
    let (a, b) = (&c[0], &c[1]);
    a.gossip.publish_load(&[(
        a.id(1),
        RouterLoad {
            in_flight: 5,
            pending_prefill_tokens: 40_000,
            decoding: 1,
            ..RouterLoad::default()
        },
    )]);
    let ok = wait_until(CONVERGE, || {
        b.gossip.peer_load(b.id(1)).load.in_flight == 5
            && c[2].gossip.peer_load(c[2].id(1)).load.in_flight == 5
    })
    .await;
    assert!(ok, "A's in-flight not visible");
    assert_eq!(
        b.gossip.peer_load(b.id(1)).load.pending_prefill_tokens,
        40_000
    );
    assert_eq!(b.gossip.peer_load(b.id(0)).load, RouterLoad::default());

    // Least-load choice on own + peer load: A fills instance 0, then B must not also pick it.
    let pick = |n: &Node, own: &[u32; 2]| -> usize {
        let total = |i: usize| own[i] + n.gossip.peer_load(n.id(i)).load.in_flight;
        if total(0) <= total(1) {
            0
        } else {
            1
        }
    };
    a.gossip.publish_load(&[(a.id(1), RouterLoad::default())]);
    assert!(wait_until(CONVERGE, || b.gossip.peer_load(b.id(1)).load.in_flight == 0).await);
    let a_own = [0u32, 0];
    let a_pick = pick(a, &a_own);
    assert_eq!(a_pick, 0);
    a.gossip.publish_load(&[(
        a.id(0),
        RouterLoad {
            in_flight: 1,
            ..Default::default()
        },
    )]);
    assert!(wait_until(CONVERGE, || b.gossip.peer_load(b.id(0)).load.in_flight == 1).await);
    assert_eq!(pick(b, &[0, 0]), 1, "B picked the instance A just filled");

    // Health observations are shared too.
    a.gossip
        .publish_health(&[(a.id(3), false), (a.id(2), true)]);
    let ok = wait_until(CONVERGE, || {
        b.gossip.peer_health(b.id(3)) == Some(false) && b.gossip.peer_health(b.id(2)) == Some(true)
    })
    .await;
    assert!(ok, "health not shared");
    assert_eq!(b.gossip.peer_health(b.id(0)), None);
    for n in c {
        n.gossip.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decoding_sizes_travel_with_the_load_and_fill_in_for_replicas_that_send_counts_only() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // The first two send sizes; the third counts only, as a replica of an earlier release does.
    let started = AtomicUsize::new(0);
    let c = cluster_of(3, |cfg| kvgate_gossip::GossipConfig {
        share_load_sizes: started.fetch_add(1, Ordering::Relaxed) < 2,
        ..cfg
    })
    .await;
    let (a, b, counts_only) = (&c[0], &c[1], &c[2]);
    let decoding = |n: u32, context: u64, output: u64| RouterLoad {
        in_flight: n,
        decoding: n,
        decoding_context_tokens: context,
        decoding_output_tokens: output,
        ..RouterLoad::default()
    };
    a.gossip
        .publish_load(&[(a.id(1), decoding(2, 30_000, 500))]);
    counts_only
        .gossip
        .publish_load(&[(counts_only.id(1), decoding(1, 99_999, 999))]);
    // B: A's two at their sizes, the third replica's one at A's mean.
    let want = decoding(3, 45_000, 750);
    let ok = wait_until(CONVERGE, || b.gossip.peer_load(b.id(1)).load == want).await;
    assert!(ok, "{:?}", b.gossip.peer_load(b.id(1)).load);
    // The counts-only replica reads A's sizes too.
    let want = decoding(2, 30_000, 500);
    let ok = wait_until(CONVERGE, || {
        counts_only.gossip.peer_load(counts_only.id(1)).load == want
    })
    .await;
    assert!(
        ok,
        "{:?}",
        counts_only.gossip.peer_load(counts_only.id(1)).load
    );
    // B's status says which peers send sizes (in an upgrade, not the earlier releases).
    let st = b.gossip.cluster_status();
    let sends = |addr: std::net::SocketAddr| {
        st.members
            .iter()
            .find(|m| m.addr == addr.to_string())
            .map(|m| m.sends_load_sizes)
    };
    assert_eq!(sends(a.gossip.local_addr()), Some(true));
    assert_eq!(sends(counts_only.gossip.local_addr()), Some(false));
    for n in c {
        n.gossip.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_push_on_change_a_dispatch_needs_no_tick() {
    // Flush and load ticks an hour apart: only the dispatch push can carry anything.
    let c = cluster_of(2, |cfg| kvgate_gossip::GossipConfig {
        flush_interval_ms: 3_600_000,
        load_interval_ms: 3_600_000,
        push_on_change: true,
        ..cfg
    })
    .await;
    let (a, b) = (&c[0], &c[1]);
    let prompt = chain(70, 40);
    a.decide(2, &prompt);
    let load = RouterLoad {
        in_flight: 1,
        pending_prefill_tokens: 640,
        ..RouterLoad::default()
    };
    a.gossip.publish_load_change(a.id(2), load);
    let ok = wait_until(CONVERGE, || {
        b.gossip.peer_load(b.id(2)).load == load && b.holds(2, &prompt) == 40
    })
    .await;
    assert!(ok, "B did not see A's dispatch");
    // Its unseen window is the measured convergence lag (at least the spacing of pushes), not
    // two hour-long load ticks.
    let window = b.gossip.unseen_window_ms();
    assert!(
        (1..CONVERGE.as_millis() as u64).contains(&window),
        "{window}"
    );
    for n in c {
        n.gossip.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_replica_catches_up_from_snapshots() {
    let mut c = cluster(3).await;
    let before = chain(10, 200);
    c[0].decide(1, &before);
    c[2].gossip.publish_load(&[(
        c[2].id(3),
        RouterLoad {
            in_flight: 7,
            ..Default::default()
        },
    )]);
    assert!(wait_until(CONVERGE, || c[2].holds(1, &before) == 200).await);
    assert!(
        wait_until(CONVERGE, || c[0]
            .gossip
            .peer_load(c[0].id(3))
            .load
            .in_flight
            == 7)
        .await
    );

    // C goes away; its load share disappears from A and B.
    let dead = c.pop().expect("three nodes");
    let addr = dead.addr;
    dead.gossip.shutdown().await;
    let ok = wait_until(CONVERGE, || {
        c.iter().all(|n| n.gossip.live_peers() == 1)
            && c[0].gossip.peer_load(c[0].id(3)).load.in_flight == 0
    })
    .await;
    assert!(ok, "C's departure not detected or its load kept");

    // Decisions made while C is down.
    let during = chain(11, 150);
    c[1].decide(0, &during);
    assert!(wait_until(CONVERGE, || c[0].holds(0, &during) == 150).await);

    // C restarts on the same address with an empty index and catches up from A's and B's
    // snapshots, without those prompts being routed again.
    let c2 = Node::start(addr, fast_config(&[c[0].addr]), false).await;
    assert_eq!(c2.holds(1, &before), 0);
    let ok = wait_until(CONVERGE, || {
        c2.holds(1, &before) == 200 && c2.holds(0, &during) == 150
    })
    .await;
    assert!(ok, "restarted replica did not catch up");
    assert!(wait_until(CONVERGE, || c[0].gossip.live_peers() == 2).await);
    c2.gossip.shutdown().await;
    for n in c {
        n.gossip.shutdown().await;
    }
}

/// A, B, C with `forget_dead_peer_placements` (the default) at `stride`; C dies. With stride 16,
/// C's checkpoints reach A and are left unmaterialized, so forgetting must drop them too.
async fn forget_dead_replica(stride: usize) {
    let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let cfg = |seeds: &[SocketAddr]| kvgate_gossip::GossipConfig {
        checkpoint_stride: stride,
        ..fast_config(seeds)
    };
    assert!(cfg(&[]).forget_dead_peer_placements, "the default");
    let a = Node::start(any, cfg(&[]), false).await;
    let b = Node::start(any, cfg(&[a.addr]), true).await;
    let c = Node::start(any, cfg(&[a.addr]), false).await;
    assert!(
        wait_until(CONVERGE, || [&a, &b, &c]
            .iter()
            .all(|n| n.gossip.live_peers() == 2))
        .await
    );
    let from_b = chain(60, 80);
    let from_c = chain(61, 80);
    b.decide(0, &from_b);
    c.decide(1, &from_c);
    // Received by A (every batch C and B sent), without materializing anything.
    assert!(
        wait_until(CONVERGE, || a.has_all_batches_of(&b)
            && a.has_all_batches_of(&c))
        .await
    );
    c.gossip.shutdown().await;
    // C's placements vanish from A; B's are re-fetched and stay.
    assert!(wait_until(CONVERGE, || a.gossip.live_peers() == 1).await);
    let ok = wait_until(CONVERGE, || {
        a.holds(1, &from_c) == 0 && a.holds(0, &from_b) == 80
    })
    .await;
    assert!(
        ok,
        "dead replica's placements not forgotten, or live one's lost (stride {stride})"
    );
    a.gossip.shutdown().await;
    b.gossip.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_replicas_placements_are_forgotten_at_once() {
    forget_dead_replica(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_replicas_unmaterialized_checkpoints_are_forgotten_too() {
    forget_dead_replica(16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_replicas_placements_can_be_kept_until_their_ttl() {
    let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let cfg = |seeds: &[SocketAddr]| kvgate_gossip::GossipConfig {
        forget_dead_peer_placements: false,
        ..fast_config(seeds)
    };
    let a = Node::start(any, cfg(&[]), false).await;
    let c = Node::start(any, cfg(&[a.addr]), false).await;
    assert!(wait_until(CONVERGE, || a.gossip.live_peers() == 1).await);
    let from_c = chain(62, 80);
    c.decide(1, &from_c);
    assert!(wait_until(CONVERGE, || a.holds(1, &from_c) == 80).await);
    c.gossip.shutdown().await;
    assert!(wait_until(CONVERGE, || a.gossip.live_peers() == 0).await);
    assert_eq!(a.holds(1, &from_c), 80, "kept until their TTL");
    a.gossip.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_replica_rejoins_and_converges() {
    let c = cluster(3).await;
    c[2].partition(true);
    let ok = wait_until(CONVERGE, || {
        c[0].gossip.live_peers() == 1
            && c[1].gossip.live_peers() == 1
            && c[2].gossip.live_peers() == 0
    })
    .await;
    assert!(ok, "partition not detected");
    let during = chain(20, 120);
    c[0].decide(3, &during);
    assert!(wait_until(CONVERGE, || c[1].holds(3, &during) == 120).await);
    assert_eq!(c[2].holds(3, &during), 0, "nothing crosses a partition");

    c[2].partition(false);
    let ok = wait_until(Duration::from_secs(15), || {
        c.iter().all(|n| n.gossip.live_peers() == 2) && c[2].holds(3, &during) == 120
    })
    .await;
    assert!(ok, "partitioned replica did not rejoin and converge");
    // And fresh decisions flow to it again.
    let after = chain(21, 50);
    c[1].decide(2, &after);
    assert!(wait_until(CONVERGE, || c[2].holds(2, &after) == 50).await);
    for n in c {
        n.gossip.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_secret_or_cluster_is_rejected() {
    let c = cluster(2).await;
    let a = &c[0];
    let forged = chain(30, 40);

    // A stranger with the wrong secret.
    let stranger = Keys::new("test", b"not-the-secret-at-all");
    send_raw(a.addr, &sealed_delta(&stranger, 99, 1, 1, &forged)).await;
    assert!(wait_until(CONVERGE, || a.rejected("auth") >= 1).await);
    // A replica of another cluster that happens to share the secret.
    let other = Keys::new("other-cluster", SECRET.as_bytes());
    send_raw(a.addr, &sealed_delta(&other, 98, 1, 1, &forged)).await;
    assert!(wait_until(CONVERGE, || a.rejected("cluster") >= 1).await);

    // A whole replica started with the wrong secret never joins and never injects.
    let mut cfg = fast_config(&[a.addr]);
    cfg.secret = "wrong-secret-wrong-secret".into();
    let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let intruder = Node::start(any, cfg, false).await;
    intruder.decide(1, &forged);
    intruder.gossip.publish_load(&[(
        intruder.id(1),
        RouterLoad {
            in_flight: 9,
            ..Default::default()
        },
    )]);
    let before = a.rejected("auth");
    assert!(
        wait_until(CONVERGE, || a.rejected("auth") > before).await,
        "intruder's announces not rejected"
    );

    // The control: a correctly keyed datagram is accepted, proving the forged ones were refused
    // for their keys alone.
    let good = Keys::new("test", SECRET.as_bytes());
    let legit = chain(31, 40);
    send_raw(a.addr, &sealed_delta(&good, 97, 1, 1, &legit)).await;
    assert!(wait_until(CONVERGE, || a.holds(1, &legit) == 40).await);
    assert_eq!(a.holds(1, &forged), 0, "forged placement applied");
    assert_eq!(
        a.gossip.peer_load(a.id(1)).load.in_flight,
        0,
        "forged load applied"
    );
    assert_eq!(a.gossip.live_peers(), 1, "intruder became a member");
    intruder.gossip.shutdown().await;
    for n in c {
        n.gossip.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_replayed_messages_are_ignored() {
    let c = cluster(2).await;
    let a = &c[0];
    let keys = Keys::new("test", SECRET.as_bytes());

    send_raw(a.addr, b"garbage").await;
    send_raw(a.addr, &[0u8; 200]).await;
    assert!(
        wait_until(CONVERGE, || a.rejected("too_short") >= 1
            && a.rejected("version") >= 1)
        .await
    );

    // Authenticated but undecodable payload: a count that lies about its length.
    let mut d = Vec::new();
    keys.seal(
        &Header {
            kind: Kind::Delta,
            sender: 55,
            counter: 1,
            wall_ms: wall_ms(),
        },
        &[0x00, 0x01, 0xff, 0xff, 0xff, 0x7f],
        &mut d,
    );
    send_raw(a.addr, &d).await;
    assert!(wait_until(CONVERGE, || a.rejected("malformed") >= 1).await);

    // A valid datagram is applied once; its replay is refused.
    let h = chain(40, 25);
    let valid = sealed_delta(&keys, 56, 1, 2, &h);
    send_raw(a.addr, &valid).await;
    assert!(wait_until(CONVERGE, || a.holds(2, &h) == 25).await);
    send_raw(a.addr, &valid).await;
    assert!(wait_until(CONVERGE, || a.rejected("replay") >= 1).await);
    // An old message outside the timestamp window.
    let mut stale = Vec::new();
    keys.seal(
        &Header {
            kind: Kind::Delta,
            sender: 57,
            counter: 1,
            wall_ms: wall_ms() - 3_600_000,
        },
        &[],
        &mut stale,
    );
    send_raw(a.addr, &stale).await;
    assert!(wait_until(CONVERGE, || a.rejected("stale") >= 1).await);

    // The replica is unharmed: gossip between A and B still works.
    let after = chain(41, 30);
    c[1].decide(0, &after);
    assert!(wait_until(CONVERGE, || a.holds(0, &after) == 30).await);
    assert_eq!(a.gossip.live_peers(), 1);
    for n in c {
        n.gossip.shutdown().await;
    }
}

/// A peer's checkpoints wait unmaterialized until a prompt containing them arrives; an engine
/// evicting the prefix meanwhile must not let them predict it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_checkpoints_of_evicted_blocks_are_not_materialized() {
    let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let cfg = |seeds: &[SocketAddr]| kvgate_gossip::GossipConfig {
        checkpoint_stride: 16,
        ..fast_config(seeds)
    };
    let a = Node::start(any, cfg(&[]), false).await;
    let b = Node::start(any, cfg(&[a.addr]), true).await;
    assert!(b.index.set_on_remove(b.gossip.eviction_hook()));
    assert!(
        wait_until(CONVERGE, || a.gossip.live_peers() == 1
            && b.gossip.live_peers() == 1)
        .await
    );
    let evicted = chain(70, 80);
    let kept = chain(71, 80);
    a.decide(1, &evicted);
    a.decide(1, &kept);
    assert!(wait_until(CONVERGE, || b.has_all_batches_of(&a)).await);
    // B's engine events: instance 1 evicted the tail of one prompt (its last two checkpoints,
    // blocks 63 and 79, among them); another instance evicted the other prompt's blocks.
    b.index
        .remove(b.id(1), &evicted[48..], kvgate_core::Tier::Gpu);
    b.index.remove(b.id(0), &kept, kvgate_core::Tier::Gpu);
    assert_eq!(
        b.holds(1, &evicted),
        48,
        "up to the deepest checkpoint still held"
    );
    assert_eq!(b.holds(1, &kept), 80, "another instance's eviction");
    a.gossip.shutdown().await;
    b.gossip.shutdown().await;
}
