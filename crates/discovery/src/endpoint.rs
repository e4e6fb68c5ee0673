//! [`Endpoint`]: one engine instance as a source sees it; [`EndpointSet`]: what a source
//! publishes.

use std::sync::Arc;

/// One engine endpoint reported by a discovery source.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    /// Stable name: the pod name for Kubernetes sources, `host:port` for DNS and static URLs
    /// (or the configured name). Used in logs, metrics labels and `x-kvgate-instance`.
    pub name: String,
    /// Base URL, `http://ip:port`.
    pub url: String,
    /// ZMQ endpoint of the engine's KV event publisher, when it has one.
    pub kv_events: Option<String>,
    /// ZMQ endpoint of the engine's KV event replay socket.
    pub kv_replay: Option<String>,
    /// Model the endpoint serves, when the source knows it (a label); `None` means the pool's.
    pub model: Option<String>,
    /// Engine family (`vllm` / `sglang`), when the source knows it; `None` means the pool's.
    pub flavour: Option<String>,
    /// Role for disaggregated serving (`prefill`, `decode`, `both`), when labelled.
    pub role: Option<String>,
    /// Data-parallel size of the engine, when labelled.
    pub dp_size: Option<u32>,
}

impl Endpoint {
    /// An endpoint with only a name and a URL.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            url: url.into(),
            kv_events: None,
            kv_replay: None,
            model: None,
            flavour: None,
            role: None,
            dp_size: None,
        }
    }

    /// The identity the fleet keys instances by: same name and URL, same instance.
    pub fn key(&self) -> (&str, &str) {
        (&self.name, &self.url)
    }
}

/// The whole current set of a pool's endpoints, as last seen by its source.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointSet {
    /// Increases by one with every published set.
    pub version: u64,
    /// The endpoints, sorted by [`Endpoint::key`], no duplicate keys.
    pub endpoints: Arc<Vec<Endpoint>>,
    /// Why the source could not refresh, when its last attempt failed; `endpoints` is then the
    /// last set it did see.
    pub error: Option<String>,
}

impl EndpointSet {
    /// A set of `endpoints` (sorted and de-duplicated here) at `version`.
    pub fn new(version: u64, mut endpoints: Vec<Endpoint>) -> Self {
        endpoints.sort();
        endpoints.dedup_by(|a, b| a.key() == b.key());
        Self {
            version,
            endpoints: Arc::new(endpoints),
            error: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_are_sorted_and_deduplicated_by_key() {
        let set = EndpointSet::new(
            1,
            vec![
                Endpoint::new("b", "http://10.0.0.2:8000"),
                Endpoint::new("a", "http://10.0.0.1:8000"),
                Endpoint::new("b", "http://10.0.0.2:8000"),
            ],
        );
        let names: Vec<_> = set.endpoints.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn a_new_ip_is_a_new_endpoint() {
        let old = Endpoint::new("vllm-0", "http://10.0.0.1:8000");
        let moved = Endpoint::new("vllm-0", "http://10.0.0.9:8000");
        assert_ne!(old.key(), moved.key());
    }
}
