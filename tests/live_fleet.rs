//! The live fleet: a discovered pool's instances follow the endpoint sets its source publishes
//! while the gateway serves — scale up, scale down with requests in flight, a rolling update
//! under load, an address reused by a new pod, and a source outage.

mod common;

use common::{ask, client, eventually, eventually_async, Gateway, Mock, Mode};
use kvgate::config::Config;
use kvgate_discovery::{Endpoint, EndpointSet, SourceKind};
use serde_json::json;
use tokio::sync::watch;

/// A gateway whose one pool is discovered from the sets the test sends on the returned
/// channel.
/// Each test names its own model: metrics are process-wide and labelled by it.
async fn gateway(model: &str, grace_ms: u64) -> (Gateway, watch::Sender<EndpointSet>) {
    let mut cfg: Config = common::config_for(&[]);
    let pool = &mut cfg.pools[0];
    pool.model = model.into();
    pool.instances.clear();
    pool.discovery.source = SourceKind::Dns;
    pool.discovery.name = Some("engines.test.invalid".into());
    pool.discovery.port = Some(8000);
    pool.discovery.drain_grace_ms = grace_ms;
    let (tx, rx) = watch::channel(EndpointSet::default());
    let gw = Gateway::start_with(cfg, |s| s.set_source(0, rx)).await;
    (gw, tx)
}

/// A prompt of many full hash blocks.
static LONG: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| "a shared system prompt. ".repeat(200));

fn publish(tx: &watch::Sender<EndpointSet>, endpoints: &[(&str, &Mock)]) {
    let version = tx.borrow().version + 1;
    tx.send_replace(EndpointSet::new(
        version,
        endpoints
            .iter()
            .map(|(name, m)| Endpoint::new(*name, m.url()))
            .collect(),
    ));
}

/// Serving instance names, sorted.
fn serving(gw: &Gateway) -> Vec<String> {
    let view = gw.state.fleet.view();
    let mut v: Vec<String> = view.serving().map(|i| i.name.clone()).collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_pool_is_not_ready_until_discovery_adds_an_instance() {
    let a = Mock::start("a").await;
    let (gw, tx) = gateway("empty", 1_000).await;
    let ready = || async {
        client()
            .get(gw.url("/ready"))
            .send()
            .await
            .unwrap()
            .status()
    };
    assert_eq!(ready().await, 503);
    let (status, _) = ask(&gw, "hi").await;
    assert_eq!(status, 503, "no instance yet");
    publish(&tx, &[("a", &a)]);
    assert!(eventually(5, || serving(&gw) == ["a"]).await);
    assert_eq!(ready().await, 200);
    assert_eq!(ask(&gw, "hi").await, (200, "a".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_up_takes_traffic_and_scale_down_drains_in_flight_requests() {
    let a = Mock::start("a").await;
    let b = Mock::start("b").await;
    let (gw, tx) = gateway("scale", 0).await;
    publish(&tx, &[("b", &b)]);
    assert!(eventually(5, || serving(&gw) == ["b"]).await);

    // A request held on b while b is removed: it still finishes there.
    b.set_mode(Mode::Held);
    let held = {
        let url = gw.url("/v1/chat/completions");
        tokio::spawn(async move {
            client()
                .post(url)
                .json(&json!({"model": "scale", "messages": [{"role": "user", "content": "long"}]}))
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    assert!(eventually(5, || b.held() == 1).await);
    let b_id = gw.state.fleet.view().members(0)[0];
    publish(&tx, &[("a", &a)]);
    assert!(eventually(5, || serving(&gw) == ["a"]).await);
    // b drains: present, removed, no new requests; not freed while its request runs, even
    // though its grace (0) is over.
    let b_inst = gw.state.fleet.instance(b_id).expect("b still present");
    assert!(b_inst.is_removed());
    for i in 0..10 {
        assert_eq!(ask(&gw, &format!("new {i}")).await, (200, "a".into()));
    }
    let admin: serde_json::Value =
        serde_json::from_str(&gw.get_text("/admin/instances").await).unwrap();
    let states: Vec<(String, String)> = admin["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["name"].as_str().unwrap().into(),
                i["state"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert!(
        states.contains(&("b".into(), "draining".into())),
        "{states:?}"
    );
    assert!(
        gw.state.fleet.instance(b_id).is_some(),
        "freed with a request in flight"
    );
    b.release(1);
    assert_eq!(held.await.unwrap().unwrap(), 200);
    // Once nothing of it is in flight, its slot is freed and what was learned is dropped.
    assert!(
        eventually(5, || gw
            .state
            .fleet
            .instance(b_id)
            .is_none_or(|i| i.uid != b_inst.uid))
        .await
    );
    assert_eq!(gw.state.routing.index().instance_entries(b_id), 0);
    let m = gw.get_text("/metrics").await;
    assert!(
        m.contains(r#"kvgate_pool_instances{pool="scale",state="serving"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"kvgate_discovery_changes_total{pool="scale",change="removed"} 1"#),
        "{m}"
    );
    // The freed instance's series leave the scrape; the serving one's stay.
    assert!(!m.contains(r#"instance="b""#), "{m}");
    assert!(
        m.contains(r#"kvgate_instance_healthy{pool="scale",instance="a"} 1"#),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_under_load_fails_no_request() {
    let mocks = [
        Mock::start("v1-0").await,
        Mock::start("v1-1").await,
        Mock::start("v2-0").await,
        Mock::start("v2-1").await,
    ];
    let (gw, tx) = gateway("rolling", 200).await;
    publish(&tx, &[("v1-0", &mocks[0]), ("v1-1", &mocks[1])]);
    assert!(eventually(5, || serving(&gw).len() == 2).await);
    let load = {
        let url = gw.url("/v1/chat/completions");
        tokio::spawn(async move {
            let c = client();
            let mut statuses = Vec::new();
            for i in 0..300 {
                let r = c
                    .post(&url)
                    .json(&json!({"model": "rolling", "messages": [{"role": "user", "content": format!("q{}", i % 7)}]}))
                    .send()
                    .await;
                statuses.push(r.map(|r| r.status().as_u16()).unwrap_or(0));
            }
            statuses
        })
    };
    // One pod at a time: a new one ready, then an old one gone.
    publish(
        &tx,
        &[
            ("v1-0", &mocks[0]),
            ("v1-1", &mocks[1]),
            ("v2-0", &mocks[2]),
        ],
    );
    assert!(eventually(5, || serving(&gw).len() == 3).await);
    publish(&tx, &[("v1-1", &mocks[1]), ("v2-0", &mocks[2])]);
    publish(
        &tx,
        &[
            ("v1-1", &mocks[1]),
            ("v2-0", &mocks[2]),
            ("v2-1", &mocks[3]),
        ],
    );
    publish(&tx, &[("v2-0", &mocks[2]), ("v2-1", &mocks[3])]);
    assert!(eventually(5, || serving(&gw) == ["v2-0", "v2-1"]).await);
    let statuses = load.await.unwrap();
    assert!(
        statuses.iter().all(|&s| s == 200),
        "failed: {:?}",
        statuses.iter().filter(|&&s| s != 200).count()
    );
    // The new pods took traffic; the old ones take none now.
    let before = (mocks[0].count(), mocks[1].count());
    for i in 0..20 {
        let (status, who) = ask(&gw, &format!("after {i}")).await;
        assert_eq!(status, 200);
        assert!(who.starts_with("v2-"), "{who}");
    }
    assert_eq!((mocks[0].count(), mocks[1].count()), before);
    assert!(mocks[2].count() + mocks[3].count() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_reused_by_a_new_pod_is_a_new_instance() {
    let m = Mock::start("engine").await;
    let (gw, tx) = gateway("reuse", 0).await;
    publish(&tx, &[("old-pod", &m)]);
    assert!(eventually(5, || serving(&gw) == ["old-pod"]).await);
    for _ in 0..3 {
        assert_eq!(ask(&gw, &LONG).await.0, 200);
    }
    let old = gw.state.fleet.view().serving().next().cloned().unwrap();
    assert!(
        gw.state.routing.index().instance_entries(old.id) > 0,
        "routing placed blocks"
    );
    publish(&tx, &[("new-pod", &m)]);
    assert!(eventually(5, || serving(&gw) == ["new-pod"]).await);
    let new = gw.state.fleet.view().serving().next().cloned().unwrap();
    assert_ne!(new.uid, old.uid);
    // The new pod's cache is empty: nothing the old one was credited with carries over.
    assert!(
        eventually(5, || gw
            .state
            .fleet
            .instance(old.id)
            .is_none_or(|i| i.uid != old.uid))
        .await
    );
    assert_eq!(gw.state.routing.index().instance_entries(new.id), 0);
    assert_eq!(ask(&gw, &LONG).await, (200, "new-pod".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_outage_keeps_the_last_known_fleet() {
    let a = Mock::start("a").await;
    let b = Mock::start("b").await;
    let (gw, tx) = gateway("outage", 0).await;
    publish(&tx, &[("a", &a), ("b", &b)]);
    assert!(eventually(5, || serving(&gw).len() == 2).await);
    tx.send_modify(|s| {
        s.version += 1;
        s.error = Some("api server unreachable".into());
    });
    assert!(
        eventually_async(5, || async {
            gw.get_text("/metrics")
                .await
                .contains(r#"kvgate_discovery_up{pool="outage"} 0"#)
        })
        .await
    );
    assert_eq!(serving(&gw), ["a", "b"]);
    for i in 0..6 {
        assert_eq!(ask(&gw, &format!("during outage {i}")).await.0, 200);
    }
    publish(&tx, &[("a", &a), ("b", &b)]);
    assert!(
        eventually_async(5, || async {
            gw.get_text("/metrics")
                .await
                .contains(r#"kvgate_discovery_up{pool="outage"} 1"#)
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_pool_reports_its_size_too() {
    let a = Mock::start("a").await;
    let b = Mock::start("b").await;
    let mut cfg = common::config_for(&[a.url(), b.url()]);
    cfg.pools[0].model = "static-size".into();
    let gw = Gateway::start(cfg).await;
    assert!(
        eventually_async(5, || async {
            gw.get_text("/metrics")
                .await
                .contains(r#"kvgate_pool_instances{pool="static-size",state="serving"} 2"#)
        })
        .await,
        "{}",
        gw.get_text("/metrics").await
    );
    // It has no discovery source to report on.
    assert!(!gw
        .get_text("/metrics")
        .await
        .contains(r#"kvgate_discovery_up{pool="static-size"}"#));
}
