//! Engine slowed down under load (sim fault `slow_factor`): routing steers around it.

use crate::common::*;
use crate::harness::{self, Load, Outcome, Report};
use serde_json::json;
use std::time::Instant;

/// Three engines; 120 non-streaming requests with prompts of their own (load decides), 6 at a
/// time; after 20 completed one engine becomes 50 times slower. Asserts: no request lost, and
/// of the requests started after the fault the slow engine served at most 15% (a third would be
/// an even split): its queue, tracked by the router, makes it the costlier choice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_engine_is_steered_around() {
    let t = Instant::now();
    let fleet = harness::fleet(3, false).await;
    let infos = fleet.instances();
    let gw = Gateway::start(harness::config(&infos)).await;
    harness::all_usable(&gw).await;
    let (victim, victim_url) = (infos[1].name.clone(), infos[1].url.clone());
    let url = gw.url("/v1/chat/completions");
    let model = infos[0].model.clone();
    let load = Load {
        requests: 120,
        concurrency: 6,
        fault_after: 20,
        request: Box::new(move |i| (url.clone(), harness::chat(&model, i, 16, false))),
        failover: false,
    };
    let report = harness::run(
        load,
        Box::new(move |_| {
            Box::pin(
                async move { harness::set_faults(&victim_url, json!({"slow_factor": 50.0})).await },
            )
        }),
    )
    .await;
    harness::summary("slow", t, &report);
    let lost = report.lost();
    assert!(lost.is_empty(), "lost {}: {lost:?}", lost.len());
    let after: Vec<&Outcome> = report.after().collect();
    let share = Report::served_by(&after, &victim) as f64 / after.len() as f64;
    eprintln!(
        "  slow engine's share after the fault: {:.1}%",
        share * 100.0
    );
    assert!(
        share <= 0.15,
        "the slow engine still got {:.1}%",
        share * 100.0
    );
    drop(gw);
    fleet.shutdown().await;
}
