//! A pool with `source = "kubernetes"` pointed at a fake API server whose EndpointSlices name
//! real mock engines: the gateway follows the watch from 2 to 3 to 1 engines while requests
//! keep succeeding; an SSE stream in flight on an engine being scaled down finishes whole while
//! new requests go elsewhere; pod labels set an instance's model (another model's pods are not
//! the pool's), role and data-parallel size, and its KV event streams start and stop with it;
//! an API server outage keeps the last fleet serving and recovery converges; the same source
//! over TLS with a CA file and a bearer token; and through generated kubeconfig files: a token
//! user, a client-certificate user against a server that requires one, a missing context and an
//! `exec` user (both refused with the name to fix).

mod common;

#[path = "common/pki.rs"]
mod pki;

use common::{ask, client, eventually, eventually_async, Gateway, Mock, Mode};
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

/// A config whose one pool (`model`, its own name: metrics are process-wide) follows the
/// EndpointSlices of Service `vllm` on `api`.
fn k8s_config(model: &str, api: &FakeApi, grace_ms: u64) -> Config {
    let mut cfg: Config = common::config_for(&[]);
    let pool = &mut cfg.pools[0];
    pool.model = model.into();
    pool.instances.clear();
    pool.discovery.source = SourceKind::Kubernetes;
    pool.discovery.api_server = Some(api.url());
    pool.discovery.namespace = Some(NS.into());
    pool.discovery.service = Some("vllm".into());
    pool.discovery.drain_grace_ms = grace_ms;
    cfg
}

async fn discovery_up(gw: &Gateway, pool: &str, up: u8) -> bool {
    let want = format!("kvgate_discovery_up{{pool=\"{pool}\"}} {up}");
    eventually_async(15, || async {
        gw.get_text("/metrics").await.contains(&want)
    })
    .await
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_in_flight_finishes_whole_through_a_scale_down() {
    use std::sync::atomic::Ordering::SeqCst;
    let a = Mock::start("a").await;
    let b = Mock::start("b").await;
    b.set_mode(Mode::HeldStream { chunks: 8 });
    let api = FakeApi::start().await.unwrap();
    api.list(SLICES, "10", vec![engine_slice(1, "10", &b)]);
    let slices = api.watch(SLICES);
    api.list(PODS, "10", vec![]);
    let gw = Gateway::start(k8s_config("k8s-stream", &api, 0)).await;
    assert!(
        eventually(10, || serving(&gw) == ["vllm-1"]).await,
        "{:?}",
        serving(&gw)
    );

    // A stream on vllm-1: its first event is through, the rest held by the engine.
    let mut resp = client()
        .post(gw.url("/v1/chat/completions"))
        .json(&json!({"model": "k8s-stream", "stream": true, "messages": [{"role": "user", "content": "long story"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()
            .get("x-kvgate-instance")
            .and_then(|v| v.to_str().ok()),
        Some("vllm-1")
    );
    let mut body = resp.chunk().await.unwrap().expect("first event").to_vec();
    assert!(eventually(5, || b.held() == 1).await);
    let b_id = gw.state.fleet.view().members(0)[0];

    // Scale-down through a rollout: vllm-0 turns ready, vllm-1's endpoint turns terminating.
    slices.event("ADDED", engine_slice(0, "11", &a));
    slices.event(
        "MODIFIED",
        slice(
            "vllm-1",
            "12",
            b.addr.port(),
            &[("127.0.0.1", "vllm-1", false, true)],
        ),
    );
    assert!(
        eventually(10, || serving(&gw) == ["vllm-0"]).await,
        "{:?}",
        serving(&gw)
    );
    let b_inst = gw
        .state
        .fleet
        .instance(b_id)
        .expect("vllm-1 drains: present while its stream runs");
    assert!(b_inst.is_removed());
    for i in 0..10 {
        assert_eq!(
            ask(&gw, &format!("new {i}")).await,
            (200, "vllm-0".into()),
            "no new request goes to the removed instance"
        );
    }
    assert_eq!(b.count(), 1, "vllm-1 received only the stream");
    assert_eq!(b.state.streams_completed.load(SeqCst), 0, "still streaming");
    // A sweep now (grace 0 is over) must not free it: its stream is in flight.
    kvgate::live::sweep(&gw.state);
    assert!(
        gw.state.fleet.instance(b_id).is_some(),
        "freed with a stream in flight"
    );

    // The engine finishes: the client gets the whole stream.
    b.release(1);
    while let Some(c) = resp.chunk().await.unwrap() {
        body.extend_from_slice(&c);
    }
    let text = String::from_utf8(body).unwrap();
    for i in 0..8 {
        assert!(text.contains(&format!("\"t{i}\"")), "t{i} missing: {text}");
    }
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(eventually(5, || b.state.streams_completed.load(SeqCst) == 1).await);
    assert_eq!(b.state.streams_dropped.load(SeqCst), 0);
    // Then, nothing of it in flight, it is freed.
    assert!(
        eventually(5, || gw
            .state
            .fleet
            .instance(b_id)
            .is_none_or(|i| i.uid != b_inst.uid))
        .await
    );
}

/// An EndpointSlice `vllm-<i>` of one ready endpoint 127.0.0.1:`port`, pod `vllm-<i>`.
fn slice_at(i: usize, rv: &str, port: u16, ready: bool) -> serde_json::Value {
    slice(
        &format!("vllm-{i}"),
        rv,
        port,
        &[("127.0.0.1", &format!("vllm-{i}"), ready, !ready)],
    )
}

/// The KV event streams `/admin/index` shows for instance `name`: `(rank, endpoint, connected)`.
async fn streams_of(gw: &Gateway, name: &str) -> Vec<(u64, String, bool)> {
    let v: serde_json::Value = serde_json::from_str(&gw.get_text("/admin/index").await).unwrap();
    let mut out: Vec<(u64, String, bool)> = v["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|s| s["instance"] == name)
        .map(|s| {
            (
                s["dp_rank"].as_u64().unwrap_or(u64::MAX),
                s["endpoint"].as_str().unwrap_or("").to_string(),
                s["connected"] == true,
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_labels_set_model_role_and_dp_size_and_kv_events_follow_the_instance() {
    // vllm-0: a simulated engine publishing KV events; vllm-1 and vllm-2: mocks.
    let sim = kvgate_sim::Fleet::start(kvgate_sim::FleetConfig {
        engines: 1,
        time_scale: 20.0,
        ..Default::default()
    })
    .await
    .expect("simulated engine");
    let info = sim.instances()[0].clone();
    let port_of = |url: &str| -> u16 {
        url.trim_end_matches('/')
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .expect("a port")
    };
    let events_port = port_of(info.kv_events_endpoint.as_deref().expect("sim KV events"));
    let model = info.model.clone();
    let plain = Mock::start("plain").await;
    let other = Mock::start("other").await;

    let api = FakeApi::start().await.unwrap();
    api.list(
        SLICES,
        "10",
        vec![
            slice_at(1, "10", plain.addr.port(), true),
            slice_at(2, "10", other.addr.port(), true),
        ],
    );
    let slices = api.watch(SLICES);
    // Every pod exists (labelled) before its endpoint is ready.
    api.list(
        PODS,
        "10",
        vec![
            pod(
                "vllm-0",
                "10",
                "127.0.0.1",
                true,
                json!({"kvgate.dev/role": "prefill", "kvgate.dev/dp-size": "2"}),
                json!({"kvgate.dev/model": &model, "kvgate.dev/kv-events-port": events_port.to_string()}),
            ),
            pod(
                "vllm-1",
                "10",
                "127.0.0.1",
                true,
                json!({"llm-d.ai/role": "decode"}),
                json!({}),
            ),
            pod(
                "vllm-2",
                "10",
                "127.0.0.1",
                true,
                json!({}),
                json!({"kvgate.dev/model": "another/model"}),
            ),
        ],
    );
    let gw = Gateway::start(k8s_config(&model, &api, 0)).await;
    // vllm-2 is labelled for another model: not this pool's.
    assert!(
        eventually(10, || serving(&gw) == ["vllm-1"]).await,
        "{:?}",
        serving(&gw)
    );
    assert!(streams_of(&gw, "vllm-1").await.is_empty(), "no KV events");

    // vllm-0 turns ready: an instance with its role, dp size and two KV event streams.
    slices.event("ADDED", slice_at(0, "11", port_of(&info.url), true));
    assert!(
        eventually(10, || serving(&gw) == ["vllm-0", "vllm-1"]).await,
        "{:?}",
        serving(&gw)
    );
    let admin: serde_json::Value =
        serde_json::from_str(&gw.get_text("/admin/instances").await).unwrap();
    let labels: Vec<(String, serde_json::Value, serde_json::Value)> = admin["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["name"].as_str().unwrap().to_string(),
                i["role"].clone(),
                i["dp_size"].clone(),
            )
        })
        .collect();
    assert!(
        labels.contains(&("vllm-0".into(), json!("prefill"), json!(2))),
        "{labels:?}"
    );
    assert!(
        labels.contains(&("vllm-1".into(), json!("decode"), json!(null))),
        "{labels:?}"
    );
    assert!(!labels.iter().any(|l| l.0 == "vllm-2"), "{labels:?}");
    let want = |rank: u64| format!("tcp://127.0.0.1:{}", events_port as u64 + rank);
    assert!(
        eventually_async(10, || async {
            let s = streams_of(&gw, "vllm-0").await;
            s.len() == 2 && s[0].0 == 0 && s[0].1 == want(0) && s[0].2 && s[1].1 == want(1)
        })
        .await,
        "{:?}",
        streams_of(&gw, "vllm-0").await
    );
    for i in 0..12 {
        let (status, who) = ask(&gw, &format!("q{i}")).await;
        assert_eq!(status, 200);
        assert_ne!(who, "vllm-2");
    }
    assert_eq!(other.count(), 0, "another model's engine got a request");

    // vllm-0 terminates: it drains and its KV event streams stop.
    slices.event("MODIFIED", slice_at(0, "12", port_of(&info.url), false));
    assert!(
        eventually(10, || serving(&gw) == ["vllm-1"]).await,
        "{:?}",
        serving(&gw)
    );
    assert!(
        eventually_async(10, || async { streams_of(&gw, "vllm-0").await.is_empty() }).await,
        "{:?}",
        streams_of(&gw, "vllm-0").await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_outage_keeps_the_last_fleet_and_recovery_converges() {
    let m = [
        Mock::start("e0").await,
        Mock::start("e1").await,
        Mock::start("e2").await,
    ];
    let api = FakeApi::start().await.unwrap();
    api.list(
        SLICES,
        "10",
        vec![engine_slice(0, "10", &m[0]), engine_slice(1, "10", &m[1])],
    );
    let slices = api.watch(SLICES);
    api.list(PODS, "10", vec![]);
    let pods = api.watch(PODS);
    let gw = Gateway::start(k8s_config("k8s-outage", &api, 0)).await;
    assert!(
        eventually(10, || serving(&gw) == ["vllm-0", "vllm-1"]).await,
        "{:?}",
        serving(&gw)
    );
    assert!(discovery_up(&gw, "k8s-outage", 1).await);

    // The API server fails every request and the open watches break.
    api.fail_all(Some(503));
    slices.abort();
    pods.abort();
    assert!(
        discovery_up(&gw, "k8s-outage", 0).await,
        "the outage is reported"
    );
    // The source keeps retrying, and failing, while the last fleet serves.
    let tries = api.seen(SLICES, true).len();
    assert!(eventually(10, || api.seen(SLICES, true).len() > tries).await);
    assert!(discovery_up(&gw, "k8s-outage", 0).await);
    assert_eq!(serving(&gw), ["vllm-0", "vllm-1"]);
    for i in 0..6 {
        let (status, who) = ask(&gw, &format!("during the outage {i}")).await;
        assert_eq!(status, 200);
        assert!(who == "vllm-0" || who == "vllm-1", "{who}");
    }

    // Meanwhile vllm-1 went away and vllm-2 came. The API server returns: the resumed watch's
    // version is too old, the relist shows the new set.
    api.status(SLICES, true, 410, "too old resource version");
    api.list(
        SLICES,
        "20",
        vec![engine_slice(0, "20", &m[0]), engine_slice(2, "20", &m[2])],
    );
    let _slices = api.watch(SLICES);
    api.fail_all(None);
    assert!(
        eventually(15, || serving(&gw) == ["vllm-0", "vllm-2"]).await,
        "{:?}",
        serving(&gw)
    );
    assert!(discovery_up(&gw, "k8s-outage", 1).await, "recovered");
    let before = m[1].count();
    for i in 0..6 {
        let (status, who) = ask(&gw, &format!("after {i}")).await;
        assert_eq!(status, 200);
        assert!(who == "vllm-0" || who == "vllm-2", "{who}");
    }
    assert_eq!(m[1].count(), before);
}
