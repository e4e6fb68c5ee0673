//! [`DiscoveryConfig::validate`]: the settings each source needs, checked before anything starts.

use crate::config::{DiscoveryConfig, SourceKind};
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
                if self.port.is_none() {
                    return Err(invalid(
                        "port",
                        "the dns source needs the engines' HTTP port",
                    ));
                }
                Ok(())
            }
            SourceKind::Kubernetes => {
                let set = [
                    self.service.is_some(),
                    self.selector.is_some(),
                    self.inference_pool.is_some(),
                ]
                .iter()
                .filter(|&&b| b)
                .count();
                if set != 1 {
                    return Err(invalid(
                        "service",
                        "the kubernetes source needs exactly one of service, selector and \
                         inference_pool",
                    ));
                }
                Ok(())
            }
        }
    }
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
}
