//! The `kvgate::audit` line of a refused request, as the binary's JSON log writes it: one line
//! per refusal with the tenant and the reason, and never the prompt text or the API key.
//!
//! This test binary installs a global `tracing` subscriber writing JSON lines into a buffer (the
//! gateway logs from its serving threads, so a thread-local one would miss them); each test finds
//! its own lines by request id.

mod common;

use common::*;
use std::sync::{Arc, Mutex, OnceLock};

/// Everything logged in this process, as JSON lines.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logs() -> &'static Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs::default();
        let writer = logs.clone();
        // As the binary with `log_format = "json"`.
        let subscriber = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        logs
    })
}

/// The log lines mentioning `needle`.
fn lines_with(needle: &str) -> Vec<String> {
    let bytes = logs().0.lock().unwrap().clone();
    String::from_utf8_lossy(&bytes)
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

const PROMPT: &str = "the secret plan PROMPT-TEXT-7f3a2c";
const GOOD_KEY: &str = "sk-audit-good-key-5b1e";
const WRONG_KEY: &str = "sk-audit-wrong-key-9d4c";

async fn gateway(a: &Mock) -> Gateway {
    let mut c = config_for(&[a.url()]);
    let keys = fresh_dir("audit").join("keys.toml");
    std::fs::write(
        &keys,
        format!(
            "[[keys]]\nkey = \"{GOOD_KEY}\"\ntenant = \"alpha\"\nmodels = [\"only-this-model\"]\n"
        ),
    )
    .unwrap();
    c.auth.enabled = true;
    c.auth.keys_file = keys.to_string_lossy().into_owned();
    let gw = Gateway::start(c).await;
    assert!(eventually(10, || gw.state.fleet.any_usable(gw.state.clock.now_ms())).await);
    gw
}

/// Posts the secret prompt with `auth` and request id `rid`; returns the status.
async fn refused(gw: &Gateway, auth: &str, rid: &str) -> u16 {
    let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": PROMPT}]});
    client()
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", auth)
        .header("x-request-id", rid)
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The one audit line of request `rid`, parsed, once it is written.
async fn audit_line(rid: &str) -> (String, serde_json::Value) {
    let mut found = Vec::new();
    let written = eventually(5, || {
        found = lines_with(rid)
            .into_iter()
            .filter(|l| l.contains("kvgate::audit"))
            .collect();
        !found.is_empty()
    })
    .await;
    assert!(written, "no kvgate::audit line for {rid}");
    assert_eq!(found.len(), 1, "one audit line per refusal: {found:?}");
    let v = serde_json::from_str(&found[0]).unwrap();
    (found.remove(0), v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_is_audited_with_tenant_and_reason_but_no_prompt_or_key() {
    logs();
    let a = Mock::start("a").await;
    let gw = gateway(&a).await;

    // A wrong key: 401, tenant unknown.
    let rid = "audit-wrong-key-1";
    assert_eq!(refused(&gw, &format!("Bearer {WRONG_KEY}"), rid).await, 401);
    let (line, v) = audit_line(rid).await;
    assert_eq!(v["target"], "kvgate::audit", "{line}");
    assert_eq!(v["tenant"], "unauthenticated", "{line}");
    assert_eq!(v["reason"], "auth", "{line}");
    assert_eq!(v["status"], 401, "{line}");

    // A good key, a model outside its allow-list: 403, the key's tenant.
    let rid = "audit-model-2";
    assert_eq!(refused(&gw, &format!("Bearer {GOOD_KEY}"), rid).await, 403);
    let (line, v) = audit_line(rid).await;
    assert_eq!(v["tenant"], "alpha", "{line}");
    assert_eq!(v["reason"], "model", "{line}");
    assert_eq!(v["status"], 403, "{line}");

    // Neither the prompt nor a key is in any line logged, audit or not.
    for secret in [PROMPT, "PROMPT-TEXT", WRONG_KEY, GOOD_KEY] {
        assert_eq!(
            lines_with(secret),
            Vec::<String>::new(),
            "{secret} was logged"
        );
    }
    // Nothing reached the engine.
    assert_eq!(a.count(), 0);
}
