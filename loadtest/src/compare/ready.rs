//! Readiness of a router under test: its worker list (or health) and a warm-up request.
//!
//! SGLang-style routers report ready before their workers are registered, so when `GET /workers`
//! exists it must list every worker as routable; otherwise `GET /health` must answer 200. Then one
//! small streamed request must succeed end to end. Every wait is bounded by the given timeout.

use std::time::Duration;

use crate::prompt::ApiKind;
use crate::replay::request::{send, Attempt};
use crate::replay::Outcome;

/// Why a router never became ready.
#[derive(Debug, thiserror::Error)]
#[error("router at {url} not ready after {secs} s: {last}")]
pub struct NotReady {
    /// Router URL.
    pub url: String,
    /// Time waited.
    pub secs: u64,
    /// Last observation.
    pub last: String,
}

/// Waits until the router lists every worker (or is healthy), then warms it up with one request.
pub async fn wait_ready(
    client: &reqwest::Client,
    url: &str,
    workers: &[String],
    model: &str,
    api: ApiKind,
    timeout: Duration,
) -> Result<(), NotReady> {
    let start = tokio::time::Instant::now();
    let mut last = String::from("no answer");
    let fail = |last: String| NotReady {
        url: url.to_string(),
        secs: timeout.as_secs(),
        last,
    };
    loop {
        if start.elapsed() > timeout {
            return Err(fail(last));
        }
        match probe(client, url, workers).await {
            Ok(()) => break,
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    loop {
        if start.elapsed() > timeout {
            return Err(fail(last));
        }
        let body = warm_up_body(model, api);
        let (outcome, _) = send(Attempt {
            client,
            url: &format!("{url}{}", api.path()),
            body,
            timeout: Duration::from_secs(30),
            header: None,
        })
        .await;
        match outcome {
            Outcome::Ok => return Ok(()),
            other => last = format!("warm-up request: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn probe(client: &reqwest::Client, url: &str, workers: &[String]) -> Result<(), String> {
    let get = |path: &str| {
        client
            .get(format!("{url}{path}"))
            .timeout(Duration::from_secs(5))
            .send()
    };
    match get("/workers").await {
        Ok(r) if r.status().is_success() => {
            let text = r.text().await.map_err(|e| e.to_string())?;
            return unready_workers(&text, workers);
        }
        Ok(_) => {}
        Err(e) => return Err(e.to_string()),
    }
    match get("/health").await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("/health answered {}", r.status())),
        Err(e) => Err(e.to_string()),
    }
}

/// One entry of a router's worker list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedWorker {
    /// The worker's URL as the router gives it.
    pub url: String,
    /// Why the router would not route to it yet, if it says so.
    pub not_ready: Option<String>,
}

/// Reads a `GET /workers` answer: `{"workers": [...]}` with objects that have a `url` (smg,
/// sglang-router, vllm-router) or plain URL strings, `{"urls": [...]}`, or a bare array of either.
/// An entry is not ready when it says `"is_healthy": false`, or has a `status` other than
/// `"ready"` (smg gives every worker one, `ready` when it routes to it; the others have no
/// `status`). `None` when the answer has none of these shapes.
pub fn parse_workers(body: &str) -> Option<Vec<ListedWorker>> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    let list = match &v {
        serde_json::Value::Array(a) => a,
        serde_json::Value::Object(o) => o.get("workers").or_else(|| o.get("urls"))?.as_array()?,
        _ => return None,
    };
    list.iter().map(listed_worker).collect()
}

fn listed_worker(v: &serde_json::Value) -> Option<ListedWorker> {
    if let Some(url) = v.as_str() {
        return Some(ListedWorker {
            url: url.to_string(),
            not_ready: None,
        });
    }
    let o = v.as_object()?;
    let url = o.get("url")?.as_str()?.to_string();
    let not_ready = match (
        o.get("is_healthy").and_then(|h| h.as_bool()),
        o.get("status").and_then(|s| s.as_str()),
    ) {
        (Some(false), _) => Some("unhealthy".to_string()),
        (_, Some(st)) if !st.eq_ignore_ascii_case("ready") => Some(format!("status {st}")),
        _ => None,
    };
    Some(ListedWorker { url, not_ready })
}

/// `host:port` of a URL, lower-cased, without scheme, path or trailing slash, so that
/// `http://127.0.0.1:8000/` and `http://127.0.0.1:8000` name the same worker.
fn authority(url: &str) -> String {
    let rest = url.trim();
    let rest = rest.split_once("://").map_or(rest, |(_, r)| r);
    let end = rest.find('/').unwrap_or(rest.len());
    rest[..end].to_ascii_lowercase()
}

/// `Ok` when the router's worker list names every worker as routable, else what is missing.
/// An answer of unknown shape counts a worker as listed when its `host:port` occurs in it.
pub fn unready_workers(body: &str, workers: &[String]) -> Result<(), String> {
    let Some(listed) = parse_workers(body) else {
        let missing: Vec<&String> = workers
            .iter()
            .filter(|w| !body.contains(&authority(w)))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        return Err(format!("/workers does not list {missing:?} yet"));
    };
    let mut problems = Vec::new();
    for w in workers {
        let want = authority(w);
        match listed.iter().find(|l| authority(&l.url) == want) {
            None => problems.push(format!("{w} not listed")),
            Some(ListedWorker {
                not_ready: Some(why),
                ..
            }) => problems.push(format!("{w} {why}")),
            Some(_) => {}
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("/workers: {}", problems.join(", ")))
    }
}

fn warm_up_body(model: &str, api: ApiKind) -> Vec<u8> {
    let v = match api {
        ApiKind::Chat => serde_json::json!({
            "model": model, "messages": [{"role": "user", "content": "warm-up"}],
            "max_tokens": 1, "stream": true,
        }),
        ApiKind::Completions => serde_json::json!({
            "model": model, "prompt": "warm-up", "max_tokens": 1, "stream": true,
        }),
    };
    v.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `GET /workers` of smg 1.13.0 (`--policy cache_aware`) in front of a 4-engine simulated
    /// fleet, captured during a comparison run.
    const SMG_1_13_0: &str = r#"{"workers":[{"id":"01a23377-1140-7164-b033-0094c28efef2","model_id":"kvgate-sim","url":"http://127.0.0.1:34085","models":[{"id":"kvgate-sim","model_type":["chat","completions","responses","tools"],"hf_model_type":"llama","architectures":["LlamaForCausalLM"],"context_length":131072,"tokenizer_path":"kvgate-sim"}],"worker_type":"regular","connection_mode":"http","runtime_type":"sglang","labels":{"tokenizer_path":"kvgate-sim","max_model_len":"131072","max_running_requests":"256","model_path":"kvgate-sim","is_generation":"true","version":"kvgate-sim 0.1.0","dp_size":"1","served_model_name":"kvgate-sim","context_length":"131072","model_type":"llama","architectures":"[\"LlamaForCausalLM\"]","tp_size":"1"},"priority":50,"cost":1.0,"max_connection_attempts":20,"is_healthy":true,"status":"ready","load":0,"http2":false},{"id":"01a23377-1140-7164-b033-009369847f4a","model_id":"kvgate-sim","url":"http://127.0.0.1:40813","models":[{"id":"kvgate-sim","model_type":["chat","completions","responses","tools"],"hf_model_type":"llama","architectures":["LlamaForCausalLM"],"context_length":131072,"tokenizer_path":"kvgate-sim"}],"worker_type":"regular","connection_mode":"http","runtime_type":"sglang","labels":{"tokenizer_path":"kvgate-sim","served_model_name":"kvgate-sim","dp_size":"1","version":"kvgate-sim 0.1.0","is_generation":"true","max_running_requests":"256","architectures":"[\"LlamaForCausalLM\"]","context_length":"131072","tp_size":"1","model_type":"llama","max_model_len":"131072","model_path":"kvgate-sim"},"priority":50,"cost":1.0,"max_connection_attempts":20,"is_healthy":true,"status":"ready","load":3,"http2":false},{"id":"01a23377-113f-76f9-a82f-289a8830947f","model_id":"kvgate-sim","url":"http://127.0.0.1:44049","models":[{"id":"kvgate-sim","model_type":["chat","completions","responses","tools"],"hf_model_type":"llama","architectures":["LlamaForCausalLM"],"context_length":131072,"tokenizer_path":"kvgate-sim"}],"worker_type":"regular","connection_mode":"http","runtime_type":"sglang","labels":{"version":"kvgate-sim 0.1.0","tokenizer_path":"kvgate-sim","max_running_requests":"256","model_type":"llama","served_model_name":"kvgate-sim","architectures":"[\"LlamaForCausalLM\"]","is_generation":"true","context_length":"131072","max_model_len":"131072","model_path":"kvgate-sim","tp_size":"1","dp_size":"1"},"priority":50,"cost":1.0,"max_connection_attempts":20,"is_healthy":true,"status":"ready","load":2,"http2":false},{"id":"01a23377-113f-76f9-a82f-289959ebc47a","model_id":"kvgate-sim","url":"http://127.0.0.1:40573","models":[{"id":"kvgate-sim","model_type":["chat","completions","responses","tools"],"hf_model_type":"llama","architectures":["LlamaForCausalLM"],"context_length":131072,"tokenizer_path":"kvgate-sim"}],"worker_type":"regular","connection_mode":"http","runtime_type":"sglang","labels":{"model_type":"llama","context_length":"131072","architectures":"[\"LlamaForCausalLM\"]","is_generation":"true","model_path":"kvgate-sim","version":"kvgate-sim 0.1.0","max_model_len":"131072","dp_size":"1","served_model_name":"kvgate-sim","tp_size":"1","max_running_requests":"256","tokenizer_path":"kvgate-sim"},"priority":50,"cost":1.0,"max_connection_attempts":20,"is_healthy":true,"status":"ready","load":7,"http2":false}],"total":4,"stats":{"prefill_count":0,"decode_count":0,"regular_count":4}}"#;

    /// `GET /workers` of sglang-router 0.3.2 in front of two loopback engines.
    const SGLANG_ROUTER_0_3_2: &str = r#"{"workers":[{"id":"26721257-6eda-4b20-8d53-735023ae2d61","url":"http://127.0.0.1:41001","model_id":"kvgate-sim","priority":50,"cost":1.0,"worker_type":"regular","is_healthy":true,"load":0,"connection_mode":"HTTP","metadata":{"model_type":"llama","served_model_name":"kvgate-sim","disaggregation_mode":"null","dp_size":"1","architectures":"[\"LlamaForCausalLM\"]","tp_size":"1","model_path":"kvgate-sim"},"disable_health_check":false},{"id":"bd4524b4-cc82-4cb0-b225-a56f86359b5c","url":"http://127.0.0.1:41002","model_id":"kvgate-sim","priority":50,"cost":1.0,"worker_type":"regular","is_healthy":true,"load":0,"connection_mode":"HTTP","metadata":{"disaggregation_mode":"null","model_type":"llama","tp_size":"1","served_model_name":"kvgate-sim","model_path":"kvgate-sim","dp_size":"1","architectures":"[\"LlamaForCausalLM\"]"},"disable_health_check":false}],"total":2,"stats":{"prefill_count":0,"decode_count":0,"regular_count":2}}"#;

    /// `GET /workers` of vllm-router 0.1.17 in front of two loopback engines.
    const VLLM_ROUTER_0_1_17: &str = r#"{"workers":[{"url":"http://127.0.0.1:41002","model_id":"unknown","worker_type":"regular","is_healthy":true,"load":0,"connection_mode":"Http","priority":50,"cost":1.0},{"url":"http://127.0.0.1:41001","model_id":"unknown","worker_type":"regular","is_healthy":true,"load":0,"connection_mode":"Http","priority":50,"cost":1.0}],"total":2,"stats":{"prefill_count":0,"decode_count":0,"regular_count":2}}"#;

    fn urls(ports: &[u16]) -> Vec<String> {
        ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect()
    }

    #[test]
    fn reads_smgs_worker_list() {
        let listed = parse_workers(SMG_1_13_0).unwrap();
        assert_eq!(listed.len(), 4);
        assert!(listed.iter().all(|w| w.not_ready.is_none()), "{listed:?}");
        let fleet = urls(&[34085, 40813, 44049, 40573]);
        assert_eq!(unready_workers(SMG_1_13_0, &fleet), Ok(()));
        let err = unready_workers(SMG_1_13_0, &urls(&[34085, 40999])).unwrap_err();
        assert!(err.contains("http://127.0.0.1:40999 not listed"), "{err}");
        assert!(!err.contains("34085"), "{err}");
    }

    #[test]
    fn a_listed_smg_worker_that_is_not_ready_keeps_waiting() {
        let pending = SMG_1_13_0.replacen(r#""status":"ready""#, r#""status":"pending""#, 1);
        let err = unready_workers(&pending, &urls(&[34085, 40813, 44049, 40573])).unwrap_err();
        assert_eq!(err, "/workers: http://127.0.0.1:34085 status pending");
        let unhealthy = SMG_1_13_0.replacen(r#""is_healthy":true"#, r#""is_healthy":false"#, 2);
        let err = unready_workers(&unhealthy, &urls(&[40813])).unwrap_err();
        assert!(err.contains("40813 unhealthy"), "{err}");
    }

    #[test]
    fn reads_the_other_routers_worker_lists() {
        for body in [SGLANG_ROUTER_0_3_2, VLLM_ROUTER_0_1_17] {
            assert_eq!(parse_workers(body).map(|l| l.len()), Some(2), "{body}");
            assert_eq!(unready_workers(body, &urls(&[41001, 41002])), Ok(()));
            assert!(unready_workers(body, &urls(&[41001, 41003])).is_err());
        }
        let plain = r#"{"urls":["http://127.0.0.1:41001/","HTTP://127.0.0.1:41002"]}"#;
        assert_eq!(unready_workers(plain, &urls(&[41001, 41002])), Ok(()));
        assert_eq!(
            unready_workers(r#"["http://127.0.0.1:41001"]"#, &urls(&[41001])),
            Ok(())
        );
    }

    #[test]
    fn a_port_that_prefixes_another_is_not_a_match() {
        // 127.0.0.1:4100 is a substring of 127.0.0.1:41001, which a text search would accept.
        let err = unready_workers(SGLANG_ROUTER_0_3_2, &urls(&[4100])).unwrap_err();
        assert!(err.contains("not listed"), "{err}");
    }

    #[test]
    fn an_answer_of_unknown_shape_is_searched_for_each_worker() {
        assert_eq!(parse_workers("127.0.0.1:41001 up"), None);
        assert_eq!(parse_workers(r#"{"count":2}"#), None);
        assert_eq!(
            unready_workers(
                "127.0.0.1:41001 up\n127.0.0.1:41002 up",
                &urls(&[41001, 41002])
            ),
            Ok(())
        );
        assert!(unready_workers("127.0.0.1:41001 up", &urls(&[41001, 41002])).is_err());
    }

    #[test]
    fn authority_drops_scheme_path_and_case() {
        assert_eq!(authority(" HTTP://LocalHost:80/v1/ "), "localhost:80");
        assert_eq!(authority("127.0.0.1:9"), "127.0.0.1:9");
    }
}
