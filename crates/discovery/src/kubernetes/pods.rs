//! `selector` and `inference_pool` modes: pods to [`Endpoint`]s.
//!
//! Invariant: a pod counts when its phase is `Running`, its `Ready` condition is `True`, it has
//! no deletion timestamp (terminating pods drain) and it has a parseable pod IP.

use super::metadata::{decorate, Ports, Warned};
use super::objects::Pod;
use crate::address::http_url;
use crate::endpoint::Endpoint;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// The pod's IP if it is ready to take new requests.
pub fn ready_ip(pod: &Pod) -> Option<IpAddr> {
    let st = &pod.status;
    let ready = st
        .conditions
        .iter()
        .any(|c| c.kind == "Ready" && c.status == "True");
    if st.phase.as_deref() != Some("Running") || !ready || pod.metadata.deletion_timestamp.is_some()
    {
        return None;
    }
    st.pod_ip.as_deref()?.parse().ok()
}

/// The ready pods of `pods` as endpoints on `port`.
pub fn from_pods(
    pods: &BTreeMap<String, Pod>,
    port: u16,
    ports: Ports,
    warned: &mut Warned,
) -> Vec<Endpoint> {
    pods.values()
        .filter_map(|pod| {
            let ip = ready_ip(pod)?;
            let mut e = Endpoint::new(pod.metadata.name.clone(), http_url(ip, port));
            decorate(&mut e, ip, Some(&pod.metadata), ports, warned);
            Some(e)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, phase: &str, ready: &str, deleting: bool, ip: Option<&str>) -> Pod {
        let mut v = json!({
            "metadata": {"name": name},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]}
        });
        if deleting {
            v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        if let Some(ip) = ip {
            v["status"]["podIP"] = json!(ip);
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_running_ready_live_pods_with_an_ip() {
        let pods: BTreeMap<_, _> = [
            pod("a", "Running", "True", false, Some("10.0.0.1")),
            pod("b", "Running", "False", false, Some("10.0.0.2")),
            pod("c", "Pending", "True", false, Some("10.0.0.3")),
            pod("d", "Running", "True", true, Some("10.0.0.4")),
            pod("e", "Running", "True", false, None),
        ]
        .into_iter()
        .map(|p| (p.metadata.name.clone(), p))
        .collect();
        let eps = from_pods(&pods, 8000, Ports::default(), &mut Warned::default());
        let got: Vec<_> = eps
            .iter()
            .map(|e| (e.name.as_str(), e.url.as_str()))
            .collect();
        assert_eq!(got, [("a", "http://10.0.0.1:8000")]);
    }
}
