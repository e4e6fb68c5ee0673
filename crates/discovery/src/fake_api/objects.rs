//! Builders of the objects the fake API server serves (EndpointSlices, Pods, InferencePools
//! `v1` and `v1alpha2`), in the API server's JSON shape, and the collection paths of namespace
//! [`NS`].

use serde_json::{json, Value};

pub const NS: &str = "ns";
pub const SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices";
pub const PODS: &str = "/api/v1/namespaces/ns/pods";
pub const POOLS_V1: &str = "/apis/inference.networking.k8s.io/v1/namespaces/ns/inferencepools";
pub const POOLS_V1A2: &str =
    "/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/ns/inferencepools";

/// An EndpointSlice of one port; endpoints `(ip, pod, ready, terminating)`.
pub fn slice(name: &str, rv: &str, port: u16, endpoints: &[(&str, &str, bool, bool)]) -> Value {
    json!({
        "metadata": {"name": name, "resourceVersion": rv, "labels": {"kubernetes.io/service-name": "vllm"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": endpoints.iter().map(|(ip, pod, ready, term)| json!({
            "addresses": [ip],
            "conditions": {"ready": ready, "serving": ready, "terminating": term},
            "targetRef": {"kind": "Pod", "name": pod, "namespace": NS}
        })).collect::<Vec<_>>()
    })
}

/// A pod; `ready` sets phase Running and condition Ready.
pub fn pod(
    name: &str,
    rv: &str,
    ip: &str,
    ready: bool,
    labels: Value,
    annotations: Value,
) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NS, "resourceVersion": rv, "labels": labels, "annotations": annotations},
        "status": {
            "phase": if ready { "Running" } else { "Pending" },
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]
        }
    })
}

/// An InferencePool `v1` object.
pub fn pool_v1(name: &str, rv: &str, labels: Value, port: u16) -> Value {
    json!({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": name, "namespace": NS, "resourceVersion": rv},
        "spec": {"selector": {"matchLabels": labels}, "targetPorts": [{"number": port}],
                 "endpointPickerRef": {"name": "epp"}}
    })
}

/// An InferencePool `v1alpha2` object.
pub fn pool_v1alpha2(name: &str, rv: &str, labels: Value, port: u16) -> Value {
    json!({
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferencePool",
        "metadata": {"name": name, "namespace": NS, "resourceVersion": rv},
        "spec": {"selector": labels, "targetPortNumber": port, "extensionRef": {"name": "epp"}}
    })
}
