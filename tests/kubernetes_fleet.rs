//! A pool with `source = "kubernetes"` pointed at a fake API server whose EndpointSlices name
//! real mock engines: the gateway follows the watch from 2 to 3 to 1 engines while requests
//! keep succeeding; the same source over TLS with a CA file and a bearer token; and through
//! generated kubeconfig files: a token user, a client-certificate user against a server that
//! requires one, a missing context and an `exec` user (both refused with the name to fix).

mod common;

#[path = "common/pki.rs"]
mod pki;

use common::{client, eventually, Gateway, Mock};
use kvgate::config::Config;
use kvgate_discovery::fake_api::{pod, slice, FakeApi, NS, PODS, SLICES};
use kvgate_discovery::SourceKind;
use serde_json::json;

/// One slice per engine (each mock listens on its own port, as slices may).
fn engine_slice(i: usize, rv: &str, m: &Mock) -> serde_json::Value {
    slice(
        &format!("vllm-{i}"),
        rv,
        m.addr.port(),
        &[("127.0.0.1", &format!("vllm-{i}"), true, false)],
    )
}

fn serving(gw: &Gateway) -> Vec<String> {
    let view = gw.state.fleet.view();
    let mut v: Vec<String> = view.serving().map(|i| i.name.clone()).collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_pool_scales_2_3_1_through_watch_events_without_failures() {
    let mocks = [
        Mock::start("e0").await,
        Mock::start("e1").await,
        Mock::start("e2").await,
    ];
    let api = FakeApi::start().await.unwrap();
    api.list(
        SLICES,
        "10",
        vec![
            engine_slice(0, "10", &mocks[0]),
            engine_slice(1, "10", &mocks[1]),
        ],
    );
    let slices = api.watch(SLICES);
    api.list(PODS, "10", vec![]);

    let mut cfg: Config = common::config_for(&[]);
    let pool = &mut cfg.pools[0];
    pool.model = "k8s".into();
    pool.instances.clear();
    pool.discovery.source = SourceKind::Kubernetes;
    pool.discovery.api_server = Some(api.url());
    pool.discovery.namespace = Some(NS.into());
    pool.discovery.service = Some("vllm".into());
    pool.discovery.drain_grace_ms = 200;
    let gw = Gateway::start(cfg).await;
    assert!(
        eventually(10, || serving(&gw) == ["vllm-0", "vllm-1"]).await,
        "{:?}",
        serving(&gw)
    );

    let url = gw.url("/v1/chat/completions");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let c = client();
            let mut statuses = Vec::new();
            let mut i = 0u32;
            // At least 20 requests, and on until the scale-down has been seen.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || i < 20 {
                let r = c
                    .post(&url)
                    .json(&json!({"model": "k8s", "messages": [{"role": "user", "content": format!("q{i}")}]}))
                    .send()
                    .await;
                let who = r.as_ref().ok().and_then(|r| {
                    r.headers()
                        .get("x-kvgate-instance")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string)
                });
                statuses.push((r.map(|r| r.status().as_u16()).unwrap_or(0), who));
                i += 1;
            }
            statuses
        })
    };

    slices.event("ADDED", engine_slice(2, "11", &mocks[2]));
    assert!(
        eventually(10, || serving(&gw) == ["vllm-0", "vllm-1", "vllm-2"]).await,
        "{:?}",
        serving(&gw)
    );
    // The new engine takes traffic.
    assert!(
        eventually(10, || !mocks[2].state.received.lock().is_empty()).await,
        "vllm-2 never served"
    );

    slices.event("DELETED", engine_slice(0, "12", &mocks[0]));
    // Scaling down through readiness: vllm-1's endpoint turns terminating.
    slices.event(
        "MODIFIED",
        slice(
            "vllm-1",
            "13",
            mocks[1].addr.port(),
            &[("127.0.0.1", "vllm-1", false, true)],
        ),
    );
    assert!(
        eventually(10, || serving(&gw) == ["vllm-2"]).await,
        "{:?}",
        serving(&gw)
    );

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let statuses = load.await.unwrap();
    let failed: Vec<_> = statuses.iter().filter(|(s, _)| *s != 200).collect();
    assert!(
        failed.is_empty(),
        "failed requests: {failed:?} of {}",
        statuses.len()
    );
    let c = client();
    for i in 0..5 {
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .json(&json!({"model": "k8s", "messages": [{"role": "user", "content": format!("after {i}")}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let who = r
            .headers()
            .get("x-kvgate-instance")
            .and_then(|v| v.to_str().ok());
        assert_eq!(who, Some("vllm-2"), "after scaling to 1 only vllm-2 serves");
    }
    assert_eq!(
        api.seen(SLICES, false)[0].query["labelSelector"],
        "kubernetes.io/service-name=vllm"
    );
}

/// Serves `app` over TLS with `leaf` on `listener` until the test ends; with `client_ca`, only
/// to clients presenting a certificate it signed.
fn serve_tls(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    leaf: &pki::Leaf,
    client_ca: Option<&pki::Ca>,
) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.cert.der().clone()).unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                std::sync::Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut tls = builder.with_single_cert(certs, key).unwrap();
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(tls));
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let app = app.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await;
            });
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_pool_over_tls_with_a_ca_file_and_a_token() {
    let engine = Mock::start("e0").await;
    let ca = pki::Ca::new("kube-ca");
    let dir = pki::dir();
    let ca_file = pki::write(&dir, "ca.crt", &ca.pem);
    let token_file = pki::write(&dir, "token", "sa-token\n");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (api, app) = FakeApi::unserved(listener.local_addr().unwrap());
    serve_tls(listener, app, &ca.server(), None);
    api.list(
        PODS,
        "3",
        vec![pod(
            "vllm-0",
            "3",
            "127.0.0.1",
            true,
            json!({"app": "vllm", "kvgate.dev/role": "both"}),
            json!({}),
        )],
    );

    let mut cfg: Config = common::config_for(&[]);
    let pool = &mut cfg.pools[0];
    pool.model = "k8s-tls".into();
    pool.instances.clear();
    pool.discovery.source = SourceKind::Kubernetes;
    pool.discovery.api_server = Some(format!("https://localhost:{}", api.addr.port()));
    pool.discovery.ca_file = Some(ca_file.into());
    pool.discovery.token_file = Some(token_file.into());
    pool.discovery.namespace = Some(NS.into());
    pool.discovery.selector = Some("app=vllm".into());
    pool.discovery.port = Some(engine.addr.port());
    let gw = Gateway::start(cfg).await;
    assert!(
        eventually(10, || serving(&gw) == ["vllm-0"]).await,
        "{:?}",
        serving(&gw)
    );
    assert_eq!(
        api.seen(PODS, false)[0].auth.as_deref(),
        Some("Bearer sa-token")
    );
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .json(&json!({"model": "k8s-tls", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _ = std::fs::remove_dir_all(dir);
}

/// A kubeconfig whose current context `dev` uses cluster `c1` at `server` (its CA at
/// `ca.crt` beside the file, a relative path) and user `u1` with the `user` YAML lines.
fn kubeconfig(server: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: dev\n\
         clusters:\n- name: c1\n  cluster:\n    server: {server}\n    certificate-authority: ca.crt\n\
         contexts:\n- name: dev\n  context:\n    cluster: c1\n    user: u1\n    namespace: {NS}\n\
         users:\n- name: u1\n  user:\n{user}"
    )
}

/// A selector-mode pool reading its API server and credentials from the kubeconfig at `path`.
fn kubeconfig_pool(cfg: &mut Config, model: &str, path: &str, engine_port: u16) {
    let pool = &mut cfg.pools[0];
    pool.model = model.into();
    pool.instances.clear();
    pool.discovery.source = SourceKind::Kubernetes;
    pool.discovery.kubeconfig = Some(path.into());
    pool.discovery.selector = Some("app=vllm".into());
    pool.discovery.port = Some(engine_port);
}

fn one_pod(api: &FakeApi) {
    api.list(
        PODS,
        "3",
        vec![pod(
            "vllm-0",
            "3",
            "127.0.0.1",
            true,
            json!({"app": "vllm"}),
            json!({}),
        )],
    );
}

async fn chat_ok(gw: &Gateway, model: &str) {
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .json(&json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_token_user_over_tls() {
    let engine = Mock::start("e0").await;
    let ca = pki::Ca::new("kube-ca");
    let dir = pki::dir();
    pki::write(&dir, "ca.crt", &ca.pem);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (api, app) = FakeApi::unserved(listener.local_addr().unwrap());
    serve_tls(listener, app, &ca.server(), None);
    one_pod(&api);
    let server = format!("https://localhost:{}", api.addr.port());
    let path = pki::write(
        &dir,
        "config",
        &kubeconfig(&server, "    token: kc-token\n"),
    );

    let mut cfg: Config = common::config_for(&[]);
    kubeconfig_pool(&mut cfg, "kc-token", &path, engine.addr.port());
    let gw = Gateway::start(cfg).await;
    assert!(
        eventually(10, || serving(&gw) == ["vllm-0"]).await,
        "{:?}",
        serving(&gw)
    );
    let seen = api.seen(PODS, false);
    assert_eq!(seen[0].auth.as_deref(), Some("Bearer kc-token"));
    assert_eq!(seen[0].query["labelSelector"], "app=vllm", "{seen:?}");
    chat_ok(&gw, "kc-token").await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_client_certificate_user_over_mutual_tls() {
    use base64::Engine as _;
    let engine = Mock::start("e0").await;
    let ca = pki::Ca::new("kube-ca");
    let client_ca = pki::Ca::new("kube-client-ca");
    let dir = pki::dir();
    pki::write(&dir, "ca.crt", &ca.pem);
    let leaf = client_ca.client("system:serviceaccount:ns:kvgate");
    pki::write(&dir, "client.crt", &leaf.cert_pem);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (api, app) = FakeApi::unserved(listener.local_addr().unwrap());
    serve_tls(listener, app, &ca.server(), Some(&client_ca));
    one_pod(&api);
    let server = format!("https://localhost:{}", api.addr.port());
    // The certificate as a relative file, the key inline.
    let key_data = base64::engine::general_purpose::STANDARD.encode(&leaf.key_pem);
    let user = format!("    client-certificate: client.crt\n    client-key-data: {key_data}\n");
    let path = pki::write(&dir, "config", &kubeconfig(&server, &user));

    let mut cfg: Config = common::config_for(&[]);
    kubeconfig_pool(&mut cfg, "kc-cert", &path, engine.addr.port());
    let gw = Gateway::start(cfg).await;
    assert!(
        eventually(10, || serving(&gw) == ["vllm-0"]).await,
        "{:?}",
        serving(&gw)
    );
    assert_eq!(
        api.seen(PODS, false)[0].auth,
        None,
        "no token: the certificate"
    );
    chat_ok(&gw, "kc-cert").await;

    // Without the certificate the same server refuses the handshake: the test can fail.
    let none = pki::write(&dir, "config-none", &kubeconfig(&server, "    {}\n"));
    let dc = kvgate_discovery::DiscoveryConfig {
        source: SourceKind::Kubernetes,
        kubeconfig: Some(none.into()),
        selector: Some("app=vllm".into()),
        port: Some(engine.addr.port()),
        ..Default::default()
    };
    let (rx, task) =
        kvgate::discovery::start(&dc, tokio_util::sync::CancellationToken::new()).unwrap();
    assert!(
        eventually(10, || rx.borrow().error.is_some()).await,
        "a client without a certificate is refused"
    );
    task.abort();
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_missing_kubeconfig_context_or_an_exec_user_is_refused_by_name() {
    let dir = pki::dir();
    let ca = pki::Ca::new("kube-ca");
    pki::write(&dir, "ca.crt", &ca.pem);
    let token = pki::write(
        &dir,
        "token-config",
        &kubeconfig("https://127.0.0.1:6443", "    token: t\n"),
    );
    let mut dc = kvgate_discovery::DiscoveryConfig {
        source: SourceKind::Kubernetes,
        kubeconfig: Some(token.into()),
        context: Some("prod".into()),
        service: Some("vllm".into()),
        ..Default::default()
    };
    let cancel = tokio_util::sync::CancellationToken::new();
    let e = kvgate::discovery::start(&dc, cancel.clone())
        .expect_err("a missing context is refused")
        .to_string();
    assert!(e.contains("context \"prod\" not found"), "{e}");

    let exec = "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: aws\n      args: [eks, get-token]\n";
    dc.kubeconfig = Some(
        pki::write(
            &dir,
            "exec-config",
            &kubeconfig("https://127.0.0.1:6443", exec),
        )
        .into(),
    );
    dc.context = None;
    let e = kvgate::discovery::start(&dc, cancel)
        .expect_err("an exec user is refused")
        .to_string();
    assert!(e.contains("user \"u1\"") && e.contains("exec"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}
