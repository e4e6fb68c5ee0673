//! `service` mode: a Service's EndpointSlices (and its endpoints' pods) to [`Endpoint`]s.
//!
//! Invariants: an endpoint counts when `conditions.ready` is true or absent and
//! `conditions.terminating` is not true (a terminating endpoint is left out, which drains it);
//! `FQDN` slices and unparsable addresses are skipped; the port is the slice's port named
//! `port_name` (or its first port when no name is configured), else the configured `port`; an
//! endpoint with no port is skipped; the name is the backing pod's, else the address.

use super::metadata::{decorate, Ports, Warned};
use super::objects::{EndpointSlice, Pod, SlicePort};
use crate::address::http_url;
use crate::endpoint::Endpoint;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// What `service` mode needs from the config.
#[derive(Debug, Clone, Default)]
pub struct SliceSettings {
    /// `port_name`.
    pub port_name: Option<String>,
    /// `port`, when a slice names no usable port.
    pub port: Option<u16>,
    /// KV ports.
    pub ports: Ports,
}

fn slice_port(ports: &[SlicePort], s: &SliceSettings) -> Option<u16> {
    let chosen = match &s.port_name {
        Some(name) => ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name.as_str())),
        None => ports.iter().find(|p| p.port.is_some()),
    };
    chosen
        .and_then(|p| p.port)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0)
        .or(s.port)
}

/// The ready endpoints of `slices`, decorated from their pods in `pods`.
pub fn from_slices(
    slices: &BTreeMap<String, EndpointSlice>,
    pods: &BTreeMap<String, Pod>,
    s: &SliceSettings,
    warned: &mut Warned,
) -> Vec<Endpoint> {
    let mut out = Vec::new();
    for slice in slices.values() {
        if slice.address_type == "FQDN" {
            continue;
        }
        let Some(port) = slice_port(&slice.ports, s) else {
            continue;
        };
        for ep in &slice.endpoints {
            let c = &ep.conditions;
            if c.ready == Some(false) || c.terminating == Some(true) {
                continue;
            }
            let Some(ip) = ep.addresses.first().and_then(|a| a.parse::<IpAddr>().ok()) else {
                continue;
            };
            let pod_name = ep
                .target_ref
                .as_ref()
                .filter(|r| r.kind.as_deref().is_none_or(|k| k == "Pod"))
                .and_then(|r| r.name.clone());
            let meta = pod_name
                .as_ref()
                .and_then(|n| pods.get(n))
                .map(|p| &p.metadata);
            let name = pod_name.clone().unwrap_or_else(|| ip.to_string());
            let mut e = Endpoint::new(name, http_url(ip, port));
            decorate(&mut e, ip, meta, s.ports, warned);
            out.push(e);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(v: serde_json::Value) -> BTreeMap<String, EndpointSlice> {
        let s: EndpointSlice = serde_json::from_value(v).unwrap();
        [(s.metadata.name.clone(), s)].into_iter().collect()
    }

    #[test]
    fn only_ready_not_terminating_endpoints_on_the_named_port() {
        let slices = slice(json!({
            "metadata": {"name": "vllm-abc"},
            "addressType": "IPv4",
            "ports": [{"name": "metrics", "port": 9000}, {"name": "http", "port": 8000}],
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "targetRef": {"kind": "Pod", "name": "vllm-0"}},
                {"addresses": ["10.0.0.2"], "conditions": {}},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": false}},
                {"addresses": ["10.0.0.4"], "conditions": {"ready": true, "terminating": true}},
                {"addresses": ["not-an-ip"]}
            ]
        }));
        let s = SliceSettings {
            port_name: Some("http".into()),
            ..SliceSettings::default()
        };
        let eps = from_slices(&slices, &BTreeMap::new(), &s, &mut Warned::default());
        let got: Vec<_> = eps
            .iter()
            .map(|e| (e.name.as_str(), e.url.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("vllm-0", "http://10.0.0.1:8000"),
                ("10.0.0.2", "http://10.0.0.2:8000")
            ]
        );
        let first = from_slices(
            &slices,
            &BTreeMap::new(),
            &SliceSettings::default(),
            &mut Warned::default(),
        );
        assert_eq!(
            first[0].url, "http://10.0.0.1:9000",
            "no port_name: the first port"
        );
    }

    #[test]
    fn a_slice_without_ports_uses_the_configured_port_or_is_skipped() {
        let slices = slice(json!({"metadata": {"name": "s"}, "addressType": "IPv6",
            "endpoints": [{"addresses": ["fd00::1"]}]}));
        assert!(from_slices(
            &slices,
            &BTreeMap::new(),
            &SliceSettings::default(),
            &mut Warned::default()
        )
        .is_empty());
        let s = SliceSettings {
            port: Some(8000),
            ..SliceSettings::default()
        };
        let eps = from_slices(&slices, &BTreeMap::new(), &s, &mut Warned::default());
        assert_eq!(eps[0].url, "http://[fd00::1]:8000");
    }
}
