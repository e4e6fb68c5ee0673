//! The union of the instances' `/v1/models`, cached and served by the gateway.
//!
//! Invariants:
//! - The cached answer always lists every configured pool model, even before any instance answered
//!   (so clients can discover what the gateway serves); entries instances report win, keeping their
//!   extra fields (`max_model_len`, `root`, ...) as sent.
//! - Bounded: at most [`MAX_MODELS_PER_INSTANCE`] entries are taken from each instance.

use super::Pool;
use ahash::AHashMap;
use bytes::Bytes;
use parking_lot::RwLock;
use serde::Deserialize;
use serde_json::value::RawValue;

/// Cap on entries read from one instance's list.
pub const MAX_MODELS_PER_INSTANCE: usize = 1024;

/// The cached `/v1/models` body.
#[derive(Debug)]
pub struct ModelsCache {
    body: RwLock<Bytes>,
}

#[derive(Deserialize)]
struct List {
    #[serde(default)]
    data: Vec<Box<RawValue>>,
}

#[derive(Deserialize)]
struct Entry<'a> {
    #[serde(borrow)]
    id: std::borrow::Cow<'a, str>,
}

/// One instance's parsed list: (model id, the entry's raw JSON).
pub type InstanceModels = Vec<(String, Box<RawValue>)>;

/// Parses an instance's `/v1/models` answer.
pub fn parse_list(body: &[u8]) -> Result<InstanceModels, serde_json::Error> {
    let list: List = serde_json::from_slice(body)?;
    let mut out = Vec::new();
    for raw in list.data.into_iter().take(MAX_MODELS_PER_INSTANCE) {
        let id = serde_json::from_str::<Entry<'_>>(raw.get())?
            .id
            .into_owned();
        out.push((id, raw));
    }
    Ok(out)
}

impl ModelsCache {
    /// The answer listing only the configured pool models.
    pub fn new(pools: &[Pool]) -> Self {
        let (body, _) = union(pools, &[]);
        Self {
            body: RwLock::new(body),
        }
    }
    /// The current body.
    pub fn get(&self) -> Bytes {
        self.body.read().clone()
    }
    /// Replaces the body.
    pub fn set(&self, body: Bytes) {
        *self.body.write() = body;
    }
}

/// Builds the union body from per-pool instance answers (`(pool index, models)`), and the map of
/// model ids beyond the pools' own names to the pool whose instances list them.
pub fn union(
    pools: &[Pool],
    answers: &[(usize, InstanceModels)],
) -> (Bytes, AHashMap<String, usize>) {
    let mut seen: AHashMap<&str, usize> = AHashMap::new();
    let mut entries: Vec<String> = Vec::new();
    let mut discovered = AHashMap::new();
    for (pool, list) in answers {
        for (id, raw) in list {
            if seen.contains_key(id.as_str()) {
                continue;
            }
            seen.insert(id.as_str(), *pool);
            entries.push(raw.get().to_string());
            if !pools.iter().any(|p| &p.model == id) {
                discovered.insert(id.clone(), *pool);
            }
        }
    }
    for p in pools {
        if !seen.contains_key(p.model.as_str()) {
            entries.push(
                serde_json::json!({
                    "id": p.model,
                    "object": "model",
                    "created": 0,
                    "owned_by": "kvgate",
                })
                .to_string(),
            );
        }
    }
    let mut body = String::from("{\"object\":\"list\",\"data\":[");
    body.push_str(&entries.join(","));
    body.push_str("]}");
    (Bytes::from(body), discovered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Flavour, PoolConfig};

    fn pool(i: usize, m: &str) -> Pool {
        Pool {
            index: i,
            model: m.into(),
            config: PoolConfig {
                model: m.into(),
                block_size: None,
                tokenizer: None,
                chat_template: None,
                flavour: Flavour::Vllm,
                instances: vec![],
                max_instances: None,
                discovery: Default::default(),
            },
        }
    }

    #[test]
    fn union_dedups_keeps_fields_and_lists_configured_models() {
        let pools = vec![pool(0, "a"), pool(1, "b")];
        let a = parse_list(br#"{"object":"list","data":[{"id":"a","object":"model","max_model_len":9},{"id":"a-lora","object":"model"}]}"#).unwrap();
        let a2 = parse_list(br#"{"data":[{"id":"a","object":"model"}]}"#).unwrap();
        let (body, disc) = union(&pools, &[(0, a), (0, a2)]);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let ids: Vec<&str> = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["a", "a-lora", "b"]);
        assert_eq!(v["data"][0]["max_model_len"], 9);
        assert_eq!(disc.get("a-lora"), Some(&0));
        assert!(!disc.contains_key("a"));
    }
}
