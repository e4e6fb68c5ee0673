//! `inference_pool` mode: an `InferencePool`'s pod selector and target port.
//!
//! Invariants: `v1` reads `spec.selector.matchLabels` and the first `spec.targetPorts[].number`;
//! `v1alpha2` reads `spec.selector` as a plain label map and `spec.targetPortNumber`; a pool
//! with no labels or no valid port is an error (it would select every pod, or none usefully).

use super::objects::InferencePool;
use std::collections::BTreeMap;

/// What the pool selects: pods matching `selector` (a `labelSelector` string), on `port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolTarget {
    /// `k=v,k2=v2`, sorted by key.
    pub selector: String,
    /// The engines' port.
    pub port: u16,
}

/// The pool's selector and port, in whichever version it was served.
pub fn target(pool: &InferencePool) -> Result<PoolTarget, String> {
    let name = &pool.metadata.name;
    let sel = &pool.spec.selector;
    // v1 nests the labels under matchLabels; v1alpha2 is the label map itself.
    let map = match sel.get("matchLabels") {
        Some(m) if m.is_object() => m,
        _ => sel,
    };
    let labels: BTreeMap<String, String> = serde_json::from_value(map.clone()).map_err(|_| {
        format!("kubernetes: InferencePool {name}: spec.selector is not a label map")
    })?;
    if labels.is_empty() {
        return Err(format!(
            "kubernetes: InferencePool {name}: spec.selector selects no labels"
        ));
    }
    let port = pool
        .spec
        .target_ports
        .first()
        .and_then(|p| p.number)
        .or(pool.spec.target_port_number)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("kubernetes: InferencePool {name}: no valid target port"))?;
    let selector = labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    Ok(PoolTarget { selector, port })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pool(spec: serde_json::Value) -> InferencePool {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    #[test]
    fn both_versions() {
        let v1 = pool(
            json!({"selector": {"matchLabels": {"app": "vllm", "a": "b"}},
            "targetPorts": [{"number": 8000}], "endpointPickerRef": {"name": "epp"}}),
        );
        assert_eq!(
            target(&v1),
            Ok(PoolTarget {
                selector: "a=b,app=vllm".into(),
                port: 8000
            })
        );
        let v1a2 = pool(json!({"selector": {"app": "sglang"}, "targetPortNumber": 30000}));
        assert_eq!(
            target(&v1a2),
            Ok(PoolTarget {
                selector: "app=sglang".into(),
                port: 30000
            })
        );
    }

    #[test]
    fn no_labels_or_no_port_is_an_error() {
        assert!(target(&pool(json!({"selector": {}, "targetPortNumber": 1}))).is_err());
        assert!(target(&pool(json!({"selector": {"app": "x"}}))).is_err());
        assert!(target(&pool(
            json!({"selector": {"app": "x"}, "targetPorts": [{"number": 70000}]})
        ))
        .is_err());
    }
}
