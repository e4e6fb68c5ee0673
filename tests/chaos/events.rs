//! KV event stream gone silent (sim fault `stop_events`: the engine keeps serving but publishes
//! nothing).

use crate::common::*;
use crate::harness::{self, Load};
use serde_json::json;
use std::time::{Duration, Instant};

/// Silence bound used here (`events.silence_threshold_ms`), and the dispatches it needs
/// (`events.silence_min_requests`).
const SILENCE_MS: u64 = 600;
const MIN_REQUESTS: u64 = 4;

/// Three engines with KV events, silence detection at 600 ms / 4 dispatches; 90 requests, 4 at a
/// time; after 20 completed one engine stops publishing. Asserts: no request lost; the gateway
/// flags the stream silent in `/admin/index` (`silent: true`) and drops its event-derived blocks
/// (`last_wipe: "silent"`, `tracked_blocks: 0`) within the threshold plus one watchdog period
/// (150 ms) plus 1 s of slack of the fault; routing still serves all 20 requests sent after that;
/// the other streams are not flagged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_event_stream_is_flagged_and_routing_continues() {
    let t = Instant::now();
    let fleet = harness::fleet(3, true).await;
    let infos = fleet.instances();
    let mut cfg = harness::config(&infos);
    cfg.events.silence_threshold_ms = SILENCE_MS;
    cfg.events.silence_min_requests = MIN_REQUESTS;
    let gw = Gateway::start(cfg).await;
    harness::all_usable(&gw).await;
    harness::streams_connected(&gw, 3).await;
    let (victim, victim_url) = (infos[1].name.clone(), infos[1].url.clone());
    let url = gw.url("/v1/chat/completions");
    let model = infos[0].model.clone();
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
            Box::pin(
                async move { harness::set_faults(&victim_url, json!({"stop_events": true})).await },
            )
        }),
    )
    .await;
    let fault_at = report.fault_at.expect("fault injected");
    let lost = report.lost();
    assert!(lost.is_empty(), "lost {}: {lost:?}", lost.len());
    // The dispatches are there; silence now only needs time.
    let flagged = eventually_async(10, || async {
        harness::stream_view(&gw, &victim).await["silent"] == true
    })
    .await;
    let took = fault_at.elapsed();
    let s = harness::stream_view(&gw, &victim).await;
    assert!(flagged, "never flagged silent: {s}");
    let bound = Duration::from_millis(SILENCE_MS + 150 + 1_000);
    assert!(took <= bound, "flagged after {took:?}, bound {bound:?}");
    eprintln!(
        "  silent flag {:.0} ms after the fault",
        took.as_secs_f64() * 1e3
    );
    assert_eq!(s["last_wipe"], "silent", "{s}");
    assert_eq!(s["tracked_blocks"], 0, "{s}");
    for i in 0..20 {
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .json(&harness::chat(&infos[0].model, 1_000 + i, 4, false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    for other in infos.iter().filter(|i| i.name != victim) {
        let s = harness::stream_view(&gw, &other.name).await;
        assert_eq!(s["silent"], false, "{s}");
    }
    harness::summary("stop_events", t, &report);
    drop(gw);
    fleet.shutdown().await;
}
