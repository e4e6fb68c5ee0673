//! The sizing driver against an in-process kvgate (token mode) in front of a static backend:
//! the fill reaches its target on the gateway's own gauge, every request of each window is
//! answered, and multi-turn traffic hits the token cache.

use std::time::{Duration, Instant};

use axum::routing::any;
use kvgate::config::{Config, Flavour, InstanceConfig, PoolConfig};
use kvgate_loadtest::compare::gateway::InProcessGateway;
use kvgate_loadtest::gateway_sizing::drive::{self, DriveConfig};
use kvgate_loadtest::gateway_sizing::{HashKind, Kind};

/// A backend answering every request at once with a fixed small chat completion.
async fn static_backend() -> String {
    let app = axum::Router::new().fallback(any(|| async {
        (
            [("content-type", "application/json")],
            r#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}"#,
        )
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drive_fills_the_index_and_answers_every_request() {
    let backend = static_backend().await;
    let mut cfg = Config::default();
    cfg.server.listen = "127.0.0.1:0".into();
    cfg.load.enabled = false;
    cfg.routing.predicted_ttl_ms = 3_600_000;
    cfg.routing.index.max_entries = 4000;
    cfg.routing.index.default_instance_capacity = 4000;
    cfg.pools = vec![PoolConfig {
        model: "m".into(),
        block_size: Some(16),
        tokenizer: Some("builtin".into()),
        chat_template: None,
        flavour: Flavour::Vllm,
        instances: vec![InstanceConfig {
            name: None,
            url: backend,
            kv_events: None,
            kv_replay: None,
            kv_topic: None,
            capacity_blocks: None,
        }],
        max_instances: None,
        discovery: Default::default(),
    }];
    let gw = InProcessGateway::start(cfg).await.unwrap();
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ok = client
            .get(format!("{}/ready", gw.url))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "gateway not ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let me = std::process::id();
    let dcfg = DriveConfig {
        url: gw.url.clone(),
        pid: me,
        backend_pids: vec![me],
        mode: HashKind::Token,
        threads: 1,
        index_entries: 4000,
        fill_timeout: Duration::from_secs(60),
        idle: Duration::from_millis(100),
        lengths: vec![1024],
        kinds: vec![Kind::Unique, Kind::MultiTurn],
        rate: 200.0,
        // Never lowered: the test process's CPU includes the driver and the backend.
        budget_cores: 1000.0,
        warmup: Duration::from_millis(100),
        duration: Duration::from_millis(500),
        conversations: 8,
        model: "m".into(),
        max_tokens: 4,
        seed: 5,
    };
    let mut seen = 0;
    let cells = drive::run(&dcfg, |_| seen += 1).await.unwrap();
    assert_eq!(seen, 2);
    assert_eq!(cells.len(), 2);
    for c in &cells {
        assert_eq!(c.requests, 100, "{c:?}");
        assert_eq!(c.errors, 0, "{c:?}");
        assert!(c.index_after_fill >= 3960, "{c:?}");
        assert!(c.index_after_cell <= 4000, "{c:?}");
        assert!(c.rss_mib > 0.0 && c.hwm_mib >= c.rss_mib, "{c:?}");
        assert!(c.cores_per_100 >= 0.0 && c.wall_s >= 0.4, "{c:?}");
    }
    let unique = &cells[0];
    assert_eq!(unique.kind, Kind::Unique);
    assert!(
        (1024..1040).contains(&unique.first_prompt_tokens),
        "{unique:?}"
    );
    let multi = &cells[1];
    assert_eq!(multi.kind, Kind::MultiTurn);
    // Every request but a conversation's first reuses the cached prefix of its previous one.
    assert!(
        multi.token_cache_hit_ratio.is_some_and(|r| r > 0.4),
        "{multi:?}"
    );
    gw.stop().await;
}
