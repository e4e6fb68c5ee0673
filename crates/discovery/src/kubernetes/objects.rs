//! The few Kubernetes API fields the source reads, as minimal typed structs.
//!
//! Invariants: every field the source does not need is ignored (unknown fields are allowed, so
//! newer API servers parse); absent *and* `null` collections read as empty, because the API
//! server omits empty ones and some clients write `null`.

use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;

/// `null` or absent as the type's default.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// An object kind the watch loop tracks.
pub trait Resource:
    serde::de::DeserializeOwned + Clone + PartialEq + Send + Sync + 'static
{
    /// Its metadata.
    fn meta(&self) -> &ObjectMeta;
}

/// `metadata` of an object.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// Unique within the namespace and kind; the key objects are tracked by.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// Where a watch resumes after this object's change.
    #[serde(default)]
    pub resource_version: Option<String>,
    /// Labels (per-pod settings: model, role, flavour, dp size).
    #[serde(default, deserialize_with = "nullable")]
    pub labels: BTreeMap<String, String>,
    /// Annotations (per-pod KV event ports).
    #[serde(default, deserialize_with = "nullable")]
    pub annotations: BTreeMap<String, String>,
    /// Set once the object is being deleted: a terminating pod takes no new requests.
    #[serde(default)]
    pub deletion_timestamp: Option<String>,
}

/// `metadata` of a list.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    /// The list's consistent snapshot version; the watch starts from it.
    #[serde(default)]
    pub resource_version: Option<String>,
    /// Token for the next page, when the list was cut by `limit`.
    #[serde(default, rename = "continue")]
    pub continue_token: Option<String>,
}

/// A list answer.
#[derive(Clone, Debug, Deserialize)]
pub struct List<T> {
    /// Its version and paging token.
    #[serde(default)]
    pub metadata: ListMeta,
    /// The objects.
    #[serde(
        default = "Vec::new",
        deserialize_with = "nullable_vec",
        bound(deserialize = "T: Deserialize<'de>")
    )]
    pub items: Vec<T>,
}

fn nullable_vec<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// A `Status` object: an error answer's body, or an `ERROR` watch event's object.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Status {
    /// The HTTP-like code (410 = the resource version is too old).
    #[serde(default)]
    pub code: Option<u16>,
    /// Why.
    #[serde(default)]
    pub message: Option<String>,
    /// Machine-readable reason (`Expired`, `Forbidden`).
    #[serde(default)]
    pub reason: Option<String>,
}

/// `discovery.k8s.io/v1` EndpointSlice.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlice {
    /// Its metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `IPv4`, `IPv6` or `FQDN` (skipped).
    #[serde(default, deserialize_with = "nullable")]
    pub address_type: String,
    /// The endpoints.
    #[serde(default, deserialize_with = "nullable")]
    pub endpoints: Vec<SliceEndpoint>,
    /// The ports every endpoint of the slice serves.
    #[serde(default, deserialize_with = "nullable")]
    pub ports: Vec<SlicePort>,
}

impl Resource for EndpointSlice {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
}

/// One endpoint of a slice.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SliceEndpoint {
    /// Its addresses; all name the same backend, the first is used.
    #[serde(default, deserialize_with = "nullable")]
    pub addresses: Vec<String>,
    /// Readiness.
    #[serde(default)]
    pub conditions: SliceConditions,
    /// The pod behind it.
    #[serde(default)]
    pub target_ref: Option<ObjectRef>,
}

/// An endpoint's conditions; absent means unknown, and `ready` unknown counts as ready.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct SliceConditions {
    /// Ready for new requests.
    #[serde(default)]
    pub ready: Option<bool>,
    /// Being shut down.
    #[serde(default)]
    pub terminating: Option<bool>,
}

/// A reference to another object.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ObjectRef {
    /// `Pod` for endpoints backed by pods.
    #[serde(default)]
    pub kind: Option<String>,
    /// The object's name.
    #[serde(default)]
    pub name: Option<String>,
}

/// A port of a slice.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct SlicePort {
    /// The Service port's name.
    #[serde(default)]
    pub name: Option<String>,
    /// The port number (`i32` in the API; out-of-range values are skipped).
    #[serde(default)]
    pub port: Option<i32>,
}

/// `v1` Pod.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Pod {
    /// Its metadata (labels, annotations, deletion).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Phase, IP and conditions.
    #[serde(default)]
    pub status: PodStatus,
}

impl Resource for Pod {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
}

/// A pod's status.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    /// `Running` is the only phase that serves.
    #[serde(default)]
    pub phase: Option<String>,
    /// The pod's (first) IP.
    #[serde(default, rename = "podIP")]
    pub pod_ip: Option<String>,
    /// `Ready` among them.
    #[serde(default, deserialize_with = "nullable")]
    pub conditions: Vec<PodCondition>,
}

/// One pod condition.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct PodCondition {
    /// `Ready`, `ContainersReady`, ...
    #[serde(rename = "type", default)]
    pub kind: String,
    /// `True`, `False`, `Unknown`.
    #[serde(default)]
    pub status: String,
}

/// Gateway API Inference Extension `InferencePool`, in either served version: `v1`
/// (`spec.selector.matchLabels`, `spec.targetPorts[].number`) or `v1alpha2` (`spec.selector` a
/// plain map, `spec.targetPortNumber`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct InferencePool {
    /// Its metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Selector and ports.
    #[serde(default)]
    pub spec: InferencePoolSpec,
}

impl Resource for InferencePool {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
}

/// The fields of both versions' specs.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolSpec {
    /// `v1`: `{matchLabels: {..}}`; `v1alpha2`: `{label: value}`.
    #[serde(default)]
    pub selector: serde_json::Value,
    /// `v1`: the target ports (exactly one today).
    #[serde(default, deserialize_with = "nullable")]
    pub target_ports: Vec<PoolPort>,
    /// `v1alpha2`: the target port.
    #[serde(default)]
    pub target_port_number: Option<i32>,
}

/// A `v1` pool port.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct PoolPort {
    /// The port number.
    #[serde(default)]
    pub number: Option<i32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_and_absent_collections_read_as_empty() {
        let s: EndpointSlice =
            serde_json::from_str(r#"{"metadata":{"name":"s","labels":null},"endpoints":null}"#)
                .unwrap();
        assert!(s.endpoints.is_empty() && s.ports.is_empty() && s.metadata.labels.is_empty());
        let l: List<Pod> =
            serde_json::from_str(r#"{"metadata":{"resourceVersion":"7"},"items":null}"#).unwrap();
        assert!(l.items.is_empty());
        assert_eq!(l.metadata.resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn pod_ip_is_read() {
        let p: Pod = serde_json::from_str(
            r#"{"metadata":{"name":"p"},"status":{"phase":"Running","podIP":"10.0.0.1",
                "conditions":[{"type":"Ready","status":"True"}]}}"#,
        )
        .unwrap();
        assert_eq!(p.status.pod_ip.as_deref(), Some("10.0.0.1"));
        assert_eq!(p.status.conditions[0].kind, "Ready");
    }
}
