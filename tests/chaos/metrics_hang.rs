//! Engine `/metrics` hanging (sim fault `metrics_hang`): the load scraper's timeout bounds each
//! scrape, so the other instances' reports stay fresh and the hanging one's goes stale.

use crate::common::*;
use crate::harness::{self, Load};
use serde_json::json;
use std::time::{Duration, Instant};

const POLL_MS: u64 = 100;
const TIMEOUT_MS: u64 = 300;
const STALE_MS: u64 = 600;

/// Three engines, scrapes every 100 ms with a 300 ms timeout, reports stale after 600 ms; 90
/// requests, 4 at a time; after 20 completed one engine's `/metrics` hangs. Asserts: no request
/// lost; `/admin/instances` shows that instance's engine-reported load `stale: true` within
/// stale + timeout + poll + 1 s of the fault, while the others' stay fresh (their reports keep
/// advancing: a scrape round waits at most one timeout for the hanging instance); 20 requests
/// sent while it is stale are all served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_metrics_endpoint_goes_stale_and_routing_continues() {
    let t = Instant::now();
    let fleet = harness::fleet(3, false).await;
    let infos = fleet.instances();
    let mut cfg = harness::config(&infos);
    cfg.load.poll_interval_ms = POLL_MS;
    cfg.load.timeout_ms = TIMEOUT_MS;
    cfg.load.stale_after_ms = STALE_MS;
    let gw = Gateway::start(cfg).await;
    harness::all_usable(&gw).await;
    let fresh = eventually_async(10, || async {
        let v = harness::admin(&gw, "/admin/instances").await;
        v["instances"]
            .as_array()
            .is_some_and(|a| a.iter().all(|i| i["engine"]["stale"] == false))
    })
    .await;
    assert!(fresh, "engine load never scraped");
    let (victim, victim_url) = (infos[0].name.clone(), infos[0].url.clone());
    let url = gw.url("/v1/chat/completions");
    let model = infos[0].model.clone();
    let vu = victim_url.clone();
    let load = Load {
        requests: 90,
        concurrency: 4,
        fault_after: 20,
        request: Box::new(move |i| (url.clone(), harness::chat(&model, i, 16, false))),
        failover: false,
    };
    let report = harness::run(
        load,
        Box::new(move |_| {
            Box::pin(async move { harness::set_faults(&vu, json!({"metrics_hang": true})).await })
        }),
    )
    .await;
    let fault_at = report.fault_at.expect("fault injected");
    let lost = report.lost();
    assert!(lost.is_empty(), "lost {}: {lost:?}", lost.len());
    let stale = eventually_async(10, || async {
        harness::instance_view(&gw, &victim).await["engine"]["stale"] == true
    })
    .await;
    let took = fault_at.elapsed();
    assert!(stale, "never marked stale");
    let bound = Duration::from_millis(STALE_MS + TIMEOUT_MS + POLL_MS + 1_000);
    assert!(took <= bound, "stale after {took:?}, bound {bound:?}");
    eprintln!("  stale {:.0} ms after the fault", took.as_secs_f64() * 1e3);
    // The others' reports keep advancing while the victim hangs.
    let at = |v: &serde_json::Value| v["engine"]["at"].as_u64().unwrap_or(0);
    let others: Vec<_> = infos.iter().filter(|i| i.name != victim).collect();
    let mut before = Vec::new();
    for o in &others {
        before.push(at(&harness::instance_view(&gw, &o.name).await));
    }
    for i in 0..20 {
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .json(&harness::chat(&infos[0].model, 1_000 + i, 4, false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    for (o, b) in others.iter().zip(before) {
        let ok = eventually_async(5, || async {
            let v = harness::instance_view(&gw, &o.name).await;
            v["engine"]["stale"] == false && at(&v) > b
        })
        .await;
        assert!(ok, "{}'s load report stopped advancing", o.name);
    }
    assert_eq!(
        harness::instance_view(&gw, &victim).await["engine"]["stale"],
        true
    );
    harness::set_faults(&victim_url, json!({})).await;
    harness::summary("metrics_hang", t, &report);
    drop(gw);
    fleet.shutdown().await;
}
