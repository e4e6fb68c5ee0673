//! Per-pod settings read from labels and annotations onto an [`Endpoint`].
//!
//! | key | kind | field | values |
//! | --- | --- | --- | --- |
//! | `kvgate.dev/model` | annotation or label (`llm-d.ai/model` label) | `model` | any (a label cannot hold `/`: use the annotation) |
//! | `kvgate.dev/flavour` | label | `flavour` | `vllm`, `sglang` |
//! | `kvgate.dev/role` | label (`llm-d.ai/role`) | `role` | `prefill`, `decode`, `both` (llm-d's `prefill-decode` = `both`) |
//! | `kvgate.dev/dp-size` | label | `dp_size` | 1 or more |
//! | `kvgate.dev/kv-events-port` | annotation | `kv_events` | 1-65535, over `kv_events_port` |
//! | `kvgate.dev/kv-replay-port` | annotation | `kv_replay` | 1-65535, over `kv_replay_port` |
//!
//! Invariants: kvgate's own keys win over llm-d's; a malformed value leaves its field unset (or
//! at the configured port) and is logged once per pod, key and value, never failing the set;
//! the memory of what was logged is bounded.

use super::objects::ObjectMeta;
use crate::address::tcp_url;
use crate::endpoint::Endpoint;
use std::collections::HashSet;
use std::net::IpAddr;

/// Model label / annotation.
pub const MODEL: &str = "kvgate.dev/model";
/// llm-d's model label.
pub const LLMD_MODEL: &str = "llm-d.ai/model";
/// Engine family label.
pub const FLAVOUR: &str = "kvgate.dev/flavour";
/// Role label.
pub const ROLE: &str = "kvgate.dev/role";
/// llm-d's role label.
pub const LLMD_ROLE: &str = "llm-d.ai/role";
/// Data-parallel size label.
pub const DP_SIZE: &str = "kvgate.dev/dp-size";
/// KV events port annotation.
pub const KV_EVENTS_PORT: &str = "kvgate.dev/kv-events-port";
/// KV replay port annotation.
pub const KV_REPLAY_PORT: &str = "kvgate.dev/kv-replay-port";

/// How many malformed values are remembered as logged (then the memory starts over).
const MAX_WARNED: usize = 4096;

/// The malformed values already logged.
#[derive(Debug, Default)]
pub struct Warned {
    seen: HashSet<String>,
}

impl Warned {
    fn warn(&mut self, pod: &str, key: &str, value: &str, expected: &str) {
        if self.seen.len() >= MAX_WARNED {
            self.seen.clear();
        }
        if self.seen.insert(format!("{pod}\0{key}\0{value}")) {
            tracing::warn!(
                pod,
                key,
                value,
                expected,
                "kubernetes discovery: ignoring a malformed pod setting"
            );
        }
    }
}

/// The configured KV ports, used when a pod does not annotate its own.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ports {
    /// `kv_events_port`.
    pub kv_events: Option<u16>,
    /// `kv_replay_port`.
    pub kv_replay: Option<u16>,
}

fn port(meta: &ObjectMeta, key: &str, default: Option<u16>, warned: &mut Warned) -> Option<u16> {
    match meta.annotations.get(key) {
        None => default,
        Some(v) => match v.trim().parse::<u16>() {
            Ok(p) if p != 0 => Some(p),
            _ => {
                warned.warn(&meta.name, key, v, "a port 1-65535");
                default
            }
        },
    }
}

/// Sets `e`'s KV addresses (on `ip`) and the fields `meta` labels; without `meta` (the pod not
/// seen yet) only the configured ports apply.
pub fn decorate(
    e: &mut Endpoint,
    ip: IpAddr,
    meta: Option<&ObjectMeta>,
    ports: Ports,
    warned: &mut Warned,
) {
    let Some(meta) = meta else {
        e.kv_events = ports.kv_events.map(|p| tcp_url(ip, p));
        e.kv_replay = ports.kv_replay.map(|p| tcp_url(ip, p));
        return;
    };
    e.kv_events = port(meta, KV_EVENTS_PORT, ports.kv_events, warned).map(|p| tcp_url(ip, p));
    e.kv_replay = port(meta, KV_REPLAY_PORT, ports.kv_replay, warned).map(|p| tcp_url(ip, p));
    let label = |k: &str| {
        meta.labels
            .get(k)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    };
    e.model = meta
        .annotations
        .get(MODEL)
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
        .or_else(|| label(MODEL))
        .or_else(|| label(LLMD_MODEL))
        .map(str::to_string);
    e.flavour = label(FLAVOUR).and_then(|v| match v {
        "vllm" | "sglang" => Some(v.to_string()),
        _ => {
            warned.warn(&meta.name, FLAVOUR, v, "vllm or sglang");
            None
        }
    });
    e.role = match (label(ROLE), label(LLMD_ROLE)) {
        (Some(v), _) => role(v).or_else(|| {
            warned.warn(&meta.name, ROLE, v, "prefill, decode or both");
            None
        }),
        (None, Some(v)) => role(v).or_else(|| {
            warned.warn(
                &meta.name,
                LLMD_ROLE,
                v,
                "prefill, decode or prefill-decode",
            );
            None
        }),
        (None, None) => None,
    };
    e.dp_size = label(DP_SIZE).and_then(|v| match v.parse::<u32>() {
        Ok(n) if n >= 1 => Some(n),
        _ => {
            warned.warn(&meta.name, DP_SIZE, v, "a whole number, 1 or more");
            None
        }
    });
}

/// kvgate's role for a label value (kvgate's or llm-d's).
fn role(v: &str) -> Option<String> {
    match v {
        "prefill" | "decode" | "both" => Some(v.to_string()),
        "prefill-decode" => Some("both".to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: "p".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..ObjectMeta::default()
        }
    }

    fn ep(m: Option<&ObjectMeta>) -> Endpoint {
        let mut e = Endpoint::new("p", "http://10.0.0.1:8000");
        let ports = Ports {
            kv_events: Some(5557),
            kv_replay: None,
        };
        decorate(
            &mut e,
            "10.0.0.1".parse().unwrap(),
            m,
            ports,
            &mut Warned::default(),
        );
        e
    }

    #[test]
    fn kvgate_labels_and_annotations_fill_the_fields() {
        let m = meta(
            &[
                (FLAVOUR, "sglang"),
                (ROLE, "decode"),
                (LLMD_ROLE, "prefill"),
                (DP_SIZE, "4"),
                (LLMD_MODEL, "x"),
            ],
            &[
                (MODEL, "meta-llama/Llama-3.1-8B"),
                (KV_EVENTS_PORT, "6000"),
                (KV_REPLAY_PORT, "6001"),
            ],
        );
        let e = ep(Some(&m));
        assert_eq!(e.model.as_deref(), Some("meta-llama/Llama-3.1-8B"));
        assert_eq!(e.flavour.as_deref(), Some("sglang"));
        assert_eq!(e.role.as_deref(), Some("decode"), "kvgate's label wins");
        assert_eq!(e.dp_size, Some(4));
        assert_eq!(e.kv_events.as_deref(), Some("tcp://10.0.0.1:6000"));
        assert_eq!(e.kv_replay.as_deref(), Some("tcp://10.0.0.1:6001"));
    }

    #[test]
    fn llmd_labels_are_accepted() {
        let m = meta(&[(LLMD_ROLE, "prefill-decode"), (LLMD_MODEL, "qwen")], &[]);
        let e = ep(Some(&m));
        assert_eq!(e.role.as_deref(), Some("both"));
        assert_eq!(e.model.as_deref(), Some("qwen"));
        assert_eq!(
            e.kv_events.as_deref(),
            Some("tcp://10.0.0.1:5557"),
            "the configured port"
        );
    }

    #[test]
    fn malformed_values_leave_fields_unset() {
        let m = meta(
            &[(FLAVOUR, "trt"), (ROLE, "leader"), (DP_SIZE, "0")],
            &[(KV_EVENTS_PORT, "99999")],
        );
        let e = ep(Some(&m));
        assert_eq!((e.flavour, e.role, e.dp_size), (None, None, None));
        assert_eq!(e.kv_events.as_deref(), Some("tcp://10.0.0.1:5557"));
        assert_eq!(ep(None).kv_events.as_deref(), Some("tcp://10.0.0.1:5557"));
    }
}
