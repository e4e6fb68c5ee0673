//! TLS on the public listener, end to end: HTTPS over HTTP/1.1 (kvgate's own loop for a body
//! with a length, hyper for a chunked body and for the admin routes) and over HTTP/2 by ALPN;
//! SSE through TLS; client certificates required, optional and missing; certificate reload with
//! a connection open; handshakes that fail or never come do not disturb other clients; the admin
//! listener plain by default and, with `server.tls.admin`, TLS with the same pair and client
//! authentication.
//!
//! Certificates are made at test time (`common/pki.rs`); the gateway listens on 127.0.0.1:0.

mod common;
#[path = "common/pki.rs"]
mod pki;

use common::*;
use kvgate::config::{ClientAuth, Config, ServerTlsConfig};
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Via {
    /// HTTP/1.1, a body with a `content-length`: kvgate's own loop.
    H1,
    /// HTTP/1.1, a chunked body: hyper.
    Hyper,
    /// HTTP/2, chosen by ALPN: hyper.
    H2,
}

/// A gateway with TLS in front of one mock, and what a client needs to trust it.
struct Tls {
    gw: Gateway,
    mock: Mock,
    ca: pki::Ca,
    dir: PathBuf,
    cert_file: String,
    key_file: String,
}

async fn start(edit: impl FnOnce(&mut Config, &pki::Ca, &PathBuf)) -> Tls {
    let mock = Mock::start("a").await;
    let ca = pki::Ca::new("kvgate test CA");
    let dir = pki::dir();
    let (cert_file, key_file) = ca.server().write(&dir, "server");
    let mut c = config_for(&[mock.url()]);
    c.server.tls = Some(ServerTlsConfig {
        cert_file: cert_file.clone(),
        key_file: key_file.clone(),
        reload_interval_ms: 50,
        ..Default::default()
    });
    edit(&mut c, &ca, &dir);
    c.validate().unwrap();
    let gw = Gateway::start(c).await;
    Tls {
        gw,
        mock,
        ca,
        dir,
        cert_file,
        key_file,
    }
}

impl Tls {
    fn url(&self, path: &str) -> String {
        format!("https://{}{}", self.gw.addr, path)
    }
}

/// A client trusting only `ca_pem`, speaking the protocol of `via`.
fn client_for(ca_pem: &str, via: Via, identity: Option<&pki::Leaf>) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .timeout(Duration::from_secs(15));
    b = match via {
        Via::H1 | Via::Hyper => b.http1_only(),
        Via::H2 => b.http2_prior_knowledge(),
    };
    if let Some(leaf) = identity {
        b = b.identity(reqwest::Identity::from_pem(leaf.identity_pem().as_bytes()).unwrap());
    }
    b.build().unwrap()
}

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;

/// A proxied POST as `via` sends it.
async fn post(
    c: &reqwest::Client,
    url: String,
    via: Via,
    body: &'static str,
) -> reqwest::Result<reqwest::Response> {
    let req = c.post(url).header("content-type", "application/json");
    let req = match via {
        Via::H1 | Via::H2 => req.body(body),
        Via::Hyper => {
            let chunks: Vec<Result<&'static str, std::io::Error>> = vec![Ok(body)];
            req.body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        }
    };
    req.send().await
}

fn version(via: Via) -> http::Version {
    match via {
        Via::H2 => http::Version::HTTP_2,
        _ => http::Version::HTTP_11,
    }
}

macro_rules! over_every_path {
    ($($name:ident),* $(,)?) => {
        mod h1 {
            $(#[tokio::test] async fn $name() { super::$name(super::Via::H1).await })*
        }
        mod hyper {
            $(#[tokio::test] async fn $name() { super::$name(super::Via::Hyper).await })*
        }
        mod h2 {
            $(#[tokio::test] async fn $name() { super::$name(super::Via::H2).await })*
        }
    };
}

over_every_path!(
    proxied_posts_and_admin_routes_are_served_over_tls,
    sse_streams_through_tls,
    a_required_client_certificate_is_checked,
    an_optional_client_certificate_may_be_missing,
    a_reload_serves_new_connections_the_new_certificate_and_keeps_old_ones,
    the_admin_listener_serves_tls_with_the_same_pair_when_asked,
);

async fn proxied_posts_and_admin_routes_are_served_over_tls(via: Via) {
    let t = start(|_, _, _| {}).await;
    let c = client_for(&t.ca.pem, via, None);
    for _ in 0..3 {
        let resp = post(&c, t.url("/v1/chat/completions"), via, CHAT)
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.version(), version(via));
        assert_eq!(resp.headers()["x-kvgate-instance"], "i0");
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["object"], "chat.completion", "{v}");
    }
    assert_eq!(t.mock.count(), 3);
    assert_eq!(t.mock.received()[0].body, CHAT.as_bytes());
    let models = c.get(t.url("/v1/models")).send().await.unwrap();
    assert_eq!(models.status(), 200);
    assert_eq!(models.version(), version(via));
    let missing = c.get(t.url("/nowhere")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
}

async fn sse_streams_through_tls(via: Via) {
    let t = start(|_, _, _| {}).await;
    t.mock.set_mode(Mode::Stream {
        chunks: 4,
        delay: Duration::from_millis(100),
    });
    let c = client_for(&t.ca.pem, via, None);
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut resp = post(&c, t.url("/v1/chat/completions"), via, body)
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    // Events arrive one by one as the instance sends them, not all at the end.
    let mut arrivals = Vec::new();
    let mut text = String::new();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        arrivals.push(tokio::time::Instant::now());
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert_eq!(text.matches("data: ").count(), 5, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(arrivals.len() >= 4, "{} reads", arrivals.len());
    let spread = *arrivals.last().unwrap() - arrivals[0];
    assert!(spread >= Duration::from_millis(250), "{spread:?}");
}

async fn a_required_client_certificate_is_checked(via: Via) {
    let t = start(|c, ca, dir| {
        let ca_file = pki::write(dir, "clients.pem", &ca.pem);
        let tls = c.server.tls.as_mut().unwrap();
        tls.client_ca_file = Some(ca_file);
        tls.client_auth = ClientAuth::Required;
    })
    .await;
    let without = client_for(&t.ca.pem, via, None);
    assert!(
        post(&without, t.url("/v1/chat/completions"), via, CHAT)
            .await
            .is_err(),
        "served without a client certificate"
    );
    let stranger = pki::Ca::new("another CA").client("mallory");
    let wrong = client_for(&t.ca.pem, via, Some(&stranger));
    assert!(
        post(&wrong, t.url("/v1/chat/completions"), via, CHAT)
            .await
            .is_err(),
        "served with a certificate of another CA"
    );
    let leaf = t.ca.client("alice");
    let with = client_for(&t.ca.pem, via, Some(&leaf));
    let resp = post(&with, t.url("/v1/chat/completions"), via, CHAT)
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        t.mock.count(),
        1,
        "only the certified client reached the instance"
    );
    let metrics = with.get(t.url("/metrics")).send().await.unwrap();
    let text = metrics.text().await.unwrap();
    assert!(
        text.contains("kvgate_tls_handshake_failures_total{reason=\"error\"}"),
        "{text}"
    );
}

async fn an_optional_client_certificate_may_be_missing(via: Via) {
    let t = start(|c, ca, dir| {
        let ca_file = pki::write(dir, "clients.pem", &ca.pem);
        let tls = c.server.tls.as_mut().unwrap();
        tls.client_ca_file = Some(ca_file);
        tls.client_auth = ClientAuth::Optional;
    })
    .await;
    let leaf = t.ca.client("alice");
    for identity in [None, Some(&leaf)] {
        let c = client_for(&t.ca.pem, via, identity);
        let resp = post(&c, t.url("/v1/chat/completions"), via, CHAT)
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    let stranger = pki::Ca::new("another CA").client("mallory");
    let wrong = client_for(&t.ca.pem, via, Some(&stranger));
    assert!(post(&wrong, t.url("/v1/chat/completions"), via, CHAT)
        .await
        .is_err());
}

async fn a_reload_serves_new_connections_the_new_certificate_and_keeps_old_ones(via: Via) {
    let t = start(|_, _, _| {}).await;
    let old = client_for(&t.ca.pem, via, None);
    let resp = post(&old, t.url("/v1/chat/completions"), via, CHAT)
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();

    // A bad pair (a key that is not the certificate's) keeps the old one in force.
    let next_ca = pki::Ca::new("next CA");
    let next = next_ca.server();
    let other_key = next_ca.server().key_pem;
    pki::write(&t.dir, "server.crt", &next.cert_pem);
    pki::write(&t.dir, "server.key", &other_key);
    let errors = || {
        let text = kvgate::metrics::install().unwrap().render();
        text.lines()
            .find_map(|l| l.strip_prefix("kvgate_tls_cert_reloads_total{outcome=\"error\"} "))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert!(
        eventually(10, || errors() >= 1.0).await,
        "the bad pair was not noticed"
    );
    let fresh_old = client_for(&t.ca.pem, via, None);
    let resp = post(&fresh_old, t.url("/v1/chat/completions"), via, CHAT).await;
    assert_eq!(
        resp.unwrap().status(),
        200,
        "the old pair stays after a bad one"
    );

    // The good pair: new connections get it.
    assert_eq!(pki::write(&t.dir, "server.key", &next.key_pem), t.key_file);
    assert_eq!(
        pki::write(&t.dir, "server.crt", &next.cert_pem),
        t.cert_file
    );
    let ok = eventually_async(10, || async {
        let c = client_for(&next_ca.pem, via, None);
        matches!(post(&c, t.url("/v1/chat/completions"), via, CHAT).await, Ok(r) if r.status() == 200)
    })
    .await;
    assert!(ok, "new connections never saw the new certificate");
    let stale = client_for(&t.ca.pem, via, None);
    assert!(
        post(&stale, t.url("/v1/chat/completions"), via, CHAT)
            .await
            .is_err(),
        "a new connection still got the old certificate"
    );
    // The connection opened before the reload still works: `old` trusts only the old CA, so a
    // success here cannot be a new connection.
    let resp = post(&old, t.url("/v1/chat/completions"), via, CHAT)
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

/// Plain HTTP to the TLS port and a client that never speaks neither crash the gateway nor hold
/// up others; the silent one is closed at the handshake timeout.
#[tokio::test]
async fn failed_and_stalled_handshakes_do_not_disturb_other_clients() {
    let t = start(|c, _, _| {
        c.server.tls.as_mut().unwrap().handshake_timeout_ms = 300;
    })
    .await;
    let mut silent = tokio::net::TcpStream::connect(t.gw.addr).await.unwrap();
    let mut garbage = tokio::net::TcpStream::connect(t.gw.addr).await.unwrap();
    garbage
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let c = client_for(&t.ca.pem, Via::H1, None);
    for _ in 0..3 {
        let resp = post(&c, t.url("/v1/chat/completions"), Via::H1, CHAT)
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    // The garbage connection is closed (after an alert at most), never answered in HTTP.
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), garbage.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the garbage connection was left open");
    assert!(!got.starts_with(b"HTTP/"), "answered in plain HTTP");
    let started = tokio::time::Instant::now();
    let mut scratch = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read_to_end(&mut scratch)).await;
    assert!(
        read.is_ok(),
        "the silent connection outlived the handshake timeout"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    // Counted by the connection's task just after it dropped the socket: poll, not read once.
    let metrics = kvgate::metrics::install().unwrap();
    assert!(
        eventually(5, || metrics.render().contains(
            "kvgate_tls_handshake_failures_total{reason=\"timeout\"}"
        ))
        .await,
        "{}",
        metrics.render()
    );
    let resp = post(&c, t.url("/v1/chat/completions"), Via::H1, CHAT)
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

/// A missing or unusable certificate stops the start with an error naming the file.
#[tokio::test]
async fn an_unusable_certificate_stops_the_start_naming_the_file() {
    let mut c = config_for(&["http://127.0.0.1:9".to_string()]);
    c.server.tls = Some(ServerTlsConfig {
        cert_file: "/nonexistent/kvgate.crt".into(),
        key_file: "/nonexistent/kvgate.key".into(),
        ..Default::default()
    });
    let state = kvgate::app::AppState::new(c).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let e = kvgate::app::run(listener, state, async {})
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/kvgate.crt"), "{e}");
}

/// `server.tls.admin`: the admin listener shakes hands with the public listener's pair and
/// checks client certificates as it does; without it the admin listener stays plain HTTP.
async fn the_admin_listener_serves_tls_with_the_same_pair_when_asked(via: Via) {
    let plain = start(|c, _, _| c.server.admin_listen = "127.0.0.1:0".into()).await;
    let admin = plain.gw.admin_addr.unwrap();
    let r = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the admin listener is plain by default");

    let t = start(|c, ca, dir| {
        c.server.admin_listen = "127.0.0.1:0".into();
        let tls = c.server.tls.as_mut().unwrap();
        tls.admin = true;
        tls.client_ca_file = Some(pki::write(dir, "clients.pem", &ca.pem));
        tls.client_auth = ClientAuth::Required;
    })
    .await;
    let admin = t.gw.admin_addr.unwrap();
    assert!(
        reqwest::get(format!("http://{admin}/health"))
            .await
            .is_err(),
        "plain HTTP answered on a TLS admin listener"
    );
    let without = client_for(&t.ca.pem, via, None);
    assert!(
        without
            .get(format!("https://{admin}/metrics"))
            .send()
            .await
            .is_err(),
        "the admin listener served without a client certificate"
    );
    let leaf = t.ca.client("prometheus");
    let with = client_for(&t.ca.pem, via, Some(&leaf));
    for path in ["/metrics", "/admin/instances", "/health"] {
        let r = with
            .get(format!("https://{admin}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.version(), version(via), "{path}");
    }
    // The public listener no longer serves the admin surface, over TLS as before.
    let r = with.get(t.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

/// A client config trusting only `ca`, speaking only the TLS versions `versions`.
fn rustls_client(
    ca: &pki::Ca,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> std::sync::Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert.der().clone()).unwrap();
    let mut c = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    std::sync::Arc::new(c)
}

/// A client that speaks TLS 1.2 only shakes hands (TLS 1.2 is the oldest version served) and is
/// served a proxied request.
#[tokio::test]
async fn a_client_limited_to_tls_1_2_is_served() {
    let t = start(|_, _, _| {}).await;
    let connector =
        tokio_rustls::TlsConnector::from(rustls_client(&t.ca, &[&rustls::version::TLS12]));
    let tcp = tokio::net::TcpStream::connect(t.gw.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .expect("TLS 1.2 handshake");
    let (_, conn) = tls.get_ref();
    assert_eq!(
        conn.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
    assert_eq!(conn.alpn_protocol(), Some(&b"http/1.1"[..]));
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{CHAT}",
        CHAT.len()
    );
    tls.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    // A TLS peer may close without close_notify; what was read until then counts.
    let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("served_by"), "{text}");
    assert_eq!(t.mock.count(), 1);
}

/// A ClientHello offering TLS 1.1 at most (no `supported_versions` extension); rustls clients
/// cannot speak anything older than 1.2, so the bytes are written here. It carries
/// `signature_algorithms`, which rustls reads before it picks a version: without it the refusal
/// would be a `handshake_failure` for the missing extension, not the version's alert.
fn tls_1_1_client_hello() -> Vec<u8> {
    let mut hello = vec![0x03, 0x02]; // client_version: TLS 1.1
    hello.extend_from_slice(&[0x5a; 32]); // random
    hello.push(0); // no session id
                   // TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA, TLS_RSA_WITH_AES_128_CBC_SHA
    hello.extend_from_slice(&[0x00, 0x04, 0xc0, 0x13, 0x00, 0x2f]);
    hello.extend_from_slice(&[0x01, 0x00]); // compression: null
                                            // Extensions: signature_algorithms (13) = rsa_pkcs1_sha256, ecdsa_secp256r1_sha256.
    let sigalgs = [0x00, 0x0d, 0x00, 0x06, 0x00, 0x04, 0x04, 0x01, 0x04, 0x03];
    hello.extend_from_slice(&(sigalgs.len() as u16).to_be_bytes());
    hello.extend_from_slice(&sigalgs);
    let mut handshake = vec![0x01]; // ClientHello
    handshake.extend_from_slice(&(hello.len() as u32).to_be_bytes()[1..]);
    handshake.extend(hello);
    let mut record = vec![0x16, 0x03, 0x01]; // handshake record, TLS 1.0 record version
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend(handshake);
    record
}

/// A client offering nothing newer than TLS 1.1 is refused with a `protocol_version` alert, and
/// the gateway goes on serving TLS 1.2 clients.
#[tokio::test]
async fn a_client_limited_to_tls_1_1_is_refused_with_a_protocol_version_alert() {
    let t = start(|_, _, _| {}).await;
    let mut old = tokio::net::TcpStream::connect(t.gw.addr).await.unwrap();
    old.write_all(&tls_1_1_client_hello()).await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), old.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the TLS 1.1 connection was left open");
    // One alert record: content type 21, two bytes of alert: fatal (2), protocol_version (70).
    assert!(got.len() >= 7, "no alert: {got:?}");
    assert_eq!(got[0], 0x15, "not an alert record: {got:?}");
    assert_eq!(&got[3..7], &[0x00, 0x02, 0x02, 70], "{got:?}");
    let connector =
        tokio_rustls::TlsConnector::from(rustls_client(&t.ca, &[&rustls::version::TLS12]));
    let tcp = tokio::net::TcpStream::connect(t.gw.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    connector
        .connect(name, tcp)
        .await
        .expect("a TLS 1.2 client after the refused one");
}
