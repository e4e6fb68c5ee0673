//! A gateway replica killed (shut down) under load and restarted, with its gossip peer gone in
//! between.

use crate::common::*;
use crate::harness::{self, Load};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) fn with_gossip(
    infos: &[kvgate_sim::fleet::SimInstanceInfo],
    seeds: Vec<String>,
) -> kvgate::config::Config {
    let mut c = harness::config(infos);
    c.gossip = kvgate_gossip::GossipConfig {
        enabled: true,
        bind: "127.0.0.1:0".into(),
        seeds,
        secret: "chaos-test-secret-0123456".into(),
        probe_period_ms: 200,
        probe_rtt_ms: 80,
        suspect_to_down_ms: 600,
        seed_interval_ms: 200,
        ..Default::default()
    };
    c
}

pub(crate) async fn gossip_of(g: &Gateway) -> kvgate_gossip::Gossip {
    let ok = eventually(10, || g.state.routing.gossip().is_some()).await;
    assert!(ok, "gossip did not start");
    g.state.routing.gossip().cloned().expect("started")
}

pub(crate) async fn serve(g: &Gateway, model: &str, n: usize) {
    for i in 0..n {
        let r = client()
            .post(g.url("/v1/chat/completions"))
            .json(&harness::chat(model, 5_000 + i, 4, false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}

/// Two replicas A and B with gossip over three engines; 100 requests, 4 at a time, alternating
/// between the replicas that are up; after 30 completed, A is taken out of the rotation and shut
/// down (its in-flight requests drain). A request that reached A's address as it stopped
/// accepting gets no answer at all; the load sends it once more to the rotation (what a client
/// balancer does) — at most one per concurrent worker, each started before the shutdown.
/// Asserts: no request lost; B sees its gossip peer gone
/// (`live_peers() == 0`) within 5 s and keeps routing (20 more requests served); a restarted A
/// (seeded with B's gossip address) rejoins — both see one live peer — within 10 s, and both
/// serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_killed_and_restarted_rejoins_and_nothing_is_lost() {
    let t = Instant::now();
    let fleet = harness::fleet(3, false).await;
    let infos = fleet.instances();
    let model = infos[0].model.clone();
    let a = Gateway::start(with_gossip(&infos, vec![])).await;
    let ga = gossip_of(&a).await;
    let b = Gateway::start(with_gossip(&infos, vec![ga.local_addr().to_string()])).await;
    let gb = gossip_of(&b).await;
    assert!(eventually(10, || ga.live_peers() == 1 && gb.live_peers() == 1).await);
    harness::all_usable(&a).await;
    harness::all_usable(&b).await;

    let up = Arc::new(Mutex::new(vec![
        a.url("/v1/chat/completions"),
        b.url("/v1/chat/completions"),
    ]));
    let rotation = up.clone();
    let m = model.clone();
    let load = Load {
        requests: 100,
        concurrency: 4,
        fault_after: 30,
        request: Box::new(move |i| {
            let up = rotation.lock();
            (up[i % up.len()].clone(), harness::chat(&m, i, 16, false))
        }),
        failover: true,
    };
    let a = Mutex::new(Some(a));
    let report = harness::run(
        load,
        Box::new(|_| {
            Box::pin(async {
                up.lock().remove(0);
                let mut a = a.lock().take().expect("replica A");
                a.shutdown();
                let join = a.join.take().expect("serve task");
                let ended = tokio::time::timeout(Duration::from_secs(10), join).await;
                assert!(ended.is_ok(), "replica A did not stop within 10 s");
            })
        }),
    )
    .await;
    let lost = report.lost();
    assert!(lost.is_empty(), "lost {}: {lost:?}", lost.len());
    let failed_over: Vec<_> = report.outcomes.iter().filter(|o| o.failed_over).collect();
    assert!(failed_over.len() <= 4, "{failed_over:?}");
    assert!(
        failed_over.iter().all(|o| !o.after_fault),
        "{failed_over:?}"
    );
    eprintln!("  {} requests failed over to B", failed_over.len());
    let gone = Instant::now();
    assert!(
        eventually(5, || gb.live_peers() == 0).await,
        "B still sees A"
    );
    eprintln!(
        "  B saw A gone after {:.0} ms",
        gone.elapsed().as_secs_f64() * 1e3
    );
    serve(&b, &model, 20).await;

    let restarted = Instant::now();
    let a2 = Gateway::start(with_gossip(&infos, vec![gb.local_addr().to_string()])).await;
    let ga2 = gossip_of(&a2).await;
    let rejoined = eventually(10, || ga2.live_peers() == 1 && gb.live_peers() == 1).await;
    assert!(
        rejoined,
        "A did not rejoin: A sees {}, B sees {}",
        ga2.live_peers(),
        gb.live_peers()
    );
    eprintln!(
        "  A rejoined after {:.0} ms",
        restarted.elapsed().as_secs_f64() * 1e3
    );
    harness::all_usable(&a2).await;
    serve(&a2, &model, 10).await;
    serve(&b, &model, 10).await;
    harness::summary("replica", t, &report);
    drop((a2, b));
    fleet.shutdown().await;
}
