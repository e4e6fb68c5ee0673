//! TLS to instances: an `https://` instance is reached through `[upstream.tls]` (its CA bundle,
//! and the gateway's client certificate when the engine requires one), for proxied requests,
//! streaming and health checks alike; an engine whose certificate the CA did not sign, or that
//! requires a certificate the gateway does not present, is never reached; bad settings and
//! files stop the start-up with an error naming them.
//!
//! The engine is a TLS terminator (tokio-rustls, certificates made at test time by
//! `common/pki.rs`) in front of a plain mock, all on 127.0.0.1 port 0.

mod common;
#[path = "common/pki.rs"]
mod pki;
#[path = "common/tls_engine.rs"]
mod tls_engine;

use common::*;
use kvgate::config::{Config, UpstreamTlsConfig};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tls_engine::{tls_engine, tls_engine_with};

fn with_tls(url: &str, tls: UpstreamTlsConfig) -> Config {
    let mut c = config_for(&[url.to_string()]);
    c.upstream.tls = Some(tls);
    c.upstream.max_attempts = 1;
    c.validate().expect("valid");
    c
}

async fn complete(gw: &Gateway, stream: bool) -> reqwest::Response {
    client()
        .post(gw.url("/v1/completions"))
        .json(&serde_json::json!({ "model": "m", "prompt": "hello", "stream": stream }))
        .send()
        .await
        .expect("answered")
}

fn usable(gw: &Gateway) -> bool {
    gw.state.fleet.any_usable(gw.state.clock.now_ms())
}

#[tokio::test]
async fn an_https_instance_is_reached_with_the_configured_ca() {
    let ca = pki::Ca::new("engines CA");
    let dir = pki::dir();
    let ca_file = pki::write(&dir, "ca.pem", &ca.pem);
    let (engine, mock) = tls_engine(&ca, None).await;
    let gw = Gateway::start(with_tls(
        &engine.url,
        UpstreamTlsConfig {
            ca_file,
            ..Default::default()
        },
    ))
    .await;
    assert!(
        eventually(10, || usable(&gw)).await,
        "health checks over TLS failed"
    );
    let r = complete(&gw, false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-kvgate-instance"], "i0");
    assert!(
        r.text().await.unwrap().contains("tls"),
        "the mock behind TLS answered"
    );
    mock.set_mode(Mode::Stream {
        chunks: 5,
        delay: Duration::from_millis(1),
    });
    let r = complete(&gw, true).await;
    assert_eq!(r.status(), 200);
    let body = r.text().await.unwrap();
    assert!(body.contains("[DONE]"), "{body}");
    // Keep-alive over TLS: requests share connections instead of a handshake each.
    mock.set_mode(Mode::Json);
    let before = engine.handshakes.load(Ordering::SeqCst);
    for _ in 0..10 {
        assert_eq!(complete(&gw, false).await.status(), 200);
    }
    let more = engine.handshakes.load(Ordering::SeqCst) - before;
    assert!(more < 10, "{more} handshakes for 10 sequential requests");
}

/// The CA bundle is re-read when it changes: an engine whose CA the gateway did not trust at
/// start becomes reachable once the bundle names it, without a restart; a bad bundle written
/// later keeps the good one in force.
#[tokio::test]
async fn a_changed_ca_bundle_applies_without_a_restart() {
    let engines_ca = pki::Ca::new("engines CA");
    let other = pki::Ca::new("another CA");
    let dir = pki::dir();
    let ca_file = pki::write(&dir, "ca.pem", &other.pem);
    let (engine, _mock) = tls_engine(&engines_ca, None).await;
    let gw = Gateway::start(with_tls(
        &engine.url,
        UpstreamTlsConfig {
            ca_file: ca_file.clone(),
            reload_interval_ms: 20,
            ..Default::default()
        },
    ))
    .await;
    assert_ne!(complete(&gw, false).await.status(), 200, "untrusted engine");
    pki::write(&dir, "ca.pem", &engines_ca.pem);
    let gw_ref = &gw;
    assert!(
        eventually_async(10, || async move {
            complete(gw_ref, false).await.status() == 200
        })
        .await,
        "the new CA bundle was not taken up"
    );
    // A broken bundle is refused; the one in force stays.
    pki::write(&dir, "ca.pem", "not a certificate");
    assert!(
        eventually_async(10, || async move {
            gw_ref
                .get_text("/metrics")
                .await
                .contains("kvgate_upstream_tls_reloads_total{outcome=\"error\"}")
        })
        .await,
        "the bad bundle was not counted"
    );
    assert_eq!(complete(&gw, false).await.status(), 200);
}

/// `server_name`: an engine reached by IP whose certificate names only a DNS name is verified
/// for that name.
#[tokio::test]
async fn server_name_verifies_engines_for_the_configured_name() {
    let ca = pki::Ca::new("engines CA");
    let dir = pki::dir();
    let ca_file = pki::write(&dir, "ca.pem", &ca.pem);
    let (engine, _mock) = tls_engine_with(&ca.server_for(&["engines.inference.svc"]), None).await;
    let by_ip = Gateway::start(with_tls(
        &engine.url,
        UpstreamTlsConfig {
            ca_file: ca_file.clone(),
            ..Default::default()
        },
    ))
    .await;
    assert_ne!(
        complete(&by_ip, false).await.status(),
        200,
        "the certificate does not name 127.0.0.1"
    );
    let named = Gateway::start(with_tls(
        &engine.url,
        UpstreamTlsConfig {
            ca_file,
            server_name: Some("engines.inference.svc".into()),
            ..Default::default()
        },
    ))
    .await;
    assert!(eventually(10, || usable(&named)).await);
    assert_eq!(complete(&named, false).await.status(), 200);
}

#[tokio::test]
async fn mutual_tls_presents_the_gateway_certificate() {
    let server_ca = pki::Ca::new("engines CA");
    let client_ca = pki::Ca::new("gateways CA");
    let dir = pki::dir();
    let ca_file = pki::write(&dir, "ca.pem", &server_ca.pem);
    let (cert_file, key_file) = client_ca.client("kvgate").write(&dir, "gateway");
    let (engine, _mock) = tls_engine(&server_ca, Some(&client_ca)).await;
    // With the client certificate: served.
    let gw = Gateway::start(with_tls(
        &engine.url,
        UpstreamTlsConfig {
            ca_file: ca_file.clone(),
            cert_file: Some(cert_file),
            key_file: Some(key_file),
            ..Default::default()
        },
    ))
    .await;
    assert!(eventually(10, || usable(&gw)).await);
    assert_eq!(complete(&gw, false).await.status(), 200);

    // Without one the engine refuses every handshake: never usable, requests answered 502/503.
    let handshakes = engine.handshakes.load(Ordering::SeqCst);
    let gw = Gateway::start(with_tls(
        &engine.url,
        UpstreamTlsConfig {
            ca_file,
            ..Default::default()
        },
    ))
    .await;
    let r = complete(&gw, false).await;
    assert!(matches!(r.status().as_u16(), 502 | 503), "{}", r.status());
    assert_eq!(engine.handshakes.load(Ordering::SeqCst), handshakes);
    assert!(
        eventually(10, || !usable(&gw)).await,
        "health checks passed without a client certificate"
    );
}

#[tokio::test]
async fn an_engine_certificate_from_another_ca_is_refused() {
    let ours = pki::Ca::new("engines CA");
    let theirs = pki::Ca::new("someone else's CA");
    let dir = pki::dir();
    let ca_file = pki::write(&dir, "ca.pem", &ours.pem);
    let (engine, mock) = tls_engine(&theirs, None).await;
    let gw = Gateway::start(with_tls(
        &engine.url,
        UpstreamTlsConfig {
            ca_file,
            ..Default::default()
        },
    ))
    .await;
    let r = complete(&gw, false).await;
    assert!(matches!(r.status().as_u16(), 502 | 503), "{}", r.status());
    assert!(
        eventually(10, || !usable(&gw)).await,
        "health checks passed against an untrusted certificate"
    );
    assert_eq!(
        mock.count(),
        0,
        "a request crossed an untrusted TLS connection"
    );
}

#[tokio::test]
async fn bad_settings_and_files_stop_the_start() {
    // An https:// instance without [upstream.tls].
    let c = config_for(&["https://127.0.0.1:8443".to_string()]);
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("pools[0].instances[0].url") && e.contains("upstream.tls"),
        "{e}"
    );
    // A certificate without its key, and the other way round.
    let mut c = config_for(&["https://127.0.0.1:8443".to_string()]);
    c.upstream.tls = Some(UpstreamTlsConfig {
        ca_file: "/ca.pem".into(),
        cert_file: Some("/c.pem".into()),
        key_file: None,
        ..Default::default()
    });
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("upstream.tls.key_file"));
    c.upstream.tls = Some(UpstreamTlsConfig {
        ca_file: String::new(),
        ..Default::default()
    });
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("upstream.tls.ca_file"));
    // ... unless the system's roots are trusted instead.
    c.upstream.tls = Some(UpstreamTlsConfig {
        ca_file: String::new(),
        system_roots: true,
        ..Default::default()
    });
    c.validate().expect("system_roots without ca_file");
    // Files that do not exist or hold no certificate: the state is not built.
    let dir = pki::dir();
    for ca_file in [
        "/nonexistent/ca.pem".to_string(),
        pki::write(&dir, "empty.pem", "not a certificate"),
    ] {
        let mut c = config_for(&["https://127.0.0.1:8443".to_string()]);
        c.upstream.tls = Some(UpstreamTlsConfig {
            ca_file: ca_file.clone(),
            ..Default::default()
        });
        c.validate().unwrap();
        let e = kvgate::app::AppState::new(c)
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains(&ca_file), "{e}");
    }
    // A key that does not match its certificate.
    let ca = pki::Ca::new("CA");
    let (cert_file, _) = ca.client("a").write(&dir, "a");
    let (_, other_key) = ca.client("b").write(&dir, "b");
    let mut c = config_for(&["https://127.0.0.1:8443".to_string()]);
    c.upstream.tls = Some(UpstreamTlsConfig {
        ca_file: pki::write(&dir, "ca.pem", &ca.pem),
        cert_file: Some(cert_file.clone()),
        key_file: Some(other_key),
        ..Default::default()
    });
    let e = kvgate::app::AppState::new(c)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains(&cert_file), "{e}");
}
