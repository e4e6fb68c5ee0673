//! Instance health, the models union, readiness, admin views and metrics exposition.

mod common;

use common::*;
use std::process::Command;

async fn get_json(gw: &Gateway, path: &str) -> serde_json::Value {
    client()
        .get(gw.url(path))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn chat(gw: &Gateway, body: &'static str) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
}

fn healthy_flag(v: &serde_json::Value, i: usize) -> bool {
    v["instances"][i]["healthy"].as_bool().unwrap()
}

#[tokio::test]
async fn active_checks_eject_and_recover() {
    let a = Mock::start("a").await;
    let b = Mock::start("b").await;
    let gw = Gateway::start(config_for(&[a.url(), b.url()])).await;
    a.set_healthy(false);
    let mut ejected = false;
    for _ in 0..250 {
        if !healthy_flag(&get_json(&gw, "/admin/instances").await, 0) {
            ejected = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(ejected, "unhealthy instance never taken out of rotation");
    let before = a.count();
    for _ in 0..6 {
        let r = chat(&gw, CHAT).await;
        assert_eq!(r.headers()["x-kvgate-instance"], "i1");
    }
    assert_eq!(a.count(), before);

    a.set_healthy(true);
    let mut recovered = false;
    for _ in 0..250 {
        if healthy_flag(&get_json(&gw, "/admin/instances").await, 0) {
            recovered = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(recovered, "instance never recovered");
    let mut served_by_a = false;
    for _ in 0..6 {
        if chat(&gw, CHAT).await.headers()["x-kvgate-instance"] == "i0" {
            served_by_a = true;
        }
    }
    assert!(served_by_a, "recovered instance gets no traffic");
}

#[tokio::test]
async fn no_healthy_instance_is_503_with_retry_after_and_not_ready() {
    let a = Mock::start("a").await;
    let gw = Gateway::start(config_for(&[a.url()])).await;
    assert_eq!(
        client()
            .get(gw.url("/ready"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    a.set_healthy(false);
    let mut unready = false;
    for _ in 0..250 {
        if client()
            .get(gw.url("/ready"))
            .send()
            .await
            .unwrap()
            .status()
            == 503
        {
            unready = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(unready);
    let r = chat(&gw, CHAT).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_healthy_instance");
    assert_eq!(
        client()
            .get(gw.url("/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn models_is_the_union_and_discovered_ids_route() {
    let a = Mock::start("a").await;
    let b = Mock::start("b").await;
    *a.state.models.lock() = vec!["m".into(), "m-lora-a".into()];
    *b.state.models.lock() = vec!["m".into(), "m-lora-b".into()];
    let gw = Gateway::start(config_for(&[a.url(), b.url()])).await;
    let mut ids = Vec::new();
    for _ in 0..250 {
        let v = get_json(&gw, "/v1/models").await;
        assert_eq!(v["object"], "list");
        ids = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect();
        if ids.len() == 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    ids.sort();
    assert_eq!(ids, ["m", "m-lora-a", "m-lora-b"]);
    let r = chat(
        &gw,
        r#"{"model":"m-lora-b","messages":[{"role":"user","content":"x"}]}"#,
    )
    .await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn admin_views_show_load_decisions_and_index() {
    let a = Mock::start("a").await;
    let gw = Gateway::start(config_for(&[a.url()])).await;
    assert_eq!(chat(&gw, CHAT).await.status(), 200);
    let d = get_json(&gw, "/admin/decisions").await;
    let last = &d["decisions"].as_array().unwrap()[0];
    assert_eq!(last["chosen"], "i0");
    assert!(last["decision"]["scores"].is_array(), "{last}");
    let idx = get_json(&gw, "/admin/index").await;
    assert!(idx["stats"].is_object(), "{idx}");
    assert_eq!(idx["instances"][0]["name"], "i0");
    // Engine load scraped from the mock's /metrics.
    let mut scraped = serde_json::Value::Null;
    for _ in 0..250 {
        let v = get_json(&gw, "/admin/instances").await;
        if !v["instances"][0]["engine"].is_null() {
            scraped = v;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(scraped["instances"][0]["engine"]["waiting"], 2, "{scraped}");
    // Each report carries the gateway's own in-flight count when it arrived (the one request,
    // or none once it finished): only the engine's excess over it counts as another client's.
    assert!(
        scraped["instances"][0]["engine"]["tracked_in_flight"]
            .as_u64()
            .is_some_and(|n| n <= 1),
        "{scraped}"
    );
    assert_eq!(
        scraped["instances"][0]["capacity_blocks"], 1000,
        "{scraped}"
    );
    assert!(scraped["instances"][0]["header_latency_ms"].is_number());
}

#[tokio::test]
async fn metrics_exposition_is_valid_prometheus() {
    let a = Mock::start("a").await;
    let gw = Gateway::start(config_for(&[a.url()])).await;
    assert_eq!(chat(&gw, CHAT).await.status(), 200);
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(r#"{"model":"x","messages":[{"role":"user","content":"x"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let resp = client().get(gw.url("/metrics")).send().await.unwrap();
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = resp.text().await.unwrap();
    for name in [
        "kvgate_requests_total",
        "kvgate_request_duration_seconds_bucket",
        "kvgate_routing_decisions_total",
        "kvgate_routing_decision_duration_seconds_bucket",
        "kvgate_rejected_requests_total",
        "kvgate_instance_healthy",
        "kvgate_index_blocks",
        "kvgate_index_memory_bytes",
        "kvgate_index_evicted_total",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    let healthy = text
        .lines()
        .find(|l| l.starts_with("kvgate_instance_healthy{"))
        .unwrap_or_default();
    assert!(healthy.contains("pool=\""), "no pool label: {healthy}");
    let value = |prefix: &str| -> Option<f64> {
        let line = text.lines().find(|l| l.starts_with(prefix))?;
        line.rsplit(' ').next()?.parse().ok()
    };
    for source in ["event", "local", "peer"] {
        let series = format!("kvgate_index_entries{{source=\"{source}\"}}");
        assert!(value(&series).is_some(), "{series} missing:\n{text}");
    }
    // The index's shards are allocated at start: its estimate is never zero.
    assert!(value("kvgate_index_memory_bytes").unwrap_or(0.0) > 0.0);
    assert!(text.contains("status=\"2xx\""));
    assert!(!text.contains("hello"), "prompt text leaked into labels");

    if Command::new("promtool").arg("--version").output().is_err() {
        eprintln!("SKIPPED promtool validation: promtool not installed (.ci/run installs the Debian `prometheus` package)");
        return;
    }
    let dir = fresh_dir("metrics").join("metrics.txt");
    std::fs::write(&dir, &text).unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("promtool check metrics < {}", dir.display()))
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&dir);
    assert!(
        out.status.success(),
        "promtool rejected /metrics:\n{}\n{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
