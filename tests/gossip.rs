//! Two gateway replicas with gossip enabled in front of the same mock engines: a prefix routed
//! through one is routed to the same instance by the other, and each scores the other's in-flight
//! load. Every wait is bounded; nothing asserts on speed.

mod common;

use common::*;
use kvgate_core::InstanceId;
use std::time::Duration;

fn with_gossip(urls: &[String], seeds: Vec<String>) -> kvgate::config::Config {
    let mut c = config_for(urls);
    c.gossip = kvgate_gossip::GossipConfig {
        enabled: true,
        bind: "127.0.0.1:0".into(),
        seeds,
        secret: "gateway-test-secret-0123".into(),
        probe_period_ms: 200,
        probe_rtt_ms: 80,
        suspect_to_down_ms: 600,
        seed_interval_ms: 200,
        ..Default::default()
    };
    c
}

async fn gossip_of(g: &Gateway) -> kvgate_gossip::Gossip {
    let ok = eventually(10, || g.state.routing.gossip().is_some()).await;
    assert!(ok, "gossip did not start");
    g.state.routing.gossip().cloned().expect("started")
}

/// Three mock engines and their URLs.
async fn three_engines() -> ([Mock; 3], Vec<String>) {
    let engines = [
        Mock::start("e0").await,
        Mock::start("e1").await,
        Mock::start("e2").await,
    ];
    let urls = engines.iter().map(|m| m.url()).collect();
    (engines, urls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_placements_and_load() {
    let (engines, urls) = three_engines().await;
    let a = Gateway::start(with_gossip(&urls, vec![])).await;
    let ga = gossip_of(&a).await;
    let b = Gateway::start(with_gossip(&urls, vec![ga.local_addr().to_string()])).await;
    let gb = gossip_of(&b).await;
    assert!(eventually(10, || ga.live_peers() == 1 && gb.live_peers() == 1).await);
    // Gossip hears each replica's engine evictions (its removal hook is taken).
    for g in [&a, &b] {
        let noop: kvgate_core::index::RemoveHook = std::sync::Arc::new(|_, _| {});
        assert!(!g.state.routing.index().set_on_remove(noop));
    }
    let all_usable = |g: &Gateway| {
        let now = g.state.clock.now_ms();
        g.state
            .fleet
            .view()
            .instances()
            .all(|i| i.health.usable(now))
    };
    assert!(
        eventually(10, || all_usable(&a) && all_usable(&b)).await,
        "instances not healthy"
    );

    for i in 0..6 {
        let prompt = format!(
            "conversation {i}: {}",
            "a long shared prefix of words. ".repeat(60)
        );
        let before = ga.cluster_status().batches_sent;
        let (chosen, _) = complete_at(a.addr, &prompt).await;
        assert!(!chosen.is_empty());
        // Wait until A has flushed this decision and B has every batch A produced, then route
        // the same prompt through B.
        assert!(eventually(10, || ga.cluster_status().batches_sent > before).await);
        let sent = ga.cluster_status().batches_sent;
        let ok = eventually(10, || received_batches(&gb, sent)).await;
        assert!(ok, "B did not receive A's decisions");
        let (via_b, matched) = complete_at(b.addr, &prompt).await;
        assert_eq!(via_b, chosen, "B routed prompt {i} elsewhere");
        assert!(matched > 0, "B saw no cached blocks for prompt {i}");
    }

    // A request held in flight through A counts in B's view of that instance.
    engines[1].set_mode(Mode::Slow(Duration::from_secs(3)));
    engines[0].set_mode(Mode::Slow(Duration::from_secs(3)));
    engines[2].set_mode(Mode::Slow(Duration::from_secs(3)));
    let a_url = a.url("/v1/completions");
    let slow = tokio::spawn(async move {
        client()
            .post(a_url)
            .json(&serde_json::json!({ "model": "m", "prompt": "hold me", "max_tokens": 1 }))
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    let ok = eventually(10, || {
        (0..3).any(|i| gb.peer_load(InstanceId(i)).load.in_flight == 1)
    })
    .await;
    assert!(ok, "A's in-flight request not visible to B");
    let _ = slow.await;
    let ok = eventually(10, || {
        (0..3).all(|i| gb.peer_load(InstanceId(i)).load.in_flight == 0)
    })
    .await;
    assert!(ok, "finished request still counted");

    let status = client()
        .get(b.url("/admin/cluster"))
        .send()
        .await
        .expect("admin")
        .json::<serde_json::Value>()
        .await
        .expect("json");
    assert_eq!(status["members"][0]["state"], "alive");
    assert!(status["bytes_in"].as_u64().unwrap_or(0) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replicas_dead_instance_verdict_steers_the_others() {
    let (engines, urls) = three_engines().await;
    let a = Gateway::start(with_gossip(&urls, vec![])).await;
    let ga = gossip_of(&a).await;
    // B checks health so rarely that anything it learns about e1 within the test comes from A.
    let mut cb = with_gossip(&urls, vec![ga.local_addr().to_string()]);
    cb.health.interval_ms = 600_000;
    let b = Gateway::start(cb).await;
    let gb = gossip_of(&b).await;
    assert!(eventually(10, || ga.live_peers() == 1 && gb.live_peers() == 1).await);
    let inst = |g: &Gateway, i: usize| {
        g.state
            .fleet
            .instance(kvgate_core::InstanceId(i as u32))
            .expect("instance")
            .health
            .usable(g.state.clock.now_ms())
    };
    assert!(eventually(10, || (0..3).all(|i| inst(&a, i) && inst(&b, i))).await);

    engines[1].set_healthy(false);
    assert!(
        eventually(10, || !inst(&a, 1)).await,
        "A did not see e1 die"
    );
    assert!(
        eventually(10, || !inst(&b, 1)).await,
        "A's verdict did not reach B"
    );
    let own = b
        .state
        .fleet
        .instance(kvgate_core::InstanceId(1))
        .expect("instance")
        .health
        .own_usable(b.state.clock.now_ms());
    assert!(own, "B itself never observed e1 dead: the verdict is A's");
    for i in 0..12 {
        let (chosen, _) = complete_at(b.addr, &format!("request {i} {}", "x ".repeat(40))).await;
        assert_ne!(
            chosen, "i1",
            "B routed request {i} to the instance A saw dead"
        );
    }

    // Recovery observed by A reaches B the same way.
    engines[1].set_healthy(true);
    assert!(
        eventually(10, || inst(&a, 1)).await,
        "A did not see e1 recover"
    );
    assert!(
        eventually(10, || inst(&b, 1)).await,
        "A's recovery did not reach B"
    );
    let mut reached = false;
    for i in 0..60 {
        let (chosen, _) = complete_at(b.addr, &format!("after {i} {}", "y ".repeat(40))).await;
        reached |= chosen == "i1";
    }
    assert!(reached, "B never routed to the recovered instance");
}

/// Leading blocks of `prompt` (a completion) that `g`'s index places on instance `id`, after
/// bringing in peers' checkpoints as routing does.
fn held(g: &Gateway, prompt: &str, id: InstanceId) -> u32 {
    use kvgate::proxy::parse::{parse, Endpoint};
    let body = serde_json::to_vec(&serde_json::json!({ "model": "m", "prompt": prompt })).unwrap();
    let input = parse(Endpoint::Completions, &body).expect("parses");
    let pool = &g.state.fleet.pools()[0];
    let prep = g.state.routing.prepare(pool, &input).expect("hashes");
    let now = g.state.clock.now_ms();
    if let Some(gossip) = g.state.routing.gossip() {
        gossip.materialize(&prep.hashes, now);
    }
    let mut m = kvgate_core::index::PrefixMatches::default();
    g.state
        .routing
        .index()
        .match_prefix(&prep.hashes, now, &mut m);
    m.get(id).total()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attempt_is_taken_back_here_and_on_peers() {
    let (engines, urls) = three_engines().await;
    // Two engines refuse every request with 503; the third serves.
    engines[0].set_mode(Mode::Status(503));
    engines[1].set_mode(Mode::Status(503));
    let a = Gateway::start(with_gossip(&urls, vec![])).await;
    let ga = gossip_of(&a).await;
    let b = Gateway::start(with_gossip(&urls, vec![ga.local_addr().to_string()])).await;
    let gb = gossip_of(&b).await;
    assert!(eventually(10, || ga.live_peers() == 1 && gb.live_peers() == 1).await);
    let id_of = |g: &Gateway, name: &str| {
        g.state
            .fleet
            .view()
            .instances()
            .find(|i| i.name == name)
            .map(|i| i.id)
            .expect("instance")
    };

    // Distinct prompts until one was first sent to a refusing engine (retried on the third).
    let mut refused = None;
    for i in 0..20 {
        let prompt = format!(
            "refused {i}: {}",
            "a prefix long enough for blocks. ".repeat(40)
        );
        let (chosen, _) = complete_at(a.addr, &prompt).await;
        assert_eq!(chosen, "i2", "only i2 answers");
        if engines[0].count() + engines[1].count() > 0 {
            refused = Some(prompt);
            break;
        }
    }
    let prompt = refused.expect("no request was first routed to a refusing engine");
    let bad = if engines[0].count() > 0 { "i0" } else { "i1" };

    // Here: the prediction on the refusing engine is gone, the served one stays.
    assert_eq!(
        held(&a, &prompt, id_of(&a, bad)),
        0,
        "A still predicts {bad}"
    );
    assert!(held(&a, &prompt, id_of(&a, "i2")) > 0);
    // On the peer: once the decision that followed the retraction arrived, the retraction has
    // been applied too (both travel in A's delta stream, in order).
    let ok = eventually(10, || held(&b, &prompt, id_of(&b, "i2")) > 0).await;
    assert!(ok, "B never learned A's decision");
    assert_eq!(
        held(&b, &prompt, id_of(&b, bad)),
        0,
        "B still predicts {bad}"
    );
}
