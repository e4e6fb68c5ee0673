//! The middle of a rolling upgrade, for real: replica A is an earlier release's `kvgate` binary
//! (a child process), replica B this release's gateway, gossiping in front of the same three mock
//! engines. The earlier binary is built from git history by `tests/gossip_upgrade.sh`, which runs
//! this test with `KVGATE_EARLIER_BIN` set, once per earlier release (CI runs the script); it is
//! ignored by a plain `cargo test`, which has no earlier binary
//! (`crates/gossip/tests/wire_golden` pins the wire format against those releases byte for byte).
//!
//! Asserts, each within a bounded wait: both see each other alive; a prefix routed through either
//! is routed to the same instance, with cached blocks, by the other; a request A holds in flight
//! (decoding, its size unknown to A's release) counts in B's view with its sizes marked unknown;
//! an engine B finds dead is avoided by A, which never checks it itself (B's verdict travels in
//! the counts-only `load` datagram, the only load kind A reads), and used again once B sees it
//! recover; A drops B's `load_sized` datagrams as an unknown kind and refuses nothing else.

mod common;

#[path = "flood/child.rs"]
#[allow(dead_code)]
mod child;

use child::Child;
use common::*;
use kvgate_core::InstanceId;
use serde_json::Value;
use std::path::PathBuf;

const SECRET: &str = "upgrade-test-secret-0123";

/// The earlier release's binary.
fn earlier_binary() -> PathBuf {
    let bin = std::env::var_os("KVGATE_EARLIER_BIN")
        .expect("KVGATE_EARLIER_BIN names an earlier kvgate binary (tests/gossip_upgrade.sh)");
    PathBuf::from(bin)
}

fn gossip(seeds: Vec<String>) -> kvgate_gossip::GossipConfig {
    kvgate_gossip::GossipConfig {
        enabled: true,
        bind: "127.0.0.1:0".into(),
        seeds,
        secret: SECRET.into(),
        probe_period_ms: 200,
        probe_rtt_ms: 80,
        suspect_to_down_ms: 600,
        seed_interval_ms: 200,
        ..Default::default()
    }
}

/// Whether the earlier release knows `server.admin_listen` (`KVGATE_EARLIER_ADMIN_LISTEN`, set by
/// the script from that release's source; unset: it does). Releases before it serve the admin
/// API on the main listener and refuse the key.
fn earlier_knows_admin_listen() -> bool {
    std::env::var("KVGATE_EARLIER_ADMIN_LISTEN").map_or(true, |v| v != "0")
}

/// A's config, written by hand with only keys every release since gossip encryption knows (a
/// serialized config of this release would name keys the earlier one refuses). A checks health
/// so rarely that whatever it learns about an engine within the test comes from B.
fn earlier_config(urls: &[String], seed: &str) -> String {
    // The same protocol timings and secret as B's.
    let g = gossip(vec![seed.to_owned()]);
    let admin = if earlier_knows_admin_listen() {
        "admin_listen = \"main\"\n"
    } else {
        ""
    };
    let mut t = format!(
        r#"[server]
listen = "127.0.0.1:0"
{admin}
[health]
interval_ms = 600000
timeout_ms = 500

[load]
poll_interval_ms = 100

[gossip]
enabled = true
bind = "127.0.0.1:0"
seeds = ["{seed}"]
secret = "{secret}"
probe_period_ms = {probe}
probe_rtt_ms = {rtt}
suspect_to_down_ms = {down}
seed_interval_ms = {seeds_ms}

[[pools]]
model = "m"
"#,
        secret = g.secret,
        probe = g.probe_period_ms,
        rtt = g.probe_rtt_ms,
        down = g.suspect_to_down_ms,
        seeds_ms = g.seed_interval_ms,
    );
    for (i, u) in urls.iter().enumerate() {
        t.push_str(&format!(
            "\n[[pools.instances]]\nname = \"i{i}\"\nurl = \"{u}\"\n"
        ));
    }
    t
}

/// `GET path` on the child, as JSON.
async fn admin(a: &Child, path: &str) -> Value {
    get_json(format!("http://{}{path}", a.addr)).await
}

/// Delta batches the child has produced.
async fn batches_sent_by(a: &Child) -> u64 {
    admin(a, "/admin/cluster").await["batches_sent"]
        .as_u64()
        .expect("batches_sent")
}

fn prompt(tag: &str, i: usize) -> String {
    format!("{tag} {i}: {}", "a long prefix of words. ".repeat(60))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an earlier release's binary: tests/gossip_upgrade.sh builds it and runs this"]
async fn an_earlier_release_and_this_one_gossip_as_one_cluster() {
    let bin = earlier_binary();
    let engines = [
        Mock::start("e0").await,
        Mock::start("e1").await,
        Mock::start("e2").await,
    ];
    let urls: Vec<String> = engines.iter().map(|m| m.url()).collect();
    let mut cb = config_for(&urls);
    cb.gossip = gossip(vec![]);
    let b = Gateway::start(cb).await;
    assert!(
        eventually(10, || b.state.routing.gossip().is_some()).await,
        "B's gossip did not start"
    );
    let gb = b.state.routing.gossip().cloned().expect("started");
    let a = Child::start_binary(&bin, &earlier_config(&urls, &gb.local_addr().to_string()));

    // Membership, both ways.
    assert!(
        eventually(10, || gb.live_peers() == 1).await,
        "B never saw A"
    );
    let a_sees_b = eventually_async(10, || async {
        admin(&a, "/admin/cluster").await["members"][0]["state"] == "alive"
    })
    .await;
    assert!(a_sees_b, "A never saw B alive");
    let usable_on_a = |v: &Value, name: &str| {
        v["instances"]
            .as_array()
            .and_then(|is| is.iter().find(|i| i["name"] == name))
            .map(|i| i["usable"] == true)
    };
    let all_usable = eventually_async(10, || async {
        let v = admin(&a, "/admin/instances").await;
        (0..3).all(|i| usable_on_a(&v, &format!("i{i}")) == Some(true))
    })
    .await;
    assert!(all_usable, "A's instances never became usable");
    let now = || b.state.clock.now_ms();
    let b_usable = |i: u32| {
        b.state
            .fleet
            .instance(InstanceId(i))
            .is_some_and(|x| x.health.usable(now()))
    };
    assert!(eventually(10, || (0..3).all(b_usable)).await);

    // Placements A → B: B routes A's prefixes where A put them, finding them cached.
    for i in 0..4 {
        let p = prompt("through A", i);
        let before = batches_sent_by(&a).await;
        let (chosen, _) = complete_at(a.addr, &p).await;
        // A has flushed this decision, and B has every batch A produced.
        let flushed = eventually_async(10, || async { batches_sent_by(&a).await > before }).await;
        assert!(flushed, "A never flushed its decision");
        let sent = batches_sent_by(&a).await;
        let received = eventually(10, || received_batches(&gb, sent)).await;
        assert!(received, "B did not receive A's decisions");
        let (via_b, matched) = complete_at(b.addr, &p).await;
        assert_eq!(via_b, chosen, "B routed A's prompt {i} elsewhere");
        assert!(matched > 0, "B saw no cached blocks for A's prompt {i}");
    }
    // Placements B → A.
    for i in 0..4 {
        let p = prompt("through B", i);
        let before = gb.cluster_status().batches_sent;
        let (chosen, _) = complete_at(b.addr, &p).await;
        assert!(eventually(10, || gb.cluster_status().batches_sent > before).await);
        let sent = gb.cluster_status().batches_sent;
        let received = eventually_async(10, || async {
            admin(&a, "/admin/cluster").await["members"][0]["next_seq"]
                .as_u64()
                .is_some_and(|n| n >= sent)
        })
        .await;
        assert!(received, "A did not receive B's decisions");
        let (via_a, matched) = complete_at(a.addr, &p).await;
        assert_eq!(via_a, chosen, "A routed B's prompt {i} elsewhere");
        assert!(matched > 0, "A saw no cached blocks for B's prompt {i}");
    }

    // Load A → B: a stream A holds after its first token counts on B, its size unknown.
    for e in &engines {
        e.set_mode(Mode::HeldStream { chunks: 4 });
    }
    let url_a = format!("http://{}/v1/completions", a.addr);
    let held = tokio::spawn(async move {
        let r = client()
            .post(url_a)
            .json(&serde_json::json!({
                "model": "m", "prompt": "hold me", "max_tokens": 4, "stream": true
            }))
            .send()
            .await
            .expect("held request");
        r.bytes().await.map(|b| b.len())
    });
    let counted = eventually(10, || {
        (0..3).any(|i| {
            let p = gb.peer_load(InstanceId(i));
            p.load.in_flight == 1 && p.load.decoding == 1 && !p.sizes_known
        })
    })
    .await;
    assert!(
        counted,
        "A's decoding request not counted on B (sizes unknown)"
    );
    for e in &engines {
        e.release(1);
    }
    held.await.expect("held task").expect("held stream read");
    let released = eventually(10, || {
        (0..3).all(|i| gb.peer_load(InstanceId(i)).load.in_flight == 0)
    })
    .await;
    assert!(released, "A's finished request still counted on B");
    for e in &engines {
        e.set_mode(Mode::Json);
    }

    // Health B → A: e1 dies; only B checks it, and A avoids it on B's word.
    engines[1].set_healthy(false);
    assert!(
        eventually(10, || !b_usable(1)).await,
        "B did not see e1 die"
    );
    let a_avoids = eventually_async(10, || async {
        usable_on_a(&admin(&a, "/admin/instances").await, "i1") == Some(false)
    })
    .await;
    assert!(a_avoids, "B's verdict did not reach A");
    for i in 0..12 {
        let (chosen, _) = complete_at(a.addr, &prompt("while e1 is dead", i)).await;
        assert_ne!(
            chosen, "i1",
            "A routed request {i} to the instance B saw dead"
        );
    }
    engines[1].set_healthy(true);
    let a_back = eventually_async(10, || async {
        usable_on_a(&admin(&a, "/admin/instances").await, "i1") == Some(true)
    })
    .await;
    assert!(a_back, "B's recovery verdict did not reach A");

    // What A refused: B's sized load only, as a kind it does not know.
    let cluster = admin(&a, "/admin/cluster").await;
    let rejected = cluster["rejected"].as_object().cloned().unwrap_or_default();
    assert!(
        rejected.get("kind").and_then(Value::as_u64).unwrap_or(0) > 0,
        "A never saw a load_sized datagram: {rejected:?}"
    );
    let other: u64 = rejected
        .iter()
        .filter(|(k, _)| k.as_str() != "kind")
        .filter_map(|(_, v)| v.as_u64())
        .sum();
    assert_eq!(other, 0, "A refused other datagrams: {rejected:?}");
    let refused_by_b: u64 = gb.cluster_status().rejected.values().sum();
    assert_eq!(refused_by_b, 0, "B refused some of A's datagrams");
    eprintln!(
        "gossip upgrade: A ({}) and this release as one cluster; A refused {} load_sized datagrams",
        bin.display(),
        rejected["kind"]
    );
}
