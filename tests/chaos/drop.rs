//! Engine cutting every stream after its first token (sim fault `drop_rate = 1`).

use crate::common::*;
use crate::harness::{self, Load, Outcome};
use serde_json::json;
use std::time::Instant;

const BROKEN: &str = r#""code":"upstream_stream_broken""#;

/// Three engines, 90 streaming requests, 4 at a time; after 15 completed one engine drops every
/// new stream after its first token. Asserts: every stream started after the fault that went to
/// that engine, and every stream cut at all, is relayed as 200 from that engine and ends with the
/// gateway's SSE error event (`upstream_stream_broken`), never with `[DONE]` (at least one such
/// stream); every other stream (another engine, or that engine before the fault) ends with
/// `[DONE]` and carries no error event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_cut_by_an_engine_end_with_an_error_event() {
    let t = Instant::now();
    let fleet = harness::fleet(3, false).await;
    let infos = fleet.instances();
    let gw = Gateway::start(harness::config(&infos)).await;
    harness::all_usable(&gw).await;
    let (victim, victim_url) = (infos[2].name.clone(), infos[2].url.clone());
    let url = gw.url("/v1/chat/completions");
    let model = infos[0].model.clone();
    let load = Load {
        requests: 90,
        concurrency: 4,
        fault_after: 15,
        request: Box::new(move |i| (url.clone(), harness::chat(&model, i, 8, true))),
        failover: false,
    };
    let report = harness::run(
        load,
        Box::new(move |_| {
            Box::pin(
                async move { harness::set_faults(&victim_url, json!({"drop_rate": 1.0})).await },
            )
        }),
    )
    .await;
    harness::summary("drop", t, &report);
    let (cut, whole): (Vec<&Outcome>, Vec<&Outcome>) = report
        .outcomes
        .iter()
        .partition(|o| o.body.contains(BROKEN));
    eprintln!("  {} streams cut, {} whole", cut.len(), whole.len());
    assert!(!cut.is_empty(), "no stream went to the dropping engine");
    for o in &cut {
        assert_eq!(o.instance.as_deref(), Some(victim.as_str()), "{o:?}");
        assert_eq!(o.status, 200, "{o:?}");
        let last = o.body.trim_end().lines().last().unwrap_or_default();
        assert!(last.starts_with("data: {\"error\""), "{o:?}");
        assert!(!o.body.contains("[DONE]"), "{o:?}");
    }
    for o in &whole {
        assert!(o.ok(), "{o:?}");
        assert!(o.body.trim_end().ends_with("data: [DONE]"), "{o:?}");
        assert!(!o.body.contains("\"error\""), "{o:?}");
        // Started once the fault was in place: the engine cut it.
        assert!(
            !(o.after_fault && o.instance.as_deref() == Some(victim.as_str())),
            "{o:?}"
        );
    }
    drop(gw);
    fleet.shutdown().await;
}
