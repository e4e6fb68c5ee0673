//! Engine restarted under load (sim fault `restart`: cache cleared, in-flight requests cut with a
//! 500, KV event sequence back to 0, no `AllBlocksCleared`).

use crate::common::*;
use crate::harness::{self, Load};
use serde_json::{json, Value};
use std::time::Instant;

/// Two engines with KV events, `idempotent_requests` on, predictions short-lived (300 ms) so that
/// credit comes from events only. A long prompt is sent first and cached on one engine (the
/// victim); its event-derived blocks are awaited. 80 requests, 4 at a time; after 20 completed
/// the victim restarts. Asserts: no request lost (the cut ones are retried elsewhere); the
/// gateway detects the restart from the event stream (`restarts >= 1`, `last_wipe: "restart"` in
/// `/admin/index`) and drops the victim's event-derived blocks (its tracked block count equals
/// what the engine caches now, `GET /admin/cache`); once predictions expired, the same prompt is credited with 0 matched blocks
/// (`x-kvgate-matched-blocks`): no stale credit after restart detection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_engine_loses_nothing_and_leaves_no_stale_credit() {
    let t = Instant::now();
    let fleet = harness::fleet(2, true).await;
    let infos = fleet.instances();
    let mut cfg = harness::config(&infos);
    cfg.upstream.idempotent_requests = true;
    cfg.routing.predicted_ttl_ms = 300;
    let gw = Gateway::start(cfg).await;
    harness::all_usable(&gw).await;
    harness::streams_connected(&gw, 2).await;
    let model = infos[0].model.clone();
    let prefix = "The restart probe carries a long and distinctive system prompt. ".repeat(30);
    let probe = |q: &str| {
        json!({"model": model, "max_tokens": 2, "messages": [
            {"role": "system", "content": prefix}, {"role": "user", "content": q}]})
    };
    let ask = |body: Value| {
        let url = gw.url("/v1/chat/completions");
        async move {
            let r = client().post(url).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let h = |n: &str| r.headers()[n].to_str().unwrap().to_string();
            let (inst, matched) = (h("x-kvgate-instance"), h("x-kvgate-matched-blocks"));
            (inst, matched.parse::<u64>().unwrap())
        }
    };
    let (victim, _) = ask(probe("first")).await;
    let victim_url = infos.iter().find(|i| i.name == victim).unwrap().url.clone();
    // The engine's events, not the prediction, now credit the prefix.
    let ok = eventually_async(10, || async {
        harness::stream_view(&gw, &victim).await["tracked_blocks"]
            .as_u64()
            .unwrap_or(0)
            > 10
    })
    .await;
    assert!(ok, "the probe's blocks never arrived as events");
    let held = harness::stream_view(&gw, &victim).await["tracked_blocks"]
        .as_u64()
        .unwrap();

    let url = gw.url("/v1/chat/completions");
    let m = model.clone();
    let load = Load {
        requests: 80,
        concurrency: 4,
        fault_after: 20,
        request: Box::new(move |i| (url.clone(), harness::chat(&m, i, 16, false))),
        failover: false,
    };
    let vu = victim_url.clone();
    let report = harness::run(
        load,
        Box::new(move |_| {
            Box::pin(async move { harness::set_faults(&vu, json!({"restart": true})).await })
        }),
    )
    .await;
    harness::summary("restart", t, &report);
    let lost = report.lost();
    assert!(lost.is_empty(), "lost {}: {lost:?}", lost.len());

    // Detection needs a message from the restarted engine: requests until it published one.
    let mut extra = 0;
    let detected = eventually_async(10, || {
        extra += 1;
        let body = harness::chat(&model, 10_000 + extra, 2, false);
        let (gw, victim) = (&gw, &victim);
        async move {
            let _ = client()
                .post(gw.url("/v1/chat/completions"))
                .json(&body)
                .send()
                .await;
            let s = harness::stream_view(gw, victim).await;
            s["restarts"].as_u64().unwrap_or(0) >= 1
        }
    })
    .await;
    let s = harness::stream_view(&gw, &victim).await;
    assert!(detected, "restart never detected: {s}");
    assert_eq!(s["last_wipe"], "restart", "{s}");
    // The index is exact again: it tracks what the engine caches now, not the probe's blocks
    // from before the restart.
    let exact = eventually_async(5, || async {
        let engine: Value = client()
            .get(format!("{victim_url}/admin/cache"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let cached = engine["gpu"].as_array().map_or(0, Vec::len) as u64;
        harness::stream_view(&gw, &victim).await["tracked_blocks"].as_u64() == Some(cached)
    })
    .await;
    let s = harness::stream_view(&gw, &victim).await;
    assert!(
        exact,
        "the victim's tracked blocks differ from its cache: {s} (held {held} before)"
    );
    // Predictions made before and during the load have expired: the prefix is credited nowhere.
    let expired = eventually(5, || {
        gw.state.routing.index().stats().entries_by_source[1] == 0
    })
    .await;
    assert!(expired, "predicted entries never expired");
    let (_, matched) = ask(probe("second")).await;
    assert_eq!(matched, 0, "stale credit for the restarted engine's prefix");
    drop(gw);
    fleet.shutdown().await;
}
