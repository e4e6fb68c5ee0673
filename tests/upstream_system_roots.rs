//! `[upstream.tls] system_roots = true`: an `https://` instance whose certificate chains to one
//! of the system's CA certificates is reached without a `ca_file`; one whose certificate chains
//! to no system root is never reached; no usable system certificate stops the start-up.
//!
//! The system's roots are pointed at test CAs with `SSL_CERT_FILE`, which is process-wide: this
//! binary holds one test so nothing else reads it meanwhile.

mod common;
#[path = "common/pki.rs"]
mod pki;
#[path = "common/tls_engine.rs"]
mod tls_engine;

use common::*;
use kvgate::config::UpstreamTlsConfig;

fn system_roots_config(url: &str) -> kvgate::config::Config {
    let mut c = config_for(&[url.to_string()]);
    c.upstream.tls = Some(UpstreamTlsConfig {
        system_roots: true,
        ..Default::default()
    });
    c.upstream.max_attempts = 1;
    c.validate().expect("valid");
    c
}

async fn status(gw: &Gateway) -> u16 {
    client()
        .post(gw.url("/v1/completions"))
        .json(&serde_json::json!({ "model": "m", "prompt": "hello" }))
        .send()
        .await
        .expect("answered")
        .status()
        .as_u16()
}

#[tokio::test]
async fn system_roots_trust_what_the_system_trusts_and_nothing_else() {
    let public = pki::Ca::new("a public CA");
    let other = pki::Ca::new("a CA the system does not know");
    let dir = pki::dir();
    let (engine, mock) = tls_engine::tls_engine(&public, None).await;

    std::env::set_var("SSL_CERT_FILE", pki::write(&dir, "system.pem", &public.pem));
    let gw = Gateway::start(system_roots_config(&engine.url)).await;
    assert!(
        eventually(10, || gw.state.fleet.any_usable(gw.state.clock.now_ms())).await,
        "health checks over TLS failed"
    );
    assert_eq!(status(&gw).await, 200);
    let served = mock.count();
    assert!(served >= 1, "the engine behind TLS was not reached");
    let handshakes = engine.handshakes.load(std::sync::atomic::Ordering::SeqCst);
    assert!(handshakes >= 1, "no TLS handshake completed");
    drop(gw);

    std::env::set_var("SSL_CERT_FILE", pki::write(&dir, "others.pem", &other.pem));
    let gw = Gateway::start(system_roots_config(&engine.url)).await;
    let s = status(&gw).await;
    assert!(matches!(s, 502 | 503), "{s}");
    assert_eq!(
        mock.count(),
        served,
        "a request crossed a connection no system root vouches for"
    );
    assert_eq!(
        engine.handshakes.load(std::sync::atomic::Ordering::SeqCst),
        handshakes,
        "a handshake completed with a certificate no system root vouches for"
    );
    drop(gw);

    std::env::set_var(
        "SSL_CERT_FILE",
        pki::write(&dir, "none.pem", "no certificates"),
    );
    std::env::set_var("SSL_CERT_DIR", dir.join("no-such-dir"));
    let e = kvgate::app::AppState::new(system_roots_config(&engine.url))
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("system's CA certificates"), "{e}");
}
