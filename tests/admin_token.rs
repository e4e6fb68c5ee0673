//! With an admin token, `/admin/*` and `/metrics` answer only to `Authorization: Bearer <token>`;
//! `/health`, `/ready` and the inference endpoints are untouched by it.

mod common;

use common::*;

const TOKEN: &str = "admin-token-for-tests-0123456789";

fn token_file(name: &str, text: &str) -> std::path::PathBuf {
    let path = fresh_dir(&format!("admin-{name}")).join("token");
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_surface_needs_the_token_and_probes_do_not() {
    let engine = Mock::start("e0").await;
    let mut cfg = config_for(&[engine.url()]);
    cfg.auth.admin_token_file = token_file("ok", &format!("{TOKEN}\n"))
        .to_string_lossy()
        .into_owned();
    let gw = Gateway::start(cfg).await;
    let c = client();
    for path in [
        "/metrics",
        "/admin/instances",
        "/admin/decisions",
        "/admin/index",
        "/admin/cluster",
        "/admin/admission",
    ] {
        for auth in [None, Some("Bearer wrong-token-wrong-token"), Some(TOKEN)] {
            let mut req = c.get(gw.url(path));
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 401, "{path} with {auth:?}");
            assert_eq!(r.headers()["www-authenticate"], "Bearer");
            let v: serde_json::Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], "invalid_admin_token", "{path}");
        }
        let r = c
            .get(gw.url(path))
            .header("authorization", format!("Bearer {TOKEN}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path} with the token");
    }
    for path in ["/health", "/ready"] {
        let r = c.get(gw.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path} is for probes");
    }
    // The inference endpoints do not take the admin token's place of API keys.
    let r = c
        .post(gw.url("/v1/chat/completions"))
        .json(&serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[test]
fn a_short_or_missing_token_file_stops_the_start() {
    let mut cfg = config_for(&["http://127.0.0.1:1".into()]);
    cfg.auth.admin_token_file = token_file("short", "short").to_string_lossy().into_owned();
    let e = kvgate::app::AppState::new(cfg.clone())
        .err()
        .expect("refused");
    assert!(e.to_string().contains("at least 16 bytes"), "{e}");
    cfg.auth.admin_token_file = "/nonexistent/kvgate-admin-token".into();
    let e = kvgate::app::AppState::new(cfg).err().expect("refused");
    assert!(e.to_string().contains("auth.admin_token_file"), "{e}");
}
