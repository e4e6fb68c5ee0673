//! A replica rolled out of service: once shutdown is asked for (SIGTERM in the binary), `/ready`
//! fails at once while new connections are still served for `server.drain_delay_ms`, then the
//! listener closes, in-flight requests finish, and the replica leaves gossip cleanly (its peer
//! sees it gone long before failure detection would have declared it down).

mod common;

use common::*;
use serde_json::json;

fn config(urls: &[String], seeds: Vec<String>) -> kvgate::config::Config {
    let mut c = config_for(urls);
    c.server.drain_delay_ms = 3_000;
    c.gossip = kvgate_gossip::GossipConfig {
        enabled: true,
        bind: "127.0.0.1:0".into(),
        seeds,
        secret: "shutdown-test-secret-0123".into(),
        probe_period_ms: 200,
        probe_rtt_ms: 80,
        // Far beyond the test's waits: only a clean leave makes the peer drop the replica.
        suspect_to_down_ms: 60_000,
        seed_interval_ms: 200,
        ..Default::default()
    };
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_fails_ready_first_keeps_serving_then_leaves_gossip() {
    let engine = Mock::start("e0").await;
    let urls = vec![engine.url()];
    let mut a = Gateway::start(config(&urls, vec![])).await;
    assert!(eventually(10, || a.state.routing.gossip().is_some()).await);
    let seed = a
        .state
        .routing
        .gossip()
        .map(|g| g.local_addr().to_string())
        .expect("gossip");
    let b = Gateway::start(config(&urls, vec![seed])).await;
    assert!(eventually(10, || b.state.routing.gossip().is_some()).await);
    let gb = b.state.routing.gossip().cloned().expect("gossip");
    assert!(
        eventually(10, || gb.live_peers() == 1).await,
        "peers never met"
    );

    let ready = |g: &Gateway| {
        let url = g.url("/ready");
        async move {
            // A new connection each time: the listener must still accept during the delay.
            let c = reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap();
            c.get(url)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        }
    };
    assert_eq!(ready(&a).await, 200);
    let started = std::time::Instant::now();
    a.shutdown();
    assert!(
        eventually_async(5, || async { ready(&a).await == 503 }).await,
        "/ready kept passing"
    );
    // Out of rotation, still serving: a request on a fresh connection is answered.
    let c = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let r = c
        .post(a.url("/v1/chat/completions"))
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "still here?"}]}))
        .send()
        .await
        .expect("served during the drain delay");
    assert_eq!(r.status(), 200);
    // Then the serve loop ends, and the peer sees the replica leave.
    let join = a.join.take().expect("running");
    let done = tokio::time::timeout(std::time::Duration::from_secs(20), join).await;
    assert!(
        matches!(done, Ok(Ok(Ok(())))),
        "serve loop did not end cleanly"
    );
    assert!(
        started.elapsed().as_millis() >= 3_000,
        "listener closed before the drain delay"
    );
    assert!(
        eventually(10, || gb.live_peers() == 0).await,
        "peer still counts the replica"
    );
}
