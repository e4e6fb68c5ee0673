//! `server.admin_listen`: a second listener serving only the admin surface.
//!
//! With it set, `/admin/*` and `/metrics` are served there only (the main listener answers them
//! 404 in the OpenAI error shape, on kvgate's own HTTP/1.1 loop's hand-off and on HTTP/2 alike),
//! `/health` and `/ready` are on both, the inference endpoints on the main listener only; the
//! admin token still applies; the admin listener keeps `[server.limits]` with a connection cap
//! of its own; graceful shutdown closes it too. In front of real instances it is the default
//! (on loopback), unless an admin token or `admin_listen = "main"` keeps the surface on the main
//! listener.

mod common;

use common::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ADMIN: [&str; 6] = [
    "/metrics",
    "/admin/instances",
    "/admin/decisions",
    "/admin/index",
    "/admin/cluster",
    "/admin/admission",
];
const TOKEN: &str = "admin-token-for-tests-0123456789";

/// How a client reaches the gateway.
#[derive(Clone, Copy, Debug)]
enum Via {
    /// HTTP/1.1: kvgate's own loop, which hands every non-proxied request to hyper.
    H1,
    /// HTTP/2 with prior knowledge: hyper from the first byte.
    H2,
}

fn client_via(via: Via) -> reqwest::Client {
    let b = reqwest::Client::builder().timeout(Duration::from_secs(15));
    match via {
        Via::H1 => b.http1_only(),
        Via::H2 => b.http2_prior_knowledge(),
    }
    .build()
    .unwrap()
}

fn chat() -> serde_json::Value {
    serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
}

async fn gateway(engine: &Mock, token: bool) -> Gateway {
    let mut cfg = config_for(&[engine.url()]);
    cfg.server.admin_listen = "127.0.0.1:0".into();
    if token {
        let path = fresh_dir("admin-listener").join("token");
        std::fs::write(&path, TOKEN).unwrap();
        cfg.auth.admin_token_file = path.to_string_lossy().into_owned();
    }
    Gateway::start(cfg).await
}

async fn status_and_code(r: reqwest::Response) -> (u16, String) {
    let status = r.status().as_u16();
    let v: serde_json::Value = r.json().await.unwrap_or_default();
    (
        status,
        v["error"]["code"].as_str().unwrap_or("").to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_surface_is_served_on_its_own_listener_only() {
    let engine = Mock::start("e0").await;
    let gw = gateway(&engine, false).await;
    assert!(eventually(5, || gw.state.fleet.any_usable(gw.state.clock.now_ms())).await);
    for via in [Via::H1, Via::H2] {
        let c = client_via(via);
        // The same connection first serves a proxied request (on HTTP/1.1: kvgate's own loop),
        // then the admin paths (handed to hyper).
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .json(&chat())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{via:?}: inference on the main listener");
        for path in ADMIN {
            let r = c.get(gw.url(path)).send().await.unwrap();
            assert_eq!(
                r.headers()["content-type"],
                "application/json",
                "{via:?} {path}"
            );
            assert_eq!(
                status_and_code(r).await,
                (404, "not_found".to_string()),
                "{via:?}: {path} on the main listener"
            );
            let r = c.get(gw.admin_url(path)).send().await.unwrap();
            assert_eq!(r.status(), 200, "{via:?}: {path} on the admin listener");
        }
        for path in ["/health", "/ready"] {
            for url in [gw.url(path), gw.admin_url(path)] {
                let r = c.get(&url).send().await.unwrap();
                assert_eq!(r.status(), 200, "{via:?}: {url}");
            }
        }
        // The admin listener serves no inference, whatever the method or path.
        let r = c
            .post(gw.admin_url("/v1/chat/completions"))
            .json(&chat())
            .send()
            .await
            .unwrap();
        assert_eq!(
            status_and_code(r).await.0,
            404,
            "{via:?}: inference on the admin listener"
        );
        let r = c.get(gw.admin_url("/v1/models")).send().await.unwrap();
        assert_eq!(status_and_code(r).await.0, 404, "{via:?}");
    }
    // Only the main listener's requests reached the engine.
    assert_eq!(engine.count(), 2);
    // The metrics served on the admin listener count the main listener's requests.
    let text = client()
        .get(gw.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("kvgate_requests_total"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_token_still_applies_on_the_admin_listener() {
    let engine = Mock::start("e0").await;
    let gw = gateway(&engine, true).await;
    let c = client();
    for path in ADMIN {
        let r = c.get(gw.admin_url(path)).send().await.unwrap();
        assert_eq!(r.headers()["www-authenticate"], "Bearer", "{path}");
        assert_eq!(
            status_and_code(r).await,
            (401, "invalid_admin_token".to_string())
        );
        let r = c
            .get(gw.admin_url(path))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path} with the token");
        // The main listener does not serve it even with the token.
        let r = c.get(gw.url(path)).bearer_auth(TOKEN).send().await.unwrap();
        assert_eq!(r.status(), 404, "{path} on the main listener");
    }
    for path in ["/health", "/ready"] {
        let r = c.get(gw.admin_url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path} needs no token");
    }
}

/// A raw connection: sends `GET path` and reads the whole answer (`connection: close`).
async fn raw_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// True when the peer closes `s` (end of file or reset) within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(within, s.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_has_the_limits_and_a_connection_cap_of_its_own() {
    let engine = Mock::start("e0").await;
    let mut cfg = config_for(&[engine.url()]);
    cfg.server.admin_listen = "127.0.0.1:0".into();
    cfg.server.limits.max_connections = 2;
    cfg.server.limits.evict_idle_at_capacity = false;
    cfg.server.limits.idle_timeout_ms = 60_000;
    let gw = Gateway::start(cfg).await;
    let admin = gw.admin_addr.unwrap();

    // The main listener at its cap leaves the admin listener's places free.
    let mut main_held = Vec::new();
    for _ in 0..2 {
        main_held.push(TcpStream::connect(gw.addr).await.unwrap());
    }
    assert!(eventually(5, || gw.state.limits.open_connections() == 2).await);
    assert!(raw_get(admin, "/health").await.starts_with("HTTP/1.1 200"));
    // The server closes a connection before it gives its place back: until it has, the two
    // below could count that one and the second of them be refused in place of the third.
    let admin_limits = gw.state.admin_limits.as_ref().unwrap();
    assert!(eventually(5, || admin_limits.open_connections() == 0).await);

    // The admin listener at its own cap answers the 503 of the main listener's cap.
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(TcpStream::connect(admin).await.unwrap());
    }
    assert!(eventually(5, || admin_limits.open_connections() == 2).await);
    let refused = raw_get(admin, "/metrics").await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("too_many_connections"), "{refused}");
    // A freed place is taken again.
    drop(held.pop());
    let ok = eventually_async(5, || async {
        raw_get(admin, "/metrics").await.starts_with("HTTP/1.1 200")
    })
    .await;
    assert!(ok, "the freed admin place was not reused");
    drop(main_held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_closes_idle_and_trickling_connections() {
    let engine = Mock::start("e0").await;
    let mut cfg = config_for(&[engine.url()]);
    cfg.server.admin_listen = "127.0.0.1:0".into();
    cfg.server.limits.idle_timeout_ms = 300;
    cfg.server.limits.header_read_timeout_ms = 300;
    let gw = Gateway::start(cfg).await;
    let admin = gw.admin_addr.unwrap();
    // Nothing sent: closed at the idle timeout.
    let mut idle = TcpStream::connect(admin).await.unwrap();
    assert!(closed_within(&mut idle, Duration::from_secs(5)).await);
    // Half a head: closed at the header timeout, unanswered.
    let mut slow = TcpStream::connect(admin).await.unwrap();
    slow.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "the trickling connection was not closed");
    assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_the_admin_listener_and_drains_its_connections() {
    let engine = Mock::start("e0").await;
    let mut cfg = config_for(&[engine.url()]);
    cfg.server.admin_listen = "127.0.0.1:0".into();
    // Far beyond the test's bound: the drain, not the grace period, must end the run.
    cfg.server.shutdown_grace_ms = 60_000;
    let mut gw = Gateway::start(cfg).await;
    let admin = gw.admin_addr.unwrap();
    // A kept-alive admin connection between requests.
    let c = client_via(Via::H1);
    assert_eq!(
        c.get(gw.admin_url("/metrics"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    gw.shutdown();
    let join = gw.join.take().unwrap();
    tokio::time::timeout(Duration::from_secs(10), join)
        .await
        .expect("the gateway stops once both listeners' connections drained")
        .unwrap()
        .unwrap();
    assert!(
        TcpStream::connect(admin).await.is_err(),
        "admin listener still open"
    );
    assert!(
        TcpStream::connect(gw.addr).await.is_err(),
        "main listener still open"
    );
}

/// In front of real instances the admin surface is off the main listener unless the config puts
/// it there: the default (`admin_listen` left empty, no admin token) is a listener of its own on
/// loopback. The harness binds that listener on 127.0.0.1 port 0, never the default's port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_front_of_static_instances_the_admin_surface_is_off_the_main_listener_by_default() {
    let engine = Mock::start("e0").await;
    let mut cfg = config_for(&[engine.url()]);
    cfg.server.admin_listen = kvgate::config::Config::default().server.admin_listen;
    assert!(cfg.server.admin_listen.is_empty(), "the default is empty");
    let gw = Gateway::start(cfg).await;
    assert_eq!(
        gw.state.config.server.admin_listen,
        kvgate::config::DEFAULT_ADMIN_LISTEN
    );
    let default: std::net::SocketAddr = kvgate::config::DEFAULT_ADMIN_LISTEN.parse().unwrap();
    assert!(default.ip().is_loopback());
    assert!(gw.admin_addr.is_some_and(|a| a.ip().is_loopback()));
    assert!(eventually(5, || gw.state.fleet.any_usable(gw.state.clock.now_ms())).await);
    let c = client();
    for path in ADMIN {
        let r = c.get(gw.url(path)).send().await.unwrap();
        assert_eq!(
            status_and_code(r).await,
            (404, "not_found".to_string()),
            "{path} on the main listener"
        );
        let r = c.get(gw.admin_url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path} on the admin listener");
    }
    for path in ["/health", "/ready"] {
        let r = c.get(gw.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path} stays on the main listener");
    }
    let r = c
        .post(gw.url("/v1/chat/completions"))
        .json(&chat())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// An admin token chooses the main listener: the default then keeps the admin surface there,
/// closed by the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_admin_token_the_default_keeps_the_surface_on_the_main_listener_closed() {
    let engine = Mock::start("e0").await;
    let mut cfg = config_for(&[engine.url()]);
    cfg.server.admin_listen = String::new();
    let path = fresh_dir("admin-default-token").join("token");
    std::fs::write(&path, TOKEN).unwrap();
    cfg.auth.admin_token_file = path.to_string_lossy().into_owned();
    let gw = Gateway::start(cfg).await;
    assert_eq!(
        gw.state.config.server.admin_listen,
        kvgate::config::ADMIN_ON_MAIN
    );
    assert!(gw.admin_addr.is_none());
    let c = client();
    for path in ADMIN {
        let r = c.get(gw.url(path)).send().await.unwrap();
        assert_eq!(
            status_and_code(r).await,
            (401, "invalid_admin_token".to_string()),
            "{path} without the token"
        );
        let r = c.get(gw.url(path)).bearer_auth(TOKEN).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path} with the token");
    }
}

#[tokio::test]
async fn an_admin_listener_without_admin_listen_is_refused() {
    let engine = Mock::start("e0").await;
    let cfg = config_for(&[engine.url()]);
    let state = kvgate::app::AppState::new(cfg).unwrap();
    let main = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let e = kvgate::app::run_with_admin(main, admin, state, async {})
        .await
        .unwrap_err();
    assert!(e.to_string().contains("server.admin_listen"), "{e}");
}
