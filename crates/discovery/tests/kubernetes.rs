//! The kubernetes source against a fake API server: list then watch, readiness, bookmarks,
//! 410 Gone in both forms, 403, disconnects, oversized events, pods by selector,
//! InferencePools in both versions, and per-pod labels and annotations.

use kvgate_discovery::fake_api::*;
use kvgate_discovery::kubernetes::limits::Limits;
use kvgate_discovery::{DiscoveryConfig, EndpointSet, KubernetesSource, Source, SourceKind};
use serde_json::json;
use std::time::Duration;
use tokio::sync::watch;

/// Fast retries so failure tests converge quickly.
fn limits() -> Limits {
    Limits {
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(100),
        max_event_bytes: 16 << 10,
        ..Limits::default()
    }
}

fn cfg(api: &FakeApi, f: impl FnOnce(&mut DiscoveryConfig)) -> DiscoveryConfig {
    let mut c = DiscoveryConfig {
        source: SourceKind::Kubernetes,
        api_server: Some(api.url()),
        namespace: Some(NS.into()),
        ..DiscoveryConfig::default()
    };
    f(&mut c);
    c.validate().expect("valid config");
    c
}

/// A running source; stops when dropped.
struct Running {
    rx: watch::Receiver<EndpointSet>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

fn start(c: &DiscoveryConfig) -> Running {
    start_with(c, limits())
}

fn start_with(c: &DiscoveryConfig, limits: Limits) -> Running {
    let source = KubernetesSource::with_limits(c, limits).expect("source");
    let (tx, rx) = watch::channel(EndpointSet::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(source.run(tx, async move {
        let _ = stopped.await;
    }));
    Running { rx, _stop: stop }
}

/// Waits (up to 10 s) until the published set satisfies `pred`; returns it.
async fn until(r: &mut Running, what: &str, pred: impl Fn(&EndpointSet) -> bool) -> EndpointSet {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let set = r.rx.borrow_and_update().clone();
        if pred(&set) {
            return set;
        }
        if tokio::time::timeout_at(deadline, r.rx.changed())
            .await
            .is_err()
        {
            panic!("timed out waiting for {what}; last set: {set:?}");
        }
    }
}

/// Waits (up to 10 s) until `f` is true.
async fn poll(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn urls(set: &EndpointSet) -> Vec<String> {
    set.endpoints
        .iter()
        .map(|e| format!("{}={}", e.name, e.url))
        .collect()
}

fn has(set: &EndpointSet, want: &[&str]) -> bool {
    set.error.is_none() && urls(set) == want
}

#[tokio::test]
async fn service_slices_list_then_watch_with_readiness_and_pod_labels() {
    let api = FakeApi::start().await.unwrap();
    api.list(
        SLICES,
        "10",
        vec![slice(
            "vllm-a",
            "9",
            8000,
            &[
                ("10.0.0.1", "vllm-0", true, false),
                ("10.0.0.2", "vllm-1", false, false),
                ("10.0.0.3", "vllm-2", true, true),
            ],
        )],
    );
    let slices = api.watch(SLICES);
    api.list(
        PODS,
        "20",
        vec![pod(
            "vllm-0",
            "19",
            "10.0.0.1",
            true,
            json!({"kvgate.dev/flavour": "sglang", "llm-d.ai/role": "prefill-decode", "kvgate.dev/dp-size": "2", "kvgate.dev/role": "bogus"}),
            json!({"kvgate.dev/model": "meta-llama/Llama-3.1-8B", "kvgate.dev/kv-events-port": "6000"}),
        )],
    );
    let _pods = api.watch(PODS);
    let mut r = start(&cfg(&api, |c| {
        c.service = Some("vllm".into());
        c.kv_events_port = Some(5557);
        c.kv_replay_port = Some(5558);
    }));

    let first = until(&mut r, "the first list", |s| s.version > 0).await;
    assert_eq!(
        urls(&first),
        ["vllm-0=http://10.0.0.1:8000"],
        "not ready and terminating left out"
    );
    let e = &first.endpoints[0];
    assert_eq!(e.model.as_deref(), Some("meta-llama/Llama-3.1-8B"));
    assert_eq!(e.flavour.as_deref(), Some("sglang"));
    assert_eq!(
        e.role, None,
        "a malformed kvgate role is not replaced by llm-d's"
    );
    assert_eq!(e.dp_size, Some(2));
    assert_eq!(
        e.kv_events.as_deref(),
        Some("tcp://10.0.0.1:6000"),
        "annotation over config"
    );
    assert_eq!(e.kv_replay.as_deref(), Some("tcp://10.0.0.1:5558"));

    let lists = api.seen(SLICES, false);
    assert_eq!(
        lists[0].query["labelSelector"],
        "kubernetes.io/service-name=vllm"
    );
    poll("the slices watch", || !api.seen(SLICES, true).is_empty()).await;
    let w = &api.seen(SLICES, true)[0];
    assert_eq!(
        w.query["resourceVersion"], "10",
        "the watch starts at the list's version"
    );
    assert_eq!(w.query["allowWatchBookmarks"], "true");
    assert_eq!(w.query["labelSelector"], "kubernetes.io/service-name=vllm");
    assert!(w.query.contains_key("timeoutSeconds"));

    slices.event(
        "ADDED",
        slice("vllm-b", "11", 8001, &[("10.0.0.4", "vllm-3", true, false)]),
    );
    until(&mut r, "an added slice", |s| {
        has(
            s,
            &["vllm-0=http://10.0.0.1:8000", "vllm-3=http://10.0.0.4:8001"],
        )
    })
    .await;
    slices.event(
        "MODIFIED",
        slice(
            "vllm-a",
            "12",
            8000,
            &[
                ("10.0.0.1", "vllm-0", false, false),
                ("10.0.0.2", "vllm-1", true, false),
            ],
        ),
    );
    until(&mut r, "a modified slice", |s| {
        has(
            s,
            &["vllm-1=http://10.0.0.2:8000", "vllm-3=http://10.0.0.4:8001"],
        )
    })
    .await;
    slices.event("DELETED", slice("vllm-b", "13", 8001, &[]));
    until(&mut r, "a deleted slice", |s| {
        has(s, &["vllm-1=http://10.0.0.2:8000"])
    })
    .await;
}

#[tokio::test]
async fn bookmarks_and_disconnects_resume_from_the_last_version() {
    let api = FakeApi::start().await.unwrap();
    api.list(
        PODS,
        "100",
        vec![pod("a", "99", "10.0.0.1", true, json!({}), json!({}))],
    );
    let w1 = api.watch(PODS);
    let w2 = api.watch(PODS);
    let w3 = api.watch(PODS);
    let mut r = start(&cfg(&api, |c| {
        c.selector = Some("app=vllm".into());
        c.port = Some(8000);
    }));
    until(&mut r, "the list", |s| has(s, &["a=http://10.0.0.1:8000"])).await;

    w1.event(
        "ADDED",
        pod("b", "101", "10.0.0.2", true, json!({}), json!({})),
    );
    w1.bookmark("150");
    until(&mut r, "b", |s| s.endpoints.len() == 2).await;
    w1.abort();
    poll("a second watch", || api.seen(PODS, true).len() >= 2).await;
    assert_eq!(
        api.seen(PODS, true)[1].query["resourceVersion"],
        "150",
        "resumes at the bookmark"
    );

    w2.event(
        "ADDED",
        pod("c", "151", "10.0.0.3", true, json!({}), json!({})),
    );
    until(&mut r, "c", |s| s.endpoints.len() == 3).await;
    drop(w2); // a clean end, as at timeoutSeconds
    poll("a third watch", || api.seen(PODS, true).len() >= 3).await;
    assert_eq!(api.seen(PODS, true)[2].query["resourceVersion"], "151");
    assert_eq!(
        api.seen(PODS, false).len(),
        1,
        "no relist after a disconnect"
    );
    w3.event(
        "DELETED",
        pod("a", "152", "10.0.0.1", true, json!({}), json!({})),
    );
    until(&mut r, "a gone", |s| {
        has(s, &["b=http://10.0.0.2:8000", "c=http://10.0.0.3:8000"])
    })
    .await;
}

#[tokio::test]
async fn gone_as_status_or_event_relists_and_converges() {
    let api = FakeApi::start().await.unwrap();
    api.list(
        PODS,
        "5",
        vec![pod("a", "5", "10.0.0.1", true, json!({}), json!({}))],
    );
    api.status(PODS, true, 410, "too old resource version");
    api.list(
        PODS,
        "50",
        vec![pod("b", "50", "10.0.0.2", true, json!({}), json!({}))],
    );
    let w = api.watch(PODS);
    api.list(
        PODS,
        "80",
        vec![pod("c", "80", "10.0.0.3", true, json!({}), json!({}))],
    );
    let mut r = start(&cfg(&api, |c| {
        c.selector = Some("app=vllm".into());
        c.port = Some(8000);
    }));
    until(&mut r, "the relist after HTTP 410", |s| {
        has(s, &["b=http://10.0.0.2:8000"])
    })
    .await;
    w.error(410);
    until(&mut r, "the relist after an ERROR 410 event", |s| {
        has(s, &["c=http://10.0.0.3:8000"])
    })
    .await;
    assert_eq!(api.seen(PODS, false).len(), 3);
    poll("the watch after the third list", || {
        api.seen(PODS, true).len() >= 3
    })
    .await;
    assert_eq!(api.seen(PODS, true)[2].query["resourceVersion"], "80");
}

#[tokio::test]
async fn forbidden_reports_the_missing_rbac_keeps_the_set_and_recovers() {
    let api = FakeApi::start().await.unwrap();
    api.list(
        PODS,
        "5",
        vec![pod("a", "5", "10.0.0.1", true, json!({}), json!({}))],
    );
    api.status(
        PODS,
        true,
        403,
        "pods is forbidden: User cannot watch resource pods",
    );
    let w = api.watch(PODS);
    let mut r = start(&cfg(&api, |c| {
        c.selector = Some("app=vllm".into());
        c.port = Some(8000);
    }));
    let failed = until(&mut r, "the 403", |s| s.error.is_some()).await;
    let msg = failed.error.clone().unwrap();
    assert!(msg.contains("verbs list,watch on pods"), "{msg}");
    assert!(msg.contains("namespace ns"), "{msg}");
    assert!(msg.contains("HTTP 403"), "{msg}");
    assert_eq!(
        urls(&failed),
        ["a=http://10.0.0.1:8000"],
        "the last set is kept"
    );
    until(&mut r, "recovery", |s| s.error.is_none()).await;
    w.event(
        "ADDED",
        pod("b", "6", "10.0.0.2", true, json!({}), json!({})),
    );
    until(&mut r, "an event after recovery", |s| {
        s.endpoints.len() == 2
    })
    .await;
}

#[tokio::test]
async fn forbidden_list_before_any_set_publishes_only_the_error() {
    let api = FakeApi::start().await.unwrap();
    api.status(
        SLICES,
        false,
        403,
        "endpointslices.discovery.k8s.io is forbidden",
    );
    let mut r = start(&cfg(&api, |c| c.service = Some("vllm".into())));
    let failed = until(&mut r, "the 403", |s| s.error.is_some()).await;
    let msg = failed.error.unwrap();
    assert!(msg.contains("list endpointslices"), "{msg}");
    assert!(msg.contains("\"discovery.k8s.io\""), "{msg}");
    assert!(failed.endpoints.is_empty());
}

#[tokio::test]
async fn an_oversized_event_line_is_an_error_then_a_relist_recovers() {
    let api = FakeApi::start().await.unwrap();
    api.list(
        PODS,
        "5",
        vec![pod("a", "5", "10.0.0.1", true, json!({}), json!({}))],
    );
    let w = api.watch(PODS);
    api.list(
        PODS,
        "9",
        vec![pod("b", "9", "10.0.0.2", true, json!({}), json!({}))],
    );
    let mut r = start(&cfg(&api, |c| {
        c.selector = Some("app=vllm".into());
        c.port = Some(8000);
    }));
    until(&mut r, "the list", |s| s.endpoints.len() == 1).await;
    // Sent in pieces without a newline: the limit holds before the line ends.
    for _ in 0..20 {
        w.raw(vec![b'x'; 1024]);
    }
    let failed = until(&mut r, "the size error", |s| s.error.is_some()).await;
    assert!(
        failed.error.as_deref().unwrap().contains("exceeds"),
        "{failed:?}"
    );
    assert_eq!(urls(&failed), ["a=http://10.0.0.1:8000"]);
    until(&mut r, "the relist", |s| {
        has(s, &["b=http://10.0.0.2:8000"])
    })
    .await;
}

#[tokio::test]
async fn pods_by_selector_follow_readiness() {
    let api = FakeApi::start().await.unwrap();
    api.list(
        PODS,
        "5",
        vec![
            pod(
                "a",
                "5",
                "10.0.0.1",
                true,
                json!({"app": "vllm"}),
                json!({}),
            ),
            pod(
                "b",
                "5",
                "10.0.0.2",
                false,
                json!({"app": "vllm"}),
                json!({}),
            ),
        ],
    );
    let w = api.watch(PODS);
    let mut r = start(&cfg(&api, |c| {
        c.selector = Some("app=vllm,tier!=cpu".into());
        c.port = Some(8000);
    }));
    until(&mut r, "only the ready pod", |s| {
        has(s, &["a=http://10.0.0.1:8000"])
    })
    .await;
    assert_eq!(
        api.seen(PODS, false)[0].query["labelSelector"],
        "app=vllm,tier!=cpu"
    );
    w.event(
        "MODIFIED",
        pod(
            "b",
            "6",
            "10.0.0.2",
            true,
            json!({"app": "vllm"}),
            json!({}),
        ),
    );
    until(&mut r, "b ready", |s| s.endpoints.len() == 2).await;
    let mut terminating = pod(
        "a",
        "7",
        "10.0.0.1",
        true,
        json!({"app": "vllm"}),
        json!({}),
    );
    terminating["metadata"]["deletionTimestamp"] = json!("2026-12-03T00:00:00Z");
    w.event("MODIFIED", terminating);
    until(&mut r, "a terminating", |s| {
        has(s, &["b=http://10.0.0.2:8000"])
    })
    .await;
}

#[tokio::test]
async fn inference_pool_v1_and_a_selector_change() {
    let api = FakeApi::start().await.unwrap();
    api.list(
        POOLS_V1,
        "3",
        vec![pool_v1("llama", "3", json!({"app": "a"}), 8000)],
    );
    let pools = api.watch(POOLS_V1);
    api.list(
        PODS,
        "5",
        vec![pod(
            "a-0",
            "5",
            "10.0.0.1",
            true,
            json!({"app": "a"}),
            json!({}),
        )],
    );
    let _pods_a = api.watch(PODS);
    api.list(
        PODS,
        "8",
        vec![pod(
            "b-0",
            "8",
            "10.0.0.9",
            true,
            json!({"app": "b"}),
            json!({}),
        )],
    );
    let _pods_b = api.watch(PODS);
    let mut r = start(&cfg(&api, |c| c.inference_pool = Some("llama".into())));
    until(&mut r, "the pool's pods", |s| {
        has(s, &["a-0=http://10.0.0.1:8000"])
    })
    .await;
    assert_eq!(
        api.seen(POOLS_V1, false)[0].query["fieldSelector"],
        "metadata.name=llama"
    );
    assert_eq!(api.seen(PODS, false)[0].query["labelSelector"], "app=a");

    pools.event("MODIFIED", pool_v1("llama", "4", json!({"app": "b"}), 9000));
    until(&mut r, "the new selector's pods", |s| {
        has(s, &["b-0=http://10.0.0.9:9000"])
    })
    .await;
    assert_eq!(api.seen(PODS, false)[1].query["labelSelector"], "app=b");
    assert!(
        api.seen(POOLS_V1A2, false).is_empty(),
        "v1 served: no fallback"
    );

    pools.event("DELETED", pool_v1("llama", "5", json!({"app": "b"}), 9000));
    let failed = until(&mut r, "the pool gone", |s| s.error.is_some()).await;
    assert!(
        failed.error.as_deref().unwrap().contains("not found"),
        "{failed:?}"
    );
    assert_eq!(
        urls(&failed),
        ["b-0=http://10.0.0.9:9000"],
        "the last set is kept"
    );
}

#[tokio::test]
async fn inference_pool_falls_back_to_v1alpha2_when_v1_is_not_served() {
    let api = FakeApi::start().await.unwrap();
    api.status(
        POOLS_V1,
        false,
        404,
        "the server could not find the requested resource",
    );
    api.list(
        POOLS_V1A2,
        "3",
        vec![pool_v1alpha2("llama", "3", json!({"app": "s"}), 30000)],
    );
    let pools = api.watch(POOLS_V1A2);
    api.list(
        PODS,
        "5",
        vec![pod(
            "s-0",
            "5",
            "10.0.0.1",
            true,
            json!({"app": "s"}),
            json!({}),
        )],
    );
    let _pods = api.watch(PODS);
    api.list(
        PODS,
        "6",
        vec![pod(
            "t-0",
            "6",
            "10.0.0.2",
            true,
            json!({"app": "t"}),
            json!({}),
        )],
    );
    let mut r = start(&cfg(&api, |c| c.inference_pool = Some("llama".into())));
    until(&mut r, "the v1alpha2 pool's pods", |s| {
        has(s, &["s-0=http://10.0.0.1:30000"])
    })
    .await;
    assert_eq!(api.seen(POOLS_V1, false).len(), 1);
    pools.event(
        "MODIFIED",
        pool_v1alpha2("llama", "4", json!({"app": "t"}), 30000),
    );
    until(&mut r, "the changed selector", |s| {
        has(s, &["t-0=http://10.0.0.2:30000"])
    })
    .await;
}

#[tokio::test]
async fn no_inference_pool_crd_at_all_is_a_clear_error() {
    let api = FakeApi::start().await.unwrap();
    api.status(POOLS_V1, false, 404, "not found");
    api.status(POOLS_V1A2, false, 404, "not found");
    let mut r = start(&cfg(&api, |c| c.inference_pool = Some("llama".into())));
    let failed = until(&mut r, "the error", |s| s.error.is_some()).await;
    assert!(
        failed.error.as_deref().unwrap().contains("CRD installed"),
        "{failed:?}"
    );
}

#[tokio::test]
async fn a_paged_list_is_read_whole_and_the_object_limit_is_an_error() {
    let api = FakeApi::start().await.unwrap();
    let p = |n: &str, ip: &str| pod(n, "1", ip, true, json!({}), json!({}));
    api.page(PODS, "7", vec![p("a", "10.0.0.1")], "tok");
    api.list(PODS, "7", vec![p("b", "10.0.0.2")]);
    let _w = api.watch(PODS);
    let c = cfg(&api, |c| {
        c.selector = Some("app=vllm".into());
        c.port = Some(8000);
    });
    let mut r = start(&c);
    until(&mut r, "both pages", |s| {
        has(s, &["a=http://10.0.0.1:8000", "b=http://10.0.0.2:8000"])
    })
    .await;
    let lists = api.seen(PODS, false);
    assert_eq!(lists[0].query["limit"], "500");
    assert!(!lists[0].query.contains_key("continue"));
    assert_eq!(lists[1].query["continue"], "tok");
    poll("the watch", || !api.seen(PODS, true).is_empty()).await;
    assert_eq!(api.seen(PODS, true)[0].query["resourceVersion"], "7");

    let api = FakeApi::start().await.unwrap();
    api.list(
        PODS,
        "7",
        vec![p("a", "10.0.0.1"), p("b", "10.0.0.2"), p("c", "10.0.0.3")],
    );
    let c = cfg(&api, |c| {
        c.selector = Some("app=vllm".into());
        c.port = Some(8000);
    });
    let mut r = start_with(
        &c,
        Limits {
            max_objects: 2,
            ..limits()
        },
    );
    let failed = until(&mut r, "the limit", |s| s.error.is_some()).await;
    assert!(
        failed
            .error
            .as_deref()
            .unwrap()
            .contains("more than 2 objects"),
        "{failed:?}"
    );
    assert!(failed.endpoints.is_empty());
}

#[tokio::test]
async fn the_token_file_is_read_again_on_every_reconnect() {
    let dir = std::env::temp_dir().join(format!("kvgate-k8s-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, "first\n").unwrap();
    let api = FakeApi::start().await.unwrap();
    api.list(
        PODS,
        "5",
        vec![pod("a", "5", "10.0.0.1", true, json!({}), json!({}))],
    );
    let w = api.watch(PODS);
    let c = cfg(&api, |c| {
        c.selector = Some("app=vllm".into());
        c.port = Some(8000);
        c.token_file = Some(token.clone());
    });
    let mut r = start(&c);
    until(&mut r, "the list", |s| s.endpoints.len() == 1).await;
    assert_eq!(
        api.seen(PODS, false)[0].auth.as_deref(),
        Some("Bearer first")
    );
    poll("the watch", || !api.seen(PODS, true).is_empty()).await;
    std::fs::write(&token, "rotated").unwrap();
    w.event(
        "ADDED",
        pod("b", "6", "10.0.0.2", true, json!({}), json!({})),
    );
    until(&mut r, "b", |s| s.endpoints.len() == 2).await;
    w.abort();
    poll("the second watch", || api.seen(PODS, true).len() >= 2).await;
    assert_eq!(
        api.seen(PODS, true)[1].auth.as_deref(),
        Some("Bearer rotated")
    );
    let _ = std::fs::remove_dir_all(dir);
}
