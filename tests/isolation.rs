//! Tenant cache isolation against the simulated engine: with `cache = "isolated"`, tenant B
//! sending tenant A's prompt gets no cached tokens (the engine's cache is partitioned by the
//! `cache_salt` kvgate sets, and kvgate's own index predicts no match), while A's own repeat
//! hits; with `shared` tenants the same repeat by B hits.

mod common;

use common::*;
use kvgate::config::{CacheSharing, InstanceConfig, PoolConfig};

async fn gateway(isolated: bool) -> (kvgate_sim::Fleet, Gateway, String) {
    let fleet = kvgate_sim::Fleet::start(kvgate_sim::FleetConfig {
        engines: 1,
        time_scale: 20.0,
        kv_events: false,
        replay: false,
        ..Default::default()
    })
    .await
    .expect("simulated fleet");
    let infos = fleet.instances();
    let mut cfg = config_for(&[]);
    let mut pool = PoolConfig::serving(
        infos[0].model.clone(),
        vec![InstanceConfig::at("sim-0", infos[0].url.clone())],
    );
    pool.block_size = Some(infos[0].block_size);
    pool.tokenizer = Some("builtin".into());
    cfg.pools = vec![pool];
    cfg.load.enabled = false;
    let dir = common::fresh_dir(&format!("isolation-{isolated}"));
    let keys = dir.join("keys.toml");
    std::fs::write(
        &keys,
        "[[keys]]\nkey = \"key-of-tenant-a\"\ntenant = \"a\"\n\
         [[keys]]\nkey = \"key-of-tenant-b\"\ntenant = \"b\"\n",
    )
    .unwrap();
    cfg.auth.enabled = true;
    cfg.auth.keys_file = keys.to_string_lossy().into_owned();
    cfg.auth.cache = if isolated {
        CacheSharing::Isolated
    } else {
        CacheSharing::Shared
    };
    let model = infos[0].model.clone();
    let gw = Gateway::start(cfg).await;
    (fleet, gw, model)
}

/// (cached tokens the engine reports, blocks kvgate predicted cached) for one request.
async fn ask(gw: &Gateway, model: &str, key: &str, salt: Option<&str>) -> (u64, u32) {
    let system = "Answer as the company's support assistant, politely. ".repeat(40);
    let mut body = serde_json::json!({
        "model": model,
        "max_tokens": 4,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hello"}],
    });
    if let Some(s) = salt {
        body["cache_salt"] = s.into();
    }
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let matched = r.headers()["x-kvgate-matched-blocks"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    (cached, matched)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_tenant_never_hits_another_tenants_cache() {
    let (_fleet, gw, model) = gateway(true).await;
    assert_eq!(ask(&gw, &model, "key-of-tenant-a", None).await, (0, 0));
    let (a_cached, a_matched) = ask(&gw, &model, "key-of-tenant-a", None).await;
    assert!(
        a_cached > 100 && a_matched > 10,
        "A's repeat should hit: {a_cached} {a_matched}"
    );
    assert_eq!(
        ask(&gw, &model, "key-of-tenant-b", None).await,
        (0, 0),
        "B hit A's cache"
    );
    // A client salt cannot reach outside the tenant: B naming any salt stays cold for A's
    // prefix, and inside A a salt partitions further.
    assert_eq!(ask(&gw, &model, "key-of-tenant-b", Some("x")).await, (0, 0));
    assert_eq!(ask(&gw, &model, "key-of-tenant-a", Some("x")).await, (0, 0));
    let (again, _) = ask(&gw, &model, "key-of-tenant-b", None).await;
    assert!(
        again > 100,
        "B's own repeat should hit its own cache: {again}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_tenants_share_the_cache() {
    let (_fleet, gw, model) = gateway(false).await;
    assert_eq!(ask(&gw, &model, "key-of-tenant-a", None).await, (0, 0));
    let (b_cached, b_matched) = ask(&gw, &model, "key-of-tenant-b", None).await;
    assert!(
        b_cached > 100 && b_matched > 10,
        "shared cache: {b_cached} {b_matched}"
    );
}
