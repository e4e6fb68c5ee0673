//! Engine answering every request with a 500 (sim fault `always_5xx`): outlier ejection after
//! `health.passive_5xx_threshold` consecutive 5xx answers, and retries of 500 only for
//! idempotent requests.

use crate::common::*;
use crate::harness::{self, Load, Outcome, Report};
use serde_json::json;
use std::time::Instant;

/// Consecutive 5xx answers that eject (set here, below the default, to keep the load short).
const THRESHOLD: u32 = 3;
const CONCURRENCY: usize = 4;

/// Three engines, 90 non-streaming requests, 4 at a time; after 15 completed one engine answers
/// 500 to everything. Returns the report, the victim's name, when the gateway was first seen
/// to eject it (polled during the load), and the (status, instance) of 10 more requests sent one
/// by one once the ejection was seen (the load may end before the poll sees it).
async fn failing_engine(
    idempotent: bool,
) -> (Report, String, Option<Instant>, Vec<(u16, Option<String>)>) {
    let fleet = harness::fleet(3, false).await;
    let infos = fleet.instances();
    let mut cfg = harness::config(&infos);
    cfg.upstream.idempotent_requests = idempotent;
    cfg.health.passive_5xx_threshold = THRESHOLD;
    // Long enough that the ejection outlasts the load.
    cfg.health.eject_ms = 60_000;
    let gw = Gateway::start(cfg).await;
    harness::all_usable(&gw).await;
    let (victim, victim_url) = (infos[0].name.clone(), infos[0].url.clone());
    let url = gw.url("/v1/chat/completions");
    let model = infos[0].model.clone();
    let load = Load {
        requests: 90,
        concurrency: CONCURRENCY,
        fault_after: 15,
        request: Box::new(move |i| (url.clone(), harness::chat(&model, i, 8, false))),
        failover: false,
    };
    let vu = victim_url.clone();
    let run = harness::run(
        load,
        Box::new(move |_| {
            Box::pin(async move { harness::set_faults(&vu, json!({"always_5xx": true})).await })
        }),
    );
    let watch = async {
        let inst = gw
            .state
            .fleet
            .instance(kvgate_core::InstanceId(0))
            .expect("instance 0");
        assert_eq!(inst.name, victim);
        let seen = eventually(20, || inst.health.ejected(gw.state.clock.now_ms())).await;
        seen.then(Instant::now)
    };
    let (report, ejected_at) = tokio::join!(run, watch);
    let mut tail = Vec::new();
    if ejected_at.is_some() {
        for i in 0..10 {
            let r = client()
                .post(gw.url("/v1/chat/completions"))
                .json(&harness::chat(&infos[0].model, 1000 + i, 8, false))
                .send()
                .await
                .expect("request after the ejection");
            let instance = r
                .headers()
                .get("x-kvgate-instance")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            tail.push((r.status().as_u16(), instance));
        }
    }
    // Also visible in the admin view.
    let v = harness::instance_view(&gw, &victim).await;
    assert_eq!(v["ejected"], true, "{v}");
    assert_eq!(v["usable"], false, "{v}");
    drop(gw);
    fleet.shutdown().await;
    (report, victim, ejected_at, tail)
}

/// With `idempotent_requests` on: no request lost (each 500 is retried on another instance), and
/// the failing engine is ejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_engine_is_ejected_and_nothing_is_lost_when_idempotent() {
    let t = Instant::now();
    let (report, _victim, ejected, _tail) = failing_engine(true).await;
    harness::summary("5xx/idempotent", t, &report);
    assert!(ejected.is_some(), "never ejected");
    let lost = report.lost();
    assert!(lost.is_empty(), "lost {}: {lost:?}", lost.len());
}

/// With the default: the engine's 500s reach the client unchanged (status, the engine's own
/// error body, its instance header) until the ejection — at least `THRESHOLD` of them and at most
/// `THRESHOLD + CONCURRENCY - 1` (requests already dispatched when the last counted 500
/// arrived) — and no request started after the ejection reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_engine_500s_pass_through_until_ejected_by_default() {
    let t = Instant::now();
    let (report, victim, ejected, tail) = failing_engine(false).await;
    harness::summary("5xx/default", t, &report);
    let ejected = ejected.expect("never ejected");
    let lost = report.lost();
    for o in &lost {
        assert_eq!(o.status, 500, "{o:?}");
        assert_eq!(o.instance.as_deref(), Some(victim.as_str()), "{o:?}");
        assert!(
            o.body.contains("injected fault: internal server error"),
            "{o:?}"
        );
    }
    let n = lost.len() as u32;
    assert!(
        (THRESHOLD..THRESHOLD + CONCURRENCY as u32).contains(&n),
        "{n} 500s passed through, threshold {THRESHOLD}"
    );
    let later: Vec<&Outcome> = report
        .outcomes
        .iter()
        .filter(|o| o.started > ejected)
        .collect();
    assert_eq!(Report::served_by(&later, &victim), 0);
    assert!(later.iter().all(|o| o.ok()));
    // However fast the load ended, requests after the ejection never reach the victim.
    assert_eq!(tail.len(), 10);
    for (status, instance) in &tail {
        assert_eq!(*status, 200, "{tail:?}");
        assert_ne!(instance.as_deref(), Some(victim.as_str()), "{tail:?}");
    }
}
