//! Client API keys end to end, over both serving paths (kvgate's HTTP/1.1 loop for a body with a
//! length, hyper for a chunked body): 401 for a missing or wrong key in either header style, 200
//! for a right one, 403 or a hidden 404 for a model outside the key's allow-list, a keys file
//! reloaded without restart, and client-only headers (the key, spoofed `x-kvgate-*`) kept from
//! the instance.

mod common;

use common::*;
use kvgate::config::Config;

#[derive(Clone, Copy, Debug)]
enum Via {
    H1,
    Hyper,
}

const BODY: &str = r#"{"model":"m","prompt":"hello","max_tokens":1}"#;

async fn post(gw: &Gateway, via: Via, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = client()
        .post(gw.url("/v1/completions"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req = match via {
        Via::H1 => req.body(BODY),
        Via::Hyper => {
            let chunks: Vec<Result<&'static str, std::io::Error>> = vec![Ok(BODY)];
            req.body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        }
    };
    req.send().await.expect("answered")
}

fn keys_file(text: &str) -> std::path::PathBuf {
    let path = fresh_dir("auth").join("keys.toml");
    std::fs::write(&path, text).unwrap();
    path
}

async fn gateway(keys: &str, f: impl FnOnce(&mut Config)) -> (Mock, Gateway, std::path::PathBuf) {
    let a = Mock::start("a").await;
    let mut c = config_for(&[a.url()]);
    let path = keys_file(keys);
    c.auth.enabled = true;
    c.auth.keys_file = path.to_string_lossy().into_owned();
    c.auth.reload_interval_ms = 50;
    f(&mut c);
    let gw = Gateway::start(c).await;
    assert!(eventually(10, || gw.state.fleet.any_usable(gw.state.clock.now_ms())).await);
    (a, gw, path)
}

const KEYS: &str = r#"
[[keys]]
key = "sk-good"
tenant = "alpha"

[[keys]]
key = "sk-other-model"
tenant = "beta"
models = ["not-m"]
"#;

async fn error_code(r: reqwest::Response) -> String {
    let v: serde_json::Value = r.json().await.unwrap();
    v["error"]["code"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn keys_are_required_on_both_paths() {
    let (a, gw, _p) = gateway(KEYS, |_| {}).await;
    for via in [Via::H1, Via::Hyper] {
        let r = post(&gw, via, &[]).await;
        assert_eq!(r.status(), 401, "{via:?}");
        assert_eq!(r.headers()["www-authenticate"], "Bearer");
        assert_eq!(error_code(r).await, "invalid_api_key");
        for h in [("authorization", "Bearer sk-bad"), ("x-api-key", "sk-bad")] {
            let r = post(&gw, via, &[h]).await;
            assert_eq!(r.status(), 401, "{via:?} {h:?}");
        }
        for h in [
            ("authorization", "Bearer sk-good"),
            ("x-api-key", "sk-good"),
        ] {
            let r = post(&gw, via, &[h]).await;
            assert_eq!(r.status(), 200, "{via:?} {h:?}");
        }
        let r = post(&gw, via, &[("x-api-key", "sk-other-model")]).await;
        assert_eq!(r.status(), 403, "{via:?}");
        assert_eq!(error_code(r).await, "model_not_allowed");
    }
    // Nothing refused reached the instance; the key and spoofed headers never do.
    let got = a.received();
    assert_eq!(got.len(), 4);
    let r = post(
        &gw,
        Via::H1,
        &[("x-api-key", "sk-good"), ("x-kvgate-instance", "spoof")],
    )
    .await;
    assert_eq!(r.status(), 200);
    for rec in a.received() {
        assert!(rec.headers.get("authorization").is_none());
        assert!(rec.headers.get("x-api-key").is_none());
        assert!(rec.headers.get("x-kvgate-instance").is_none());
    }
    assert_eq!(gw.get_text("/health").await, "ok");
}

#[tokio::test]
async fn hidden_models_answer_404() {
    let (_a, gw, _p) = gateway(KEYS, |c| c.auth.hide_disallowed_models = true).await;
    for via in [Via::H1, Via::Hyper] {
        let r = post(&gw, via, &[("x-api-key", "sk-other-model")]).await;
        assert_eq!(r.status(), 404, "{via:?}");
        assert_eq!(error_code(r).await, "model_not_found");
    }
}

#[tokio::test]
async fn keys_file_reloads_without_restart() {
    let (_a, gw, path) = gateway(KEYS, |_| {}).await;
    let r = post(&gw, Via::H1, &[("x-api-key", "sk-new")]).await;
    assert_eq!(r.status(), 401);
    std::fs::write(&path, "[[keys]]\nkey = \"sk-new\"\ntenant = \"gamma\"\n").unwrap();
    let reloaded = eventually_async(10, || async {
        post(&gw, Via::H1, &[("x-api-key", "sk-new")])
            .await
            .status()
            == 200
    })
    .await;
    assert!(reloaded, "new key never accepted");
    // A broken file keeps the keys in force.
    std::fs::write(&path, "not toml [").unwrap();
    for via in [Via::H1, Via::Hyper] {
        let r = post(&gw, via, &[("x-api-key", "sk-new")]).await;
        assert_eq!(r.status(), 200, "{via:?}");
        let r = post(&gw, via, &[("x-api-key", "sk-good")]).await;
        assert_eq!(r.status(), 401, "{via:?}");
    }
}

#[tokio::test]
async fn models_list_needs_a_key_and_shows_only_allowed_models() {
    let (_a, gw, _p) = gateway(KEYS, |_| {}).await;
    let ids = |key: &'static str| {
        let gw = &gw;
        async move {
            let r = client()
                .get(gw.url("/v1/models"))
                .header("x-api-key", key)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let v: serde_json::Value = r.json().await.unwrap_or_default();
            let ids: Vec<String> = v["data"]
                .as_array()
                .map(|d| {
                    d.iter()
                        .filter_map(|m| m["id"].as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            (status, ids)
        }
    };
    let listed = eventually_async(10, || async { ids("sk-good").await.1 == ["m"] }).await;
    assert!(listed, "{:?}", ids("sk-good").await);
    assert_eq!(ids("sk-other-model").await, (200, vec![]));
    assert_eq!(ids("sk-bad").await.0, 401);
}
