//! A pool with `source = "kubernetes"` pointed at a fake API server whose EndpointSlices name
//! real mock engines: the gateway follows the watch from 2 to 3 to 1 engines while requests
//! keep succeeding.

mod common;

#[path = "../crates/discovery/tests/fake_api/mod.rs"]
mod fake_api;

use common::{client, eventually, Gateway, Mock};
use fake_api::{slice, FakeApi, NS, PODS, SLICES};
use kvgate::config::Config;
use kvgate_discovery::SourceKind;
use serde_json::json;

/// One slice per engine (each mock listens on its own port, as slices may).
fn engine_slice(i: usize, rv: &str, m: &Mock) -> serde_json::Value {
    slice(
        &format!("vllm-{i}"),
        rv,
        m.addr.port(),
        &[("127.0.0.1", &format!("vllm-{i}"), true, false)],
    )
}

fn serving(gw: &Gateway) -> Vec<String> {
    let view = gw.state.fleet.view();
    let mut v: Vec<String> = view.serving().map(|i| i.name.clone()).collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_pool_scales_2_3_1_through_watch_events_without_failures() {
    let mocks = [
        Mock::start("e0").await,
        Mock::start("e1").await,
        Mock::start("e2").await,
    ];
    let api = FakeApi::start().await;
    api.list(
        SLICES,
        "10",
        vec![
            engine_slice(0, "10", &mocks[0]),
            engine_slice(1, "10", &mocks[1]),
        ],
    );
    let slices = api.watch(SLICES);
    api.list(PODS, "10", vec![]);

    let mut cfg: Config = common::config_for(&[]);
    let pool = &mut cfg.pools[0];
    pool.model = "k8s".into();
    pool.instances.clear();
    pool.discovery.source = SourceKind::Kubernetes;
    pool.discovery.api_server = Some(api.url());
    pool.discovery.namespace = Some(NS.into());
    pool.discovery.service = Some("vllm".into());
    pool.discovery.drain_grace_ms = 200;
    let gw = Gateway::start(cfg).await;
    assert!(
        eventually(10, || serving(&gw) == ["vllm-0", "vllm-1"]).await,
        "{:?}",
        serving(&gw)
    );

    let url = gw.url("/v1/chat/completions");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let c = client();
            let mut statuses = Vec::new();
            let mut i = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || i < 20 {
                let r = c
                    .post(&url)
                    .json(&json!({"model": "k8s", "messages": [{"role": "user", "content": format!("q{i}")}]}))
                    .send()
                    .await;
                let who = r.as_ref().ok().and_then(|r| {
                    r.headers()
                        .get("x-kvgate-instance")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string)
                });
                statuses.push((r.map(|r| r.status().as_u16()).unwrap_or(0), who));
                i += 1;
            }
            statuses
        })
    };

    slices.event("ADDED", engine_slice(2, "11", &mocks[2]));
    assert!(
        eventually(10, || serving(&gw) == ["vllm-0", "vllm-1", "vllm-2"]).await,
        "{:?}",
        serving(&gw)
    );
    // The new engine takes traffic.
    assert!(
        eventually(10, || !mocks[2].state.received.lock().is_empty()).await,
        "vllm-2 never served"
    );

    slices.event("DELETED", engine_slice(0, "12", &mocks[0]));
    // Scaling down through readiness: vllm-1's endpoint turns terminating.
    slices.event(
        "MODIFIED",
        slice(
            "vllm-1",
            "13",
            mocks[1].addr.port(),
            &[("127.0.0.1", "vllm-1", false, true)],
        ),
    );
    assert!(
        eventually(10, || serving(&gw) == ["vllm-2"]).await,
        "{:?}",
        serving(&gw)
    );

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let statuses = load.await.unwrap();
    let failed: Vec<_> = statuses.iter().filter(|(s, _)| *s != 200).collect();
    assert!(
        failed.is_empty(),
        "failed requests: {failed:?} of {}",
        statuses.len()
    );
    let tail = &statuses[statuses.len() - 5..];
    assert!(
        tail.iter().all(|(_, who)| who.as_deref() == Some("vllm-2")),
        "after scaling to 1 only vllm-2 serves: {tail:?}"
    );
    assert_eq!(
        api.seen(SLICES, false)[0].query["labelSelector"],
        "kubernetes.io/service-name=vllm"
    );
}
