//! [`DiscoveryConfig::validate`]: the settings each source needs, checked before anything starts.

use crate::config::{DiscoveryConfig, DnsRecord, SourceKind};
use crate::source::DiscoveryError;

/// Longest drain grace accepted: an hour (a drained instance holds a slot until it passes).
pub const MAX_DRAIN_GRACE_MS: u64 = 3_600_000;
/// Shortest re-resolution interval accepted.
pub const MIN_INTERVAL_MS: u64 = 100;

fn invalid(key: &'static str, message: impl Into<String>) -> DiscoveryError {
    DiscoveryError::Config {
        key,
        message: message.into(),
    }
}

impl DiscoveryConfig {
    /// Checks that the chosen source has what it needs; the error names the key.
    pub fn validate(&self) -> Result<(), DiscoveryError> {
        if self.drain_grace_ms > MAX_DRAIN_GRACE_MS {
            return Err(invalid(
                "drain_grace_ms",
                format!("at most {MAX_DRAIN_GRACE_MS} (an hour)"),
            ));
        }
        if self.interval_ms < MIN_INTERVAL_MS {
            return Err(invalid(
                "interval_ms",
                format!("at least {MIN_INTERVAL_MS}"),
            ));
        }
        match self.source {
            SourceKind::Static => Ok(()),
            SourceKind::Dns => {
                if self.name.as_deref().is_none_or(str::is_empty) {
                    return Err(invalid(
                        "name",
                        "the dns source needs the host name to resolve",
                    ));
                }
                match (self.record, self.port) {
                    (DnsRecord::A, None) => Err(invalid(
                        "port",
                        "the dns source needs the engines' HTTP port",
                    )),
                    (DnsRecord::Srv, Some(_)) => Err(invalid(
                        "port",
                        "not used with record = \"srv\": each SRV record names its port",
                    )),
                    _ => Ok(()),
                }
            }
            SourceKind::Kubernetes => self.validate_kubernetes(),
        }
    }

    fn validate_kubernetes(&self) -> Result<(), DiscoveryError> {
        if self.kubeconfig.is_some() && self.api_server.is_some() {
            return Err(invalid(
                "kubeconfig",
                "either kubeconfig (its context names the server) or api_server, not both",
            ));
        }
        if self.context.is_some() && self.api_server.is_some() {
            return Err(invalid(
                "context",
                "a kubeconfig context; api_server reads no kubeconfig",
            ));
        }
        let modes = [
            ("service", &self.service),
            ("selector", &self.selector),
            ("inference_pool", &self.inference_pool),
        ];
        let set: Vec<_> = modes.iter().filter(|(_, v)| v.is_some()).collect();
        if set.len() != 1 {
            return Err(invalid(
                "service",
                "the kubernetes source needs exactly one of service, selector and inference_pool",
            ));
        }
        if let Some(name) = &self.service {
            check_name("service", name)?;
        }
        if let Some(name) = &self.inference_pool {
            check_name("inference_pool", name)?;
        }
        if let Some(sel) = &self.selector {
            check_selector(sel)?;
            if self.port.is_none() {
                return Err(invalid(
                    "port",
                    "selector mode needs the engines' HTTP port (pods name none)",
                ));
            }
        }
        if let Some(ns) = &self.namespace {
            let ok = !ns.is_empty()
                && ns.len() <= 63
                && ns
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !ok {
                return Err(invalid(
                    "namespace",
                    "a namespace name (a DNS label: a-z, 0-9, -)",
                ));
            }
        }
        if let Some(url) = &self.api_server {
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return Err(invalid("api_server", "an https:// (or http://) URL"));
            }
            if self.namespace.is_none() {
                return Err(invalid(
                    "namespace",
                    "required with api_server (there is no pod namespace to default to)",
                ));
            }
        }
        for (key, port) in [
            ("port", self.port),
            ("kv_events_port", self.kv_events_port),
            ("kv_replay_port", self.kv_replay_port),
        ] {
            if port == Some(0) {
                return Err(invalid(key, "a port 1-65535"));
            }
        }
        Ok(())
    }
}

/// An object name: a DNS subdomain (a-z, 0-9, `-`, `.`), at most 253 bytes.
fn check_name(key: &'static str, name: &str) -> Result<(), DiscoveryError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!("{name:?} is not an object name (a-z, 0-9, -, .)"),
        ))
    }
}

/// A label selector in the API's string form: comma-separated requirements (`k=v`, `k==v`,
/// `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a)`), none empty; only label-name characters,
/// operators, parentheses and spaces.
fn check_selector(sel: &str) -> Result<(), DiscoveryError> {
    let bad = |why: &str| invalid("selector", format!("{sel:?}: {why}"));
    if sel.trim().is_empty() {
        return Err(bad("empty"));
    }
    if let Some(c) = sel
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_./=!(), ".contains(*c)))
    {
        return Err(bad(&format!("unexpected character {c:?}")));
    }
    let mut depth = 0i32;
    let mut term = String::new();
    let mut terms = Vec::new();
    for c in sel.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(std::mem::take(&mut term));
                continue;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(bad("unbalanced parentheses"));
        }
        term.push(c);
    }
    terms.push(term);
    if depth != 0 {
        return Err(bad("unbalanced parentheses"));
    }
    for t in &terms {
        let t = t.trim();
        if t.is_empty() || t == "!" || t.starts_with('=') {
            return Err(bad("an empty requirement"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_source_needs_its_keys() {
        let mut c = DiscoveryConfig::default();
        c.validate().unwrap();
        c.source = SourceKind::Dns;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("discovery.name"));
        c.name = Some("vllm.ns.svc".into());
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("discovery.port"));
        c.port = Some(8000);
        c.validate().unwrap();
        c.source = SourceKind::Kubernetes;
        assert!(c.validate().is_err());
        c.service = Some("vllm".into());
        c.validate().unwrap();
        c.selector = Some("app=vllm".into());
        assert!(c.validate().is_err());
    }

    fn k8s() -> DiscoveryConfig {
        DiscoveryConfig {
            source: SourceKind::Kubernetes,
            ..DiscoveryConfig::default()
        }
    }

    fn key_of(c: &DiscoveryConfig) -> String {
        match c.validate() {
            Err(DiscoveryError::Config { key, .. }) => key.to_string(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn kubernetes_modes_selectors_and_kubeconfig() {
        let mut c = k8s();
        c.selector = Some("app=vllm,tier in (gpu, big),!canary".into());
        assert_eq!(key_of(&c), "port", "selector mode needs a port");
        c.port = Some(8000);
        c.validate().unwrap();
        for bad in ["", "app=vllm,", "=x", "app=(", "app=v;rm", "a in (b"] {
            c.selector = Some(bad.into());
            assert_eq!(key_of(&c), "selector", "{bad:?}");
        }
        let mut c = k8s();
        c.inference_pool = Some("llama".into());
        c.validate().unwrap();
        c.kubeconfig = Some("/root/.kube/config".into());
        c.context = Some("prod".into());
        c.validate().unwrap();
        c.api_server = Some("https://10.0.0.1:6443".into());
        c.namespace = Some("inference".into());
        assert_eq!(key_of(&c), "kubeconfig");
        c.kubeconfig = None;
        assert_eq!(key_of(&c), "context");
        let mut c = k8s();
        c.service = Some("Bad_Name".into());
        assert_eq!(key_of(&c), "service");
        c.service = Some("vllm".into());
        c.namespace = Some("x/y".into());
        assert_eq!(key_of(&c), "namespace");
        c.namespace = None;
        c.api_server = Some("https://10.0.0.1:6443".into());
        assert_eq!(key_of(&c), "namespace");
        c.namespace = Some("inference".into());
        c.api_server = Some("ftp://x".into());
        assert_eq!(key_of(&c), "api_server");
        c.api_server = Some("https://10.0.0.1:6443".into());
        c.validate().unwrap();
    }
}
